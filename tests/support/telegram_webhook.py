"""Telegram webhook mode for the tests: settings, a running channel, requests posted as Telegram
would post them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from channels.telegram import SECRET_HEADER, TelegramChannel
from talon.config import Settings
from talon.runtime import Runtime
from tests.conftest import ALICE, make_settings
from tests.support.runtime import started
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram


SECRET = "s3cret_Token-0123456789"
URL = "https://talon.example.com/telegram/webhook"
PATH = "/telegram/webhook"


def wh_settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, **extra: object) -> Settings:
    values: dict[str, object] = dict(TALON_TELEGRAM_WEBHOOK_URL=URL, TALON_TELEGRAM_WEBHOOK_SECRET=SECRET,
                                     TALON_HTTP_HOST="127.0.0.1", TALON_HTTP_PORT=0)
    values.update(extra)
    return make_settings(tmp_path, tg.base_url, llm.base_url, **values)


@contextlib.asynccontextmanager
async def running(settings: Settings, **channel_kw: Any) -> AsyncIterator[tuple[Runtime, TelegramChannel]]:
    channel = TelegramChannel(settings, **channel_kw)
    async with started(settings, [channel]) as runtime:
        yield runtime, channel


async def post(channel: TelegramChannel, body: dict[str, Any] | bytes, *, secret: str | None = SECRET,
               path: str = PATH) -> tuple[int, str]:
    """POST one webhook request to Talon as Telegram would."""
    assert channel.http is not None
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(channel.http.local_url + path, data=data, headers=headers) as resp:
            return resp.status, await resp.text()


def update(tg: FakeTelegram, update_id: int, message: dict[str, Any]) -> dict[str, Any]:
    return {"update_id": update_id, **message}


def to_alice(call: Any) -> bool:
    return str(call.params.get("chat_id")) == str(ALICE)
