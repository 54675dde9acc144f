"""Inbound images: prove the bytes are an image, make them safe and small enough for a model.

Everything here is synchronous and CPU-bound; callers run it in a bounded executor.

The order of checks matters:

1. ``Image.open`` only parses the header, so the decompression-bomb guard (``width * height``
   against ``Limits.image_max_pixels``) runs before a single pixel is decoded.
2. JPEGs are decoded with ``Image.draft``: libjpeg scales by 1/2, 1/4 or 1/8 inside the DCT, which
   is several times faster than decoding full size and resizing (a 24 MP phone photo is the
   common case). The decoder still walks the whole stream, so truncation is still caught.
3. The pixels are fully decoded (``load``): that, not the extension, is the proof of an image.
4. Downscale to ``image_max_side``, apply the EXIF orientation, re-encode stepping quality and
   then size down until the bytes fit ``image_max_bytes`` once base64-encoded (providers count
   their per-image cap on the base64 they receive). A large photo is made smaller, never
   dropped. Deep-colour pixels (16-bit, float) are scaled to 8 bits, not clipped.

The re-encoded image carries no EXIF block: the orientation is already applied to the pixels, and
camera metadata such as GPS position has no business going to a model provider.
"""

from __future__ import annotations

import io
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from talon.storage.attachments import BlockingAttachments
from talon.config import Limits
from talon.content import AttachmentRef
from talon.errors import CorruptImage, ImageBomb, MediaError, NotAnImage

# Formats models accept as-is; anything else (BMP, TIFF, GIF frames, CMYK JPEG...) is re-encoded.
_PASSTHROUGH = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}
_JPEG_QUALITIES = (85, 75, 65, 55)
_SHRINK_STEP = 0.75
_MIN_SIDE = 16

# ``warnings.catch_warnings`` swaps process-wide state; the lock keeps our own worker threads from
# interleaving while Pillow's header parse runs (it is cheap, so this costs nothing measurable).
_OPEN_LOCK = threading.Lock()
# EXIF orientation -> the transpose that makes the picture upright (as ImageOps.exif_transpose).
_ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_PIXELS_IN_MESSAGE = re.compile(r"\((\d+) pixels\)")


@dataclass(frozen=True)
class PreparedImage:
    """An image block's attachment plus what happened on the way, for the notice text."""

    ref: AttachmentRef
    original_width: int
    original_height: int
    resized: bool


def prepare_image(
    source: Path,
    *,
    store: BlockingAttachments,
    limits: Limits,
    name: str | None = None,
    source_ref: AttachmentRef | None = None,
) -> PreparedImage:
    """Verify, orient, bound and store the image at ``source``.

    ``source_ref`` is the store entry ``source`` already is, if any: an image that needs no change
    is then described by it instead of being stored twice.
    Raises ``NotAnImage``, ``CorruptImage`` or ``ImageBomb`` (all ``MediaError``).
    """
    with open(source, "rb") as fh:
        im = _open_checked(fh, limits)
        orig_w, orig_h = im.size
        fmt = im.format or ""
        orientation = _orientation(im)
        fits = max(orig_w, orig_h) <= limits.image_max_side
        if fmt == "JPEG" and not fits:
            # Ask for the smallest DCT scale still at least as large as the target.
            im.draft("RGB", _target_size(im.size, limits.image_max_side))
        _decode(im, limits)

        if (
            fmt in _PASSTHROUGH
            and fits
            and orientation in (None, 1)
            and not getattr(im, "is_animated", False)
            and im.mode in ("RGB", "L", "RGBA", "LA", "P")
            and (fmt != "JPEG" or im.mode in ("RGB", "L"))
            and source.stat().st_size <= raw_byte_budget(limits.image_max_bytes)
        ):
            # Already acceptable: keep the sender's bytes (no generation loss, no extra work).
            meta = {"mime": _PASSTHROUGH[fmt], "name": name, "width": orig_w, "height": orig_h}
            if source_ref is None:
                fh.seek(0)
                source_ref = store.put_chunks(
                    iter(lambda: fh.read(1 << 16), b""), mime=_PASSTHROUGH[fmt], name=name
                )
            return PreparedImage(source_ref.model_copy(update=meta), orig_w, orig_h, resized=False)

    out = _to_8bit(im)
    if max(out.size) > limits.image_max_side:
        out = out.resize(_target_size(out.size, limits.image_max_side), Image.Resampling.LANCZOS)
    turn = _ORIENT.get(orientation or 1)
    if turn is not None:
        # After the resize, so the transpose moves 4 MP, not 24. Not ImageOps.exif_transpose:
        # it also rewrites the EXIF block, which raises on blocks Pillow can read but not write
        # (odd tag types from some cameras), and the output carries no EXIF anyway.
        out = out.transpose(turn)
    data, mime, size = encode_to_fit(
        out, max_side=limits.image_max_side, max_bytes=raw_byte_budget(limits.image_max_bytes)
    )
    ref = store.put_bytes(data, mime=mime, name=_renamed(name, mime), width=size[0], height=size[1])
    return PreparedImage(ref, orig_w, orig_h, resized=max(size) < max(orig_w, orig_h))


def raw_byte_budget(encoded_max: int) -> int:
    """The most image bytes whose base64 form (what a provider receives and counts: Anthropic's
    5 MB per image is 5 MB of base64) stays within ``encoded_max``."""
    return encoded_max // 4 * 3


def encode_to_fit(
    im: Image.Image, *, max_side: int, max_bytes: int, quality: int | None = None
) -> tuple[bytes, str, tuple[int, int]]:
    """Encode ``im`` as PNG (alpha, when small enough) or JPEG within ``max_side``/``max_bytes``.

    Steps JPEG quality down first, then the size, so detail is lost as late as possible.
    Returns (bytes, mime, (width, height)).
    """
    if max(im.size) > max_side:
        im = im.resize(_target_size(im.size, max_side), Image.Resampling.LANCZOS)
    if _has_alpha(im):
        png = _encode(im.convert("RGBA"), "PNG")
        if len(png) <= max_bytes:
            return png, "image/png", im.size
        im = _flatten(im)
    elif im.mode not in ("RGB", "L"):
        im = im.convert("RGB")

    qualities = (quality,) if quality is not None else _JPEG_QUALITIES
    while True:
        for q in qualities:
            data = _encode(im, "JPEG", quality=q)
            if len(data) <= max_bytes:
                return data, "image/jpeg", im.size
        w, h = im.size
        if min(w, h) <= _MIN_SIDE:
            # Unreachable for any sane limit; raising beats looping forever on a bad setting.
            raise CorruptImage(f"cannot encode the image within {max_bytes:,} bytes")
        shrunk = (max(_MIN_SIDE, int(w * _SHRINK_STEP)), max(_MIN_SIDE, int(h * _SHRINK_STEP)))
        im = im.resize(shrunk, Image.Resampling.LANCZOS)


def _open_checked(fh: BinaryIO, limits: Limits) -> Image.Image:
    try:
        with _OPEN_LOCK, warnings.catch_warnings():
            # Pillow's own warning threshold (~89 MP) is not ours; our check below is the guard.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(fh)
    except Image.DecompressionBombError as exc:
        # Over twice Pillow's process-wide limit: it refuses even to open. Same notice as ours.
        found = _PIXELS_IN_MESSAGE.search(str(exc))
        raise ImageBomb(int(found.group(1)) if found else 0, limits.image_max_pixels) from exc
    except UnidentifiedImageError as exc:
        fh.seek(0)
        raise NotAnImage(f"the file is not an image ({_describe_content(fh.read(512))})") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise CorruptImage(f"the image header is corrupt ({exc})") from exc
    pixels = im.size[0] * im.size[1]
    if pixels > limits.image_max_pixels:
        raise ImageBomb(pixels, limits.image_max_pixels, im.size)
    if pixels == 0:
        raise CorruptImage("the image has zero width or height")
    return im


def _decode(im: Image.Image, limits: Limits) -> None:
    try:
        im.load()
    except Image.DecompressionBombError as exc:
        # Some formats (multi-frame, tiled) only learn their real size while loading.
        found = _PIXELS_IN_MESSAGE.search(str(exc))
        raise ImageBomb(int(found.group(1)) if found else 0, limits.image_max_pixels) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise CorruptImage(f"the image is truncated or corrupt ({exc})") from exc


def upright(im: Image.Image) -> Image.Image:
    """The image turned the way its EXIF orientation says (the image itself when no turn is needed).

    Not ImageOps.exif_transpose: that also rewrites the EXIF block, and raises on blocks Pillow
    can read but not write.
    """
    turn = _ORIENT.get(_orientation(im) or 1)
    return im.transpose(turn) if turn is not None else im


def _orientation(im: Image.Image) -> int | None:
    try:
        value = im.getexif().get(0x0112)
    except Exception:  # a broken EXIF block must not cost us the picture
        return None
    return value if isinstance(value, int) else None


def _target_size(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    w, h = size
    scale = max_side / max(w, h)
    if scale >= 1:
        return size
    return max(1, round(w * scale)), max(1, round(h * scale))


def _to_8bit(im: Image.Image) -> Image.Image:
    """Deep-colour pixels (16/32-bit integer, float) scaled into 0-255.

    Pillow's own conversion to 8 bits clips instead of scaling, so a 16-bit grayscale PNG would
    come out all white and a float image all black.
    """
    if im.mode.startswith("I;16"):
        lo, hi, scale = 0.0, 65535.0, 255 / 65535
    elif im.mode in ("I", "F"):
        extrema = im.getextrema()  # (min, max) for a single-band image
        lo, hi = float(extrema[0]), float(extrema[1])  # type: ignore[arg-type]
        if lo >= 0 and hi <= 255 and im.mode == "I":
            return im.convert("L")
        if lo >= 0 and hi <= 1 and im.mode == "F":
            lo, hi = 0.0, 1.0
        elif lo >= 0 and hi <= 65535:
            lo, hi = 0.0, 65535.0
        scale = 255 / (hi - lo) if hi > lo else 0.0
    else:
        return im
    wide = im if im.mode == "F" else im.convert("I")
    return wide.point(lambda v: v * scale - lo * scale).convert("L")


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info)


def _flatten(im: Image.Image) -> Image.Image:
    rgba = im.convert("RGBA")
    background = Image.new("RGB", rgba.size, (255, 255, 255))
    background.paste(rgba, mask=rgba.getchannel("A"))
    return background


def _encode(im: Image.Image, fmt: str, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        im.save(buf, "JPEG", quality=quality, optimize=False, progressive=False)
    else:
        im.save(buf, fmt, optimize=False, compress_level=6)
    return buf.getvalue()


def _renamed(name: str | None, mime: str) -> str | None:
    if not name:
        return None
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return stem + (".png" if mime == "image/png" else ".jpg")


def _describe_content(head: bytes) -> str:
    if not head:
        return "it is empty"
    if head[4:8] == b"ftyp" and head[8:12] in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"):
        return "HEIC/HEIF photos cannot be decoded here; it can be sent again as JPEG or PNG"
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "its content is text"
        except UnicodeDecodeError as exc:
            if exc.start > len(head) - 4:  # a multi-byte character cut by our 512-byte window
                return "its content is text"
    return "unrecognized binary content"


__all__ = [
    "PreparedImage",
    "encode_to_fit",
    "prepare_image",
]
