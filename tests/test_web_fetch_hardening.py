"""web_fetch of a huge HTML table (issue 27, part 7): the HTML-to-text step runs in a worker
process with time and memory limits. The call returns in bounded time with a clear error and
the start of the page's plain text, the worker is killed (its pid gone), the event loop answers
another coroutine meanwhile, and no thread is left converting. Loopback only."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from talon.agent.tools.html_worker import ConvertLimits, plain_text_prefix
from talon.agent.tools.registry import ToolContext
from talon.agent.tools.web_fetch import WebFetchTool
from talon.config import Limits
from talon.storage.embedded.attachments import FileAttachments

pytestmark = pytest.mark.e2e  # starts worker processes and converts a 5 MB page


def big_table(rows: int = 45_000) -> str:
    cells = "".join(f"<tr><td>cell-{i}-0</td><td>value {i * 7}</td><td><a href='/r/{i}'>link {i}</a></td>"
                    f"<td>{i % 13} units</td></tr>" for i in range(rows))
    return (f"<!doctype html><html><head><title>Big table</title><script>var hidden = 'SCRIPT-TEXT'</script>"
            f"</head><body><h1>Inventory</h1><table>{cells}</table></body></html>")


SMALL = "<html><body><article><h1>Tides</h1><p>The Moon pulls the oceans of the Earth towards it, " \
        "and the water bulges on the side that faces the Moon.</p></article></body></html>"


@pytest_asyncio.fixture
async def table_site() -> AsyncIterator[str]:
    page = big_table()
    assert len(page) > 4_500_000

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/small":
            return web.Response(text=SMALL, content_type="text/html")
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _converting_threads() -> list[str]:
    """Threads whose stack is inside the HTML conversion (trafilatura, lxml, html_to_text)."""
    frames = sys._current_frames()
    busy = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        while frame is not None:
            name = frame.f_code.co_filename
            if "trafilatura" in name or "lxml" in name or frame.f_code.co_name == "html_to_text":
                busy.append(thread.name)
                break
            frame = frame.f_back
    return busy


@pytest.mark.parametrize(("seconds", "memory", "limit"), [
    (3.0, 512_000_000, "TALON_WEB_CONVERT_"),  # the defaults' memory: whichever limit comes first
    (2.0, 8_000_000_000, "TALON_WEB_CONVERT_SECONDS"),  # memory enough: the time limit cuts it
])
async def test_a_5_mb_table_is_cut_by_the_worker_limits_with_a_clear_error(
        table_site: str, tmp_path: Path, seconds: float, memory: int, limit: str) -> None:
    tool = WebFetchTool(store=FileAttachments(tmp_path / "store"), limits=Limits(), allow_hosts=["127.0.0.1"],
                        timeout_s=20.0, max_bytes=10_000_000, convert=ConvertLimits(seconds=seconds, memory=memory))
    threads_before = {t.ident for t in threading.enumerate()}
    worst = 0.0
    done = asyncio.Event()

    async def another_chat() -> None:  # what another conversation's coroutine sees meanwhile
        nonlocal worst
        while not done.is_set():
            asked = time.monotonic()
            await asyncio.sleep(0.02)
            worst = max(worst, time.monotonic() - asked - 0.02)

    ticker = asyncio.create_task(another_chat())
    started = time.monotonic()
    try:
        result = await tool.invoke({"url": f"{table_site}/table"}, ToolContext())
    finally:
        done.set()
        await ticker
    took = time.monotonic() - started
    pid = tool.converter.last_pid
    text = result.content[0].text  # type: ignore[union-attr]
    try:
        assert result.is_error
        assert "too large or complex to turn into readable text" in text, text[:500]
        assert limit in text, text[:500]
        # Nothing silently lost: the start of the page's plain text, and how much of it that is.
        assert "Inventory" in text and "cell-0-0" in text and "value 7" in text
        assert "SCRIPT-TEXT" not in text
        assert "plain text of its first 300 KB" in text
        assert "<<<UNTRUSTED WEB CONTENT" in text
        # Bounded: the conversion's cap plus the fetch of a loopback page, with a generous margin
        # (unbounded, trafilatura needs about 17 s and 640 MB for this page on this machine).
        assert took < seconds + 10.0, took
        assert worst < 1.0, worst  # the event loop kept answering
        # The worker that took the page is dead and reaped, and no thread is left converting.
        assert pid is not None and not _alive(pid)
        assert _converting_threads() == []
        leftover = [t for t in threading.enumerate() if t.ident not in threads_before]
        assert all(t.name.startswith("asyncio_") for t in leftover), leftover  # idle executor threads only

        # The next page gets a fresh worker and is converted as usual.
        small = await tool.invoke({"url": f"{table_site}/small"}, ToolContext())
        assert not small.is_error
        assert "The Moon pulls the oceans" in small.content[0].text  # type: ignore[union-attr]
        warm = tool.converter.last_pid
        assert warm is not None and warm != pid and _alive(warm)
        again = await tool.invoke({"url": f"{table_site}/small"}, ToolContext())
        assert not again.is_error and tool.converter.last_pid == warm  # kept warm between pages
    finally:
        await tool.aclose()
    assert warm is not None and not _alive(warm)  # stopped at shutdown


async def test_a_cancelled_fetch_kills_its_converter(table_site: str, tmp_path: Path) -> None:
    tool = WebFetchTool(store=None, limits=Limits(), allow_hosts=["127.0.0.1"], timeout_s=20.0,
                        max_bytes=10_000_000, convert=ConvertLimits(seconds=60.0))
    call = asyncio.create_task(tool.invoke({"url": f"{table_site}/table"}, ToolContext()))
    deadline = time.monotonic() + 30
    while tool.converter.last_pid is None:  # the page reached its worker
        assert time.monotonic() < deadline and not call.done()
        await asyncio.sleep(0.05)
    pid = tool.converter.last_pid
    call.cancel()  # the turn was stopped
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not _alive(pid)
    assert _converting_threads() == []
    await tool.aclose()


def test_the_plain_text_of_a_page_start_is_bounded_and_readable() -> None:
    page = big_table().encode()
    text = plain_text_prefix(page, "utf-8")
    assert text.startswith("Inventory")
    assert "SCRIPT-TEXT" not in text and "<td>" not in text
    assert len(text) < 300_000
