"""Media links that any worker can serve: tokens in PostgreSQL, bytes on shared storage.

Same contract as ``channels.media_links.MediaLinks`` (256-bit tokens, ``TALON_MEDIA_URL_TTL``,
404 for anything unknown, the file checked again when fetched), but the table of links is the
``talon_media_links`` table, so Twilio may fetch a link from whichever worker its request reaches.
A file link names the file by its path inside the media root (shared storage) and its inode,
size and mtime (not its device number, which differs between the machines mounting a share);
derived bytes (a re-encoded image, a transcoded voice note) go to the shared attachment store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from aiohttp import web

from channels.media_links import ROUTE_PREFIX, MediaLinks, content_disposition
from talon.errors import AttachmentError, MediaPathError
from talon.media import open_checked_media
from talon.pg.attachments import PgAttachmentStore
from talon.pg.db import Database

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024


def _identity(fd: int) -> tuple[int, int, int]:
    st = os.fstat(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns


class SharedMediaLinks(MediaLinks):
    def __init__(self, db: Database, store: PgAttachmentStore, media_root: Path, public_base_url: str,
                 ttl_s: float) -> None:
        super().__init__(media_root, public_base_url, ttl_s)
        self.db = db
        self.store = store
        self._mine: set[str] = set()  # tokens made here, for wait_fetched at stop

    def add_file(self, path: Path, file: BinaryIO, name: str, mime: str, *, root: Path | None = None) -> str:
        """A link to ``path``, opened through the checks of ``root`` (the chat's workspace, default
        the media root); the worker that serves it checks it against the same root again."""
        inode, size, mtime_ns = _identity(file.fileno())
        media = self.media_root.resolve()
        relative = str(Path(path).resolve().relative_to(media))
        workspace = str(Path(root).resolve().relative_to(media)) if root is not None else None
        return self._insert(name, mime, path=relative, root=workspace, inode=inode, size=size, mtime_ns=mtime_ns)

    def add_bytes(self, data: bytes, name: str, mime: str) -> str:
        ref = self.store.put_bytes(data, mime=mime, name=name)
        return self._insert(name, mime, sha256=ref.id, size=len(data))

    def _insert(self, name: str, mime: str, **fields: Any) -> str:
        self.db.execute("DELETE FROM talon_media_links WHERE expires < clock_timestamp() - interval '1 hour'")
        token = secrets.token_urlsafe(32)
        columns = ["token", "name", "mime", *fields]
        self.db.execute(
            f"INSERT INTO talon_media_links ({', '.join(columns)}, expires) VALUES "
            f"({', '.join(['%s'] * len(columns))}, clock_timestamp() + make_interval(secs => %s))",
            (token, name, mime, *fields.values(), self.ttl_s))
        self._mine.add(token)
        return f"{self.public_base_url}{ROUTE_PREFIX}/{token}/{quote(name, safe='')}"

    def forget(self, url: str) -> None:
        token = url.rsplit("/", 2)[-2] if url.count("/") >= 2 else ""
        self.db.execute("DELETE FROM talon_media_links WHERE token = %s", (token,))
        self._mine.discard(token)

    def __len__(self) -> int:
        row = self.db.fetchone("SELECT count(*) FROM talon_media_links WHERE expires > clock_timestamp()")
        return int(row[0]) if row else 0

    async def wait_fetched(self, timeout_s: float) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            waiting = 0
            if self._mine:
                row = self.db.fetchone("SELECT count(*) FROM talon_media_links WHERE token = ANY(%s) "
                                       "AND NOT fetched AND expires > clock_timestamp()", (sorted(self._mine),))
                waiting = int(row[0]) if row else 0
            if not waiting or loop.time() >= deadline:
                return waiting
            await asyncio.sleep(0.05)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        row = self.db.fetchone("SELECT name, mime, path, inode, size, mtime_ns, sha256, "
                               "expires > clock_timestamp(), root FROM talon_media_links WHERE token = %s", (token,))
        if row is None or row[0] != request.match_info["name"]:
            raise web.HTTPNotFound()
        name, mime, path, inode, size, mtime_ns, sha256, live, root = row
        if not live:
            log.info("media link for %s expired before it was fetched (TALON_MEDIA_URL_TTL=%gs)", name, self.ttl_s)
            raise web.HTTPNotFound()
        headers = {"Content-Type": mime, "Content-Disposition": content_disposition(name),
                   "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                   "Content-Length": str(size)}
        if sha256 is not None:
            try:
                blob = await asyncio.to_thread(self.store.file_path, sha256)
            except AttachmentError as exc:
                log.warning("media link for %s: %s", name, exc)
                raise web.HTTPNotFound() from None
            fh: BinaryIO = open(blob, "rb")
        else:
            try:
                boundary = self.media_root / root if root not in (None, ".") else self.media_root
                checked = await asyncio.to_thread(open_checked_media, self.media_root / path, boundary)
            except MediaPathError as exc:
                log.warning("media link for %s refused at fetch time: %s", name, exc)
                raise web.HTTPNotFound() from None
            fh = checked.file
            if _identity(fh.fileno()) != (inode, size, mtime_ns):
                fh.close()
                log.warning("media link for %s refused: the file changed after the link was made", name)
                raise web.HTTPNotFound()
        with fh:
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            if request.method != "HEAD":
                remaining = int(size)
                while remaining > 0:
                    chunk = await asyncio.to_thread(fh.read, min(_CHUNK, remaining))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                    await response.write(chunk)
            await response.write_eof()
        if request.method != "HEAD":
            self.db.execute("UPDATE talon_media_links SET fetched = TRUE WHERE token = %s", (token,))
        return response
