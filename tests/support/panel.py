"""Talon with its web panel on a loopback port, and an HTTP client that signs in to it: shared by
the panel's HTTP tests, its browser tests and its benchmark."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from talon.config import Settings
from tests.conftest import make_settings

if TYPE_CHECKING:
    from talon.runtime import Runtime

PASSWORD = "correct horse battery staple"


@functools.lru_cache(maxsize=1)
def password_hash() -> str:
    from talon.ui.security import hash_password

    return hash_password(PASSWORD)


def panel_settings(tmp_path: Path, tg_base: str, llm_base: str, **extra: object) -> Settings:
    values: dict[str, object] = dict(TALON_UI="true", TALON_UI_PASSWORD_HASH=password_hash(), TALON_HTTP_PORT=0,
                                     TALON_MODEL_DISCOVERY="false", TALON_TELEGRAM_ACK_REACTION="",
                                     TALON_TELEGRAM_STREAMING="off")
    values.update(extra)
    return make_settings(tmp_path, tg_base, llm_base, **values)


@contextlib.asynccontextmanager
async def running_panel(settings: Settings, telegram: bool = True) -> AsyncIterator["Runtime"]:
    """Talon (Telegram, and the panel on its HTTP server on a free loopback port) for the block."""
    from channels.http import HttpServer
    from talon.runtime import build_runtime

    channels = []
    if telegram:
        from channels.telegram import TelegramChannel

        channels.append(TelegramChannel(settings))
    http = HttpServer("127.0.0.1", 0)
    runtime = build_runtime(settings, channels, http=http)  # type: ignore[arg-type]
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


def base_url(runtime: "Runtime") -> str:
    assert runtime.http is not None
    return runtime.http.local_url


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_BODY_CSRF = re.compile(r'data-csrf="([^"]*)"')


def form_csrf(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def page_csrf(html: str) -> str:
    found = _BODY_CSRF.search(html)
    assert found and found.group(1), "no CSRF token in the page"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, password: str = PASSWORD) -> httpx.Response:
    """Sign in through the form as a browser would (Origin set); the last response (the overview
    when it worked, the sign-in page with its error when not)."""
    page = await client.get("/ui/signin")
    csrf = form_csrf(page.text)
    return await client.post("/ui/signin", data={"csrf": csrf, "password": password},
                             headers={"Origin": str(client.base_url).rstrip("/")}, follow_redirects=True)


def client_for(runtime: "Runtime") -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url(runtime), timeout=20.0)
