"""The Discord fake's application commands checked against discord.py itself: ``CommandTree.sync``
(the library's own bulk overwrite) registers commands the fake records, and an
APPLICATION_COMMAND interaction the fake sends over its gateway is parsed by discord.py, routed
to the tree's command with its user, and answered once."""

from __future__ import annotations

import asyncio
from typing import Any

import discord
import discord.http
import pytest
from discord import app_commands

from tests.fakes.discord import TOKEN, FakeDiscord
from tests.support.discord import ALICE, DM, GENERAL, GUILD
from tests.support.discord import discord_fake  # noqa: F401  (the fixture)


async def test_command_tree_sync_is_recorded_and_a_slash_command_reaches_its_callback(
        discord_fake: FakeDiscord) -> None:
    discord.http.Route.BASE = discord_fake.api_url
    intents = discord.Intents.none()
    intents.guilds = True
    client = discord.AutoShardedClient(intents=intents)  # finds the gateway with GET /gateway/bot
    tree = app_commands.CommandTree(client)
    used: list[tuple[int, int | None, str]] = []
    done = asyncio.Event()

    @tree.command(name="status", description="What is going on")
    async def status(interaction: discord.Interaction[Any]) -> None:
        used.append((interaction.user.id, interaction.guild_id, interaction.command.name if interaction.command else ""))
        await interaction.response.send_message("all fine", ephemeral=True)
        done.set()

    await client.login(TOKEN)
    task = asyncio.create_task(client.connect())
    try:
        await asyncio.wait_for(client.wait_until_ready(), 30)
        synced = await tree.sync()
        assert [c.name for c in synced] == ["status"] and synced[0].id  # the library read the fake's answer
        assert [c["name"] for c in discord_fake.commands] == ["status"] and discord_fake.command_puts == 1
        await discord_fake.dispatch("INTERACTION_CREATE", discord_fake.slash_command(GENERAL, "status", ALICE))
        await asyncio.wait_for(done.wait(), 10)
        done.clear()
        dm = discord_fake.slash_command(DM, "status", ALICE)
        await discord_fake.dispatch("INTERACTION_CREATE", dm)
        await asyncio.wait_for(done.wait(), 10)
        with pytest.raises(KeyError):
            discord_fake.slash_command(GENERAL, "nothing", ALICE)
    finally:
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        discord.http.Route.BASE = "https://discord.com/api/v10"
    assert used == [(ALICE, GUILD, "status"), (ALICE, None, "status")]
    assert discord_fake.interaction_answers[int(dm["id"])] == [{"type": 4, "data": {"tts": False, "content": "all fine", "flags": 64}}]
