"""The parts of a Telegram reply, planned from the reply alone (pure).

- The list is derived from the reply alone (its text and the *names* of its media references),
  never from the disk, so the same reply always gives the same list and ``skip_parts`` means the
  same thing after a crash. Files are resolved, contained and opened only when their part is sent.
- Parts, in order: the text as rendered HTML chunks (each <= 4096 UTF-16 units, code blocks never
  split open); then the media, one part per file, except that 2-10 consecutive references whose
  names look like images form one album part (sendMediaGroup; a longer run is cut into balanced
  albums of at most 10); then the reply's notices as plain text.
- Caption: when the media form exactly one part (one file or one album) and the whole text renders
  to at most 1024 UTF-16 units, the text becomes that part's caption (on the album's first item)
  instead of a message of its own. Otherwise the text goes first and the media follow without
  captions, so a caption never has to be cut.
- A streamed answer (``reply.live_message_id``): the first text part is the last edit of the
  message that showed the answer while it was written (``TextPart.edit``), never a caption; a
  reply with no text at all retires that message (``RetirePart``: it is deleted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote

from talon.config import Limits
from talon.envelope import OutboundReply
from talon.media import MarkdownMediaRef
from talon.render.long_reply import long_reply_note
from talon.render.telegram import markdown_to_telegram_html, split_markdown_for_telegram, utf16_len


@dataclass(frozen=True)
class TextPart:
    """One chunk of the reply's markdown, sent as an HTML message; with ``edit``, the message of
    that id (the streamed one) is edited to it instead."""

    markdown: str
    edit: int | None = None


@dataclass(frozen=True)
class RetirePart:
    """The streamed message of a reply that has no text after all: it is deleted."""

    message_id: int


@dataclass(frozen=True)
class NoticePart:
    """A line for the person (a notice), sent as plain text."""

    text: str


@dataclass(frozen=True)
class MediaPart:
    """One file, or 2-10 images sent as one album; ``caption`` is markdown ("" for none)."""

    refs: tuple[MarkdownMediaRef, ...]
    caption: str = ""


@dataclass(frozen=True)
class ReplyDocumentPart:
    """The whole of a very long reply, sent as a document (``talon.render.long_reply``)."""

    text: str
    note: str


Part = TextPart | NoticePart | MediaPart | RetirePart | ReplyDocumentPart

_IMAGE_NAME = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp"})
ALBUM_MAX = 10


def plan_parts(reply: OutboundReply, limits: Limits) -> list[Part]:
    """The ordered parts of a reply; a function of the reply alone (see the module docstring)."""
    chunks = [chunk for chunk in split_markdown_for_telegram(reply.text, limits.telegram_text_max)
              if chunk.strip()]
    document: ReplyDocumentPart | None = None
    if len(chunks) > limits.telegram_reply_max_messages:
        # Past a few messages the head goes as text and the whole reply as reply.md.
        document = ReplyDocumentPart(reply.text, long_reply_note(len(reply.text), len(chunks)))
        chunks = chunks[:1]
    groups = _media_groups(reply.media)
    live = int(reply.live_message_id) if reply.live_message_id else None
    caption = ""
    if (live is None and len(groups) == 1 and len(chunks) == 1
            and utf16_len(markdown_to_telegram_html(chunks[0])) <= limits.telegram_caption_max):
        caption, chunks = chunks[0], []
    parts: list[Part] = [TextPart(chunk, edit=live if i == 0 else None) for i, chunk in enumerate(chunks)]
    if live is not None and not chunks:
        parts.append(RetirePart(live))
    if document is not None:
        parts.append(document)
    parts.extend(MediaPart(group, caption if i == 0 else "") for i, group in enumerate(groups))
    parts.extend(NoticePart(notice) for notice in reply.notices if notice.strip())
    return parts


def _looks_like_image(ref: MarkdownMediaRef) -> bool:
    return PurePosixPath(unquote(ref.path)).suffix.lower() in _IMAGE_NAME


def _media_groups(refs: list[MarkdownMediaRef]) -> list[tuple[MarkdownMediaRef, ...]]:
    """One group per file, except runs of image names, which become albums of 2-10."""
    groups: list[tuple[MarkdownMediaRef, ...]] = []
    run: list[MarkdownMediaRef] = []

    def flush() -> None:
        # Balanced albums: 11 images are 6 + 5, never 10 + a lone photo.
        count = -(-len(run) // ALBUM_MAX)
        for i in range(count):
            album = run[len(run) * i // count: len(run) * (i + 1) // count]
            groups.append(tuple(album))
        run.clear()

    for ref in refs:
        if _looks_like_image(ref):
            run.append(ref)
            continue
        flush()
        groups.append((ref,))
    flush()
    return groups
