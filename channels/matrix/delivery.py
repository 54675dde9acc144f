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

import logging
from typing import Any

from talon.envelope import OutboundReply, conversation_id
from talon.errors import DeliveryError
from talon.media import OutboundMedia
from talon.media.failures import attach_failure_line
from talon.render.long_reply import REPLY_DOCUMENT_MIME, REPLY_DOCUMENT_NAME, reply_document
from talon.render.matrix import markdown_to_matrix_html, matrix_plain, split_for_matrix

from channels.base import PartCallback, deliver_parts
from channels.edited_view import EditedViews
from channels.matrix.api import CHANNEL, MatrixApi, check
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
        async def send(index: int, part: Part) -> None:
            reply_to = reply.reply_to_message_id if index == 0 else None
            await self._send_part(room, part, reply.thread_id, reply_to)

        await deliver_parts(self.reply_parts(reply), send, skip_parts=skip_parts, on_part=on_part)

    async def _send_part(self, room: str, part: Part, thread_id: str | None, reply_to: str | None) -> None:
        if isinstance(part, TextPart) and part.edit is not None:
            try:
                await self.edit(room, part.edit, part.markdown)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                log.warning("matrix: room=%s: cannot edit the streamed message %s (%s); sending the answer anew",
                            room, part.edit, exc)
                await self.post(room, part.markdown, thread_id=thread_id, reply_to=reply_to)
        elif isinstance(part, TextPart):
            if matrix_plain(part.markdown).strip():
                await self.post(room, part.markdown, thread_id=thread_id, reply_to=reply_to)
        elif isinstance(part, RetirePart):
            try:
                await self.api.call(room, "redact", lambda: self.api.client.room_redact(room, part.message_id))
            except DeliveryError as exc:
                log.warning("matrix: room=%s: could not redact the streamed message: %s", room, exc)
        elif isinstance(part, NoticePart):
            await self.notice(room, part.text, thread_id=thread_id)
        elif isinstance(part, ReplyDocumentPart):
            data = reply_document(part.text)
            try:
                await self._upload_and_send(room, data, REPLY_DOCUMENT_NAME, REPLY_DOCUMENT_MIME, "document",
                                            thread_id, caption=part.note)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                await self.notice(room, attach_failure_line(REPLY_DOCUMENT_NAME, f"the homeserver refused it ({exc})"),
                                  thread_id=thread_id)
        else:
            await self._send_file(room, part, thread_id)

    async def _send_file(self, room: str, part: FilePart, thread_id: str | None) -> None:
        root = self.api.settings.workspace_dir(CHANNEL, conversation_id(room, thread_id))
        opened = open_for_upload(part.ref, root, limit=self.api.upload_max_bytes, platform="the homeserver",
                                 where=f"matrix: room={room}")
        if isinstance(opened, str):
            await self.notice(room, opened, thread_id=thread_id)
            return
        media: OutboundMedia = opened
        try:
            media.file.seek(0)
            data = media.file.read()
            try:
                await self._upload_and_send(room, data, media.name, media.mime, media.kind, thread_id)
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                log.warning("matrix: room=%s: %s refused: %s", room, media.name, exc)
                await self.notice(room, attach_failure_line(media.name, "the homeserver refused it"),
                                  thread_id=thread_id)
        finally:
            media.close()

    async def _upload_and_send(self, room: str, data: bytes, name: str, mime: str, kind: str,
                               thread_id: str | None, caption: str = "") -> None:
        import io

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
