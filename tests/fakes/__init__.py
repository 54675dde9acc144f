"""Loopback fakes of the external HTTP APIs Talon talks to.

Each fake is a real aiohttp server on 127.0.0.1 (ephemeral port) that the real client library is
pointed at, so tests exercise the same request encoding, error mapping and retry code that runs in
production. Two ways to run one:

- ``async with FakeX() as fake:`` serves on the test's own event loop;
- ``with FakeX() as fake:`` (or ``start_in_thread()`` / ``stop_thread()``) serves from a private
  loop in a daemon thread, for tests that drive a subprocess or a synchronous client.

Everything a test touches (scripting failures, pushing updates, reading what was recorded, waiting)
is safe to call from any thread. ``await fake.wait_for...`` works on any loop; the ``*_sync``
variants block the calling thread and must not be called from the fake's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self, TypeVar

from aiohttp import web

__all__ = [
    "FakeOpenAI",
    "FakeTelegram",
    "FakeTwilio",
    "LoopbackServer",
    "UploadedFile",
    "read_form",
]

T = TypeVar("T")

# Real uploads (documents, videos) are far above aiohttp's 1 MB default body limit.
MAX_BODY_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class UploadedFile:
    """One file part of a multipart request, exactly as the client sent it."""

    filename: str | None
    content_type: str | None
    data: bytes


async def read_form(request: web.Request) -> tuple[dict[str, str], dict[str, UploadedFile]]:
    """Plain fields and file parts of a urlencoded or multipart body (query string included)."""
    fields: dict[str, str] = dict(request.query)
    files: dict[str, UploadedFile] = {}
    form = await request.post()
    for name, value in form.items():
        if isinstance(value, web.FileField):
            files[name] = UploadedFile(value.filename, value.content_type, value.file.read())
        elif isinstance(value, (bytes, bytearray)):
            fields[name] = bytes(value).decode("utf-8", "replace")
        else:
            fields[name] = value
    return fields, files


class LoopbackServer:
    """An aiohttp app on 127.0.0.1:0 plus the cross-thread wait/notify plumbing the fakes share.

    Subclasses build the app in ``_make_app`` and keep their state under ``self._cond``; after
    changing state they call ``self._notify()`` so async and sync waiters re-check their condition.
    """

    host = "127.0.0.1"

    def __init__(self) -> None:
        self._cond = threading.Condition()  # RLock-based: state mutations may nest
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None
        self._changed: asyncio.Event | None = None
        self._closing = False

    def _make_app(self) -> web.Application:
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return self._port

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> Self:
        if self._runner is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._closing = False
        # A short shutdown timeout: long polls and hung requests are woken on close, anything
        # still running after that is a handler bug and gets cancelled rather than waited on.
        runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self._port = runner.addresses[0][1]
        self._runner = runner
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._closing = True
        self._notify()
        await runner.cleanup()
        self._port = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self, timeout: float = 10.0) -> Self:
        """Serve from a private event loop in a daemon thread; returns once listening."""
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} is already running in a thread")
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # surfaced to the starting thread below
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        thread = threading.Thread(target=run, name=f"{type(self).__name__}-loop", daemon=True)
        thread.start()
        if not started.wait(timeout):
            raise TimeoutError(f"{type(self).__name__} did not start within {timeout}s")
        if failure:
            thread.join()
            raise failure[0]
        self._thread = thread
        return self

    def stop_thread(self, timeout: float = 10.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop_thread()

    # -- cross-thread waiting --------------------------------------------------------------

    def _in_server_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _notify(self) -> None:
        """Wake every waiter so it re-checks its condition. Callable from any thread."""
        with self._cond:
            self._cond.notify_all()
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if self._in_server_loop():
            self._pulse()
        else:
            # The loop may close between the check and the call; nobody is waiting on it then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._pulse)

    def _pulse(self) -> None:
        # Swap before setting: a waiter that re-checks and waits again gets the fresh event.
        event, self._changed = self._changed, asyncio.Event()
        if event is not None:
            event.set()

    async def _wait_until(
        self, check: Callable[[], T | None], timeout: float, describe: Callable[[], str]
    ) -> T:
        """Await until ``check()`` (run under the state lock) returns non-None."""
        if not self._in_server_loop():
            return await asyncio.to_thread(self._wait_until_sync, check, timeout, describe)
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                result = check()
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(describe())
            event = self._changed
            assert event is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    def _wait_until_sync(
        self, check: Callable[[], T | None], timeout: float, describe: Callable[[], str]
    ) -> T:
        if self._in_server_loop():
            raise RuntimeError("blocking wait called from the fake's own event loop; use await")
        deadline = time.monotonic() + timeout
        with self._cond:
            while (result := check()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(describe())
                self._cond.wait(remaining)
            return result


# Imported last: these modules subclass LoopbackServer defined above.
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402
from tests.fakes.twilio import FakeTwilio  # noqa: E402
