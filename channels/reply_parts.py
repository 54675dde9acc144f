"""The parts of a reply for channels that send text and files as separate messages (Matrix, and
the channels after it), planned from the reply alone (pure), so that ``skip_parts`` means the same
thing when a delivery is resumed after a crash.

Parts, in order: the text rendered and cut at the platform's limit (``split``: markdown pieces
that each fit once rendered); past ``max_messages`` pieces the first goes as text and the whole
reply as ``reply.md`` (``talon.render.long_reply``); then one part per file; then the notices as
plain text. A streamed answer (``reply.live_message_id``): the first text part is the last edit
of the message that showed it while it was written (``TextPart.edit``); a reply with no text at
all retires that message (``RetirePart``). Telegram plans its own parts (albums, captions).

Sending them (``send_parts``) is the same loop for each such channel: a streamed message edited
(sent anew should the platform refuse the edit), text that renders to nothing skipped, the
retired message removed (a failure only logged), a file that cannot be attached ("Could not
attach NAME: reason") said in its place while the rest of the reply goes on. Each channel says
how to talk to one conversation (a ``PartTarget``); the bridge resumes at the first part not
reported delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from talon.envelope import OutboundReply
from talon.errors import DeliveryError
from talon.media import MarkdownMediaRef, OutboundMedia
from talon.media.failures import attach_failure_line
from talon.render.long_reply import REPLY_DOCUMENT_MIME, REPLY_DOCUMENT_NAME, long_reply_note, reply_document

from channels.base import PartCallback, deliver_parts
from channels.outbound_files import open_for_upload

log = logging.getLogger(__name__)

Split = Callable[[str], list[str]]


@dataclass(frozen=True)
class TextPart:
    markdown: str
    edit: str | None = None  # the streamed message to edit into this text


@dataclass(frozen=True)
class RetirePart:
    message_id: str


@dataclass(frozen=True)
class NoticePart:
    text: str


@dataclass(frozen=True)
class FilePart:
    ref: MarkdownMediaRef


@dataclass(frozen=True)
class ReplyDocumentPart:
    text: str
    note: str


Part = TextPart | RetirePart | NoticePart | FilePart | ReplyDocumentPart


def plan_reply_parts(reply: OutboundReply, split: Split, max_messages: int) -> list[Part]:
    chunks = [chunk for chunk in split(reply.text) if chunk.strip()]
    parts: list[Part] = []
    document: ReplyDocumentPart | None = None
    if len(chunks) > max_messages:
        document = ReplyDocumentPart(reply.text, long_reply_note(len(reply.text), len(chunks)))
        chunks = chunks[:1]
    live = reply.live_message_id
    parts.extend(TextPart(chunk, edit=live if i == 0 else None) for i, chunk in enumerate(chunks))
    if live is not None and not chunks:
        parts.append(RetirePart(live))
    if document is not None:
        parts.append(document)
    parts.extend(FilePart(ref) for ref in reply.media)
    parts.extend(NoticePart(notice) for notice in reply.notices if notice.strip())
    return parts


class PartTarget(Protocol):
    """One conversation of a channel, as ``send_parts`` sends a part to it."""

    @property
    def where(self) -> str:
        """For the log: "slack: channel=C1"."""
        ...

    @property
    def platform(self) -> str:
        """Who refuses a file: "Slack", "the homeserver"."""
        ...

    @property
    def retire_verb(self) -> str:
        """How the streamed message is taken away: "delete", "redact"."""
        ...

    @property
    def workspace(self) -> Path:
        """Where the files a reply may attach are."""
        ...

    @property
    def upload_max_bytes(self) -> int: ...

    def plain(self, markdown: str) -> str:
        """The text as it reads once rendered (a part with none is not sent)."""
        ...

    async def post(self, markdown: str) -> None: ...

    async def edit(self, message_id: str, markdown: str) -> None: ...

    async def retire(self, message_id: str) -> None: ...

    async def notice(self, text: str) -> None: ...

    async def upload(self, data: bytes, name: str, mime: str, kind: str, *, comment: str = "") -> None: ...


async def send_parts(parts: Sequence[Part], target: Callable[[int], PartTarget], *, skip_parts: int = 0,
                     on_part: PartCallback | None = None) -> None:
    """Send ``parts`` from ``skip_parts`` on, each to ``target(index)`` (the first part may reply
    to the message that asked), reporting progress after each."""
    async def send(index: int, part: Part) -> None:
        await send_part(target(index), part)

    await deliver_parts(parts, send, skip_parts=skip_parts, on_part=on_part)


async def send_part(target: PartTarget, part: Part) -> None:
    if isinstance(part, TextPart) and part.edit is not None:
        try:
            await target.edit(part.edit, part.markdown)
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            log.warning("%s: cannot edit the streamed message %s (%s); sending the answer anew",
                        target.where, part.edit, exc)
            await target.post(part.markdown)
    elif isinstance(part, TextPart):
        if target.plain(part.markdown).strip():
            await target.post(part.markdown)
    elif isinstance(part, RetirePart):
        try:
            await target.retire(part.message_id)
        except DeliveryError as exc:
            log.warning("%s: could not %s the streamed message: %s", target.where, target.retire_verb, exc)
    elif isinstance(part, NoticePart):
        await target.notice(part.text)
    elif isinstance(part, ReplyDocumentPart):
        try:
            await target.upload(reply_document(part.text), REPLY_DOCUMENT_NAME, REPLY_DOCUMENT_MIME, "document",
                                comment=part.note)
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            await target.notice(attach_failure_line(REPLY_DOCUMENT_NAME, f"{target.platform} refused it ({exc})"))
    else:
        await _send_file(target, part)


async def _send_file(target: PartTarget, part: FilePart) -> None:
    opened = open_for_upload(part.ref, target.workspace, limit=target.upload_max_bytes, platform=target.platform,
                             where=target.where)
    if isinstance(opened, str):
        await target.notice(opened)
        return
    media: OutboundMedia = opened
    try:
        media.file.seek(0)
        data = media.file.read()
        try:
            await target.upload(data, media.name, media.mime, media.kind)
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            log.warning("%s: %s refused: %s", target.where, media.name, exc)
            await target.notice(attach_failure_line(media.name, f"{target.platform} refused it"))
    finally:
        media.close()
