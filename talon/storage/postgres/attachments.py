"""Attachments in PostgreSQL, content-addressed by sha256 as on disk, in chunks.

Every worker keeps the files it handles in a local cache (the file store's layout under
``TALON_DATA_DIR/attachments``); the database holds each blob once, as rows of ``CHUNK`` bytes.
A blob is uploaded after it was committed locally and downloaded into the cache the first time a
worker needs one it has not seen, a chunk at a time in both directions: a 20 MB file never sits
whole in memory, and file reads and writes run on the cache's threads. Two workers storing the
same bytes store them once (the first insert wins; the second sees the row and skips its upload).

The blocking side (media code on worker threads) commits locally on its own thread and hands the
upload to the event loop, waiting for it there.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from talon.content import AttachmentRef
from talon.errors import AttachmentError
from talon.storage.attachments import missing, sha_of
from talon.storage.embedded.attachments import FileAttachments, FileBlobs
from talon.storage.postgres.db import AsyncDatabase

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


class PgAttachments:
    def __init__(self, db: AsyncDatabase, cache_root: Path) -> None:
        self.db = db
        self.cache = FileAttachments(cache_root)
        self._blocking = _Blocking(self)

    @property
    def blocking(self) -> "_Blocking":
        return self._blocking

    @property
    def files(self) -> FileBlobs:
        return self.cache.files

    async def upload(self, path: Path, sha256: str) -> bool:
        """Store the file at ``path`` under ``sha256`` unless the database has it; True if uploaded."""
        size = (await asyncio.to_thread(path.stat)).st_size
        chunks = (size + CHUNK - 1) // CHUNK

        async def go() -> bool:
            async with self.db.transaction() as conn:
                # A concurrent upload of the same blob waits here for the first one and then skips.
                cur = await conn.execute("INSERT INTO talon_attachments (sha256, size, chunks) VALUES (%s, %s, %s) "
                                         "ON CONFLICT (sha256) DO NOTHING RETURNING 1", (sha256, size, chunks))
                if await cur.fetchone() is None:
                    return False
                with open(path, "rb") as fh:
                    for n in range(chunks):
                        data = await asyncio.to_thread(fh.read, CHUNK)
                        await conn.execute("INSERT INTO talon_attachment_chunks (sha256, n, data) "
                                           "VALUES (%s, %s, %s)", (sha256, n, data))
                return True

        # Bounded as a whole: a hung database makes this a StoreUnavailable, not a hang.
        uploaded = bool(await self.db.bounded(go()))
        self.db.count(1 + (chunks if uploaded else 0))
        return uploaded

    async def _committed(self, ref: AttachmentRef) -> AttachmentRef:
        await self.upload(self.files.path_for(ref.id), ref.id)
        return ref

    async def put_stream(self, chunks: AsyncIterator[bytes], *, mime: str, name: str | None = None,
                         limit: int | None = None) -> AttachmentRef:
        return await self._committed(await self.cache.put_stream(chunks, mime=mime, name=name, limit=limit))

    async def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                        height: int | None = None) -> AttachmentRef:
        return await self._committed(
            await self.cache.put_bytes(data, mime=mime, name=name, width=width, height=height))

    async def in_database(self, sha256: str) -> bool:
        return await self.db.fetchone("SELECT 1 FROM talon_attachments WHERE sha256 = %s", (sha256,)) is not None

    async def exists(self, sha256: str) -> bool:
        return await self.cache.exists(sha256) or await self.in_database(sha256)

    async def file_path(self, ref: AttachmentRef | str) -> Path:
        """The cached file, downloaded from the database first if needed."""
        sha = sha_of(ref)
        path = self.files.path_for(sha)
        if await asyncio.to_thread(path.is_file):
            return path
        meta = await self.db.fetchone("SELECT chunks FROM talon_attachments WHERE sha256 = %s", (sha,))
        if meta is None:
            raise missing(sha)
        sink = await asyncio.to_thread(self.files.sink, None, None)
        try:
            for n in range(int(meta[0])):
                row = await self.db.fetchone(
                    "SELECT data FROM talon_attachment_chunks WHERE sha256 = %s AND n = %s", (sha, n))
                if row is None:
                    raise AttachmentError(f"attachment {sha[:12]} is incomplete in the database "
                                          f"(chunk {n} of {meta[0]} missing)")
                await asyncio.to_thread(sink.write, [bytes(row[0])])
            if sink.digest.hexdigest() != sha:
                raise AttachmentError(f"attachment {sha[:12]} in the database does not match its hash")
        except BaseException:
            await asyncio.to_thread(sink.discard)
            raise
        # Local commit only: the database has it already.
        await asyncio.to_thread(self.files.finish, sink, mime="application/octet-stream", name=None)
        return path

    async def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        path = await self.file_path(ref)
        return await asyncio.to_thread(path.read_bytes)

    async def close(self) -> None:
        await self.cache.close()


class _Blocking:
    """``PgAttachments`` for worker threads: local work here, the database through the loop."""

    def __init__(self, store: PgAttachments) -> None:
        self.store = store

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.store.db.loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            raise RuntimeError("the blocking attachment store is for worker threads, with the database open")
        return loop

    def _uploaded(self, loop: asyncio.AbstractEventLoop, ref: AttachmentRef) -> AttachmentRef:
        path = self.store.files.path_for(ref.id)
        asyncio.run_coroutine_threadsafe(self.store.upload(path, ref.id), loop).result()
        return ref

    def put_bytes(self, data: bytes, *, mime: str, name: str | None = None, width: int | None = None,
                  height: int | None = None) -> AttachmentRef:
        loop = self._loop()
        ref = self.store.files.put_bytes(data, mime=mime, name=name, width=width, height=height)
        return self._uploaded(loop, ref)

    def put_chunks(self, chunks: Iterable[bytes], *, mime: str, name: str | None = None,
                   limit: int | None = None) -> AttachmentRef:
        loop = self._loop()
        return self._uploaded(loop, self.store.files.put_chunks(chunks, mime=mime, name=name, limit=limit))

    def file_path(self, ref: AttachmentRef | str) -> Path:
        path = self.store.files.path_for(sha_of(ref))
        if path.is_file():
            return path
        return asyncio.run_coroutine_threadsafe(self.store.file_path(ref), self._loop()).result()
