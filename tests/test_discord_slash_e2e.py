"""Discord slash commands end to end against the loopback fake (``tests/fakes/discord.py``): Talon
registers its commands with the bulk overwrite at start; a slash command from an allowed person
is answered as the text command is (and ``/stop`` stops the live answer); from a person or in a
channel not allowed, it is refused with an ephemeral line and nothing else happens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.discord.commands import COMMANDS
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.support.discord import ALICE, DM, GENERAL, MALLORY, OTHER, STRANGER_DM, discord_settings, populate, running, say

EPHEMERAL = 64


@pytest.fixture
async def discord_fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        populate(fake)
        yield fake


@pytest.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


async def slash(fake: FakeDiscord, channel: int, name: str, user: int) -> str:
    data = fake.slash_command(channel, name, user)
    await fake.dispatch("INTERACTION_CREATE", data)
    return str(data["id"])


def answer(fake: FakeDiscord, interaction: str) -> dict[str, object] | None:
    got = fake.interaction_answers.get(int(interaction))
    return got[0] if got else None


async def test_slash_commands_are_registered_answered_for_the_allowed_and_refused_for_others(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = discord_settings(tmp_path, discord_fake, llm)
    async with running(settings):
        registered = sorted(c["name"] for c in discord_fake.commands)
        mine = await slash(discord_fake, DM, "status", ALICE)
        await discord_fake.wait_until(lambda: discord_fake.texts(DM), "the /status answer")
        theirs = await slash(discord_fake, STRANGER_DM, "status", MALLORY)
        elsewhere = await slash(discord_fake, OTHER, "status", ALICE)
        in_room = await slash(discord_fake, GENERAL, "usage", ALICE)
        await discord_fake.wait_until(lambda: answer(discord_fake, theirs) and answer(discord_fake, elsewhere)
                                      and discord_fake.texts(GENERAL), "the refusals and the /usage answer")
    assert registered == sorted(COMMANDS) and discord_fake.command_puts == 1
    ok = answer(discord_fake, mine)
    assert ok is not None and ok["type"] == 4 and ok["data"]["flags"] == EPHEMERAL  # type: ignore[index]
    [status] = discord_fake.texts(DM)
    assert "model" in status.lower() or "status" in status.lower(), status
    for refused in (theirs, elsewhere):
        got = answer(discord_fake, refused)
        assert got is not None and "not allowed" in got["data"]["content"]  # type: ignore[index]
        assert got["data"]["flags"] == EPHEMERAL  # type: ignore[index]
    assert discord_fake.texts(STRANGER_DM) == [] and discord_fake.texts(OTHER) == []
    assert answer(discord_fake, in_room) is not None
    assert llm.requests == []  # commands are not turns of the model


async def test_slash_stop_stops_the_live_answer(discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    long = "Tides come in twice a day because the moon pulls the sea. " * 30
    llm.chunk_delay = 0.3
    llm.queue(long)
    settings = discord_settings(tmp_path, discord_fake, llm)
    async with running(settings):
        await say(discord_fake, DM, ALICE, "tell me about tides")
        await discord_fake.wait_until(lambda: any(len(m.versions) >= 2 for m in discord_fake.bot_messages(DM)),
                                      "an edit of the live answer")
        await slash(discord_fake, DM, "stop", ALICE)
        await discord_fake.wait_until(lambda: "Stopped." in discord_fake.texts(DM), "Stopped.")
    [live] = [m for m in discord_fake.bot_messages(DM) if m.content.startswith("Tides")]
    assert len(live.content) < len(long.strip())
