"""Replies out: a reply's parts (``channels/reply_parts.py``) sent as Discord messages, progress
reported after each part so that a restart resumes at the first part not delivered.

- Text: Discord markdown (``talon.render.discord``) cut at 2,000 characters, into the thread when
  the conversation is one; the first part replies to the message that asked in a server channel.
  ``allowed_mentions`` is always none: nothing the model writes pings anyone. Should Discord
  refuse the formatted text, it is sent once more plain.
- A streamed answer's last edit is an edit of the message that showed it; a reply with no text
  deletes that message.
- Files: attachments (multipart ``files[n]``). Over the server's upload limit (10 MB without
  boosts), empty, outside the workspace or refused: "Could not attach NAME: reason" instead, and
  the rest of the reply goes on.
"""

from __future__ import annotations

import hashlib
import io
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import discord

from talon.envelope import OutboundReply, conversation_id
from talon.errors import DeliveryError
from talon.render.discord import discord_plain, markdown_to_discord, split_for_discord

from channels.base import PartCallback
from channels.discord.api import CHANNEL, UPLOAD_MAX_BYTES, DiscordApi
from channels.edited_view import EditedViews
from channels.reply_parts import Part, plan_reply_parts, send_parts

log = logging.getLogger(__name__)

REPLY_MAX_MESSAGES = 8
NO_PINGS = discord.AllowedMentions.none()


def target(chat_id: str, thread_id: str | None) -> str:
    return thread_id or chat_id


def part_nonce(delivery_key: str | None, *where: object) -> int | None:
    """The nonce of one message of a reply (Discord enforces it: a second send with the same nonce
    within minutes returns the first message and creates none): the same on every delivery of
    the reply, so a part sent again after a restart arrives once. None without a key."""
    if delivery_key is None:
        return None
    digest = hashlib.blake2b(":".join([delivery_key, *map(str, where)]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: at most 19 digits (Discord allows 25)


class Delivery:
    def __init__(self, api: DiscordApi, live: EditedViews, sent: Any) -> None:
        self.api = api
        self.live = live
        self.sent = sent
        self.upload_max_bytes = UPLOAD_MAX_BYTES

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_reply_parts(reply, split_for_discord, REPLY_MAX_MESSAGES)

    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:
        where = target(chat_id, thread_id)
        if self.live.showing(chat_id, thread_id) or not self.api.budget.try_spend(where):
            return
        await self.api.once("typing", lambda: self.api.client.http.send_typing(int(where)))

    async def post(self, where: str, markdown: str, *, reply_to: str | None = None, what: str = "send",
                   paced: bool = True, **extra: Any) -> str:
        reference = (discord.MessageReference(message_id=int(reply_to), channel_id=int(where),
                                              fail_if_not_exists=False) if reply_to else None)
        channel = self.api.messageable(where)

        async def send(text: str) -> discord.Message:
            return await self.api.call(where, what, lambda: channel.send(
                text, reference=reference, allowed_mentions=NO_PINGS, **extra), paced=paced)  # type: ignore[arg-type]

        try:
            sent = await send(markdown_to_discord(markdown))
        except DeliveryError as exc:
            if not exc.permanent or "HTTP 400" not in str(exc):
                raise
            log.warning("discord: channel=%s: formatted text refused (%s); sending it plain", where, exc)
            sent = await send(discord_plain(markdown)[:2000])
        self.sent[str(sent.id)] = True
        return str(sent.id)

    async def edit(self, where: str, message_id: str, markdown: str, *, paced: bool = True) -> None:
        message = self.api.messageable(where).get_partial_message(int(message_id))
        await self.api.call(where, "edit", lambda: message.edit(content=markdown_to_discord(markdown),
                                                                allowed_mentions=NO_PINGS), paced=paced)

    async def notice(self, where: str, text: str, *, nonce: int | None = None) -> None:
        channel = self.api.messageable(where)
        for n, piece in enumerate(split_for_discord(text) or [text]):
            once = None if nonce is None else part_nonce(str(nonce), n)
            await self.api.call(where, "notice", lambda piece=piece, once=once: channel.send(  # type: ignore[misc]
                discord_plain(piece), allowed_mentions=NO_PINGS, nonce=once))

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        def target(index: int) -> _Target:
            reply_to = reply.reply_to_message_id if index == 0 else None
            return _Target(self, chat_id, reply.thread_id, reply_to, part_nonce(reply.delivery_key, index))

        await send_parts(self.reply_parts(reply), target, skip_parts=skip_parts, on_part=on_part)

    async def upload(self, where: str, data: bytes, name: str, *, comment: str = "",
                     nonce: int | None = None) -> None:
        channel = self.api.messageable(where)
        sent = await self.api.call(where, "upload", lambda: channel.send(
            comment or None, file=discord.File(io.BytesIO(data), filename=name), allowed_mentions=NO_PINGS,
            nonce=secrets.randbits(64) if nonce is None else nonce))  # random: discord.py's own default
        self.sent[str(sent.id)] = True


@dataclass(frozen=True)
class _Target:
    """A channel or thread as ``channels.reply_parts.send_parts`` sends a reply's parts to it."""

    delivery: Delivery
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    nonce: int | None = None  # this part's (part_nonce): sent again after a restart, it arrives once
    platform: str = "Discord"
    retire_verb: str = "delete"

    @property
    def channel(self) -> str:
        return target(self.chat_id, self.thread_id)

    @property
    def where(self) -> str:
        return f"discord: channel={self.channel}"

    @property
    def workspace(self) -> Path:
        return self.delivery.api.settings.workspace_dir(CHANNEL, conversation_id(self.chat_id, self.thread_id))

    @property
    def upload_max_bytes(self) -> int:
        return self.delivery.upload_max_bytes

    def plain(self, markdown: str) -> str:
        return discord_plain(markdown)

    async def post(self, markdown: str) -> None:
        await self.delivery.post(self.channel, markdown, reply_to=self.reply_to, nonce=self.nonce)

    async def edit(self, message_id: str, markdown: str) -> None:
        await self.delivery.edit(self.channel, message_id, markdown)

    async def retire(self, message_id: str) -> None:
        message = self.delivery.api.messageable(self.channel).get_partial_message(int(message_id))
        await self.delivery.api.call(self.channel, "delete", message.delete)

    async def notice(self, text: str) -> None:
        await self.delivery.notice(self.channel, text, nonce=self.nonce)

    async def upload(self, data: bytes, name: str, mime: str, kind: str, *, comment: str = "") -> None:
        await self.delivery.upload(self.channel, data, name, comment=comment, nonce=self.nonce)
