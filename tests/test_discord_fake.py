"""The loopback fake of Discord (tests/fakes/discord.py) checked against discord.py's own
expectations: the real client logs in, finds the gateway through ``GET /gateway/bot``, connects,
receives dispatches and interactions, and meets Discord's errors and 429s as it would on the real
platform."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import discord
import discord.http
import pytest

from tests.fakes.discord import BOT_ID, TOKEN, FakeDiscord

GUILD, GENERAL, THREAD, DM, ALICE = 500, 501, 502, 503, 600


@pytest.fixture
async def discord_fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        fake.add_user(ALICE, "alice")
        fake.add_guild(GUILD, "Crew")
        fake.add_channel(GENERAL, "general", guild_id=GUILD)
        fake.add_channel(THREAD, "plans", guild_id=GUILD, parent_id=GENERAL)
        fake.add_channel(DM, "", recipient=ALICE)
        yield fake


class Recorder(discord.AutoShardedClient):
    def __init__(self) -> None:
        wanted = discord.Intents.none()
        wanted.guilds = wanted.guild_messages = wanted.dm_messages = wanted.message_content = True
        super().__init__(intents=wanted, max_ratelimit_timeout=30.0, chunk_guilds_at_startup=False)
        self.got: list[discord.Message] = []
        self.presses: list[discord.Interaction[Any]] = []
        self.arrived = asyncio.Event()

    async def on_message(self, message: discord.Message) -> None:
        self.got.append(message)
        self.arrived.set()

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        self.presses.append(interaction)
        await interaction.response.defer()
        self.arrived.set()


@pytest.fixture
async def connected(discord_fake: FakeDiscord) -> AsyncIterator[Recorder]:
    discord.http.Route.BASE = discord_fake.api_url
    client = Recorder()
    await client.login(TOKEN)
    task = asyncio.create_task(client.connect())
    try:
        await asyncio.wait_for(client.wait_until_ready(), 30)
        yield client
    finally:
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        discord.http.Route.BASE = "https://discord.com/api/v10"


async def test_the_client_finds_the_gateway_identifies_and_gets_dispatches(
        discord_fake: FakeDiscord, connected: Recorder) -> None:
    assert connected.user is not None and connected.user.id == BOT_ID
    assert any(c.path == "/gateway/bot" for c in discord_fake.calls)  # the address came from there
    guild = connected.get_guild(GUILD)
    assert guild is not None and guild.get_channel(GENERAL) is not None and guild.get_thread(THREAD) is not None
    await discord_fake.dispatch("MESSAGE_CREATE", discord_fake.message_create(THREAD, ALICE, "in a thread"))
    await asyncio.wait_for(connected.arrived.wait(), 10)
    [message] = connected.got
    assert isinstance(message.channel, discord.Thread) and message.channel.parent_id == GENERAL
    assert message.content == "in a thread" and message.author.id == ALICE


async def test_rest_answers_and_refusals_are_what_discord_py_expects(
        discord_fake: FakeDiscord, connected: Recorder) -> None:
    channel = connected.get_partial_messageable(GENERAL)
    sent = await channel.send("hello")
    edited = await sent.edit(content="hello again")
    assert edited.content == "hello again" and discord_fake.messages[(GENERAL, sent.id)].versions == ["hello",
                                                                                                    "hello again"]
    theirs = discord_fake.message_create(GENERAL, ALICE, "mine")
    with pytest.raises(discord.Forbidden) as forbidden:
        await channel.get_partial_message(int(theirs["id"])).edit(content="x")
    assert forbidden.value.code == 50005
    with pytest.raises(discord.NotFound) as unknown:
        await connected.get_partial_messageable(999).send("x")
    assert unknown.value.code == 10003
    with pytest.raises(discord.HTTPException) as too_long:
        await channel.send("x" * 2001)
    assert too_long.value.status == 400 and too_long.value.code == 50035
    stray = discord.Client(intents=discord.Intents.none())
    with pytest.raises(discord.LoginFailure):
        await stray.login("wrong-token")
    await stray.close()


async def test_a_short_429_is_waited_out_by_discord_py_and_a_long_one_raised(
        discord_fake: FakeDiscord, connected: Recorder) -> None:
    channel = connected.get_partial_messageable(GENERAL)
    discord_fake.rate_limit_next("POST /channels/{channel_id}/messages", retry_after=0.2)
    await channel.send("after a short wait")
    statuses = [c.status for c in discord_fake.calls if c.route == "POST /channels/{channel_id}/messages"]
    assert statuses == [429, 200]
    discord_fake.rate_limit_next("POST /channels/{channel_id}/messages", retry_after=45.0)
    with pytest.raises(discord.RateLimited) as limited:
        await channel.send("too long to wait")
    assert limited.value.retry_after == 45.0
    # Every answer names its bucket, as Discord's do.
    assert all(c.status != 200 or c.route for c in discord_fake.calls)


async def test_a_button_press_arrives_as_an_interaction_answered_once(
        discord_fake: FakeDiscord, connected: Recorder) -> None:
    view = discord.ui.View(timeout=None)
    view.add_item(discord.ui.Button(label="Go", custom_id="go:1"))
    sent = await connected.get_partial_messageable(GENERAL).send("press", view=view)
    view.stop()
    press = discord_fake.button_press(GENERAL, sent.id, "go:1", ALICE)
    await discord_fake.dispatch("INTERACTION_CREATE", press)
    await asyncio.wait_for(connected.arrived.wait(), 10)
    [interaction] = connected.presses
    assert interaction.user.id == ALICE and (interaction.data or {}).get("custom_id") == "go:1"
    assert discord_fake.interaction_answers[int(press["id"])] == [{"type": 6}]
    with pytest.raises(KeyError):
        discord_fake.button_press(GENERAL, sent.id, "not-there", ALICE)
