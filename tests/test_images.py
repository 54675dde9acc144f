"""Inbound images: real JPEG/PNG/WebP files, including huge, rotated, broken and hostile ones."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from talon.storage.embedded.attachments import FileBlobs
from talon.config import Limits
from talon.errors import CorruptImage, ImageBomb, MediaError, NotAnImage
from talon.media.images import encode_to_fit, prepare_image

MB = 1_000_000


@pytest.fixture
def store(tmp_path: Path) -> FileBlobs:
    return FileBlobs(tmp_path / "store")


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6000x4000 (24 MP) photo-like JPEG, noisy enough to weigh ~12 MB."""
    rng = np.random.default_rng(7)
    y = np.linspace(0, 255, 4000, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 255, 6000, dtype=np.float32)[None, :, None]
    base = (y * 0.5 + x * 0.5) * np.array([1.0, 0.7, 0.4], dtype=np.float32)
    noise = rng.integers(-40, 40, (4000, 6000, 3), dtype=np.int16)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("img") / "big.jpg"
    Image.fromarray(pixels).save(path, "JPEG", quality=90)
    return path


def png_bomb(path: Path, width: int, height: int) -> Path:
    """A valid 1-bit PNG of ``width`` x ``height`` zeros: kilobytes on disk, huge when decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
    return path


def with_orientation(image: Image.Image, path: Path, orientation: int) -> Path:
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.save(path, "JPEG", quality=92, exif=exif.tobytes())
    return path


def red_left_blue_right(width: int, height: int) -> Image.Image:
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 2] = (255, 0, 0)
    pixels[:, width // 2 :] = (0, 0, 255)
    return Image.fromarray(pixels)


def stored_image(store: FileBlobs, ref) -> Image.Image:  # type: ignore[no-untyped-def]
    im = Image.open(io.BytesIO(store.read_bytes(ref)))
    im.load()
    return im


def test_big_photo_is_downscaled_not_dropped(big_jpeg: Path, store: FileBlobs) -> None:
    assert big_jpeg.stat().st_size > 10 * MB
    result = prepare_image(big_jpeg, store=store, limits=Limits(), name="big.jpg")
    ref = result.ref
    assert (result.original_width, result.original_height) == (6000, 4000)
    assert result.resized
    assert max(ref.width or 0, ref.height or 0) <= 2000
    assert (ref.width, ref.height) == (2000, 1333)
    assert ref.bytes <= 5 * MB and ref.mime == "image/jpeg"
    decoded = stored_image(store, ref)
    assert decoded.size == (2000, 1333) and decoded.format == "JPEG"
    # Metadata (orientation, GPS...) is not forwarded to the model.
    assert not decoded.getexif()


def test_byte_limit_steps_quality_then_size(big_jpeg: Path, store: FileBlobs) -> None:
    limits = Limits(image_max_bytes=150_000)
    ref = prepare_image(big_jpeg, store=store, limits=limits).ref
    assert ref.bytes <= 150_000
    assert 0 < max(ref.width or 0, ref.height or 0) <= 2000


@pytest.mark.parametrize(("size", "orientation"), [((400, 200), 6), ((3000, 1500), 6), ((400, 200), 8)])
def test_exif_rotated_photo_comes_out_upright(
    tmp_path: Path, store: FileBlobs, size: tuple[int, int], orientation: int
) -> None:
    # Stored landscape with red on the left; orientation 6 means "rotate 90° clockwise to view",
    # so upright the picture is portrait with red on top (8: counter-clockwise, red at bottom).
    path = with_orientation(red_left_blue_right(*size), tmp_path / "rot.jpg", orientation)
    ref = prepare_image(path, store=store, limits=Limits()).ref
    im = stored_image(store, ref).convert("RGB")
    assert im.width < im.height
    assert (ref.width, ref.height) == im.size
    top = np.asarray(im)[im.height // 8, im.width // 2]
    bottom = np.asarray(im)[im.height * 7 // 8, im.width // 2]
    red, blue = (top, bottom) if orientation == 6 else (bottom, top)
    assert red[0] > 200 and red[2] < 60
    assert blue[2] > 200 and blue[0] < 60


def test_small_image_passes_through_unchanged(tmp_path: Path, store: FileBlobs) -> None:
    path = tmp_path / "small.png"
    Image.new("RGBA", (64, 48), (10, 200, 30, 128)).save(path, "PNG")
    source_ref = store.put_bytes(path.read_bytes(), mime="application/octet-stream")
    result = prepare_image(path, store=store, limits=Limits(), name="small.png", source_ref=source_ref)
    assert result.ref.id == source_ref.id  # the sender's bytes, no re-encode
    assert result.ref.mime == "image/png" and (result.ref.width, result.ref.height) == (64, 48)
    assert not result.resized


def test_static_webp_sticker_is_accepted(tmp_path: Path, store: FileBlobs) -> None:
    path = tmp_path / "sticker.webp"
    Image.new("RGBA", (512, 512), (255, 200, 0, 255)).save(path, "WEBP")
    ref = prepare_image(path, store=store, limits=Limits()).ref
    assert ref.mime == "image/webp" and (ref.width, ref.height) == (512, 512)


def test_large_alpha_image_falls_back_to_jpeg_within_bytes(tmp_path: Path, store: FileBlobs) -> None:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (1500, 1500, 4), dtype=np.uint8)
    path = tmp_path / "noise.png"
    Image.fromarray(pixels, "RGBA").save(path, "PNG")
    limits = Limits(image_max_bytes=2 * MB)
    assert path.stat().st_size > limits.image_max_bytes
    ref = prepare_image(path, store=store, limits=limits).ref
    assert ref.mime == "image/jpeg" and ref.bytes <= 2 * MB


def test_truncated_png_is_reported_as_corrupt(tmp_path: Path, store: FileBlobs) -> None:
    rng = np.random.default_rng(2)
    good = tmp_path / "good.png"
    Image.fromarray(rng.integers(0, 256, (300, 300, 3), dtype=np.uint8)).save(good)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CorruptImage, match="truncated or corrupt"):
        prepare_image(cut, store=store, limits=Limits())


def test_text_named_jpg_is_not_an_image(tmp_path: Path, store: FileBlobs) -> None:
    path = tmp_path / "holiday.jpg"
    path.write_text("this is not a picture, just some words\n" * 20)
    with pytest.raises(NotAnImage, match="not an image.*text"):
        prepare_image(path, store=store, limits=Limits())


def test_decompression_bomb_refused_from_header(tmp_path: Path, store: FileBlobs) -> None:
    path = png_bomb(tmp_path / "bomb.png", 10_000, 10_000)
    assert path.stat().st_size < 100_000
    with pytest.raises(ImageBomb) as info:
        prepare_image(path, store=store, limits=Limits())
    message = str(info.value)
    assert "10000x10000" in message and "100,000,000 pixels" in message
    assert "40,000,000 pixels" in message and "40 MP" in message
    assert info.value.pixels == 100_000_000


def test_bomb_beyond_pillows_own_guard_gets_our_notice(tmp_path: Path, store: FileBlobs) -> None:
    # Over twice Pillow's process-wide limit Image.open itself refuses; the notice is the same.
    path = png_bomb(tmp_path / "bigger.png", 20_000, 10_000)
    with pytest.raises(ImageBomb, match="200,000,000 pixels"):
        prepare_image(path, store=store, limits=Limits())


def test_failure_reasons_are_distinct(tmp_path: Path, store: FileBlobs) -> None:
    text = tmp_path / "a.jpg"
    text.write_text("hello")
    rng = np.random.default_rng(3)
    good = tmp_path / "good.png"
    Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(good)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:5000])
    bomb = png_bomb(tmp_path / "bomb.png", 10_000, 10_000)
    reasons = set()
    for path in (text, cut, bomb):
        with pytest.raises(MediaError) as info:
            prepare_image(path, store=store, limits=Limits())
        reasons.add((type(info.value), str(info.value)))
    assert len({kind for kind, _ in reasons}) == 3 and len(reasons) == 3


def test_encode_to_fit_keeps_alpha_as_png_when_small() -> None:
    data, mime, size = encode_to_fit(
        Image.new("LA", (3000, 100), (0, 0)), max_side=2000, max_bytes=5 * MB
    )
    assert mime == "image/png" and size == (2000, 67)
    assert Image.open(io.BytesIO(data)).size == (2000, 67)
