"""Content-addressed blob store: every attachment is kept once, under its sha256.

Writes are atomic (temporary file in the same directory, fsync, rename), so a crash never
leaves a half-written blob under a real name. Session logs hold ``AttachmentRef``s into this
store; bytes are read back only when a model request is built.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import BinaryIO

from talon.content import AttachmentRef
from talon.errors import AttachmentError, DownloadTooLarge
from talon.permissions import private_dir

_CHUNK = 1 << 16


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AttachmentStore:
    """Blobs under ``root/ab/abcdef...``; the name is the sha256 of the content."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._tmp = self.root / "tmp"
        private_dir(self._tmp)
        self._remove_stale_temps()

    def _remove_stale_temps(self, older_than_s: float = 3600.0) -> None:
        """Partial downloads a crash left behind (an hour old: no live download is that slow)."""
        cutoff = time.time() - older_than_s
        for leftover in self._tmp.iterdir():
            try:
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()
            except OSError:
                continue

    def path_for(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise AttachmentError(f"not an attachment id: {sha256!r}")
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def new_temp(self) -> tuple[BinaryIO, Path]:
        """An open temporary file inside the store, for streaming a download into."""
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="in-")
        return os.fdopen(fd, "wb"), Path(name)

    def commit_temp(
        self,
        temp: Path,
        *,
        mime: str,
        name: str | None = None,
        width: int | None = None,
        height: int | None = None,
        sha256: str | None = None,
    ) -> AttachmentRef:
        """Move a finished temp file to its content address (deduplicated)."""
        if sha256 is None:
            digest = hashlib.sha256()
            with open(temp, "rb") as fh:
                for chunk in iter(lambda: fh.read(_CHUNK), b""):
                    digest.update(chunk)
            sha256 = digest.hexdigest()
        size = temp.stat().st_size
        final = self.path_for(sha256)
        if final.exists():
            temp.unlink(missing_ok=True)
        else:
            private_dir(final.parent)
            with open(temp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(temp, final)
            _fsync_dir(final.parent)
        return AttachmentRef(id=sha256, mime=mime, bytes=size, name=name, width=width, height=height)

    def put_bytes(
        self,
        data: bytes,
        *,
        mime: str,
        name: str | None = None,
        width: int | None = None,
        height: int | None = None,
    ) -> AttachmentRef:
        fh, temp = self.new_temp()
        try:
            with fh:
                fh.write(data)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return self.commit_temp(
            temp, mime=mime, name=name, width=width, height=height,
            sha256=hashlib.sha256(data).hexdigest(),
        )

    def put_chunks(
        self, chunks: Iterable[bytes], *, mime: str, name: str | None = None, limit: int | None = None
    ) -> AttachmentRef:
        """Stream chunks in, hashing as they come; over ``limit`` bytes the partial file is removed."""
        with self._sink(name, limit) as sink:
            for chunk in chunks:
                sink.write(chunk)
        return self.commit_temp(sink.temp, mime=mime, name=name, sha256=sink.digest.hexdigest())

    async def put_stream(
        self, chunks: AsyncIterator[bytes], *, mime: str, name: str | None = None, limit: int | None = None
    ) -> AttachmentRef:
        """Async twin of ``put_chunks`` for network downloads: memory stays one chunk deep."""
        with self._sink(name, limit) as sink:
            async for chunk in chunks:
                sink.write(chunk)
        return self.commit_temp(sink.temp, mime=mime, name=name, sha256=sink.digest.hexdigest())

    def _sink(self, name: str | None, limit: int | None) -> "_Sink":
        fh, temp = self.new_temp()
        return _Sink(fh, temp, name or "file", limit)

    def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        sha = ref.id if isinstance(ref, AttachmentRef) else ref
        try:
            return self.path_for(sha).read_bytes()
        except FileNotFoundError as exc:
            raise AttachmentError(f"attachment {sha[:12]} is missing from the store") from exc

    def file_path(self, ref: AttachmentRef | str) -> Path:
        sha = ref.id if isinstance(ref, AttachmentRef) else ref
        path = self.path_for(sha)
        if not path.is_file():
            raise AttachmentError(f"attachment {sha[:12]} is missing from the store")
        return path


class _Sink:
    """A temp file that hashes what it is given and refuses to grow past ``limit``.

    Leaving the ``with`` block by an exception removes the partial file.
    """

    def __init__(self, fh: BinaryIO, temp: Path, name: str, limit: int | None) -> None:
        self.fh = fh
        self.temp = temp
        self.name = name
        self.limit = limit
        self.digest = hashlib.sha256()
        self.total = 0

    def write(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.limit is not None and self.total > self.limit:
            raise DownloadTooLarge(self.name, None, self.limit)
        self.digest.update(chunk)
        self.fh.write(chunk)

    def __enter__(self) -> "_Sink":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.fh.close()
        if exc_type is not None:
            self.temp.unlink(missing_ok=True)
