"""The parts of a WhatsApp reply, planned from the reply alone (pure), and their JSON form for the
messages that wait for the 24-hour window (``window.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote

from talon.config import Limits
from talon.envelope import OutboundReply
from talon.media import MarkdownMediaRef
from talon.render.long_reply import long_reply_note
from talon.render.whatsapp import markdown_to_whatsapp, split_for_whatsapp

CAPTION_MAX = 1024  # WhatsApp shows at most this much under a photo or video

@dataclass(frozen=True)
class TextPart:
    """One message body, already in WhatsApp formatting, at most 1600 characters."""

    body: str


@dataclass(frozen=True)
class NoticePart:
    text: str


@dataclass(frozen=True)
class MediaPart:
    """One file; ``caption`` is a WhatsApp-formatted body ("" for none)."""

    ref: MarkdownMediaRef
    caption: str = ""


@dataclass(frozen=True)
class ReplyDocumentPart:
    """The whole of a very long reply, sent as ``reply.md`` (``talon.render.long_reply``)."""

    text: str
    note: str


Part = TextPart | NoticePart | MediaPart | ReplyDocumentPart

_CAPTIONED_NAMES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".mp4", ".3gp", ".mov", ".m4v"}


def plan_parts(reply: OutboundReply, limits: Limits, *, can_attach: bool = True) -> list[Part]:
    """The ordered parts of a reply; a function of the reply alone (see the module docstring).

    Past ``whatsapp_reply_max_messages`` messages the head goes as text and the whole reply as
    ``reply.md`` (only where files can be sent: without a public URL every message goes).
    """
    rendered = markdown_to_whatsapp(reply.text) if reply.text.strip() else ""
    chunks = [c for c in split_for_whatsapp(rendered, limits.whatsapp_body_max) if c.strip()]
    document: ReplyDocumentPart | None = None
    if can_attach and len(chunks) > limits.whatsapp_reply_max_messages:
        document = ReplyDocumentPart(reply.text, long_reply_note(len(reply.text), len(chunks)))
        chunks = chunks[:1]
    caption = ""
    if (len(reply.media) == 1 and len(chunks) == 1 and len(chunks[0]) <= CAPTION_MAX
            and PurePosixPath(unquote(reply.media[0].path)).suffix.lower() in _CAPTIONED_NAMES):
        caption, chunks = chunks[0], []
    parts: list[Part] = [TextPart(chunk) for chunk in chunks]
    if document is not None:
        parts += [NoticePart(document.note), document]
    parts.extend(MediaPart(ref, caption if i == 0 else "") for i, ref in enumerate(reply.media))
    for notice in reply.notices:
        parts.extend(NoticePart(c) for c in split_for_whatsapp(notice, limits.whatsapp_body_max) if c.strip())
    return parts



@dataclass(frozen=True)
class ApprovalPart:
    """An approval prompt that waits for the window: the whole prompt, then its buttons."""

    approval_id: str
    text: str


def part_json(part: Part | ApprovalPart) -> str:
    if isinstance(part, TextPart):
        return json.dumps({"kind": "text", "body": part.body})
    if isinstance(part, NoticePart):
        return json.dumps({"kind": "notice", "text": part.text})
    if isinstance(part, MediaPart):
        return json.dumps({"kind": "media", "alt": part.ref.alt, "path": part.ref.path, "caption": part.caption})
    if isinstance(part, ReplyDocumentPart):
        return json.dumps({"kind": "document", "text": part.text, "note": part.note})
    return json.dumps({"kind": "approval", "id": part.approval_id, "text": part.text})


def part_of(payload: str) -> Part | ApprovalPart | None:
    """The part a JSON form names; None for one this version does not know."""
    try:
        data = json.loads(payload)
        kind = data["kind"]
        if kind == "text":
            return TextPart(str(data["body"]))
        if kind == "notice":
            return NoticePart(str(data["text"]))
        if kind == "media":
            return MediaPart(MarkdownMediaRef(alt=str(data["alt"]), path=str(data["path"])), str(data["caption"]))
        if kind == "document":
            return ReplyDocumentPart(str(data["text"]), str(data["note"]))
        if kind == "approval":
            return ApprovalPart(str(data["id"]), str(data["text"]))
    except (ValueError, KeyError, TypeError):
        return None
    return None
