"""Images, sounds and videos made on the spot for the tests that send media."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import av
import numpy as np
from PIL import Image


def jpeg(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png_file(path: Path, size: tuple[int, int] = (64, 48), color: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    Image.new("RGB", size, color).save(path, "PNG")
    return path.read_bytes()


def odd_exif(orientation: int) -> bytes:
    """An EXIF block as some cameras and editors write it: Make stored as a RATIONAL (type 5)
    instead of ASCII. Readable, but Pillow cannot serialize it again."""
    entries = [(0x010F, 5, 1, 26), (0x0112, 3, 1, orientation << 16)]
    ifd = struct.pack(">H", len(entries)) + b"".join(struct.pack(">HHII", *e) for e in entries)
    body = b"MM\x00*" + struct.pack(">I", 8) + ifd + struct.pack(">I", 0) + struct.pack(">II", 1, 2)
    return b"Exif\x00\x00" + body


def make_video(path: Path, seconds: int = 6, fps: int = 10) -> None:
    out = av.open(str(path), "w")
    stream = out.add_stream("mpeg4", rate=fps)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for i in range(seconds * fps):
        frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), (i * 4) % 255, dtype=np.uint8), format="rgb24")
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()


def png(width: int = 64, height: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(buf, "PNG")
    return buf.getvalue()


def wav(seconds: float = 1.0, rate: int = 16_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
