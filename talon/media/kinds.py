"""Decide how an outbound file is sent: as an image, video, animation, audio, voice note or document.

The bytes decide first. A model may name a text file ``chart.png``; sending it as a photo would
fail at the platform, so content that is not recognisably media is always a document. The name
decides second: it only refines what the bytes leave open (an MP4 with no readable track list, an
audio-only WebM) and supplies the MIME type of documents. Nothing that passed the path checks is
refused here: whatever it is, it can go as a document.
"""

from __future__ import annotations

import mimetypes
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal
from urllib.parse import unquote

from talon.errors import MediaPathError
from talon.media.outbound import MarkdownMediaRef
from talon.media.paths import CheckedFile, open_checked_media

__all__ = ["MediaKind", "OutboundMedia", "outbound_channel_media", "sniff_kind"]

MediaKind = Literal["image", "video", "animation", "audio", "voice", "document"]

_HEAD_BYTES = 4096
# The track list of an MP4 (moov) can sit after the media data; read at most this much of it.
_MOOV_READ_MAX = 4 * 1024 * 1024
_MAX_TOP_BOXES = 64

_AUDIO_EXTS = {".m4a", ".m4b", ".aac", ".mka", ".weba", ".oga", ".opus", ".mp3", ".wav", ".flac"}


@dataclass
class OutboundMedia:
    """One file ready for a channel: its kind, the open file it was checked through, and facts."""

    kind: MediaKind
    path: Path
    caption: str
    file: BinaryIO
    name: str
    size: int
    mime: str

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> OutboundMedia:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- content sniffing -----------------------------------------------------------------------


def _mp3_frame(head: bytes) -> bool:
    """A plausible MPEG audio frame header (layer I-III) at the very start."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return False
    version = (head[1] >> 3) & 3
    layer = (head[1] >> 1) & 3
    bitrate = head[2] >> 4
    rate = (head[2] >> 2) & 3
    return version != 1 and layer != 0 and bitrate != 15 and rate != 3


def _adts(head: bytes) -> bool:
    return len(head) >= 7 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0


def _bmp(head: bytes) -> bool:
    # "BM" alone is too weak; require the reserved zeros and a known DIB header size.
    if len(head) < 18 or head[:2] != b"BM" or head[6:10] != b"\0\0\0\0":
        return False
    return int.from_bytes(head[14:18], "little") in (12, 40, 52, 56, 64, 108, 124)


def _iso_handlers(fd: int, size: int) -> set[bytes]:
    """Track handler types (b'vide', b'soun'...) from an ISO-BMFF file's moov box."""
    offset = 0
    for _ in range(_MAX_TOP_BOXES):
        if offset + 8 > size:
            break
        header = os.pread(fd, 16, offset)
        if len(header) < 8:
            break
        box_size = int.from_bytes(header[:4], "big")
        header_len = 8
        if box_size == 1 and len(header) >= 16:
            box_size = int.from_bytes(header[8:16], "big")
            header_len = 16
        elif box_size == 0:
            box_size = size - offset
        if box_size < header_len:
            break
        if header[4:8] == b"moov":
            body = os.pread(fd, min(box_size, _MOOV_READ_MAX), offset)
            found: set[bytes] = set()
            at = body.find(b"hdlr")
            while at >= 0:
                found.add(body[at + 12 : at + 16])
                at = body.find(b"hdlr", at + 4)
            return found
        offset += box_size
    return set()


_ISO_AUDIO_BRANDS = {b"M4A ", b"M4B ", b"M4P ", b"F4A ", b"F4B "}
_ISO_IMAGE_BRANDS = {
    b"heic": "image/heic",
    b"heix": "image/heic",
    b"mif1": "image/heif",
    b"msf1": "image/heif",
    b"avif": "image/avif",
    b"avis": "image/avif",
}


def _sniff_iso(head: bytes, fd: int, size: int, suffix: str) -> tuple[MediaKind, str]:
    brand = head[8:12]
    if brand in _ISO_IMAGE_BRANDS:
        # HEIF/AVIF stills: not every client shows them as photos, so they go as files.
        return "document", _ISO_IMAGE_BRANDS[brand]
    handlers = _iso_handlers(fd, size)
    video_mime = "video/quicktime" if brand == b"qt  " else (
        "video/3gpp" if brand.startswith(b"3g") else "video/mp4"
    )
    if b"vide" in handlers:
        return "video", video_mime
    if b"soun" in handlers or brand in _ISO_AUDIO_BRANDS:
        return "audio", "audio/mp4"
    if suffix in _AUDIO_EXTS:
        return "audio", "audio/mp4"
    return "video", video_mime


def _sniff_ogg(head: bytes) -> tuple[MediaKind, str]:
    if b"OpusHead" in head:
        return "voice", "audio/ogg"
    if b"\x80theora" in head:
        return "video", "video/ogg"
    return "audio", "audio/ogg"  # Vorbis, FLAC-in-Ogg, Speex


def _looks_like_text(head: bytes) -> bool:
    if not head or b"\0" in head:
        return False
    for trim in range(4):  # the read may have cut a multi-byte character in half
        try:
            head[: len(head) - trim].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def sniff_kind(head: bytes, *, name: str = "", fd: int | None = None, size: int = 0) -> tuple[
    MediaKind, str | None
]:
    """(kind, mime) from the first bytes; mime None means the content was not recognised.

    ``fd`` and ``size`` let MP4-family files be inspected past the head for their track list.
    """
    suffix = Path(name).suffix.lower()
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image", "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image", "image/jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "animation", "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image", "image/webp"
    if _bmp(head):
        return "image", "image/bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio", "audio/wav"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "video", "video/x-msvideo"
    if head[4:8] == b"ftyp" and len(head) >= 12:
        if fd is None:
            return ("audio", "audio/mp4") if head[8:12] in _ISO_AUDIO_BRANDS else ("video", "video/mp4")
        return _sniff_iso(head, fd, size, suffix)
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        if suffix in _AUDIO_EXTS:
            return "audio", "audio/webm" if b"webm" in head else "audio/x-matroska"
        return "video", "video/webm" if b"webm" in head else "video/x-matroska"
    if head.startswith(b"OggS"):
        return _sniff_ogg(head)
    if head.startswith(b"fLaC"):
        return "audio", "audio/flac"
    if head.startswith(b"ID3") or _mp3_frame(head):
        return "audio", "audio/mpeg"
    if _adts(head):
        return "audio", "audio/aac"
    if head.startswith(b"#!AMR"):
        return "audio", "audio/amr"
    if head.startswith(b"%PDF-"):
        return "document", "application/pdf"
    if head.startswith((b"II*\0", b"MM\0*")):
        return "document", "image/tiff"
    if head.startswith(b"PK\x03\x04"):
        return "document", "application/zip"
    stripped = head.lstrip()[:512]
    if stripped.startswith((b"<svg", b"<?xml")) and b"<svg" in head:
        return "document", "image/svg+xml"
    return "document", None


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
    return "text/plain" if _looks_like_text(head) else "application/octet-stream"


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
        kind, mime = sniff_kind(head, name=name, fd=fd, size=checked.size)
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
