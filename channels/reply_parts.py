"""The parts of a reply for channels that send text and files as separate messages (Matrix, and
the channels after it), planned from the reply alone (pure), so that ``skip_parts`` means the same
thing when a delivery is resumed after a crash.

Parts, in order: the text rendered and cut at the platform's limit (``split``: markdown pieces
that each fit once rendered); past ``max_messages`` pieces the first goes as text and the whole
reply as ``reply.md`` (``talon.render.long_reply``); then one part per file; then the notices as
plain text. A streamed answer (``reply.live_message_id``): the first text part is the last edit
of the message that showed it while it was written (``TextPart.edit``); a reply with no text at
all retires that message (``RetirePart``). Telegram plans its own parts (albums, captions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from talon.envelope import OutboundReply
from talon.media import MarkdownMediaRef
from talon.render.long_reply import long_reply_note

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
