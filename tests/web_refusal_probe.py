"""Runs web_fetch against every address trick and prints what it answered, as JSON.

Meant to run inside a network namespace of its own with only loopback up, and a private
/etc/hosts bound over the real one (tests/test_web_fetch.py starts it with ``unshare -n -m``), so
that even a broken guard could not send a packet beyond this machine. On top of that, every
socket connect to a non-loopback address is refused here and recorded: the test checks that none
was even tried.

argv: the path of a JSON list of [url, allow_hosts] cases. ``{port}`` in a URL is the port of a
loopback aiohttp server started here (``/page``, and ``/to?u=URL`` which redirects to URL).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
from typing import Any

from aiohttp import web

tried: list[str] = []
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # a unix socket
    try:
        return ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _guarded(original: Any) -> Any:
    def connect(self: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            tried.append(repr(address))
            raise OSError(f"the test guard refuses a connection to {address!r}")
        return original(self, address)
    return connect


socket.socket.connect = _guarded(_connect)  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded(_connect_ex)  # type: ignore[method-assign]


async def main() -> None:
    from talon.agent.tools.registry import ToolContext
    from talon.agent.tools.web_fetch import WebFetchTool
    from talon.config import Limits

    cases = json.loads(open(sys.argv[1]).read())

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body><p>the loopback page answered</p></body></html>",
                            content_type="text/html")

    async def to(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["u"])

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/to", to)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    out = []
    for url, allow in cases:
        url = url.replace("{port}", str(port))
        tool = WebFetchTool(store=None, limits=Limits(), allow_hosts=allow, timeout_s=10)
        result = await tool.invoke({"url": url}, ToolContext())
        out.append({"url": url, "is_error": result.is_error, "text": result.content[0].text})  # type: ignore[union-attr]
    await runner.cleanup()
    print(json.dumps({"results": out, "tried": tried}))


if __name__ == "__main__":
    asyncio.run(main())
