"""Fit one outbound file to what WhatsApp (through Twilio) can carry.

WhatsApp plays a narrow set of types, one media item per message, at most 16 MB each (5 MB for
images, 100 MB for documents). ``fit_for_whatsapp`` takes a file that already passed the media-root checks (an
``OutboundMedia``, read through its open file, never reopened by path) and decides how it goes:

- image: JPEG/PNG within 5 MB as is; anything else that is an image (WebP, BMP, a larger photo) is
  re-encoded to JPEG/PNG within 5 MB; an image that cannot be decoded goes as a document.
- video: MP4/3GPP as is, other containers as documents (WhatsApp would refuse them as video).
- voice: OGG/Opus as is. Audio WhatsApp cannot play (WAV, FLAC, Vorbis, WebM...) and audio meant as
  a voice note (its name or alt text says "voice") is transcoded to OGG/Opus with PyAV; MP3, AAC,
  M4A and AMR otherwise go as audio. Audio that cannot be decoded goes as a document.
- GIFs and everything else: document.

Everything here is synchronous and CPU-bound; the channel runs it in a worker thread. Pillow and
PyAV are imported there, by the first file that needs them.
"""

from __future__ import annotations

import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO, Literal

from talon.config import MB, Limits
from talon.errors import MediaError, MediaTooLarge
from talon.media import OutboundMedia

log = logging.getLogger(__name__)

WaKind = Literal["image", "video", "audio", "voice", "document"]

IMAGE_MIMES = frozenset({"image/jpeg", "image/png"})
VIDEO_MIMES = frozenset({"video/mp4", "video/3gpp"})
AUDIO_MIMES = frozenset({"audio/mpeg", "audio/mp4", "audio/aac", "audio/amr"})
# Kinds that show the message body as a caption under the media.
CAPTIONED_KINDS = frozenset({"image", "video"})

IMAGE_MAX_SIDE = 4096  # WhatsApp shows far less; this only bounds the re-encode's work
OPUS_RATE = 48_000
OPUS_BIT_RATE = 32_000


@dataclass(frozen=True)
class WhatsAppMedia:
    """How one file goes out: as the checked file itself (``data`` None) or as derived bytes."""

    kind: WaKind
    name: str
    mime: str
    size: int
    data: bytes | None = None
    note: str = ""  # what was changed, for the log


def meant_as_voice(name: str, alt: str) -> bool:
    return "voice" in f"{PurePosixPath(name).stem} {alt}".lower()


def fit_for_whatsapp(media: OutboundMedia, limits: Limits, *, voice: bool = False) -> WhatsAppMedia:
    """Decide how ``media`` is sent; raises ``MediaError`` when it cannot go at all."""
    if media.size == 0:
        raise MediaError("the file is empty")
    fitted = _fit(media, limits, voice)
    limit = limits.whatsapp_document_max_bytes if fitted.kind == "document" else limits.whatsapp_media_max_bytes
    if fitted.size > limit:
        raise MediaTooLarge(
            f"it is {fitted.size / MB:.1f} MB, over WhatsApp's {limit / MB:.0f} MB limit for "
            f"{'a document' if fitted.kind == 'document' else 'media'}"
        )
    return fitted


def _as_is(media: OutboundMedia, kind: WaKind) -> WhatsAppMedia:
    return WhatsAppMedia(kind=kind, name=media.name, mime=media.mime, size=media.size)


def _fit(media: OutboundMedia, limits: Limits, voice: bool) -> WhatsAppMedia:
    if media.kind == "image":
        if media.mime in IMAGE_MIMES and media.size <= limits.whatsapp_image_max_bytes:
            return _as_is(media, "image")
        try:
            return reencode_image(media, limits)
        except Exception as exc:  # any decoder failure: the file itself can still go
            log.info("whatsapp: %s cannot be re-encoded (%s); sending it as a document", media.name, exc)
            return _as_is(media, "document")
    if media.kind == "video":
        return _as_is(media, "video" if media.mime in VIDEO_MIMES else "document")
    if media.kind == "voice" and media.mime == "audio/ogg":
        return _as_is(media, "voice")
    if media.kind in ("audio", "voice"):
        playable = media.mime in AUDIO_MIMES
        if playable and not voice:
            return _as_is(media, "audio")
        try:
            return transcode_voice(media, limits)
        except Exception as exc:
            fallback: WaKind = "audio" if playable else "document"
            log.info("whatsapp: %s cannot be transcoded to OGG/Opus (%s); sending it as %s",
                     media.name, exc, fallback)
            return _as_is(media, fallback)
    return _as_is(media, "document")


def _renamed(name: str, suffix: str) -> str:
    stem = PurePosixPath(name).stem or "file"
    return stem + suffix


def reencode_image(media: OutboundMedia, limits: Limits) -> WhatsAppMedia:
    """The image as JPEG (or PNG with transparency) within WhatsApp's image limit."""
    from PIL import Image  # Pillow and PyAV load with the first file that needs them, not with Talon

    from talon.media.images import encode_to_fit, upright

    fh: BinaryIO = media.file
    fh.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im = Image.open(fh)
    with im:
        pixels = im.size[0] * im.size[1]
        if pixels > limits.image_max_pixels:
            raise MediaError(f"{pixels / 1e6:.0f} MP is over the {limits.image_max_pixels / 1e6:.0f} MP decode limit")
        im.load()
        data, mime, (w, h) = encode_to_fit(
            upright(im), max_side=IMAGE_MAX_SIDE, max_bytes=limits.whatsapp_image_max_bytes
        )
    name = _renamed(media.name, ".png" if mime == "image/png" else ".jpg")
    return WhatsAppMedia(kind="image", name=name, mime=mime, size=len(data), data=data,
                         note=f"re-encoded from {media.mime}, {media.size:,} bytes, to {w}x{h}")


def transcode_voice(media: OutboundMedia, limits: Limits) -> WhatsAppMedia:
    """The audio as an OGG/Opus voice note (mono, 48 kHz), within the audio limits."""
    import av

    if media.size > limits.audio_max_bytes:
        raise MediaError(f"{media.size / MB:.1f} MB is over the {limits.audio_max_bytes / MB:.0f} MB audio limit")
    fh = media.file
    fh.seek(0)
    cap = int(limits.audio_max_seconds * OPUS_RATE)
    out_buf = io.BytesIO()
    written = 0
    with av.open(fh, mode="r", metadata_errors="ignore") as src:
        if not src.streams.audio:
            raise MediaError("it has no audio track")
        stream = src.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=OPUS_RATE)
        with av.open(out_buf, "w", format="ogg") as out:
            enc = out.add_stream("libopus", rate=OPUS_RATE)
            enc.layout = "mono"
            enc.bit_rate = OPUS_BIT_RATE

            def push(frames: list[av.AudioFrame]) -> None:
                nonlocal written
                for frame in frames:
                    written += frame.samples
                    if written > cap:
                        raise MediaError(f"it is longer than {limits.audio_max_seconds / 60:.0f} minutes")
                    for packet in enc.encode(frame):
                        out.mux(packet)

            for frame in src.decode(stream):
                push(resampler.resample(frame))
            push(resampler.resample(None))
            for packet in enc.encode(None):
                out.mux(packet)
    if written == 0:
        raise MediaError("it contains no audio samples")
    data = out_buf.getvalue()
    return WhatsAppMedia(kind="voice", name=_renamed(media.name, ".ogg"), mime="audio/ogg",
                         size=len(data), data=data,
                         note=f"transcoded from {media.mime} to OGG/Opus ({written / OPUS_RATE:.1f}s)")
