"""Decide how an outbound file is sent: as an image, video, animation, audio, voice note or document.

The bytes decide first (``talon.media.sniff``). A model may name a text file ``chart.png``; sending
it as a photo would fail at the platform, so content that is not recognisably media is always a
document. The name decides second: it only refines what the bytes leave open (an MP4 with no
readable track list, an audio-only WebM) and supplies the MIME type of documents. Nothing that
passed the path checks is refused here: whatever it is, it can go as a document.
"""

from __future__ import annotations

import mimetypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import unquote

from talon.errors import MediaPathError
from talon.media.outbound import MarkdownMediaRef
from talon.media.paths import CheckedFile, HoldsOpenFile, open_checked_media
from talon.media.sniff import Sniffed, looks_like_text, sniff

__all__ = ["MediaKind", "OutboundMedia", "outbound_channel_media"]

MediaKind = Literal["image", "video", "animation", "audio", "voice", "document"]

_HEAD_BYTES = 4096


@dataclass
class OutboundMedia(HoldsOpenFile):
    """One file ready for a channel: its kind, the open file it was checked through, and facts."""

    kind: MediaKind
    path: Path
    caption: str
    file: BinaryIO
    name: str
    size: int
    mime: str


# --- kind and MIME type --------------------------------------------------------------------

# Stills every chat client shows as a photo; TIFF and HEIF/AVIF go as files.
_PHOTO_FORMATS = {"png", "jpeg", "webp", "bmp"}


def _kind_of(sniffed: Sniffed | None) -> MediaKind:
    """How a file is sent, from what its bytes are (see ``talon.media.sniff``)."""
    if sniffed is None:
        return "document"
    if sniffed.format == "gif":
        return "animation"
    if sniffed.format == "opus":
        return "voice"
    if sniffed.family == "image":
        return "image" if sniffed.format in _PHOTO_FORMATS else "document"
    if sniffed.family == "audio":
        return "audio"
    if sniffed.family == "video":
        return "video"
    return "document"


def _document_mime(sniffed: str | None, name: str, head: bytes) -> str:
    guessed, _ = mimetypes.guess_type(name)
    media_guess = guessed is not None and guessed.split("/")[0] in ("image", "audio", "video")
    if sniffed == "application/zip" and guessed and not media_guess:
        return guessed  # docx, xlsx, epub... are zip files with a telling name
    if sniffed:
        return sniffed
    if guessed and not media_guess:
        return guessed
    # The name claimed media the bytes are not: say what the bytes are.
    return "text/plain" if looks_like_text(head) else "application/octet-stream"


# --- entry point ----------------------------------------------------------------------------


def _open(path: str, root: Path) -> tuple[CheckedFile, str]:
    """Open the path as written; failing that, its percent-decoded form (models often write
    ``my%20chart.png`` for a file named ``my chart.png``). Both go through the same checks."""
    try:
        return open_checked_media(path, root), path
    except MediaPathError:
        decoded = unquote(path)
        if decoded == path:
            raise
        try:
            return open_checked_media(decoded, root), decoded
        except MediaPathError:
            pass
        raise


def outbound_channel_media(ref: MarkdownMediaRef, caption: str, root: Path) -> OutboundMedia:
    """Resolve, open and classify one lifted reference; the caller closes the result.

    Raises ``MediaPathError`` with a specific reason when the path may not be sent.
    """
    checked, used = _open(ref.path, root)
    try:
        name = Path(used).name or checked.name
        fd = checked.file.fileno()
        head = os.pread(fd, _HEAD_BYTES, 0)
        sniffed = sniff(head, name=name, fd=fd, size=checked.size)
        kind = _kind_of(sniffed)
        mime = sniffed.mime if sniffed is not None else None
        if kind == "document":
            mime = _document_mime(mime, name, head)
        assert mime is not None
        return OutboundMedia(
            kind=kind,
            path=checked.path,
            caption=caption,
            file=checked.file,
            name=name,
            size=checked.size,
            mime=mime,
        )
    except BaseException:
        checked.close()
        raise
