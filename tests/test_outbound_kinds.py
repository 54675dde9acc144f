"""outbound_channel_media on real files: the bytes decide the kind, the name only refines it."""

from __future__ import annotations

import os
import wave
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from tests.pdfs import pdf_bytes
from talon.errors import MediaPathError
from talon.media import MarkdownMediaRef, OutboundMedia, outbound_channel_media

# --- real media made on the spot -----------------------------------------------------------


def _image(fmt: str, mode: str = "RGB") -> Callable[[Path], None]:
    def make(path: Path) -> None:
        Image.new(mode, (32, 24), (200, 40, 40)).save(path, format=fmt)

    return make


def _gif(path: Path) -> None:
    frames = [Image.new("P", (16, 16), i * 40) for i in range(3)]
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def _sine(rate: int, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16).reshape(1, -1)


def _audio(container_format: str, codec: str, rate: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with av.open(str(path), "w", format=container_format) as out:
            stream = out.add_stream(codec, rate=rate)
            stream.layout = "mono"
            frame = av.AudioFrame.from_ndarray(_sine(rate), format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)

    return make


def _video(container_format: str, codec: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with av.open(str(path), "w", format=container_format) as out:
            stream = out.add_stream(codec, rate=10)
            stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
            for i in range(10):
                rgb = np.full((48, 64, 3), i * 20, dtype=np.uint8)
                frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)

    return make


def _wav(path: Path) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(_sine(8000).tobytes())


def _pdf(path: Path) -> None:
    path.write_bytes(pdf_bytes([None]))


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


CASES = [
    ("png", "chart.png", _image("PNG"), "image", "image/png"),
    ("jpeg", "photo.jpg", _image("JPEG"), "image", "image/jpeg"),
    ("webp", "pic.webp", _image("WEBP"), "image", "image/webp"),
    ("bmp", "pic.bmp", _image("BMP"), "image", "image/bmp"),
    ("gif", "loop.gif", _gif, "animation", "image/gif"),
    ("ogg opus", "note.ogg", _audio("ogg", "libopus", 48000), "voice", "audio/ogg"),
    ("mp3", "song.mp3", _audio("mp3", "libmp3lame", 44100), "audio", "audio/mpeg"),
    ("m4a (M4A brand)", "song.m4a", _audio("ipod", "aac", 44100), "audio", "audio/mp4"),
    ("audio-only mp4 (isom brand)", "song.mp4", _audio("mp4", "aac", 44100), "audio", "audio/mp4"),
    ("flac", "song.flac", _audio("flac", "flac", 44100), "audio", "audio/flac"),
    ("wav", "beep.wav", _wav, "audio", "audio/wav"),
    ("mp4 h264", "clip.mp4", _video("mp4", "libx264"), "video", "video/mp4"),
    ("mp4 mpeg4", "clip2.mp4", _video("mp4", "mpeg4"), "video", "video/mp4"),
    ("mov", "clip.mov", _video("mov", "mpeg4"), "video", "video/quicktime"),
    ("mkv", "clip.mkv", _video("matroska", "mpeg4"), "video", "video/x-matroska"),
    ("webm", "clip.webm", _video("webm", "libvpx"), "video", "video/webm"),
    ("pdf", "report.pdf", _pdf, "document", "application/pdf"),
    ("text named png", "fake.png", _bytes(b"just some text, not a picture\n"), "document", "text/plain"),
    ("csv", "data.csv", _bytes(b"a,b\n1,2\n"), "document", "text/csv"),
    ("unknown binary", "blob.bin", _bytes(b"\x00\x01TALON" + bytes(range(256)) * 4), "document",
     "application/octet-stream"),
    ("binary named mp3", "noise.mp3", _bytes(b"\x00\x01\x02\x03" * 100), "document",
     "application/octet-stream"),
    ("no extension", "README", _bytes(b"hello\n"), "document", "text/plain"),
    ("empty file", "empty.png", _bytes(b""), "document", "application/octet-stream"),
    ("pdf named jpg", "scan.jpg", _pdf, "document", "application/pdf"),
    ("png named txt", "image.txt", _image("PNG"), "image", "image/png"),
]


@pytest.mark.parametrize("name, filename, make, kind, mime", CASES, ids=[c[0] for c in CASES])
def test_kind_from_content(
    tmp_path: Path, name: str, filename: str, make: Callable[[Path], None], kind: str, mime: str
) -> None:
    root = tmp_path / "media_root"
    root.mkdir()
    make(root / filename)
    media = outbound_channel_media(MarkdownMediaRef(alt="x", path=filename), "the caption", root)
    try:
        assert (media.kind, media.mime) == (kind, mime)
        assert media.caption == "the caption"
        assert media.name == filename
        assert media.path == (root / filename).resolve()
        assert media.size == (root / filename).stat().st_size
        assert media.file.read() == (root / filename).read_bytes()  # reads from the start
    finally:
        media.close()
    assert media.file.closed


def test_relative_to_root_not_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "media_root"
    (root / "out").mkdir(parents=True)
    _image("PNG")(root / "out" / "p.png")
    monkeypatch.chdir(tmp_path)
    with outbound_channel_media(MarkdownMediaRef("p", "out/p.png"), "", root) as media:
        assert media.kind == "image"


def test_percent_encoded_name_falls_back_to_decoded(tmp_path: Path) -> None:
    root = tmp_path / "media_root"
    root.mkdir()
    _image("PNG")(root / "my chart.png")
    with outbound_channel_media(MarkdownMediaRef("c", "my%20chart.png"), "", root) as media:
        assert media.name == "my chart.png"
        assert media.kind == "image"


def test_percent_encoding_cannot_smuggle_dot_dot(tmp_path: Path) -> None:
    root = tmp_path / "media_root"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("s")
    with pytest.raises(MediaPathError):
        outbound_channel_media(MarkdownMediaRef("s", "%2e%2e/secret.txt"), "", root)


@pytest.mark.parametrize(
    "path, reason",
    [("../x.png", "'..'"), ("https://x/y.png", "URL"), ("missing.png", "no such file")],
)
def test_refusals_propagate(tmp_path: Path, path: str, reason: str) -> None:
    root = tmp_path / "media_root"
    root.mkdir()
    with pytest.raises(MediaPathError, match=reason):
        outbound_channel_media(MarkdownMediaRef("x", path), "", root)


def test_symlink_name_is_the_name_written(tmp_path: Path) -> None:
    root = tmp_path / "media_root"
    root.mkdir()
    _image("PNG")(root / "v3.png")
    os.symlink(root / "v3.png", root / "latest.png")
    with outbound_channel_media(MarkdownMediaRef("c", "latest.png"), "", root) as media:
        assert isinstance(media, OutboundMedia)
        assert media.name == "latest.png"
        assert media.path == (root / "v3.png").resolve()
