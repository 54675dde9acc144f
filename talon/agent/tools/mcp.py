"""MCP servers as agent tools, through the official ``mcp`` SDK.

Each configured server (``talon.agent.tools.mcp_config``) becomes tools named
``mcp__<server>__<tool>`` (cut to the providers' 64 characters and kept unique), with the
server's own description and input schema. ``McpTool.server`` names the server a tool belongs
to, for rules that treat servers differently.

Connections. Each live link to a server (a child process for stdio, a session for streamable
HTTP) is a ``_Connection`` owned by one task of its own, because the SDK's transports must be
entered and left in one task. A stdio server is started by ``talon.agent.tools.mcp_launch`` (its
command line, environment and walls) and spoken to through Talon's own transport
(``talon.agent.tools.mcp_stdio``: one message at most ``TALON_MCP_MAX_RESULT`` bytes, read linearly;
stderr to Talon's log under ``talon.mcp.<server>``, cut and rate-limited). A connection that fails
to start, exits, sends a message past the cap, or lets a call run past ``TALON_MCP_TIMEOUT``
(taken as hung) is restarted with backoff (1 s doubling to 60 s); meanwhile a call gets a tool
error saying why, and ``/status`` says so. ``/stop`` cancels a call: the SDK tells the server the
request was cancelled. Stopping Talon stops every connection with its whole process tree.

Shared and per-chat servers. A server whose config has no ``${WORKSPACE}`` is one connection
for every chat, started with Talon, on the host (the operator's trust decision). One with
``${WORKSPACE}`` gets a connection per workspace, in the shell's bubblewrap sandbox (refused where
none can be made), started on first use in that chat and stopped when idle for
``TALON_MCP_IDLE_TIMEOUT``, or, least recently used first, when ``TALON_MCP_PER_CHAT_MAX`` run.
Each chat's connection starts and backs off on its own. The server's tools are learned from the
first of its connections that starts, and offered in every chat from then on; a chat whose own
connection failed gets the reason as the tool error.

Results. Text goes to the model between untrusted markers naming the server (``talon.agent
.tools.untrusted``), cut at ``OUTSIDE_RESULT_MAX_CHARS``; the context pipeline saves long results to
a file with a preview like any tool output. Images become image blocks (checked and downscaled
like inbound photos); audio and binary resources become a short notice.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talon.agent.tools.mcp_config import McpServerConfig
from talon.agent.tools.mcp_launch import Launcher, resolve_command
from talon.agent.tools.sandbox import SandboxLimits
from talon.agent.tools.registry import Tool, ToolContext, ToolRegistry, ToolResult, ToolSource
from talon.agent.tools.untrusted import cut, image_from_bytes, untrusted_block
from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import ContentBlock, TextBlock
from talon.errors import McpUnavailable
from talon.tls import sdk_tls

__all__ = ["McpManager", "McpTool", "ServerStatus", "mcp_tool_name"]

log = logging.getLogger(__name__)

TOOL_NAME_MAX = 64  # OpenAI's and Anthropic's limit on a tool name
_BACKOFF_FIRST_S = 1.0
_BACKOFF_MAX_S = 60.0
# A connection that stayed up this long starts its backoff afresh when it fails.
_STABLE_S = 60.0
_STDERR_TAIL = 5
_LIST_PAGES_MAX = 20
_DESCRIPTION_MAX = 1024
_IMAGE_MAX_BASE64 = 30_000_000


def mcp_tool_name(server: str, tool: str, taken: set[str]) -> str:
    """``mcp__<server>__<tool>``, with characters the providers refuse replaced, cut to 64
    characters and made unique with a short hash of the pair when needed."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", f"mcp__{server}__{tool}")
    if len(name) <= TOOL_NAME_MAX and name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()
    for width in (6, 10, 16):
        candidate = f"{name[:TOOL_NAME_MAX - width - 1]}_{digest[:width]}"
        if candidate not in taken:
            return candidate
    raise ValueError(f"no unique tool name for {server}/{tool}")


@dataclass(frozen=True)
class ServerStatus:
    """What ``/status`` and ``talon doctor`` say about one configured server."""

    name: str
    transport: str
    per_chat: bool
    state: str  # starting, ready, failed, restarting, stopped; for a per-chat server, how many run
    tools: int | None
    detail: str = ""

    def line(self) -> str:
        tools = f", {self.tools} tool{'s' if self.tools != 1 else ''}" if self.tools is not None else ""
        kind = "per chat" if self.per_chat else self.transport
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.name} ({kind}): {self.state}{tools}{detail}"


_resolve_command = resolve_command


class _Connection:
    """One live link to one server, owned by its task; restarted with backoff until closed."""

    def __init__(self, config: McpServerConfig, *, label: str, start_timeout_s: float,
                 on_tools: Callable[[McpServerConfig, list[Any]], None], launcher: Launcher,
                 workspace: Path | None = None, max_message: int = 4_000_000) -> None:
        self.config = config
        self.label = label  # the server's name, plus the chat's workspace for a per-chat one
        self.start_timeout_s = start_timeout_s
        self.on_tools = on_tools
        self.launcher = launcher
        self.workspace = workspace  # a per-chat server's workspace (on the host); None for a shared one
        self.max_message = max_message
        self.overflowed = 0  # the size of the last message past TALON_MCP_MAX_RESULT, in this session
        self.state = "starting"
        self.detail = ""
        self.client: Any = None
        self.first_attempt = asyncio.Event()
        self.attempt_done = asyncio.Event()  # the current try to start has ended, either way
        self.next_try = 0.0
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._wake = asyncio.Event()
        self._wake_reason = ""
        self._last_reason = ""
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._log = logging.getLogger(f"talon.mcp.{config.name}")

    def start(self, after: asyncio.Task[None] | None = None) -> None:
        """Start the owner task; ``after``: a connection being stopped to make room, waited for
        first, so the per-chat cap holds for processes, not just connections."""
        self._task = asyncio.create_task(self._run(after), name=f"mcp-{self.label}")

    # --- the owner task -----------------------------------------------------------------------
    async def _run(self, after: asyncio.Task[None] | None = None) -> None:
        if after is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(after)
        delay = _BACKOFF_FIRST_S
        while not self._closing:
            self.state = "starting"
            self.attempt_done.clear()
            up_since: list[float] = []
            try:
                reason = await self._session(up_since)
            except Exception as exc:  # whatever the server or transport did: logged, retried
                reason = _describe(exc)
            finally:
                self.client = None
                self.first_attempt.set()
                self.attempt_done.set()
            if self._closing:
                break
            if up_since and time.monotonic() - up_since[0] >= _STABLE_S:
                delay = _BACKOFF_FIRST_S
            tail = f" (its last output: {' | '.join(self.stderr_tail)})" if self.stderr_tail else ""
            self.state = "restarting" if up_since else "failed"
            self.detail = f"{reason}{tail}"
            self.next_try = time.monotonic() + delay
            # Warned once per reason; the same failure again (every minute at most) is info.
            level = logging.INFO if reason == self._last_reason else logging.WARNING
            self._last_reason = reason
            log.log(level, "MCP server %s %s: %s%s; trying again in %.0fs", self.label,
                    "stopped working" if up_since else "could not start", reason, tail, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_wait(), delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)
        self.state = "stopped"

    async def _wake_wait(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return

    async def _session(self, up_since: list[float]) -> str:
        """Run one connection until it ends; returns why it ended."""
        import anyio
        from mcp import Client
        from mcp_types import Implementation

        self._wake.clear()
        self._wake_reason = ""
        self.stderr_tail.clear()
        self.overflowed = 0
        async with AsyncExitStack() as stack:
            transport = await self._transport(stack)
            client = Client(transport, client_info=Implementation(name="talon", version="0.1.0"))
            started = time.monotonic()
            with anyio.CancelScope() as scope:
                # The deadline covers the start only: it is lifted once the server is ready.
                scope.deadline = anyio.current_time() + self.start_timeout_s
                async with client:
                    tools = await self._list_tools(client)
                    scope.deadline = math.inf
                    self.client = client
                    self.state = "ready"
                    self.detail = ""
                    up_since.append(time.monotonic())
                    log.info("MCP server %s ready in %.1fs: %d tool(s)", self.label,
                             time.monotonic() - started, len(tools))
                    self.on_tools(self.config, tools)
                    self.first_attempt.set()
                    self.attempt_done.set()
                    await self._until_woken()
                    self.client = None
            if scope.cancelled_caught:
                return f"it did not answer within {self.start_timeout_s:g}s of starting (TALON_MCP_START_TIMEOUT)"
            return self._wake_reason or "stopped"

    async def _until_woken(self) -> None:
        if not self._closing:
            await self._wake.wait()

    async def _transport(self, stack: AsyncExitStack) -> Any:
        if self.config.command is None:
            import httpx2  # the SDK's own HTTP client library
            from mcp.client.streamable_http import streamable_http_client

            # The SDK's defaults: 30 s to connect and write, 300 s between reads of a held stream
            # (each call has its own TALON_MCP_TIMEOUT). No redirects beyond the endpoint's origin.
            http = httpx2.AsyncClient(verify=sdk_tls(), headers=self.config.headers or None,
                                      timeout=httpx2.Timeout(30.0, read=300.0))
            await stack.enter_async_context(http)
            assert self.config.url is not None
            return streamable_http_client(self.config.url, http_client=http)
        from talon.agent.tools.mcp_stdio import stdio_transport

        # A per-chat server in the sandbox (or refused), a shared one on the host; either way
        # with an environment built from nothing but the config's env (talon.agent.tools.mcp_launch).
        if self.workspace is not None:
            launch = await self.launcher.per_chat(self.config, self.workspace)
        else:
            launch = await self.launcher.shared(self.config)
        return stdio_transport(launch, max_message=self.max_message, logger=self._log, tail=self.stderr_tail,
                               on_exit=self._exited, on_overflow=self._overflow)

    def _exited(self, why: str) -> None:
        if not self._closing:
            self.wake(why)

    def _overflow(self, size: int) -> None:
        self.overflowed = size
        log.warning("MCP server %s sent a message of more than %s bytes (TALON_MCP_MAX_RESULT=%s); restarting it",
                    self.label, f"{size:,}", self.max_message)
        self.wake(f"it sent a message larger than {self.max_message:,} bytes (TALON_MCP_MAX_RESULT)")

    async def _list_tools(self, client: Any) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES_MAX):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    # --- used from turns ----------------------------------------------------------------------
    def wake(self, reason: str) -> None:
        """End the current link (it died or hung); the owner task restarts it after its backoff."""
        if not self._wake_reason:
            self._wake_reason = reason
        self._wake.set()

    def unavailable(self) -> McpUnavailable:
        if self.state == "starting":
            return McpUnavailable(f"the MCP server {self.config.name!r} is still starting")
        wait = max(0.0, self.next_try - time.monotonic())
        again = f"; Talon tries again in {wait:.0f}s" if not self._closing else ""
        return McpUnavailable(f"the MCP server {self.config.name!r} is not running ({self.detail or self.state}){again}")

    async def wait_ready(self, timeout_s: float) -> Any:
        """The connected client, waiting for a start in progress; McpUnavailable otherwise."""
        if self.client is None and self.state == "starting":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.attempt_done.wait(), timeout_s)
        if self.client is None:
            raise self.unavailable()
        return self.client

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is None:
            return
        # The SDK ends a stdio server within ~6 s (stdin closed, then SIGTERM, then SIGKILL to
        # its process group); only a task that is still stuck after that is cancelled.
        done, _ = await asyncio.wait({self._task}, timeout=15.0)
        if not done:
            log.warning("MCP server %s did not stop in time; cancelling it", self.label)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def _describe(exc: BaseException) -> str:
    if isinstance(exc, McpUnavailable):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _describe(inner)
    text = str(exc).strip()
    name = type(exc).__name__
    if "Connection closed" in text:
        return "the connection closed (the server exited)"
    return f"{name}: {text}"[:500] if text else name


class McpTool(Tool):
    """One tool of one MCP server, as the model sees it."""

    def __init__(self, manager: "McpManager", server: str, remote: Any, name: str) -> None:
        self.manager = manager
        # The configured server this tool belongs to (its key in the mcpServers file).
        self.server = server
        # The tool's own name on that server.
        self.remote_name: str = remote.name
        self.name = name
        description = (remote.description or remote.title or remote.name).strip()
        self.description = f"[MCP server {server}] {description}"[:_DESCRIPTION_MAX]
        schema = dict(remote.input_schema or {})
        if schema.get("type") != "object":
            schema = {"type": "object", "properties": {}}
        schema.setdefault("properties", {})
        self.parameters = schema

    @property
    def offered(self) -> bool:
        return self.manager.offers(self.server)

    def time_limit(self, args: dict[str, Any], default: float) -> float:
        # A per-chat server may have to start first; the call itself has TALON_MCP_TIMEOUT.
        return self.manager.start_timeout_s + self.manager.call_timeout_s + 10.0

    async def run(self, args: dict[str, Any]) -> ToolResult:
        return await self.invoke(args, ToolContext())

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.manager.call(self.server, self.remote_name, args, ctx)


class McpManager(ToolSource):
    """Every configured MCP server: their connections, their tools in ``registry``, their state."""

    def __init__(self, configs: list[McpServerConfig], registry: ToolRegistry, *,
                 store: AttachmentStore | None, limits: Limits, call_timeout_s: float = 60.0,
                 start_timeout_s: float = 30.0, idle_timeout_s: float = 600.0, per_chat_max: int = 8,
                 max_result: int = 4_000_000, sandbox_limits: SandboxLimits | None = None,
                 launcher: Launcher | None = None) -> None:
        self.configs = {c.name: c for c in configs}
        self.registry = registry
        self.store = store
        self.limits = limits
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.per_chat_max = per_chat_max  # TALON_MCP_PER_CHAT_MAX: per-chat processes at once
        self.max_result = max_result  # TALON_MCP_MAX_RESULT: bytes of one message from a server
        self.launcher = launcher or Launcher(sandbox_limits)
        self.shared: dict[str, _Connection] = {}
        self.per_chat: dict[tuple[str, Path], _Connection] = {}
        self._tools: dict[str, list[McpTool]] = {}
        self._listings: dict[str, list[tuple[str, str | None, str]]] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # per-chat connections being stopped
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        registry.sources.append(self)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every shared server (in the background; ``prepare`` waits for the first try)."""
        for config in self.configs.values():
            if not config.per_chat:
                connection = self._connection(config, None, config.name)
                self.shared[config.name] = connection
        if any(c.per_chat for c in self.configs.values()):
            self._reaper = asyncio.create_task(self._reap_idle(), name="mcp-idle")
            await self.launcher.sandbox()  # looked up now: a missing sandbox is said at start

    async def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        connections = [*self.shared.values(), *self.per_chat.values()]
        self.shared.clear()
        self.per_chat.clear()
        await asyncio.gather(*(c.close() for c in connections), *self._stopping, return_exceptions=True)
        self.launcher.close()

    def _connection(self, config: McpServerConfig, workspace: Path | None, label: str,
                    after: asyncio.Task[None] | None = None) -> _Connection:
        connection = _Connection(config, label=label, start_timeout_s=self.start_timeout_s,
                                 on_tools=lambda _config, tools: self._learn(config, tools), launcher=self.launcher,
                                 workspace=workspace, max_message=self.max_result)
        connection.start(after)
        return connection

    def _stop_later(self, connection: _Connection) -> asyncio.Task[None]:
        task = asyncio.create_task(connection.close(), name=f"mcp-stop-{connection.label}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return task

    async def _reap_idle(self) -> None:
        interval = max(0.2, min(30.0, self.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            idle = [key for key, c in self.per_chat.items()
                    if c.in_flight == 0 and now - c.last_used >= self.idle_timeout_s]
            for key in idle:
                connection = self.per_chat.pop(key)
                log.info("MCP server %s idle for %.0fs; stopping it", connection.label, now - connection.last_used)
                await connection.close()

    # --- tools --------------------------------------------------------------------------------
    def _learn(self, config: McpServerConfig, tools: list[Any]) -> None:
        """Offer a server's tools (on its first start, and when a restart lists others)."""
        wanted = [t for t in tools if config.wants(t.name)]
        listing = [(t.name, t.description, json.dumps(t.input_schema, sort_keys=True, default=str)) for t in wanted]
        if config.name in self._tools and self._listings.get(config.name) == listing:
            return
        self._listings[config.name] = listing
        old = self._tools.get(config.name, [])
        for tool in old:
            self.registry.tools.pop(tool.name, None)
        taken = set(self.registry.tools)
        made: list[McpTool] = []
        for remote in wanted:
            name = mcp_tool_name(config.name, remote.name, taken)
            taken.add(name)
            tool = McpTool(self, config.name, remote, name)
            self.registry.add(tool)
            made.append(tool)
        self._tools[config.name] = made
        left_out = len(tools) - len(wanted)
        log.info("MCP server %s offers %d tool(s)%s", config.name, len(made),
                 f" ({left_out} left out by allowTools/denyTools)" if left_out else "")

    def offers(self, server: str) -> bool:
        """Whether the server's tools are offered now: a shared server while it runs; a per-chat
        one once its tools are known (each chat's own process starts on first use)."""
        config = self.configs.get(server)
        if config is None or self._closed:
            return False
        if config.per_chat:
            return server in self._tools
        connection = self.shared.get(server)
        return connection is not None and connection.client is not None

    async def prepare(self, ctx: ToolContext) -> None:
        """Before a turn: wait (bounded) for shared servers still on their first start, and start
        this chat's own instance of a per-chat server whose tools are not known yet (each chat's
        instance starts and backs off on its own: one chat's failure hides nothing from another)."""
        waits = [c.first_attempt.wait() for c in self.shared.values() if not c.first_attempt.is_set()]
        for config in self.configs.values():
            if config.per_chat and config.name not in self._tools:
                connection = self._chat_connection(config, ctx)
                if connection is not None and not connection.first_attempt.is_set():
                    waits.append(connection.first_attempt.wait())
        if not waits:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), self.start_timeout_s + 1.0)

    def _chat_connection(self, config: McpServerConfig, ctx: ToolContext) -> _Connection | None:
        """This chat's instance of a per-chat server (keyed by its workspace, so forum topics
        that share a workspace share it), started if it is not running; None when there is no
        workspace, or when TALON_MCP_PER_CHAT_MAX instances run and every one is mid-call."""
        if self._closed:
            return None
        workspace = getattr(ctx.workspace, "real_root", None)
        if workspace is None:
            return None
        key = (config.name, Path(workspace))
        connection = self.per_chat.get(key)
        if connection is None:
            after = None
            if len(self.per_chat) >= self.per_chat_max:
                after = self._evict_one()
                if after is None:
                    return None
            connection = self._connection(config, Path(workspace), f"{config.name} [{Path(workspace).name}]", after)
            self.per_chat[key] = connection
        connection.last_used = time.monotonic()
        return connection

    def _evict_one(self) -> asyncio.Task[None] | None:
        """Stop the least recently used per-chat instance that is not mid-call (the task that
        stops it); None if every one is mid-call."""
        idle = [(c.last_used, key) for key, c in self.per_chat.items() if c.in_flight == 0]
        if not idle:
            return None
        _, key = min(idle)
        connection = self.per_chat.pop(key)
        log.info("MCP server %s stopped: %d per-chat servers run (TALON_MCP_PER_CHAT_MAX) and it was used "
                 "least recently", connection.label, self.per_chat_max)
        return self._stop_later(connection)

    # --- calls --------------------------------------------------------------------------------
    async def call(self, server: str, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        config = self.configs[server]
        connection = self._chat_connection(config, ctx) if config.per_chat else self.shared.get(server)
        if connection is None:
            if config.per_chat and getattr(ctx.workspace, "real_root", None) is not None and not self._closed:
                return ToolResult.text(
                    f"Error: the MCP server {server!r} cannot start for this chat now: {self.per_chat_max} per-chat "
                    "MCP servers are running (TALON_MCP_PER_CHAT_MAX) and every one is in the middle of a call; "
                    "try again shortly", is_error=True)
            return ToolResult.text(f"Error: the MCP server {server!r} is not available here", is_error=True)
        connection.last_used = time.monotonic()
        connection.in_flight += 1
        try:
            client = await connection.wait_ready(self.start_timeout_s)
            result = await client.call_tool(tool, args, read_timeout_seconds=self.call_timeout_s)
        except McpUnavailable as exc:
            return ToolResult.text(f"Error: {exc}", is_error=True)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                connection.wake(f"a call to {tool} got no answer within {self.call_timeout_s:g}s (taken as hung)")
                return ToolResult.text(
                    f"Error: {tool} on the MCP server {server!r} did not answer within {self.call_timeout_s:g}s "
                    "(TALON_MCP_TIMEOUT); the call was cancelled and the server is being restarted", is_error=True)
            if exc.code == CONNECTION_CLOSED and connection.overflowed:
                return self._too_large(server, tool)
            if exc.code == CONNECTION_CLOSED:
                connection.wake("the connection closed during a call (the server exited)")
                return ToolResult.text(
                    f"Error: the MCP server {server!r} stopped during the call to {tool} (it exited or closed "
                    "the connection); Talon restarts it, so the call may be tried again shortly", is_error=True)
            return ToolResult.text(f"Error: the MCP server {server!r} refused the call to {tool}: {exc.message}",
                                   is_error=True)
        except (OSError, ConnectionError) as exc:
            if connection.overflowed:
                return self._too_large(server, tool)
            connection.wake(f"the connection failed: {exc}")
            return ToolResult.text(f"Error: the MCP server {server!r} could not be reached: {exc}", is_error=True)
        except Exception as exc:
            if _is_transport_failure(exc):
                if connection.overflowed:
                    return self._too_large(server, tool)
                connection.wake(f"the connection failed: {_describe(exc)}")
                return ToolResult.text(f"Error: the MCP server {server!r} could not be reached: {_describe(exc)}",
                                       is_error=True)
            raise
        finally:
            connection.in_flight -= 1
            connection.last_used = time.monotonic()
        return await self._result(server, tool, result)

    def _too_large(self, server: str, tool: str) -> ToolResult:
        return ToolResult.text(
            f"Error: the answer of the MCP server {server!r} to {tool} was larger than {self.max_result:,} bytes "
            "(TALON_MCP_MAX_RESULT), so it was not read; the call failed and the server is being restarted. "
            "Ask for less (a narrower query, a smaller range).", is_error=True)

    async def _result(self, server: str, tool: str, result: Any) -> ToolResult:
        from mcp_types import (
            AudioContent,
            BlobResourceContents,
            EmbeddedResource,
            ImageContent,
            ResourceLink,
            TextContent,
            TextResourceContents,
        )

        texts: list[str] = []
        images: list[ContentBlock] = []
        for n, block in enumerate(result.content, 1):
            if isinstance(block, TextContent):
                texts.append(block.text)
            elif isinstance(block, ImageContent):
                texts.append(await self._image(block.data, block.mime_type, f"{server}-{tool}-{n}", images))
            elif isinstance(block, AudioContent):
                texts.append(f"[audio ({block.mime_type}) not shown: Talon passes no audio from tools]")
            elif isinstance(block, ResourceLink):
                texts.append(f"[resource: {block.name} {block.uri}]")
            elif isinstance(block, EmbeddedResource):
                resource = block.resource
                if isinstance(resource, TextResourceContents):
                    texts.append(f"[resource {resource.uri}]\n{resource.text}")
                elif isinstance(resource, BlobResourceContents):
                    mime = resource.mime_type or "application/octet-stream"
                    if mime.startswith("image/"):
                        texts.append(await self._image(resource.blob, mime, f"{server}-{tool}-{n}", images))
                    else:
                        texts.append(f"[resource {resource.uri}: {mime}, not shown (binary)]")
        if not texts and result.structured_content is not None:
            texts.append(json.dumps(result.structured_content, ensure_ascii=False, indent=2))
        body, omitted = cut("\n\n".join(t for t in texts if t) or "(no output)")
        text = untrusted_block("TOOL RESULT", {"server": server, "tool": tool}, body,
                               f"Output of the MCP server {server!r}")
        if omitted:
            text += f"\n[... {omitted:,} more characters of this result were cut]"
        return ToolResult(content=[TextBlock(text=text), *images], is_error=bool(result.is_error))

    async def _image(self, data: str, mime: str, name: str, images: list[ContentBlock]) -> str:
        if self.store is None:
            return f"[image ({mime}) not shown: no attachment store in this setup]"
        if len(data) > _IMAGE_MAX_BASE64:
            return f"[image ({mime}) not shown: {len(data) * 3 // 4:,} bytes is too large]"
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return f"[image ({mime}) not shown: its data is not valid base64]"
        block, why = await image_from_bytes(raw, name=name, store=self.store, limits=self.limits)
        if block is None:
            return f"[image ({mime}) not shown: {why}]"
        images.append(block)
        return f"[image {len(images)}: {block.ref.width}x{block.ref.height}, shown below]"

    # --- status -------------------------------------------------------------------------------
    def statuses(self) -> list[ServerStatus]:
        out: list[ServerStatus] = []
        for config in self.configs.values():
            tools = len(self._tools[config.name]) if config.name in self._tools else None
            if not config.per_chat:
                connection = self.shared.get(config.name)
                state = connection.state if connection is not None else "stopped"
                detail = connection.detail if connection is not None and connection.client is None else ""
                out.append(ServerStatus(config.name, config.transport, False, state, tools, detail))
                continue
            running = [c for (name, _), c in self.per_chat.items() if name == config.name]
            ready = sum(1 for c in running if c.client is not None)
            failing = [c for c in running if c.client is None and c.state in ("failed", "restarting")]
            state = f"{ready} running" if running else "started on first use in a chat"
            detail = f"{len(failing)} failing, e.g. {failing[0].detail}" if failing else ""
            problem = self.launcher.sandbox_problem
            if problem is not None:
                state, detail = "refused", f"per-chat servers run only in a sandbox, and none can be made here: {problem}"
            out.append(ServerStatus(config.name, config.transport, True, state, tools, detail))
        return out

    def status_lines(self) -> list[str]:
        if not self.configs:
            return []
        return ["MCP: " + "; ".join(s.line() for s in self.statuses())]


def _is_transport_failure(exc: BaseException) -> bool:
    """An error of the link itself (HTTP client, closed streams), not of the tool."""
    import anyio

    if isinstance(exc, (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)):
        return True
    module = type(exc).__module__ or ""
    return module.startswith(("httpx", "httpcore"))


async def doctor_rows(configs: list[McpServerConfig], *, start_timeout_s: float,
                      launcher: Launcher | None = None,
                      sandbox_limits: SandboxLimits | None = None) -> list[tuple[str, str]]:
    """``talon doctor``: each server with its state and tool count. Shared servers are started
    and stopped again; per-chat ones are only looked up (they start in a chat's workspace)."""
    if not configs:
        return [("mcp servers", "none configured")]
    manager = McpManager(configs, ToolRegistry(), store=None, limits=Limits(), start_timeout_s=start_timeout_s,
                         launcher=launcher, sandbox_limits=sandbox_limits)
    started = time.monotonic()
    await manager.start()
    try:
        waits = [c.first_attempt.wait() for c in manager.shared.values()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), start_timeout_s + 1.0)
        elapsed = time.monotonic() - started
        rows: list[tuple[str, str]] = []
        for status in manager.statuses():
            config = manager.configs[status.name]
            if status.per_chat:
                assert config.command is not None
                found = _resolve_command(config.command)
                _, problem = await manager.launcher.sandbox()
                if problem is not None:
                    value = f"FAILED: a per-chat server runs only in a sandbox, and none can be made here: {problem}"
                elif found:
                    value = (f"per chat (${{WORKSPACE}}): started in each chat's workspace on first use, in the "
                             f"sandbox (uid 65534, no network, only its workspace writable); {found}")
                else:
                    value = f"MISSING: command {config.command!r} not found (a per-chat server)"
            elif status.state == "ready":
                value = f"ready ({status.transport}): {status.tools or 0} tool(s) [{elapsed:.1f} s]"
            else:
                value = f"FAILED ({status.transport}): {status.detail or status.state}"
            rows.append((f"mcp {status.name}", value))
        return rows
    finally:
        await manager.close()
