"""Attachments as files: blobs under ``root/ab/abcdef...``, named by the sha256 of their content.

Writes are atomic (temporary file in the same directory, fsync, rename), so a crash never leaves
a half-written blob under a real name. The async side runs every write, hash and fsync on a
small pool of threads: a 20 MB download is written in batches of about a megabyte there, so the
event loop only forwards chunks.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TypeVar

from talon.content import AttachmentRef
from talon.errors import AttachmentError, DownloadTooLarge
from talon.permissions import private_dir
from talon.storage.attachments import check_sha, missing, sha_of

_CHUNK = 1 << 16
# Chunks handed to the writer thread at once: few thread hops per download, little memory.
_BATCH = 1 << 20
T = TypeVar("T")


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


class Sink:
    """A temp file that hashes what it is given and refuses to grow past ``limit``.

    ``count`` checks the limit (cheap, on the loop); ``write`` hashes and writes (a thread)."""

    def __init__(self, fh: BinaryIO, temp: Path, name: str, limit: int | None) -> None:
        self.fh = fh
        self.temp = temp
        self.name = name
        self.limit = limit
        self.digest = hashlib.sha256()
        self.total = 0

    def count(self, n: int) -> None:
        self.total += n
        if self.limit is not None and self.total > self.limit:
            raise DownloadTooLarge(self.name, None, self.limit)

    def write(self, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            self.digest.update(chunk)
            self.fh.write(chunk)

    def discard(self) -> None:
        self.fh.close()
        self.temp.unlink(missing_ok=True)


class FileBlobs:
    """The blocking side of the file store (worker threads, command-line tools)."""

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
        return self.root / sha256[:2] / check_sha(sha256)

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def new_temp(self) -> tuple[BinaryIO, Path]:
        """An open temporary file inside the store, for streaming into."""
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="in-")
        return os.fdopen(fd, "wb"), Path(name)

    def sink(self, name: str | None, limit: int | None) -> Sink:
        fh, temp = self.new_temp()
        return Sink(fh, temp, name or "file", limit)

    def commit_temp(self, temp: Path, *, mime: str, name: str | None = None, width: int | None = None,
                    height: int | None = None, sha256: str | None = None) -> AttachmentRef:
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

    def finish(self, sink: Sink, *, mime: str, name: str | None) -> AttachmentRef:
        sink.fh.close()
        return self.commit_temp(sink.temp, mime=mime, name=name, sha256=sink.digest.hexdigest())

    def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                  height: int | None = None) -> AttachmentRef:
        sink = self.sink(name, None)
        try:
            sink.write([data])
        except BaseException:
            sink.discard()
            raise
        ref = self.finish(sink, mime=mime, name=name)
        return ref.model_copy(update={"width": width, "height": height})

    def put_chunks(self, chunks: Iterable[bytes], *, mime: str, name: str | None = None,
                   limit: int | None = None) -> AttachmentRef:
        sink = self.sink(name, limit)
        try:
            for chunk in chunks:
                sink.count(len(chunk))
                sink.write([chunk])
        except BaseException:
            sink.discard()
            raise
        return self.finish(sink, mime=mime, name=name)

    def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        return self.file_path(ref).read_bytes()

    def file_path(self, ref: AttachmentRef | str) -> Path:
        sha = sha_of(ref)
        path = self.path_for(sha)
        if not path.is_file():
            raise missing(sha)
        return path


async def stream_into(blobs: FileBlobs, chunks: AsyncIterator[bytes], run: "Callable[..., asyncio.Future[object]]",
                      *, mime: str, name: str | None, limit: int | None) -> AttachmentRef:
    """``put_stream`` on ``blobs``: chunks gathered on the loop, written in batches by ``run``."""
    sink: Sink = await run(blobs.sink, name, limit)  # type: ignore[assignment]
    try:
        batch: list[bytes] = []
        size = 0
        async for chunk in chunks:
            sink.count(len(chunk))
            batch.append(chunk)
            size += len(chunk)
            if size >= _BATCH:
                await run(sink.write, batch)
                batch, size = [], 0
        if batch:
            await run(sink.write, batch)
    except BaseException:
        # Not awaited: the cancelled caller must not wait, and the file is only a temp.
        run(sink.discard)
        raise
    return await run(lambda: blobs.finish(sink, mime=mime, name=name))  # type: ignore[return-value]


class FileAttachments:
    """The async store over ``FileBlobs``; file work on a bounded pool of threads."""

    def __init__(self, root: Path, *, threads: int = 4) -> None:
        self.files = FileBlobs(root)
        self.root = self.files.root
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="attachments")

    @property
    def blocking(self) -> FileBlobs:
        return self.files

    def _run(self, fn: Callable[..., T], *args: object) -> "asyncio.Future[T]":
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def path_for(self, sha256: str) -> Path:
        return self.files.path_for(sha256)

    async def put_stream(self, chunks: AsyncIterator[bytes], *, mime: str, name: str | None = None,
                         limit: int | None = None) -> AttachmentRef:
        return await stream_into(self.files, chunks, self._run, mime=mime, name=name, limit=limit)

    async def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                        height: int | None = None) -> AttachmentRef:
        return await self._run(lambda: self.files.put_bytes(data, mime=mime, name=name, width=width, height=height))

    async def file_path(self, ref: AttachmentRef | str) -> Path:
        return await self._run(self.files.file_path, ref)

    async def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        return await self._run(self.files.read_bytes, ref)

    async def exists(self, sha256: str) -> bool:
        return await self._run(self.files.exists, sha256)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, True)
