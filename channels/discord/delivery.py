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

import io
import logging
from typing import Any

import discord

from talon.envelope import OutboundReply, conversation_id
from talon.errors import DeliveryError
from talon.media import OutboundMedia
from talon.media.failures import attach_failure_line
from talon.render.discord import discord_plain, markdown_to_discord, split_for_discord
from talon.render.long_reply import REPLY_DOCUMENT_NAME, reply_document

from channels.base import PartCallback, deliver_parts
from channels.discord.api import CHANNEL, UPLOAD_MAX_BYTES, DiscordApi
from channels.edited_view import EditedViews
from channels.outbound_files import open_for_upload
from channels.reply_parts import (
    FilePart,
    NoticePart,
    Part,
    ReplyDocumentPart,
    RetirePart,
    TextPart,
    plan_reply_parts,
)

log = logging.getLogger(__name__)

REPLY_MAX_MESSAGES = 8
NO_PINGS = discord.AllowedMentions.none()


def target(chat_id: str, thread_id: str | None) -> str:
    return thread_id or chat_id


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

    async def notice(self, where: str, text: str) -> None:
        channel = self.api.messageable(where)
        for piece in split_for_discord(text) or [text]:
            await self.api.call(where, "notice", lambda piece=piece: channel.send(  # type: ignore[misc]
                discord_plain(piece), allowed_mentions=NO_PINGS))

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        where = target(chat_id, reply.thread_id)

        async def send(index: int, part: Part) -> None:
            reply_to = reply.reply_to_message_id if index == 0 else None
            await self._send_part(chat_id, where, part, reply.thread_id, reply_to)

        await deliver_parts(self.reply_parts(reply), send, skip_parts=skip_parts, on_part=on_part)

    async def _send_part(self, chat_id: str, where: str, part: Part, thread_id: str | None,
                         reply_to: str | None) -> None:
        if isinstance(part, TextPart) and part.edit is not None:
            try:
                await self.edit(where, part.edit, part.markdown)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                log.warning("discord: channel=%s: cannot edit the streamed message %s (%s); sending the answer anew",
                            where, part.edit, exc)
                await self.post(where, part.markdown, reply_to=reply_to)
        elif isinstance(part, TextPart):
            if discord_plain(part.markdown).strip():
                await self.post(where, part.markdown, reply_to=reply_to)
        elif isinstance(part, RetirePart):
            message = self.api.messageable(where).get_partial_message(int(part.message_id))
            try:
                await self.api.call(where, "delete", message.delete)
            except DeliveryError as exc:
                log.warning("discord: channel=%s: could not delete the streamed message: %s", where, exc)
        elif isinstance(part, NoticePart):
            await self.notice(where, part.text)
        elif isinstance(part, ReplyDocumentPart):
            try:
                await self.upload(where, reply_document(part.text), REPLY_DOCUMENT_NAME, comment=part.note)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                await self.notice(where, attach_failure_line(REPLY_DOCUMENT_NAME, f"Discord refused it ({exc})"))
        else:
            await self._send_file(chat_id, where, part, thread_id)

    async def _send_file(self, chat_id: str, where: str, part: FilePart, thread_id: str | None) -> None:
        root = self.api.settings.workspace_dir(CHANNEL, conversation_id(chat_id, thread_id))
        opened = open_for_upload(part.ref, root, limit=self.upload_max_bytes, platform="Discord",
                                 where=f"discord: channel={where}")
        if isinstance(opened, str):
            await self.notice(where, opened)
            return
        media: OutboundMedia = opened
        try:
            media.file.seek(0)
            data = media.file.read()
            try:
                await self.upload(where, data, media.name)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                log.warning("discord: channel=%s: %s refused: %s", where, media.name, exc)
                await self.notice(where, attach_failure_line(media.name, "Discord refused it"))
        finally:
            media.close()

    async def upload(self, where: str, data: bytes, name: str, *, comment: str = "") -> None:
        channel = self.api.messageable(where)
        sent = await self.api.call(where, "upload", lambda: channel.send(
            comment or None, file=discord.File(io.BytesIO(data), filename=name), allowed_mentions=NO_PINGS))
        self.sent[str(sent.id)] = True
