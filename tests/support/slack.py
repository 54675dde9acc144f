"""Slack test helpers: the fake's channels and people, settings for it and the fake model, a
running channel (Events API)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from talon.config import Settings
from talon.runtime import Runtime, build_runtime
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack


ALICE, MALLORY, CAROL = "U0ALICE01", "U0MALLOR1", "U0CAROL01"
DM, STRANGER_DM, GENERAL = "D0ALICE01", "D0MALLOR1", "C0GENERAL"


def populate(fake: FakeSlack) -> None:
    fake.add_channel(DM, "alice", kind="im")
    fake.add_channel(STRANGER_DM, "mallory", kind="im")
    fake.add_channel(GENERAL, "general")
    fake.add_user(ALICE, "alice")
    fake.add_user(MALLORY, "mallory")
    fake.add_user(CAROL, "carol")


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        populate(fake)
        yield fake


def slack_env(tmp_path: Path, slack: FakeSlack, llm_base: str, **extra: str) -> dict[str, str]:
    env = {
        "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET, "SLACK_API_BASE_URL": slack.api_url,
        "OPENAI_BASE_URL": llm_base, "OPENAI_API_KEY": "test-key", "TALON_MODEL": "openai:fake-model",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_MODEL_MAX_RETRIES": "0", "TALON_MODEL_TIMEOUT": "30", "TALON_ACK_DELAY": "0",
        "TALON_HTTP_HOST": "127.0.0.1", "TALON_HTTP_PORT": "0", "TALON_SLACK_STREAM_INTERVAL": "0.2",
        "TALON_SLACK_ALLOWED_USERS": ALICE, "TALON_SLACK_ALLOWED_CHANNELS": GENERAL,
        "TALON_MODEL_DISCOVERY": "false",
    }
    env.update(extra)
    return env


def slack_settings(tmp_path: Path, slack: FakeSlack, llm: FakeOpenAI, **extra: str) -> Settings:
    return Settings(_env_file=None, **slack_env(tmp_path, slack, llm.base_url, **extra))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[Runtime, str]]:
    from channels.slack import SlackChannel

    channel = SlackChannel(settings)
    runtime = build_runtime(settings, [channel])
    await runtime.start()
    try:
        assert channel.http is not None
        yield runtime, channel.http.local_url + channel.events_path
    finally:
        await runtime.stop()
