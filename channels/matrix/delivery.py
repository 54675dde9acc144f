"""Replies out: a reply's parts (``channels/reply_parts.py``) sent as Matrix events, progress
reported after each part so that a restart resumes at the first part not delivered.

- Text: ``m.text`` with ``body`` (plain) and ``formatted_body`` (``org.matrix.custom.html``,
  ``talon.render.matrix``), cut at ``MATRIX_TEXT_LIMIT``. In a thread every event carries the
  thread relation (``m.thread``, with the reply fallback); in a room the first part replies to
  the message that asked.
- A streamed answer's last edit is an ``m.replace`` of the message that showed it (``m.new_content``
  holds the final text); a reply with no text redacts that message.
- Files: uploaded to the homeserver's media repository, then sent as ``m.image``, ``m.audio``,
  ``m.video`` or ``m.file`` by their kind. Over the homeserver's upload limit (``m.upload.size``
  from its media config), empty, outside the workspace or refused: the person gets "Could not
  attach NAME: reason" instead, and the rest of the reply goes on. Into an encrypted room the
  file is encrypted before the upload and sent with ``file`` (its keys) instead of ``url``
  (``crypto.py``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talon.envelope import OutboundReply, conversation_id
from talon.render.matrix import markdown_to_matrix_html, matrix_plain, split_for_matrix

from channels.base import PartCallback
from channels.edited_view import EditedViews
from channels.matrix.api import CHANNEL, MatrixApi, check
from channels.reply_parts import Part, plan_reply_parts, send_parts

REPLY_MAX_MESSAGES = 8
_MSGTYPES = {"image": "m.image", "animation": "m.image", "audio": "m.audio", "voice": "m.audio",
             "video": "m.video", "document": "m.file"}


def text_content(markdown: str) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": matrix_plain(markdown), "format": "org.matrix.custom.html",
            "formatted_body": markdown_to_matrix_html(markdown)}


def edit_content(event_id: str, markdown: str) -> dict[str, Any]:
    new = text_content(markdown)
    return {**{k: (f"* {v}" if k in ("body", "formatted_body") else v) for k, v in new.items()},
            "m.new_content": new, "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}


def placed(content: dict[str, Any], *, thread_id: str | None, reply_to: str | None) -> dict[str, Any]:
    """``content`` in its thread (with the reply fallback) or as a reply to ``reply_to``."""
    if thread_id is not None:
        rel: dict[str, Any] = {"rel_type": "m.thread", "event_id": thread_id, "is_falling_back": reply_to is None,
                               "m.in_reply_to": {"event_id": reply_to or thread_id}}
        return {**content, "m.relates_to": rel}
    if reply_to is not None:
        return {**content, "m.relates_to": {"m.in_reply_to": {"event_id": reply_to}}}
    return content


class Delivery:
    def __init__(self, api: MatrixApi, live: EditedViews, sent: Any) -> None:
        self.api = api
        self.live = live
        self.sent = sent  # the intake's record of the bot's own events

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_reply_parts(reply, split_for_matrix, REPLY_MAX_MESSAGES)

    async def send_typing(self, room: str, thread_id: str | None = None) -> None:
        if self.live.showing(room, thread_id) or not self.api.budget.try_spend(room):
            return
        check(await self.api.client.room_typing(room, True, timeout=10_000), "typing")

    async def post(self, room: str, markdown: str, *, thread_id: str | None, reply_to: str | None,
                   what: str = "send", paced: bool = True) -> str:
        event_id = await self.api.send(room, placed(text_content(markdown), thread_id=thread_id, reply_to=reply_to),
                                       what, paced=paced)
        self.sent[event_id] = True
        return event_id

    async def edit(self, room: str, event_id: str, markdown: str, *, paced: bool = True) -> None:
        await self.api.send(room, edit_content(event_id, markdown), "edit", paced=paced)

    async def notice(self, room: str, text: str, *, thread_id: str | None = None) -> None:
        for piece in split_for_matrix(text) or [text]:
            await self.api.send(room, placed({"msgtype": "m.notice", "body": piece}, thread_id=thread_id,
                                             reply_to=None), "notice")

    async def deliver(self, room: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        def target(index: int) -> _Room:
            reply_to = reply.reply_to_message_id if index == 0 else None
            return _Room(self, room, reply.thread_id, reply_to)

        await send_parts(self.reply_parts(reply), target, skip_parts=skip_parts, on_part=on_part)

    async def upload_and_send(self, room: str, data: bytes, name: str, mime: str, kind: str,
                               thread_id: str | None, caption: str = "") -> None:
        crypto = self.api.client.crypto
        keys: dict[str, Any] | None = None
        body, content_type = data, mime
        if crypto is not None and crypto.encrypts(room):  # an encrypted attachment (crypto.py)
            body, keys = crypto.encrypt_file(data)
            content_type = "application/octet-stream"

        def upload() -> Any:
            return self.api.client.upload(io.BytesIO(body), content_type=content_type, filename=name,
                                          filesize=len(body))

        async def call() -> Any:
            answer, _ = await upload()
            return answer

        uploaded = await self.api.call(room, "upload", call, paced=False)
        content: dict[str, Any] = {"msgtype": _MSGTYPES.get(kind, "m.file"), "body": name, "filename": name,
                                   "info": {"mimetype": mime, "size": len(data)}}
        if keys is None:
            content["url"] = uploaded.content_uri
        else:
            content["file"] = {"url": uploaded.content_uri, "mimetype": mime, **keys}
        if caption:
            content["body"] = caption
        event_id = await self.api.send(room, placed(content, thread_id=thread_id, reply_to=None), "send file")
        self.sent[event_id] = True


@dataclass(frozen=True)
class _Room:
    """A room (and thread) as ``channels.reply_parts.send_parts`` sends a reply's parts to it."""

    delivery: Delivery
    room: str
    thread_id: str | None
    reply_to: str | None
    platform: str = "the homeserver"
    retire_verb: str = "redact"

    @property
    def where(self) -> str:
        return f"matrix: room={self.room}"

    @property
    def workspace(self) -> Path:
        return self.delivery.api.settings.workspace_dir(CHANNEL, conversation_id(self.room, self.thread_id))

    @property
    def upload_max_bytes(self) -> int:
        return self.delivery.api.upload_max_bytes

    def plain(self, markdown: str) -> str:
        return matrix_plain(markdown)

    async def post(self, markdown: str) -> None:
        await self.delivery.post(self.room, markdown, thread_id=self.thread_id, reply_to=self.reply_to)

    async def edit(self, message_id: str, markdown: str) -> None:
        await self.delivery.edit(self.room, message_id, markdown)

    async def retire(self, message_id: str) -> None:
        api = self.delivery.api
        await api.call(self.room, "redact", lambda: api.client.room_redact(self.room, message_id))

    async def notice(self, text: str) -> None:
        await self.delivery.notice(self.room, text, thread_id=self.thread_id)

    async def upload(self, data: bytes, name: str, mime: str, kind: str, *, comment: str = "") -> None:
        await self.delivery.upload_and_send(self.room, data, name, mime, kind, self.thread_id,
                                             caption=comment)
