"""What ``read_file`` shows for each kind of file, always bounded.

- text: numbered lines from ``offset`` (1-based line) for ``limit`` lines, cut to a character cap,
  with a footer saying how to read on;
- PDF: extracted text from ``offset`` (1-based page) for ``limit`` pages, same cap;
- image: one image block (verified, downscaled and re-encoded by the media layer when needed);
- video: a few JPEG frames spread over the window ``offset`` .. ``offset + limit`` seconds.

Synchronous and CPU-bound; the tools run these in a worker thread.
"""

from __future__ import annotations

import io
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from talon.media.sniff import SNIFF_BYTES, sniff
from talon.errors import ToolError

log = logging.getLogger(__name__)

MAX_LINE_CHARS = 2000
DEFAULT_LINES = 2000
DEFAULT_PDF_PAGES = 20
# Lines are counted past the shown window so the footer can say how many there are; beyond this
# many bytes the count stops (a multi-GB log is not walked to the end for a footer).
COUNT_BYTES_LIMIT = 64_000_000
# One read never reads more than this many bytes, however few lines they hold (a 20 GB sparse
# file is one endless "line" of NULs): the cost of a call is bounded by bytes, not lines.
READ_BYTES_LIMIT = 128 * 1024 * 1024

VIDEO_FRAMES_PER_CALL = 8
VIDEO_DEFAULT_WINDOW_S = 60.0
VIDEO_FRAME_SIDE = 768
VIDEO_FRAME_QUALITY = 75
VIDEO_TIME_BUDGET_S = 20.0
VIDEO_MAX_DECODED_PER_FRAME = 600

# Bytes no sniffer knows, with NULs and a video name: probably a video (MPEG-PS, ASF...).
_VIDEO_SUFFIXES = {".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".3gp", ".ts", ".flv", ".wmv"}

FileKind = str  # "text" | "pdf" | "image" | "video" | "audio" | "binary"


def sniff_kind(path: Path, head: bytes) -> FileKind:
    """Decide by content first (``talon.media.sniff``), by name only where content is ambiguous."""
    sniffed = sniff(head, name=path.name)
    if sniffed is not None:
        if sniffed.format == "pdf":
            return "pdf"
        if sniffed.family != "document":
            return sniffed.family
        # a ZIP or an SVG: shown as text if it is text, refused as binary if not
    elif path.suffix.lower() in _VIDEO_SUFFIXES and b"\x00" in head:
        return "video"
    if b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "binary"
    return "text"


def _cut_line(line: str, more: int = 0) -> str:
    more += max(0, len(line) - MAX_LINE_CHARS)
    if not more:
        return line
    return line[:MAX_LINE_CHARS] + f" [... line cut, {more:,} more characters]"


def _bounded_lines(fh: io.TextIOWrapper, cap: int) -> Iterator[tuple[str, int]]:
    """Each line (newline stripped) cut to ``cap`` characters, with how many were left out.

    A file that is one 100 MB line must not become one 100 MB string: the rest of a long line is
    read in pieces and only counted.
    """
    while True:
        line = fh.readline(cap + 1)
        if not line:
            return
        more = 0
        if not line.endswith("\n") and len(line) > cap:
            while piece := fh.readline(1 << 16):
                if piece.endswith("\n"):
                    more += len(piece) - 1
                    break
                more += len(piece)
            more += len(line) - cap
            line = line[:cap]
        yield line.rstrip("\n").rstrip("\r"), more


def _encoding(head: bytes) -> str:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    return "utf-8-sig"


class _Capped(io.RawIOBase):
    """The first ``cap`` bytes of an open file, read with ``pread`` (the file is not moved)."""

    def __init__(self, fd: int, cap: int) -> None:
        self._fd = fd
        self._pos = 0
        self.cap = cap
        self.hit_cap = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "memoryview | bytearray") -> int:  # type: ignore[override]
        room = self.cap - self._pos
        if room <= 0:
            self.hit_cap = self.hit_cap or bool(os.pread(self._fd, 1, self._pos))
            return 0
        data = os.pread(self._fd, min(len(buffer), room), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos


def read_text(source: BinaryIO, *, shown: str, offset: int, limit: int, max_chars: int,
              max_bytes: int = READ_BYTES_LIMIT) -> str:
    """Numbered lines ``offset`` .. ``offset + limit - 1`` of an open text file, within
    ``max_chars``, reading at most ``max_bytes`` of it."""
    fd = source.fileno()
    head = os.pread(fd, SNIFF_BYTES, 0)
    out: list[str] = []
    used = 0
    last = offset - 1
    total = 0
    counted_all = True
    cut_by_chars = False
    raw = _Capped(fd, max_bytes)
    with io.TextIOWrapper(io.BufferedReader(raw), encoding=_encoding(head), errors="replace") as fh:
        for number, (line, more) in enumerate(_bounded_lines(fh, MAX_LINE_CHARS), 1):
            total = number
            if number < offset:
                continue
            if number >= offset + limit or cut_by_chars:
                if raw.tell() > COUNT_BYTES_LIMIT:
                    counted_all = False
                    break
                continue
            text = f"{number:>6}\t{_cut_line(line, more)}"
            if used + len(text) + 1 > max_chars and out:
                cut_by_chars = True
                continue
            out.append(text)
            used += len(text) + 1
            last = number
    if raw.hit_cap:
        counted_all = False
    if total == 0:
        return f"{shown} is empty."
    if offset > total:
        if raw.hit_cap:
            raise ToolError(
                f"offset {offset} is beyond the first {max_bytes // (1024 * 1024)} MB of {shown} "
                f"({total:,} lines), which is as far as one read goes; use grep to find what you need")
        raise ToolError(f"offset {offset} is past the end of {shown} ({total:,} lines)")
    of_total = f"{total:,}" if counted_all else f"more than {total:,}"
    header = f"{shown}: lines {offset}-{last} of {of_total}"
    body = "\n".join(out)
    if last < total or not counted_all:
        why = " (character limit of one read)" if cut_by_chars else ""
        if raw.hit_cap and last >= total:
            return (f"{header}\n{body}\n[... stopped after the first {max_bytes // (1024 * 1024)} MB "
                    "of the file, as far as one read goes; use grep to search the rest]")
        return f"{header}\n{body}\n[... more lines{why}; continue with offset={last + 1}]"
    return f"{header}\n{body}"


def read_pdf(path: Path, *, shown: str, offset: int, limit: int, max_chars: int) -> str:
    """Text of pages ``offset`` .. ``offset + limit - 1`` (1-based), within ``max_chars``."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    with open(path, "rb") as fh:
        try:
            reader = PdfReader(fh)
            if reader.is_encrypted:
                try:
                    reader.decrypt("")
                except Exception as exc:
                    raise ToolError(f"{shown} is an encrypted PDF and cannot be read without its password") from exc
            pages = len(reader.pages)
        except PyPdfError as exc:
            raise ToolError(f"{shown} is not a readable PDF: {exc}") from exc
        if pages == 0:
            return f"{shown}: a PDF with no pages."
        if offset > pages:
            raise ToolError(f"offset {offset} is past the last page of {shown} ({pages} pages)")
        parts: list[str] = []
        used = 0
        last = offset - 1
        for number in range(offset, min(pages, offset + limit - 1) + 1):
            try:
                text = (reader.pages[number - 1].extract_text() or "").strip()
            except Exception as exc:  # one damaged page must not hide the others
                text = f"[page could not be read: {type(exc).__name__}]"
            block = f"--- page {number} ---\n{text or '[no text on this page (scanned image?)]'}"
            if used + len(block) > max_chars:
                if not parts:
                    parts.append(block[:max_chars] + "\n[... page cut at the character limit of one read]")
                    last = number
                break
            parts.append(block)
            used += len(block) + 1
            last = number
    header = f"{shown}: PDF, pages {offset}-{last} of {pages}"
    footer = f"\n[... more pages; continue with offset={last + 1}]" if last < pages else ""
    return f"{header}\n" + "\n".join(parts) + footer


@dataclass(frozen=True)
class Frame:
    jpeg: bytes
    width: int
    height: int
    timestamp_s: float


@dataclass(frozen=True)
class VideoWindow:
    frames: list[Frame]
    duration_s: float | None
    width: int | None
    height: int | None
    start_s: float
    end_s: float
    notes: list[str]


def sample_video_window(
    path: Path, *, start_s: float, length_s: float | None, max_frames: int = VIDEO_FRAMES_PER_CALL
) -> VideoWindow:
    """Up to ``max_frames`` frames spread evenly over [start_s, start_s + length_s)."""
    import av

    notes: list[str] = []
    deadline = time.monotonic() + VIDEO_TIME_BUDGET_S
    try:
        container = av.open(str(path), timeout=10.0)
    except Exception as exc:
        raise ToolError(f"the video could not be opened: {type(exc).__name__}: {exc}") from exc
    with container:
        if not container.streams.video:
            raise ToolError("the file has no video track")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        duration = None
        if container.duration:
            duration = container.duration / 1_000_000
        elif stream.duration and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        if duration is not None and start_s >= duration:
            raise ToolError(f"offset {start_s:g}s is past the end of the video ({duration:.1f}s)")
        end = start_s + (length_s if length_s else VIDEO_DEFAULT_WINDOW_S)
        if duration is not None:
            end = min(end, duration)
        span = max(end - start_s, 0.001)
        count = max(1, min(max_frames, math.ceil(span)))
        targets = [start_s + span * (i + 0.5) / count for i in range(count)]
        frames: list[Frame] = []
        time_base = stream.time_base
        for target in targets:
            if time.monotonic() > deadline:
                notes.append(f"stopped after {len(frames)} frames: decoding took too long")
                break
            try:
                if time_base:
                    container.seek(int(target / time_base), stream=stream, backward=True, any_frame=False)
                picked = None
                for decoded, frame in enumerate(container.decode(stream)):
                    if frame.time is None or frame.time >= target - 1e-3 or decoded >= VIDEO_MAX_DECODED_PER_FRAME:
                        picked = frame
                        break
                    picked = frame
                if picked is None:
                    continue
                image = picked.to_image()
                image.thumbnail((VIDEO_FRAME_SIDE, VIDEO_FRAME_SIDE))
                buf = io.BytesIO()
                image.convert("RGB").save(buf, "JPEG", quality=VIDEO_FRAME_QUALITY)
                stamp = float(picked.time) if picked.time is not None else target
                frames.append(Frame(buf.getvalue(), image.width, image.height, stamp))
            except (av.error.FFmpegError, ValueError, OSError) as exc:
                notes.append(f"frame at {target:.1f}s could not be decoded ({type(exc).__name__})")
        return VideoWindow(
            frames=frames,
            duration_s=duration,
            width=stream.codec_context.width or None,
            height=stream.codec_context.height or None,
            start_s=start_s,
            end_s=end,
            notes=notes,
        )
