"""Attachments: a content-addressed blob store; every blob is kept once, under its sha256.

Session logs hold ``AttachmentRef``s into it; bytes are read back only when a model request is
built or a file is sent. The interface is async (``AttachmentStore``); media code that already
runs on a worker thread (image resizing, video frames) uses its ``blocking`` side
(``BlockingAttachments``), which must never be called on the event loop.

Implementations: ``MemoryAttachments`` (tests), ``talon.storage.embedded.attachments.FileAttachments``
(files under ``TALON_DATA_DIR/attachments``) and ``talon.storage.postgres.attachments.PgAttachments``
(the database, with a local file cache).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Protocol

from talon.content import AttachmentRef
from talon.errors import AttachmentError, DownloadTooLarge
from talon.permissions import private_dir


def check_sha(sha256: str) -> str:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise AttachmentError(f"not an attachment id: {sha256!r}")
    return sha256


def sha_of(ref: AttachmentRef | str) -> str:
    return check_sha(ref.id if isinstance(ref, AttachmentRef) else ref)


def missing(sha256: str) -> AttachmentError:
    return AttachmentError(f"attachment {sha256[:12]} is missing from the store")


class BlockingAttachments(Protocol):
    """The store for code on a worker thread. Never call these on the event loop."""

    def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                  height: int | None = None) -> AttachmentRef: ...

    def put_chunks(self, chunks: Iterable[bytes], *, mime: str, name: str | None = None,
                   limit: int | None = None) -> AttachmentRef:
        """Stream chunks in, hashing as they come; over ``limit`` bytes nothing is kept
        (``DownloadTooLarge``)."""

    def file_path(self, ref: AttachmentRef | str) -> Path:
        """A local file holding the blob (``AttachmentError`` when there is none)."""


class AttachmentStore(Protocol):
    @property
    def blocking(self) -> BlockingAttachments: ...

    async def put_stream(self, chunks: AsyncIterator[bytes], *, mime: str, name: str | None = None,
                         limit: int | None = None) -> AttachmentRef:
        """Store a download as it arrives: memory stays a chunk or two deep, the loop free."""

    async def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                        height: int | None = None) -> AttachmentRef: ...

    async def file_path(self, ref: AttachmentRef | str) -> Path:
        """A local file holding the blob (``AttachmentError`` when there is none)."""

    async def read_bytes(self, ref: AttachmentRef | str) -> bytes: ...

    async def exists(self, sha256: str) -> bool: ...

    async def close(self) -> None: ...


class MemoryBlobs:
    """The blocking side of ``MemoryAttachments``: blobs in a dict. ``file_path`` writes the blob
    out under ``spill`` (media code reads files)."""

    def __init__(self, spill: Path) -> None:
        self.blobs: dict[str, bytes] = {}
        self.spill = spill
        private_dir(spill)

    def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                  height: int | None = None) -> AttachmentRef:
        sha = hashlib.sha256(data).hexdigest()
        self.blobs.setdefault(sha, data)
        return AttachmentRef(id=sha, mime=mime, bytes=len(data), name=name, width=width, height=height)

    def put_chunks(self, chunks: Iterable[bytes], *, mime: str, name: str | None = None,
                   limit: int | None = None) -> AttachmentRef:
        data = bytearray()
        for chunk in chunks:
            data += chunk
            if limit is not None and len(data) > limit:
                raise DownloadTooLarge(name or "file", None, limit)
        return self.put_bytes(bytes(data), mime=mime, name=name)

    def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        sha = sha_of(ref)
        if sha not in self.blobs:
            raise missing(sha)
        return self.blobs[sha]

    def file_path(self, ref: AttachmentRef | str) -> Path:
        data = self.read_bytes(ref)
        path = self.spill / sha_of(ref)
        if not path.exists():
            path.write_bytes(data)
        return path


class MemoryAttachments:
    """Blobs in a dict, for tests (``spill``: where ``file_path`` writes them out; default a
    temporary directory)."""

    def __init__(self, spill: Path | None = None) -> None:
        self._blobs = MemoryBlobs(Path(spill) if spill is not None else Path(tempfile.mkdtemp(prefix="talon-blobs-")))

    @property
    def blocking(self) -> MemoryBlobs:
        return self._blobs

    async def put_stream(self, chunks: AsyncIterator[bytes], *, mime: str, name: str | None = None,
                         limit: int | None = None) -> AttachmentRef:
        parts = [chunk async for chunk in chunks]
        return self._blobs.put_chunks(parts, mime=mime, name=name, limit=limit)

    async def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                        height: int | None = None) -> AttachmentRef:
        return self._blobs.put_bytes(data, mime=mime, name=name, width=width, height=height)

    async def file_path(self, ref: AttachmentRef | str) -> Path:
        return self._blobs.file_path(ref)

    async def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        return self._blobs.read_bytes(ref)

    async def exists(self, sha256: str) -> bool:
        return sha256 in self._blobs.blobs

    async def close(self) -> None:
        pass
