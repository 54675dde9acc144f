"""Attachments in PostgreSQL, content-addressed by sha256 as on disk, in chunks.

Every worker keeps the files it handles in a local cache (the embedded store's layout under
``TALON_DATA_DIR/attachments``); the database holds each blob once, as rows of ``CHUNK`` bytes.
A blob is uploaded after it was committed locally and downloaded into the cache the first time a
worker needs one it has not seen, a chunk at a time in both directions: a 20 MB file never sits
whole in memory. Two workers storing the same bytes store them once (the first insert wins; the
second sees the row and skips its upload).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from talon.attachments import AttachmentStore
from talon.content import AttachmentRef
from talon.errors import AttachmentError
from talon.pg.db import Database

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


class PgAttachmentStore(AttachmentStore):
    def __init__(self, db: Database, cache_root: Path) -> None:
        super().__init__(cache_root)
        self.db = db

    def commit_temp(self, temp: Path, *, mime: str, name: str | None = None, width: int | None = None,
                    height: int | None = None, sha256: str | None = None) -> AttachmentRef:
        ref = super().commit_temp(temp, mime=mime, name=name, width=width, height=height, sha256=sha256)
        self.upload(self.path_for(ref.id), ref.id)
        return ref

    def upload(self, path: Path, sha256: str) -> bool:
        """Store the file at ``path`` under ``sha256`` unless the database has it; True if uploaded."""
        size = path.stat().st_size
        chunks = (size + CHUNK - 1) // CHUNK
        with self.db.transaction() as conn:
            # A concurrent upload of the same blob waits here for the first one and then skips.
            row = conn.execute("INSERT INTO talon_attachments (sha256, size, chunks) VALUES (%s, %s, %s) "
                               "ON CONFLICT (sha256) DO NOTHING RETURNING 1", (sha256, size, chunks)).fetchone()
            if row is None:
                self.db.count()
                return False
            with open(path, "rb") as fh, conn.cursor() as cur:
                for n in range(chunks):
                    cur.execute("INSERT INTO talon_attachment_chunks (sha256, n, data) VALUES (%s, %s, %s)",
                                (sha256, n, fh.read(CHUNK)))
        self.db.count(1 + chunks)
        return True

    def in_database(self, sha256: str) -> bool:
        return self.db.fetchone("SELECT 1 FROM talon_attachments WHERE sha256 = %s", (sha256,)) is not None

    def exists(self, sha256: str) -> bool:
        return super().exists(sha256) or self.in_database(sha256)

    def _fetch(self, sha256: str) -> Path:
        """The cached file for ``sha256``, downloaded from the database first if needed."""
        path = self.path_for(sha256)
        if path.is_file():
            return path
        meta = self.db.fetchone("SELECT size, chunks FROM talon_attachments WHERE sha256 = %s", (sha256,))
        if meta is None:
            raise AttachmentError(f"attachment {sha256[:12]} is missing from the store")
        fh, temp = self.new_temp()
        digest = hashlib.sha256()
        try:
            with fh:
                for n in range(int(meta[1])):
                    row = self.db.fetchone("SELECT data FROM talon_attachment_chunks WHERE sha256 = %s AND n = %s",
                                           (sha256, n))
                    if row is None:
                        raise AttachmentError(f"attachment {sha256[:12]} is incomplete in the database "
                                              f"(chunk {n} of {meta[1]} missing)")
                    data = bytes(row[0])
                    digest.update(data)
                    fh.write(data)
            if digest.hexdigest() != sha256:
                raise AttachmentError(f"attachment {sha256[:12]} in the database does not match its hash")
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        # Local commit only: the database has it already.
        super().commit_temp(temp, mime="application/octet-stream", sha256=sha256)
        return path

    def file_path(self, ref: AttachmentRef | str) -> Path:
        return self._fetch(ref.id if isinstance(ref, AttachmentRef) else ref)

    def read_bytes(self, ref: AttachmentRef | str) -> bytes:
        return self._fetch(ref.id if isinstance(ref, AttachmentRef) else ref).read_bytes()
