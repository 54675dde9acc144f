"""Talon's own stdio transport for MCP servers, with bounded output.

The SDK's ``stdio_client`` re-splits a growing line on every chunk (a 100 MB line without a
newline costs minutes of CPU on the event loop) and keeps no bound on a message. Here:

- stdout is read in chunks and each chunk is searched for a newline once (linear); a message
  longer than ``max_message`` bytes (``TALON_MCP_MAX_RESULT``) is not kept: the transport ends,
  ``on_overflow`` says why (the call fails with that reason and the server is restarted), and
  the process is stopped. A large message is parsed in a worker thread, not on the loop.
- stderr goes to the log line by line, each line cut at 2,000 characters, at most
  ``_STDERR_BURST`` bytes per ``_STDERR_WINDOW_S`` seconds; what is dropped past that is
  counted and said in one line per window (and the last few lines are kept for error messages).
- stopping follows the MCP spec: stdin closed, 2 s grace, SIGTERM to the process group, 2 s,
  SIGKILL; then ``Launch.cleanup`` ends whatever the tree left (see ``talon.agent.tools.mcp_launch``).

It yields the pair of anyio memory streams the SDK's ``Client`` takes as a transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from talon.agent.tools.mcp_launch import Launch

__all__ = ["stdio_transport"]

_CHUNK = 1 << 16
_PARSE_IN_THREAD = 1 << 18  # messages larger than this are parsed off the event loop
_STDERR_LINE_CHARS = 2000
_STDERR_WINDOW_S = 10.0
_STDERR_BURST = 64_000  # bytes of stderr logged per window; the rest is counted and dropped
_GRACE_S = 2.0
_KILL_WAIT_S = 2.0


class _StderrLog:
    """A server's stderr in Talon's log: line by line, cut, rate-limited; the last lines kept."""

    def __init__(self, logger: logging.Logger, tail: deque[str]) -> None:
        self.logger = logger
        self.tail = tail
        self.partial = bytearray()
        self.skipping = False  # the rest of an over-long line is dropped
        self.window_start = time.monotonic()
        self.window_bytes = 0
        self.dropped_bytes = 0
        self.dropped_lines = 0

    def feed(self, chunk: bytes) -> None:
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            piece = chunk[start:end]
            if self.skipping:
                self.dropped_bytes += len(piece)
            else:
                room = _STDERR_LINE_CHARS - len(self.partial)
                self.partial += piece[:room]
                if len(piece) > room:
                    self.dropped_bytes += len(piece) - room
                    self._emit(cut=True)
                    self.skipping = True
            if newline < 0:
                break
            if not self.skipping:
                self._emit(cut=False)
            self.skipping = False
            start = newline + 1

    def _emit(self, *, cut: bool) -> None:
        raw = bytes(self.partial)
        self.partial.clear()
        line = raw.decode("utf-8", "replace").rstrip()
        if not line:
            return
        suffix = " [line cut]" if cut else ""
        self.tail.append(line[:300] + suffix)
        line += suffix
        now = time.monotonic()
        if now - self.window_start >= _STDERR_WINDOW_S:
            self._report_dropped()
            self.window_start, self.window_bytes = now, 0
        if self.window_bytes + len(raw) > _STDERR_BURST:
            self.dropped_bytes += len(raw)
            self.dropped_lines += 1
            return
        self.window_bytes += len(raw)
        self.logger.info("%s", line)

    def _report_dropped(self) -> None:
        if self.dropped_bytes or self.dropped_lines:
            self.logger.warning("[%s bytes of this server's stderr (%s whole lines) not logged: more than %s bytes "
                                "in %gs, or lines longer than %s characters]", f"{self.dropped_bytes:,}",
                                f"{self.dropped_lines:,}", f"{_STDERR_BURST:,}", _STDERR_WINDOW_S,
                                f"{_STDERR_LINE_CHARS:,}")
            self.dropped_bytes = self.dropped_lines = 0

    def close(self) -> None:
        if self.partial and not self.skipping:
            self._emit(cut=False)
        self._report_dropped()


def _parse(line: bytes) -> Any:
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


@asynccontextmanager
async def stdio_transport(launch: Launch, *, max_message: int, logger: logging.Logger, tail: deque[str],
                          on_exit: Callable[[str], None], on_overflow: Callable[[int], None]
                          ) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``launch`` and yield the (read, write) streams of SessionMessage the SDK's Client takes."""
    from mcp.shared.message import SessionMessage

    try:
        process = await asyncio.create_subprocess_exec(
            *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=launch.env, cwd=launch.cwd, start_new_session=True, limit=_CHUNK)
    except BaseException:
        await launch.cleanup()  # its cgroup, made for it
        raise
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False
    stderr_done = anyio.Event()

    async def read_stdout() -> None:
        buffer = bytearray()
        why = "the server process exited"
        try:
            async with read_writer:
                while True:
                    chunk = await stdout.read(_CHUNK)
                    if not chunk:
                        break
                    start = 0
                    while True:
                        newline = chunk.find(b"\n", start)
                        buffer += chunk[start:] if newline < 0 else chunk[start:newline]
                        if len(buffer) > max_message:
                            size = len(buffer)
                            buffer = bytearray()
                            why = f"it sent a message larger than {max_message:,} bytes (TALON_MCP_MAX_RESULT)"
                            if not shutting_down:
                                on_overflow(size)
                            return
                        if newline < 0:
                            break
                        line, buffer = bytes(buffer), bytearray()
                        start = newline + 1
                        if not line.strip():
                            continue
                        message = (await asyncio.to_thread(_parse, line) if len(line) > _PARSE_IN_THREAD
                                   else _parse(line))
                        try:
                            await read_writer.send(message)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return
        except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass
        finally:
            if not shutting_down:
                on_exit(why)

    async def read_stderr() -> None:
        log = _StderrLog(logger, tail)
        try:
            while chunk := await stderr.read(_CHUNK):
                log.feed(chunk)
        except (OSError, ConnectionError):
            pass
        finally:
            log.close()
            stderr_done.set()

    async def watch_exit() -> None:
        # Not process.wait(): it also waits for the pipes, which a left-behind child may hold.
        while process.returncode is None:
            await asyncio.sleep(0.2)
        if not shutting_down:
            on_exit(f"the server process exited (status {process.returncode})")

    async def write_stdin() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    stdin.write(data.encode("utf-8"))
                    await stdin.drain()
        except (OSError, ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await read_writer.aclose()

    async def stop() -> None:
        read_stream.close()
        write_stream.close()
        with contextlib.suppress(OSError, RuntimeError):
            stdin.close()
        if not await _exited(process, _GRACE_S):
            _signal_group(process.pid, signal.SIGTERM)
            if not await _exited(process, _KILL_WAIT_S):
                _signal_group(process.pid, signal.SIGKILL)
                await _exited(process, _KILL_WAIT_S)
        # Whatever the server left in its process group goes too (a wrapped tree is gone with
        # its PID namespace; an unwrapped one is also scanned for in Launch.cleanup).
        _signal_group(process.pid, signal.SIGKILL)
        with anyio.move_on_after(1.0):
            await stderr_done.wait()
        # The pipes a left-behind process may hold (or stdout unread past an over-long message)
        # are closed with the transport; nothing public exposes it.
        transport = getattr(process, "_transport", None)
        if transport is not None:
            with contextlib.suppress(PermissionError):
                transport.close()
        await launch.cleanup()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_stdout)
        tg.start_soon(read_stderr)
        tg.start_soon(write_stdin)
        tg.start_soon(watch_exit)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):
                await stop()
            tg.cancel_scope.cancel()


async def _exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
