"""Archives for the backup tests: a small Talon tree to back up, and an archive's members and manifest
read with tarfile, zstandard and json (not with the code under test), or written as an older Talon did."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import zstandard


def tar_bytes(archive: Path) -> bytes:
    """The archive's whole tar stream (zstd across all its frames, or gzip)."""
    raw = Path(archive).read_bytes()
    if str(archive).endswith(".gz"):
        import gzip

        return gzip.decompress(raw)
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()


def manifest(archive: Path) -> dict:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes(archive))) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return json.loads(member.read())


def listing(archive: Path) -> dict[str, tuple[int, str]]:
    """name -> (size, sha256) of every file the manifest lists."""
    files = manifest(archive)["files"]
    listed = {f["path"]: (f["size"], f["sha256"]) for f in files}
    assert len(listed) == len(files), "the manifest lists a file twice"
    return listed


def tree(root: Path, chats: int = 3, lines: int = 5) -> tuple[Path, Path]:
    data, media = root / "data", root / "media_root"
    for c in range(chats):
        chat = data / "sessions" / "telegram" / str(100 + c)
        chat.mkdir(parents=True)
        (chat / "CHAT").write_text(f"telegram:{100 + c}")
        with open(chat / "main.jsonl", "w") as fh:
            for i in range(lines):
                fh.write(json.dumps({"role": "user", "content": [{"type": "text", "text": f"kettle {c} line {i}"}],
                                     "at": 1_700_000_000 + i}) + "\n")
        (media / "telegram" / str(100 + c)).mkdir(parents=True)
        (media / "telegram" / str(100 + c) / "AGENTS.md").write_text(f"memory of chat {c}")
    (data / "attachments" / "ab").mkdir(parents=True)
    (data / "attachments" / "ab" / ("ab" + "0" * 62)).write_bytes(os.urandom(300_000))
    return data, media


def members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with open(archive, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z, \
            tarfile.open(fileobj=z, mode="r|") as tar:
        return [(m, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


def write_as_before(dst: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    """As the writer before the one-pass restore did: tarfile's stream mode, one zstd thread."""
    with open(dst, "wb") as raw:
        z = zstandard.ZstdCompressor(level=1).stream_writer(raw, closefd=False)
        with tarfile.open(fileobj=z, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20) as tar:
            for info, data in entries:
                tar.addfile(info, io.BytesIO(data))
        z.close()


def nothing_left(root: Path) -> None:
    assert not root.exists(), sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
