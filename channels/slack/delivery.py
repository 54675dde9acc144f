"""Replies out: a reply's parts (``channels/reply_parts.py``) sent as Slack messages, progress
reported after each part so that a restart resumes at the first part not delivered.

- Text: ``chat.postMessage`` with ``mrkdwn`` (``talon.render.slack``) cut at ``SLACK_TEXT_LIMIT``,
  into the conversation's thread (``thread_ts``) when it has one. Should Slack refuse the
  formatted text, it is sent once more as plain text (``mrkdwn: false``).
- A streamed answer's last edit is a ``chat.update`` of the message that showed it; a reply with
  no text deletes that message (``chat.delete``).
- Files: Slack's upload flow (``files.getUploadURLExternal``, the bytes to the URL it gives,
  ``files.completeUploadExternal`` into the channel and thread), through slack-sdk's
  ``files_upload_v2``. Empty, outside the workspace, over ``UPLOAD_MAX_BYTES`` or refused: the
  person gets "Could not attach NAME: reason" instead, and the rest of the reply goes on.
"""

from __future__ import annotations

import logging
from typing import Any

from talon.envelope import OutboundReply, conversation_id
from talon.errors import DeliveryError
from talon.media import OutboundMedia
from talon.media.failures import attach_failure_line
from talon.render.long_reply import REPLY_DOCUMENT_NAME, reply_document
from talon.render.slack import markdown_to_mrkdwn, slack_plain, split_for_slack

from channels.base import PartCallback, deliver_parts
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
from channels.slack.api import CHANNEL, UPLOAD_MAX_BYTES, SlackApi, error_code

log = logging.getLogger(__name__)

REPLY_MAX_MESSAGES = 8
# Refusals that are about the formatting, not the channel: the plain text may still go.
_FORMAT_ERRORS = frozenset({"invalid_blocks", "msg_too_long", "invalid_arguments", "no_text"})
_GONE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})


class Delivery:
    def __init__(self, api: SlackApi, live: EditedViews, threads: Any) -> None:
        self.api = api
        self.live = live
        self.threads = threads  # the intake's record of threads the bot answered in
        self.upload_max_bytes = UPLOAD_MAX_BYTES

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_reply_parts(reply, split_for_slack, REPLY_MAX_MESSAGES)

    async def post(self, channel: str, markdown: str, *, thread_ts: str | None, what: str = "send",
                   paced: bool = True, blocks: list[dict[str, Any]] | None = None) -> str:
        async def send(text: str, mrkdwn: bool) -> str:
            answer = await self.api.call(channel, what, lambda: self.api.client.chat_postMessage(
                channel=channel, text=text, mrkdwn=mrkdwn, thread_ts=thread_ts, blocks=blocks,
                unfurl_links=False, unfurl_media=False), paced=paced)
            return str(answer.get("ts"))

        try:
            ts = await send(markdown_to_mrkdwn(markdown), True)
        except DeliveryError as exc:
            if not exc.permanent or error_code(exc) not in _FORMAT_ERRORS:
                raise
            log.warning("slack: channel=%s: formatted text refused (%s); sending it plain", channel, exc)
            ts = await send(slack_plain(markdown)[:3900], False)
        if thread_ts is not None:
            self.threads[conversation_id(channel, thread_ts)] = True
        return ts

    async def edit(self, channel: str, ts: str, markdown: str, *, paced: bool = True,
                   blocks: list[dict[str, Any]] | None = None) -> None:
        await self.api.call(channel, "edit", lambda: self.api.client.chat_update(
            channel=channel, ts=ts, text=markdown_to_mrkdwn(markdown), blocks=blocks),
            paced=paced)

    async def notice(self, channel: str, text: str, *, thread_ts: str | None = None) -> None:
        for piece in split_for_slack(text) or [text]:
            await self.api.call(channel, "notice", lambda piece=piece: self.api.client.chat_postMessage(  # type: ignore[misc]
                channel=channel, text=slack_plain(piece), mrkdwn=False, thread_ts=thread_ts))

    async def deliver(self, channel: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        async def send(index: int, part: Part) -> None:
            await self._send_part(channel, part, reply.thread_id)

        await deliver_parts(self.reply_parts(reply), send, skip_parts=skip_parts, on_part=on_part)

    async def _send_part(self, channel: str, part: Part, thread_ts: str | None) -> None:
        if isinstance(part, TextPart) and part.edit is not None:
            try:
                await self.edit(channel, part.edit, part.markdown)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                log.warning("slack: channel=%s: cannot edit the streamed message %s (%s); sending the answer anew",
                            channel, part.edit, exc)
                await self.post(channel, part.markdown, thread_ts=thread_ts)
        elif isinstance(part, TextPart):
            if slack_plain(part.markdown).strip():
                await self.post(channel, part.markdown, thread_ts=thread_ts)
        elif isinstance(part, RetirePart):
            try:
                await self.api.call(channel, "delete", lambda: self.api.client.chat_delete(
                    channel=channel, ts=part.message_id))
            except DeliveryError as exc:
                log.warning("slack: channel=%s: could not delete the streamed message: %s", channel, exc)
        elif isinstance(part, NoticePart):
            await self.notice(channel, part.text, thread_ts=thread_ts)
        elif isinstance(part, ReplyDocumentPart):
            try:
                await self.upload(channel, reply_document(part.text), REPLY_DOCUMENT_NAME, thread_ts,
                                  comment=part.note)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                await self.notice(channel, attach_failure_line(REPLY_DOCUMENT_NAME, f"Slack refused it ({exc})"),
                                  thread_ts=thread_ts)
        else:
            await self._send_file(channel, part, thread_ts)

    async def _send_file(self, channel: str, part: FilePart, thread_ts: str | None) -> None:
        root = self.api.settings.workspace_dir(CHANNEL, conversation_id(channel, thread_ts))
        opened = open_for_upload(part.ref, root, limit=self.upload_max_bytes, platform="Slack",
                                 where=f"slack: channel={channel}")
        if isinstance(opened, str):
            await self.notice(channel, opened, thread_ts=thread_ts)
            return
        media: OutboundMedia = opened
        try:
            media.file.seek(0)
            data = media.file.read()
            try:
                await self.upload(channel, data, media.name, thread_ts)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                log.warning("slack: channel=%s: %s refused: %s", channel, media.name, exc)
                await self.notice(channel, attach_failure_line(media.name, "Slack refused it"), thread_ts=thread_ts)
        finally:
            media.close()

    async def upload(self, channel: str, data: bytes, name: str, thread_ts: str | None, *, comment: str = "") -> None:
        kwargs: dict[str, Any] = {"channel": channel, "content": data, "filename": name, "title": name}
        if thread_ts is not None:
            kwargs["thread_ts"] = thread_ts
        if comment:
            kwargs["initial_comment"] = comment
        await self.api.call(channel, "upload", lambda: self.api.client.files_upload_v2(**kwargs))
