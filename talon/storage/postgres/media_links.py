"""Media links in PostgreSQL (``talon_media_links``), so Twilio may fetch a link from whichever
worker its request reaches; derived bytes go to the shared attachment store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from talon.storage.attachments import AttachmentStore
from talon.storage.media_links import FileIdentity, MediaLink, new_token
from talon.storage.postgres.db import AsyncDatabase


class PgMediaLinks:
    def __init__(self, db: AsyncDatabase, attachments: AttachmentStore) -> None:
        self.db = db
        self.attachments = attachments

    async def _insert(self, name: str, mime: str, ttl_s: float, **fields: Any) -> str:
        token = new_token()
        columns = ["token", "name", "mime", *fields]
        # One statement: expired links (an hour past) go, the new one comes.
        await self.db.execute(
            "WITH gone AS (DELETE FROM talon_media_links WHERE expires < clock_timestamp() - interval '1 hour') "
            f"INSERT INTO talon_media_links ({', '.join(columns)}, expires) VALUES "
            f"({', '.join(['%s'] * len(columns))}, clock_timestamp() + make_interval(secs => %s))",
            (token, name, mime, *fields.values(), ttl_s))
        return token

    async def add_file(self, name: str, mime: str, path: str, root: str | None, identity: FileIdentity,
                       ttl_s: float) -> str:
        inode, size, mtime_ns = identity
        return await self._insert(name, mime, ttl_s, path=path, root=root, inode=inode, size=size, mtime_ns=mtime_ns)

    async def add_bytes(self, data: bytes, name: str, mime: str, ttl_s: float) -> str:
        ref = await self.attachments.put_bytes(data, mime=mime, name=name)
        return await self._insert(name, mime, ttl_s, sha256=ref.id, size=len(data))

    async def get(self, token: str) -> MediaLink | None:
        row = await self.db.fetchone(
            "SELECT name, mime, path, inode, size, mtime_ns, sha256, expires > clock_timestamp(), root "
            "FROM talon_media_links WHERE token = %s", (token,))
        if row is None:
            return None
        name, mime, path, inode, size, mtime_ns, sha256, live, root = row
        identity = (int(inode), int(size), int(mtime_ns)) if inode is not None else None
        return MediaLink(str(name), str(mime), int(size), bool(live), path=path,
                         root=root if root not in (None, ".") else None, identity=identity, sha256=sha256)

    async def body(self, link: MediaLink) -> bytes | Path:
        assert link.sha256 is not None
        return await self.attachments.file_path(link.sha256)

    async def fetched(self, token: str) -> None:
        await self.db.execute("UPDATE talon_media_links SET fetched = TRUE WHERE token = %s", (token,))

    async def forget(self, token: str) -> None:
        await self.db.execute("DELETE FROM talon_media_links WHERE token = %s", (token,))

    async def live(self) -> int:
        row = await self.db.fetchone("SELECT count(*) FROM talon_media_links WHERE expires > clock_timestamp()")
        return int(row[0]) if row else 0

    async def unfetched(self, tokens: list[str]) -> int:
        row = await self.db.fetchone("SELECT count(*) FROM talon_media_links WHERE token = ANY(%s) "
                                     "AND NOT fetched AND expires > clock_timestamp()", (tokens,))
        return int(row[0]) if row else 0
