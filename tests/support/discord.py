"""Discord test helpers: the fake's server, channels and people, settings for it and the fake
model, a running channel."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from talon.config import Settings
from talon.runtime import Runtime, build_runtime
from tests.fakes.discord import TOKEN, FakeDiscord
from tests.fakes.openai_server import FakeOpenAI

GUILD, GENERAL, THREAD, DM, STRANGER_DM, OTHER = 500, 501, 502, 503, 504, 505
ALICE, MALLORY, CAROL = 600, 601, 602


def populate(fake: FakeDiscord) -> None:
    for user, name in ((ALICE, "alice"), (MALLORY, "mallory"), (CAROL, "carol")):
        fake.add_user(user, name)
    fake.add_guild(GUILD, "Crew")
    fake.add_channel(GENERAL, "general", guild_id=GUILD)
    fake.add_channel(OTHER, "random", guild_id=GUILD)
    fake.add_channel(THREAD, "plans", guild_id=GUILD, parent_id=GENERAL)
    fake.add_channel(DM, "", recipient=ALICE)
    fake.add_channel(STRANGER_DM, "", recipient=MALLORY)


@pytest.fixture
async def discord_fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        populate(fake)
        yield fake


def discord_env(tmp_path: Path, fake: FakeDiscord, llm_base: str, **extra: str) -> dict[str, str]:
    env = {
        "DISCORD_BOT_TOKEN": TOKEN, "DISCORD_API_BASE_URL": fake.api_url,
        "OPENAI_BASE_URL": llm_base, "OPENAI_API_KEY": "test-key", "TALON_MODEL": "openai:fake-model",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_MODEL_MAX_RETRIES": "0", "TALON_MODEL_TIMEOUT": "30", "TALON_ACK_DELAY": "0",
        "TALON_DISCORD_STREAM_INTERVAL": "0.2", "TALON_DISCORD_ALLOWED_USERS": str(ALICE),
        "TALON_DISCORD_ALLOWED_CHANNELS": str(GENERAL), "TALON_MODEL_DISCOVERY": "false",
    }
    env.update(extra)
    return env


def discord_settings(tmp_path: Path, fake: FakeDiscord, llm: FakeOpenAI, **extra: str) -> Settings:
    return Settings(_env_file=None, **discord_env(tmp_path, fake, llm.base_url, **extra))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Runtime]:
    from channels.discord import DiscordChannel

    channel = DiscordChannel(settings)
    runtime = build_runtime(settings, [channel])
    await runtime.start()
    try:
        await asyncio.wait_for(channel.ready.wait(), 60)  # READY and every server's GUILD_CREATE
        yield runtime
    finally:
        await runtime.stop()


async def say(fake: FakeDiscord, channel: int, user: int, text: str, **kw: object) -> dict[str, object]:
    data = fake.message_create(channel, user, text, **kw)  # type: ignore[arg-type]
    await fake.dispatch("MESSAGE_CREATE", data)
    return data
