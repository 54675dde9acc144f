"""Talon's commands as Discord slash commands (application commands).

- **Registration.** At start the global command list of the bot's application is replaced with
  ``COMMANDS`` in one call (``PUT /applications/{application id}/commands``, the bulk overwrite
  that discord.py's ``CommandTree.sync`` makes), so a command removed from Talon disappears from
  Discord too. A failure is logged; the text commands keep working.
- **Use.** An ``APPLICATION_COMMAND`` interaction is checked like a message: in a direct message
  the person must pass the access gate (``TALON_DISCORD_ALLOWED_USERS`` or pairing), in a server
  the channel (or a thread's parent) must be in ``TALON_DISCORD_ALLOWED_CHANNELS``. Refused: an
  ephemeral line says so and nothing else happens. Allowed: the interaction is acknowledged with
  an ephemeral line (Discord wants an answer within 3 seconds), and the command goes to the
  bridge as the text command it stands for (``/status``...), in the same conversation (thread
  included), so it is answered as the text command is and ``/stop`` stops the live answer.
"""

from __future__ import annotations

import logging
from typing import Any

import discord

from talon.envelope import InboundMessage

from channels.base import BridgeHandle
from channels.discord.api import CHANNEL, DiscordApi
from channels.discord.intake import Intake

log = logging.getLogger(__name__)

COMMANDS: dict[str, str] = {
    "stop": "Stop the answer being written",
    "new": "Start a new conversation",
    "status": "What Talon is doing and with which model",
    "usage": "Tokens and cost so far",
    "tasks": "Scheduled tasks of this conversation",
}
_THREADS = {discord.ChannelType.public_thread, discord.ChannelType.private_thread, discord.ChannelType.news_thread}


def payload() -> list[dict[str, Any]]:
    """The application commands, as the bulk overwrite takes them (type 1: chat input)."""
    return [{"name": name, "description": what, "type": 1, "dm_permission": True, "contexts": [0, 1],
             "integration_types": [0]} for name, what in COMMANDS.items()]


class SlashCommands:
    def __init__(self, api: DiscordApi, intake: Intake) -> None:
        self.api = api
        self.intake = intake
        self._bridge: BridgeHandle | None = None
        self.registered = False

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def register(self, client: discord.Client) -> None:
        app = client.application_id
        if app is None:
            log.warning("discord: no application id; slash commands not registered (text commands work)")
            return
        try:
            await client.http.bulk_upsert_global_commands(app, payload())
        except discord.HTTPException as exc:
            log.warning("discord: registering the slash commands failed (%s); text commands still work", exc)
            return
        self.registered = True
        log.info("discord: slash commands registered: %s", ", ".join(f"/{c}" for c in COMMANDS))

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        data: Any = interaction.data or {}
        name = str(data.get("name", ""))
        if name not in COMMANDS or self._bridge is None:
            return
        user = interaction.user
        channel = interaction.channel
        thread: str | None = None
        if interaction.guild_id is None:
            chat = str(interaction.channel_id)
            allowed = await self._bridge.gate.allowed(CHANNEL, [str(user.id)])
        else:
            chat = str(interaction.channel_id)
            if channel is not None and getattr(channel, "type", None) in _THREADS:
                thread, chat = chat, str(getattr(channel, "parent_id", chat))
            allowed = self.intake.serves_channel(chat)
        if not allowed:
            log.warning("discord: /%s from %s (%s) in %s refused: not allowed here", name, user.id, user.name, chat)
            await self._answer(interaction, "You are not allowed to use this bot here.")
            return
        await self._answer(interaction, f"/{name}: on it.")
        perms = user.guild_permissions if isinstance(user, discord.Member) else None
        group = interaction.guild_id is not None
        await self._bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=chat, sender_id=str(user.id), message_id=str(interaction.id), text=f"/{name}",
            sender_name=user.display_name, sender_username=user.name, thread_id=thread,
            chat_type="group" if group else "private", chat_title=getattr(channel, "name", None) if group else None,
            sender_admin=perms is not None and (perms.administrator or perms.manage_guild)))

    async def _answer(self, interaction: discord.Interaction[Any], text: str) -> None:
        try:
            await interaction.response.send_message(text, ephemeral=True)
        except discord.HTTPException as exc:
            log.warning("discord: answering the interaction %s failed: %s", interaction.id, exc)
