"""WhatsApp test helpers: settings for the fake Twilio and model, a running channel, signed posts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
import pytest_asyncio

from channels.whatsapp import WhatsAppChannel
from talon.config import Settings
from talon.runtime import Runtime
from tests.support.runtime import started
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio


PUBLIC = "https://talon.example.test"
HOOK = "/twilio/whatsapp"
ALICE = "+15550001111"
BOB = "+15550002222"  # allowed too
EVE = "+15559999999"  # not allowed


def wa_settings(tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, **extra: object) -> Settings:
    values: dict[str, object] = dict(
        OPENAI_BASE_URL=llm.base_url,
        OPENAI_API_KEY="test-key",
        TALON_MODEL="openai:fake-model",
        TALON_MODEL_MAX_RETRIES=0,
        TALON_MODEL_TIMEOUT=20,
        TALON_MEDIA_ROOT=str(tmp_path / "media_root"),
        TALON_DATA_DIR=str(tmp_path / "data"),
        TWILIO_ACCOUNT_SID=twilio.account_sid,
        TWILIO_AUTH_TOKEN=twilio.auth_token,
        TWILIO_WHATSAPP_FROM=twilio.whatsapp_from,
        TWILIO_API_BASE_URL=twilio.base_url,
        TALON_PUBLIC_BASE_URL=PUBLIC,
        TALON_HTTP_HOST="127.0.0.1",
        TALON_HTTP_PORT=0,
        TALON_WHATSAPP_ALLOWED_NUMBERS=f"whatsapp:{ALICE}, {BOB}",
    )
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(settings: Settings, *, media_drain_s: float = 0.0) -> AsyncIterator[tuple[Runtime, WhatsAppChannel]]:
    # No wait at stop for media links nobody fetches (the fake Twilio does not fetch them itself).
    channel = WhatsAppChannel(settings, retry_base_s=0.01, media_drain_s=media_drain_s)
    async with started(settings, [channel]) as runtime:
        yield runtime, channel


async def post(channel: WhatsAppChannel, params: dict[str, str], *, signature: str | None = None,
               path: str = HOOK, sign_with: FakeTwilio | None = None) -> tuple[int, str, str]:
    """POST a webhook form to Talon; signed for PUBLIC + path unless ``signature`` is given."""
    headers = {}
    if signature is None and sign_with is not None:
        signature = sign_with.sign(PUBLIC + path, params)
    if signature is not None:
        headers["X-Twilio-Signature"] = signature
    async with aiohttp.ClientSession() as session:
        async with session.post(channel.http.local_url + path, data=params, headers=headers) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


@pytest_asyncio.fixture
async def twilio() -> AsyncIterator[FakeTwilio]:
    async with FakeTwilio() as fake:
        yield fake


@pytest.fixture
def settings(tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> Settings:
    return wa_settings(tmp_path, twilio, llm)


async def fetch(channel: WhatsAppChannel, media_url: str) -> tuple[int, dict[str, str], bytes]:
    """GET a MediaUrl from Talon's own server, as Twilio would (the public host maps to it)."""
    assert media_url.startswith(PUBLIC + "/media/")
    async with aiohttp.ClientSession() as session:
        async with session.get(channel.http.local_url + urlsplit(media_url).path) as resp:
            return resp.status, dict(resp.headers), await resp.read()


def alice_workspace(settings: Settings) -> Path:
    """Alice's own workspace: the only place her agent's files may be sent from."""
    workspace = settings.workspace_dir("whatsapp", ALICE)
    workspace.mkdir(parents=True, exist_ok=True)
    return workspace
