"""Inbound media: speed of the photo path and memory of the document path, in one run.

Run: ``python benchmarks/bench_inbound.py`` (well under two minutes). Two figures:

1. **Photo ratio** — time for ``normalize_inbound`` to turn a ~12 MB, 24 MP JPEG into its image
   block (save to the workspace, verify, downscale, encode, store), divided by the time plain
   Pillow takes to decode the same file at full size, downscale it to <= 2000 px (LANCZOS) and
   encode it (quality 85): the floor any implementation without tricks would pay. Aim: <= 1.3.
   Medians of several alternating runs.
2. **Document memory** — peak memory *added* while a 20 MB text document is received (streamed
   into the attachment store with ``put_stream`` from an async chunk generator) and normalized:
   Python allocations (tracemalloc) and resident set growth (peak RSS over the starting RSS, Linux
   only). Aim: < 30 MB.
"""

from __future__ import annotations

import asyncio
import gc
import io
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talon.storage.embedded.attachments import FileAttachments  # noqa: E402
from talon.config import Limits  # noqa: E402
from talon.content import ImageBlock, InboundFile, TextBlock  # noqa: E402
from talon.media.inbound import InboundContext, normalize_inbound  # noqa: E402

MB = 1_000_000
RUNS = 5


def make_photo(path: Path) -> Path:
    """6000x4000, a gradient plus noise: compresses like a real photo to ~12 MB."""
    rng = np.random.default_rng(7)
    y = np.linspace(0, 255, 4000, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 255, 6000, dtype=np.float32)[None, :, None]
    base = (y * 0.5 + x * 0.5) * np.array([1.0, 0.7, 0.4], dtype=np.float32)
    pixels = np.clip(base + rng.integers(-40, 40, (4000, 6000, 3), dtype=np.int16), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).save(path, "JPEG", quality=90)
    return path


def pillow_floor(path: Path, max_side: int) -> float:
    start = time.perf_counter()
    with Image.open(path) as im:
        im.load()
        scale = max_side / max(im.size)
        small = im.resize((round(im.width * scale), round(im.height * scale)), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=85)
    return time.perf_counter() - start


async def talon_photo(ctx: InboundContext, photo: InboundFile) -> float:
    start = time.perf_counter()
    blocks = await normalize_inbound("", [photo], ctx)
    elapsed = time.perf_counter() - start
    image = blocks[1]
    assert isinstance(image, ImageBlock) and max(image.ref.width or 0, image.ref.height or 0) <= 2000
    assert image.ref.bytes <= ctx.limits.image_max_bytes
    return elapsed


def photo_ratio(work: Path) -> tuple[float, float, float, int]:
    work.mkdir(parents=True, exist_ok=True)
    path = make_photo(work / "photo.jpg")
    ctx = InboundContext(store=FileAttachments(work / "store"), media_root=work / "media", save_dir="inbox/bench")
    ref = ctx.store.blocking.put_bytes(path.read_bytes(), mime="image/jpeg", name="photo.jpg")
    photo = InboundFile(kind="photo", ref=ref, name="photo.jpg", mime="image/jpeg", size=ref.bytes)
    ours: list[float] = []
    floor: list[float] = []

    async def run() -> None:
        await talon_photo(ctx, photo)  # warm-up: thread pool, imports, page cache
        pillow_floor(path, ctx.limits.image_max_side)
        for _ in range(RUNS):
            ours.append(await talon_photo(ctx, photo))
            floor.append(pillow_floor(path, ctx.limits.image_max_side))

    asyncio.run(run())
    t_ours, t_floor = statistics.median(ours), statistics.median(floor)
    return t_ours / t_floor, t_ours, t_floor, path.stat().st_size


async def _chunks(total: int, chunk: int = 1 << 16) -> AsyncIterator[bytes]:
    line = b"2024-05-01T12:00:00Z INFO worker-3 request id=7f3a served /api/items in 12 ms\n"
    block = (line * (chunk // len(line) + 1))[:chunk]
    sent = 0
    while sent < total:
        piece = block[: min(chunk, total - sent)]
        sent += len(piece)
        yield piece
        await asyncio.sleep(0)  # a network download yields between chunks


def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def document_memory(work: Path) -> tuple[float, float | None, str]:
    ctx = InboundContext(store=FileAttachments(work / "store"), media_root=work / "media", save_dir="inbox/bench")

    async def receive_and_normalize() -> str:
        ref = await ctx.store.put_stream(_chunks(20 * MB), mime="text/plain", name="server.log", limit=20 * MB)
        doc = InboundFile(kind="document", ref=ref, name="server.log", mime="text/plain", size=ref.bytes)
        blocks = await normalize_inbound("here is the log", [doc], ctx)
        assert isinstance(blocks[0], TextBlock)
        return blocks[0].text

    # Warm-up on a small file so one-time costs (imports, thread pool) are not counted.
    asyncio.run(ctx.store.put_stream(_chunks(100_000), mime="text/plain"))
    gc.collect()
    rss_reset = _reset_peak_rss()
    rss_before = _rss_kb("VmRSS")
    tracemalloc.start()
    text = asyncio.run(receive_and_normalize())
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_peak = _rss_kb("VmHWM")
    rss_added = (rss_peak - rss_before) / 1000 if rss_reset and rss_peak and rss_before else None
    notice = next(line for line in text.splitlines() if "left out" in line)
    return traced_peak / MB, rss_added, notice


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="talon-bench-") as tmp:
        work = Path(tmp)
        traced, rss, notice = document_memory(work / "doc")
        ratio, t_ours, t_floor, size = photo_ratio(work / "photo")
    limits = Limits()
    print("Inbound media benchmark")
    print(f"  photo: {size / MB:.1f} MB, 6000x4000 JPEG -> image block <= {limits.image_max_side} px, "
          f"<= {limits.image_max_bytes / MB:.0f} MB")
    print(f"    talon normalize_inbound   {t_ours * 1000:8.1f} ms (median of {RUNS})")
    print(f"    Pillow decode+resize+save {t_floor * 1000:8.1f} ms (median of {RUNS})")
    print(f"    RATIO talon / Pillow floor = {ratio:.2f}   (aim <= 1.3)")
    print("  document: 20 MB text log streamed in with put_stream, then normalized")
    print(f"    peak Python memory added (tracemalloc) = {traced:.1f} MB   (aim < 30 MB)")
    print(f"    peak RSS added                         = "
          + (f"{rss:.1f} MB" if rss is not None else "n/a (needs Linux /proc)"))
    print(f"    agent sees: {notice}")


if __name__ == "__main__":
    main()
