"""Discord messages in: who may speak, channels, threads, files, and the ``InboundMessage``
handed to the bridge.

- **Direct messages**: the person must pass the access gate (``TALON_DISCORD_ALLOWED_USERS`` or
  pairing); deny by default.
- **Server channels**: only those in ``TALON_DISCORD_ALLOWED_CHANNELS`` (a thread is served when
  its parent channel is). There a message is a turn when it mentions the bot, replies to one of
  its messages, or is a ``!command``/``/command``; other messages are chatter for the next turn.
  Administrators are members with the Administrator or Manage Server permission.
- **Threads** (and forum posts) are their own conversations: ``chat_id`` is the parent channel,
  ``thread_id`` the thread, as a Telegram topic; replies go into the thread. A message in a
  channel discord.py's cache does not know (a thread made while no worker held the gateway, or
  one the gateway never announced) arrives on a partial channel: it is looked up once over REST
  (``GET /channels/{id}``, remembered), so it is served as the thread of its parent, not ignored.
  A look-up that fails, or names another server, leaves the message unserved.
- **Files**: attachments (images, audio, voice messages, video, documents) by their CDN URL,
  fetched during the turn (``downloads.py``).
- **Never a turn**: the bot's own messages, other bots' and webhooks', system messages (joins,
  pins). An edit (``on_message_edit``) becomes the message's new version.
"""

from __future__ import annotations

import logging
import re

import discord

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage, RemoteFile, conversation_id
from talon.groups import speaker_label

from channels.admission import admit_direct
from channels.base import BridgeHandle
from channels.discord.api import CHANNEL, DiscordApi
from channels.rooms import ChatterLog, describe_unaddressed

log = logging.getLogger(__name__)

_COMMAND = re.compile(r"^[!/]([a-z]+)\b", re.IGNORECASE)
_COMMANDS = frozenset({"stop", "new", "status", "usage", "tasks", "help", "approve", "deny", "model"})
_TURN_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})


def kind_of(attachment: discord.Attachment) -> str:
    mime = attachment.content_type or ""
    if attachment.is_voice_message():
        return "voice"
    for prefix, kind in (("image/", "image"), ("audio/", "audio"), ("video/", "video")):
        if mime.startswith(prefix):
            return kind
    return "document"


def command_text(text: str) -> str:
    stripped = text.lstrip()
    match = _COMMAND.match(stripped)
    if match and match.group(1).lower() in _COMMANDS:
        return "/" + stripped[1:]
    return text


class Intake:
    def __init__(self, api: DiscordApi, *, allowed_channels: frozenset[str], chatter: ChatterLog) -> None:
        self.api = api
        self.allowed_channels = allowed_channels
        self.chatter = chatter
        self._bridge: BridgeHandle | None = None
        self.sent: BoundedMap[str, bool] = BoundedMap("discord_sent")  # the bot's own message ids
        self._unlisted_logged: BoundedMap[str, bool] = BoundedMap("discord_unlisted")
        # channels the cache did not know, looked up once: id -> (parent id or None, name)
        self._looked_up: BoundedMap[str, tuple[str | None, str | None]] = BoundedMap("discord_channels")

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    @property
    def bridge(self) -> BridgeHandle:
        if self._bridge is None:
            raise RuntimeError("the Discord channel has not been started")
        return self._bridge

    def serves_channel(self, channel_id: str) -> bool:
        return channel_id in self.allowed_channels

    async def on_message(self, message: discord.Message, *, edited_at: str | None = None) -> None:
        if message.author.bot or message.webhook_id is not None or message.author.id == self.api.bot_id:
            return
        if message.type not in _TURN_TYPES:
            return
        files = [RemoteFile(kind=kind_of(a), source=a.url, name=a.filename[:200], mime=a.content_type,  # type: ignore[arg-type]
                            size=a.size) for a in message.attachments]
        if message.guild is None and getattr(message.channel, "guild_id", None) is not None:
            # A server's message whose server the cache does not have (not yet, or not ours): never
            # taken for a direct message.
            log.warning("discord: a message from server %s, unknown here, ignored",
                        getattr(message.channel, "guild_id", None))
            return
        if message.guild is None:
            await self._direct(message, files, edited_at)
        else:
            await self._channel(message, files, edited_at)

    async def _where(self, message: discord.Message) -> tuple[str, str | None, str | None]:
        """(channel, thread or None, the thread's or channel's name)."""
        channel = message.channel
        if isinstance(channel, discord.Thread):
            return str(channel.parent_id), str(channel.id), channel.name
        if isinstance(channel, discord.PartialMessageable) and message.guild is not None:
            key = str(channel.id)
            known = self._looked_up.get(key)
            if known is None:
                known = await self._look_up(channel.id, message.guild.id)
                if known is None:
                    return key, None, None
                self._looked_up[key] = known
            parent, name = known
            return (parent, key, name) if parent is not None else (key, None, name)
        return str(channel.id), None, getattr(channel, "name", None)

    async def _look_up(self, channel_id: int, guild_id: int) -> tuple[str | None, str | None] | None:
        """A channel the cache does not know (a thread made while offline), over REST."""
        try:
            found = await self.api.once("channel look-up", lambda: self.api.client.fetch_channel(channel_id))
        except Exception as exc:
            log.warning("discord: a message in channel %s, which the gateway never announced, could not be placed "
                        "(%s); not served", channel_id, exc)
            return None
        found_guild = getattr(getattr(found, "guild", None), "id", None)
        if found_guild != guild_id:
            log.warning("discord: channel %s is not in the server its message came from; not served", channel_id)
            return None
        if isinstance(found, discord.Thread):
            return str(found.parent_id), found.name
        return None, getattr(found, "name", None)

    async def _direct(self, message: discord.Message, files: list[RemoteFile], edited_at: str | None) -> None:
        user = str(message.author.id)
        name = message.author.display_name

        async def tell(line: str) -> None:
            await self.api.once("pairing code", lambda: message.channel.send(
                line, allowed_mentions=discord.AllowedMentions.none()))

        if not await admit_direct(self.bridge.gate, CHANNEL, [user], name=name,
                                  allow_setting="TALON_DISCORD_ALLOWED_USERS", tell=tell):
            return
        if not message.content and not files:
            return
        await self.bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=str(message.channel.id), sender_id=user, message_id=str(message.id),
            text=command_text(message.content), sender_name=name, sender_username=message.author.name,
            files=files, edited_at=edited_at))

    async def _channel(self, message: discord.Message, files: list[RemoteFile], edited_at: str | None) -> None:
        chat, thread, place_name = await self._where(message)
        if not self.serves_channel(chat):
            if chat not in self._unlisted_logged:
                self._unlisted_logged[chat] = True
                log.warning("discord: message in channel %s ignored: the channel is not listed; to serve it add %s "
                            "to TALON_DISCORD_ALLOWED_CHANNELS", chat, chat)
            return
        me = self.api.bot_id
        text = message.content
        mentioned = any(user.id == me for user in message.mentions)
        text = re.sub(rf"^\s*<@!?{me}>[:,]?\s*", "", text, count=1)
        replied = message.reference is not None and str(message.reference.message_id) in self.sent
        addressed = mentioned or replied or bool(_COMMAND.match(text.lstrip()))
        conversation = conversation_id(chat, thread)
        name = message.author.display_name
        if not addressed:
            if edited_at is None:
                self.chatter.add(conversation, speaker_label(name, str(message.author.id)),
                                 describe_unaddressed(message.content, len(files)))
            return
        author = message.author
        perms = author.guild_permissions if isinstance(author, discord.Member) else None
        admin = perms is not None and (perms.administrator or perms.manage_guild)
        channel_name = getattr(message.channel, "name", None) or place_name
        parent = getattr(message.channel, "parent", None) or (
            message.guild.get_channel(int(chat)) if message.guild is not None and chat.isdigit() else None)
        await self.bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=chat, sender_id=str(author.id), message_id=str(message.id),
            text=command_text(text), sender_name=name, sender_username=author.name, files=files, chat_type="group",
            chat_title=str(getattr(parent, "name", None) or channel_name or chat), thread_id=thread,
            thread_title=channel_name if thread else None, sender_admin=admin,
            reply_to_sender="you" if replied else None, chatter=self.chatter.take(conversation),
            edited_at=edited_at))
