"""Talon's own HTTP server: one aiohttp app that channels add their routes to.

Webhooks (Twilio) and the short-lived media links handed to Twilio are served from here, on
``TALON_HTTP_HOST:TALON_HTTP_PORT``. Port 0 picks a free port; ``port`` says which one was bound.
Routes must be added before ``start`` (aiohttp freezes the router when it starts serving).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from talon.errors import ConfigError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Webhook forms are small; nothing Talon accepts over HTTP is an upload.
MAX_REQUEST_BYTES = 1024 * 1024
# A client that hangs up mid-request is logged in one WARNING line, at most once per this many
# seconds (the next line says how many more there were), never as a traceback.
ABORT_LOG_INTERVAL_S = 10.0


class AbortLog:
    """Rate-limited, one-line reports of requests whose client went away."""

    def __init__(self, interval_s: float = ABORT_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: float | None = None
        self._quiet = 0

    def report(self, request: web.Request) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            self._quiet += 1
            return
        more = f" ({self._quiet} more since the last report)" if self._quiet else ""
        log.warning("http: %s %s from %s: the client closed the connection before the request "
                    "was complete; ignored%s", request.method, request.path, request.remote or "?", more)
        self._last, self._quiet = now, 0


def listen_error(host: str, port: int, exc: OSError) -> ConfigError:
    """Which setting is at fault and what is wrong with its value; both have values, so neither
    is "missing" (``ConfigError.missing`` names the setting to change)."""
    # asyncio rewords strerror ("error while attempting to bind on address ..."): the plain one.
    plain = exc.strerror if isinstance(exc, socket.gaierror) else os.strerror(exc.errno) if exc.errno else None
    reason = (plain or str(exc)).lower()
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"TALON_HTTP_PORT={port}: address already in use on {host} (another program "
                           "listens there: stop it, or choose a free port)", ["TALON_HTTP_PORT"])
    if exc.errno == errno.EACCES:
        return ConfigError(f"TALON_HTTP_PORT={port}: permission denied (ports below 1024 need privileges; "
                           "choose a port above 1024)", ["TALON_HTTP_PORT"])
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return ConfigError(f"TALON_HTTP_HOST={host}: {reason} (not an address of this machine; "
                           "127.0.0.1 or 0.0.0.0 are)", ["TALON_HTTP_HOST"])
    return ConfigError(f"TALON_HTTP_HOST={host}, TALON_HTTP_PORT={port}: cannot listen ({reason})",
                       ["TALON_HTTP_HOST", "TALON_HTTP_PORT"])


class HttpServer:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.requested_port = port
        self.aborts = AbortLog()
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[self._aborted])
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._routes: set[tuple[str, str]] = set()

    @web.middleware
    async def _aborted(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ConnectionResetError:
            # Half a body, then a hang-up: nothing to answer and nothing wrong with Talon.
            self.aborts.report(request)
            return web.Response(status=400, text="incomplete request")

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        if self._runner is not None:
            raise RuntimeError("routes must be added before the HTTP server starts")
        self._routes.add((method.upper(), path))
        if method.upper() == "GET":
            self.app.router.add_get(path, handler)  # answers HEAD too
        else:
            self.app.router.add_route(method, path, handler)

    def has_route(self, method: str, path: str) -> bool:
        """Whether a handler for ``method`` on ``path`` was added (GET also answers HEAD)."""
        return (method.upper(), path) in self._routes

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def port(self) -> int:
        """The port actually bound (useful with ``TALON_HTTP_PORT=0``)."""
        if self._port is None:
            raise RuntimeError("the HTTP server is not running")
        return self._port

    @property
    def local_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.requested_port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise listen_error(self.host, self.requested_port, exc) from exc
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        log.info("http: listening on %s:%d", self.host, self._port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._port = None
