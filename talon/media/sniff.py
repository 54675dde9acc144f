"""What a file is, judged by its first bytes: the one content sniffer behind every file decision.

Magic numbers decide; a name never turns bytes that are not recognisably media into media. The
name only settles what the bytes leave open: an MP4-family or Matroska/WebM container may hold
video or only sound, and where no track list says which, an audio name (``song.m4a``) does.

Each caller maps the detailed answer onto its own categories: the inbound router
(``talon.media.inbound``), ``read_file`` (``talon.agent.tools.file_readers``) and the outbound
classifier (``talon.media.kinds``). Telling text from unknown binary is each caller's own rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["SNIFF_BYTES", "Family", "Sniffed", "looks_like_text", "sniff"]

SNIFF_BYTES = 8192
"""How much of a file's start callers read for sniffing (a shorter head only when the file is)."""

# The track list of an MP4 (moov) can sit after the media data; read at most this much of it.
_MOOV_READ_MAX = 4 * 1024 * 1024
_MAX_TOP_BOXES = 64
# How far into a file a PDF header may sit behind leading junk (readers accept up to 1024 bytes).
_PDF_HEADER_WITHIN = 1024
_TS_PACKET = 188

# Names that say "sound only" for a container that may hold video or sound.
_AUDIO_SUFFIXES = {".m4a", ".m4b", ".aac", ".mka", ".weba", ".oga", ".ogg", ".opus", ".mp3", ".wav", ".flac", ".wma"}

Family = Literal["image", "audio", "video", "document"]


@dataclass(frozen=True)
class Sniffed:
    """What the bytes are.

    ``format`` names the container (or codec where the container says little): png, jpeg, gif,
    webp, bmp, tiff, heif, avif, wav, avi, mp4 (every ISO-BMFF file: MP4, MOV, 3GP, M4A), webm,
    matroska, opus (Opus in Ogg), theora (Theora video in Ogg), ogg (other Ogg), flac, mp3, aac,
    amr, caf, flv, mpegts, pdf, zip, svg. ``family`` is what the content is to a person.
    """

    format: str
    family: Family
    mime: str


_GIF = Sniffed("gif", "image", "image/gif")
_TIFF = Sniffed("tiff", "image", "image/tiff")
_MP3 = Sniffed("mp3", "audio", "audio/mpeg")
_AAC = Sniffed("aac", "audio", "audio/aac")
_PDF = Sniffed("pdf", "document", "application/pdf")

_PREFIXES: tuple[tuple[bytes, Sniffed], ...] = (
    (b"\x89PNG\r\n\x1a\n", Sniffed("png", "image", "image/png")),
    (b"\xff\xd8\xff", Sniffed("jpeg", "image", "image/jpeg")),
    (b"GIF87a", _GIF),
    (b"GIF89a", _GIF),
    (b"II*\x00", _TIFF),
    (b"MM\x00*", _TIFF),
    (b"fLaC", Sniffed("flac", "audio", "audio/flac")),
    (b"ID3", _MP3),
    (b"#!AMR", Sniffed("amr", "audio", "audio/amr")),
    (b"caff\x00\x01", Sniffed("caf", "audio", "audio/x-caf")),
    (b"FLV\x01", Sniffed("flv", "video", "video/x-flv")),
    (b"%PDF-", _PDF),
    (b"PK\x03\x04", Sniffed("zip", "document", "application/zip")),
)
_RIFF_FORMS = {
    b"WEBP": Sniffed("webp", "image", "image/webp"),
    b"WAVE": Sniffed("wav", "audio", "audio/wav"),
    b"AVI ": Sniffed("avi", "video", "video/x-msvideo"),
}
_ISO_AUDIO_BRANDS = {b"M4A ", b"M4B ", b"M4P ", b"F4A ", b"F4B "}
_ISO_IMAGE_BRANDS = {
    b"heic": "image/heic",
    b"heix": "image/heic",
    b"hevc": "image/heic-sequence",
    b"mif1": "image/heif",
    b"msf1": "image/heif",
    b"avif": "image/avif",
    b"avis": "image/avif",
}


def sniff(head: bytes, *, name: str = "", fd: int | None = None, size: int = 0) -> Sniffed | None:
    """What the first bytes of a file announce, or None when they announce no known format.

    ``name`` settles an audio-or-video container the bytes leave open; ``fd`` and ``size`` (an
    open file and its length) let an MP4-family file be read past the head for its track list.
    """
    for prefix, known in _PREFIXES:
        if head.startswith(prefix):
            return known
    if head[:4] == b"RIFF" and head[8:12] in _RIFF_FORMS:
        return _RIFF_FORMS[head[8:12]]
    if _bmp(head):
        return Sniffed("bmp", "image", "image/bmp")
    audio_name = Path(name).suffix.lower() in _AUDIO_SUFFIXES
    if head[4:8] == b"ftyp" and len(head) >= 12:
        return _sniff_iso(head, audio_name, fd, size)
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        container = "webm" if b"webm" in head else "matroska"
        family: Family = "audio" if audio_name else "video"
        mime = f"{family}/webm" if container == "webm" else f"{family}/x-matroska"
        return Sniffed(container, family, mime)
    if head.startswith(b"OggS"):
        if b"\x80theora" in head:  # before Opus: a video's sound track does not make it a voice note
            return Sniffed("theora", "video", "video/ogg")
        if b"OpusHead" in head:
            return Sniffed("opus", "audio", "audio/ogg")
        return Sniffed("ogg", "audio", "audio/ogg")  # Vorbis, FLAC-in-Ogg, Speex
    mpeg_audio = _mpeg_audio_frame(head)
    if mpeg_audio is not None:
        return mpeg_audio
    if _mpeg_ts(head):
        return Sniffed("mpegts", "video", "video/mp2t")
    if head.lstrip()[:512].startswith((b"<svg", b"<?xml")) and b"<svg" in head:
        return Sniffed("svg", "document", "image/svg+xml")
    if head.find(b"%PDF-", 0, _PDF_HEADER_WITHIN) > 0 and not looks_like_text(head):
        return _PDF  # a PDF behind leading junk; a text that merely mentions "%PDF-" stays text
    return None


def looks_like_text(head: bytes) -> bool:
    """Non-empty, no NUL byte, and UTF-8 (the head may end inside a multi-byte character)."""
    if not head or b"\0" in head:
        return False
    for trim in range(4):  # the read may have cut a multi-byte character in half
        try:
            head[: len(head) - trim].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def _bmp(head: bytes) -> bool:
    # "BM" alone is too weak; require the reserved zeros and a known DIB header size.
    if len(head) < 18 or head[:2] != b"BM" or head[6:10] != b"\0\0\0\0":
        return False
    return int.from_bytes(head[14:18], "little") in (12, 40, 52, 56, 64, 108, 124)


def _mpeg_audio_frame(head: bytes) -> Sniffed | None:
    """An MPEG audio (layer II/III) or ADTS AAC frame header at the very start."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    if head[1] & 0xF6 == 0xF0:
        return _AAC if len(head) >= 7 else None
    version = (head[1] >> 3) & 3
    layer = (head[1] >> 1) & 3
    bitrate = head[2] >> 4
    rate = (head[2] >> 2) & 3
    # Layer I (3) is left out: it is extinct, and its pattern (FF FE, FF FF) is also the UTF-16 LE
    # byte-order mark. Version 1, bitrate 15 and rate 3 are reserved values.
    if layer in (1, 2) and version != 1 and bitrate != 15 and rate != 3:
        return _MP3
    return None


def _mpeg_ts(head: bytes) -> bool:
    """A sync byte (0x47) at the start of every 188-byte packet, at least three packets long."""
    if len(head) <= 2 * _TS_PACKET:
        return False
    return all(head[i] == 0x47 for i in range(0, len(head), _TS_PACKET))


def _sniff_iso(head: bytes, audio_name: bool, fd: int | None, size: int) -> Sniffed:
    brand = head[8:12]
    if brand in _ISO_IMAGE_BRANDS:
        mime = _ISO_IMAGE_BRANDS[brand]
        return Sniffed("avif" if mime == "image/avif" else "heif", "image", mime)
    handlers = _iso_handlers(fd, size) if fd is not None else set()
    if b"vide" not in handlers and (b"soun" in handlers or brand in _ISO_AUDIO_BRANDS or audio_name):
        return Sniffed("mp4", "audio", "audio/mp4")
    video = "video/quicktime" if brand == b"qt  " else "video/3gpp" if brand.startswith(b"3g") else "video/mp4"
    return Sniffed("mp4", "video", video)


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
