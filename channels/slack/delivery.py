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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talon.envelope import OutboundReply, conversation_id
from talon.errors import DeliveryError
from talon.render.slack import markdown_to_mrkdwn, slack_plain, split_for_slack

from channels.base import PartCallback
from channels.edited_view import EditedViews
from channels.reply_parts import Part, plan_reply_parts, send_parts
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
        where = _Channel(self, channel, reply.thread_id)
        await send_parts(self.reply_parts(reply), lambda index: where, skip_parts=skip_parts, on_part=on_part)

    async def upload(self, channel: str, data: bytes, name: str, thread_ts: str | None, *, comment: str = "") -> None:
        kwargs: dict[str, Any] = {"channel": channel, "content": data, "filename": name, "title": name}
        if thread_ts is not None:
            kwargs["thread_ts"] = thread_ts
        if comment:
            kwargs["initial_comment"] = comment
        await self.api.call(channel, "upload", lambda: self.api.client.files_upload_v2(**kwargs))


@dataclass(frozen=True)
class _Channel:
    """A channel (and thread) as ``channels.reply_parts.send_parts`` sends a reply's parts to it;
    Slack's parts do not reply to the message that asked (the thread places them)."""

    delivery: Delivery
    channel: str
    thread_ts: str | None
    platform: str = "Slack"
    retire_verb: str = "delete"

    @property
    def where(self) -> str:
        return f"slack: channel={self.channel}"

    @property
    def workspace(self) -> Path:
        return self.delivery.api.settings.workspace_dir(CHANNEL, conversation_id(self.channel, self.thread_ts))

    @property
    def upload_max_bytes(self) -> int:
        return self.delivery.upload_max_bytes

    def plain(self, markdown: str) -> str:
        return slack_plain(markdown)

    async def post(self, markdown: str) -> None:
        await self.delivery.post(self.channel, markdown, thread_ts=self.thread_ts)

    async def edit(self, message_id: str, markdown: str) -> None:
        await self.delivery.edit(self.channel, message_id, markdown)

    async def retire(self, message_id: str) -> None:
        api = self.delivery.api
        await api.call(self.channel, "delete", lambda: api.client.chat_delete(channel=self.channel, ts=message_id))

    async def notice(self, text: str) -> None:
        await self.delivery.notice(self.channel, text, thread_ts=self.thread_ts)

    async def upload(self, data: bytes, name: str, mime: str, kind: str, *, comment: str = "") -> None:
        await self.delivery.upload(self.channel, data, name, self.thread_ts, comment=comment)
