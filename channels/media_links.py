"""Short-lived, unguessable links to outbound files, for platforms that fetch media by URL.

Twilio cannot take an upload: a WhatsApp message names its media by URL and Twilio fetches it.
Each file gets its own link ``PUBLIC_BASE/media/<token>/<name>``: the token is 32 random bytes,
valid for ``ttl_s`` seconds; an unknown or expired token, or a name that does not match, is a plain
404 that tells a prober nothing. The table of links is a store (``talon.storage.media_links``: in
memory for one process, PostgreSQL for many workers); this module is the HTTP side.

Only files that passed the media-root checks get a link, and they are checked again when fetched:
the path is resolved inside the chat's workspace once more, opened without following symlinks, and
must still be the very file (inode, size, mtime) that was checked when the link was made.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from aiohttp import web

from talon.errors import AttachmentError, MediaPathError
from talon.media import open_checked_media
from talon.storage.media_links import FileIdentity, MediaLinkStore

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024
ROUTE_PREFIX = "/media"


def _identity(fd: int) -> FileIdentity:
    st = os.fstat(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns


def content_disposition(name: str) -> str:
    """``attachment`` with an ASCII fallback name and the exact name in RFC 5987 form."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name) or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


class MediaLinks:
    """Makes links in ``store`` and serves them (an aiohttp handler)."""

    def __init__(self, store: MediaLinkStore, media_root: Path, public_base_url: str, ttl_s: float) -> None:
        self.store = store
        self.media_root = Path(media_root).resolve()  # absolute: stored paths are relative to it
        self.public_base_url = public_base_url.rstrip("/")
        self.ttl_s = ttl_s
        self._mine: set[str] = set()  # tokens made here, for wait_fetched at stop

    route = f"{ROUTE_PREFIX}/{{token}}/{{name}}"

    # --- making links ---------------------------------------------------------------------
    async def add_file(self, path: Path, file: BinaryIO, name: str, mime: str, *, root: Path | None = None) -> str:
        """A link to ``path``, which the caller opened through the checks of ``root`` (the chat's
        workspace; default the media root) as ``file``; it is checked there again when fetched."""
        media = self.media_root
        relative = str(Path(path).resolve().relative_to(media))
        workspace = str(Path(root).resolve().relative_to(media)) if root is not None else None
        token = await self.store.add_file(name, mime, relative, workspace, _identity(file.fileno()), self.ttl_s)
        return self._url(token, name)

    async def add_bytes(self, data: bytes, name: str, mime: str) -> str:
        return self._url(await self.store.add_bytes(data, name, mime, self.ttl_s), name)

    def _url(self, token: str, name: str) -> str:
        self._mine.add(token)
        return f"{self.public_base_url}{ROUTE_PREFIX}/{token}/{quote(name, safe='')}"

    async def forget(self, url: str) -> None:
        """Withdraw a link that was never handed to Twilio (its message was refused)."""
        token = url.rsplit("/", 2)[-2] if url.count("/") >= 2 else ""
        self._mine.discard(token)
        await self.store.forget(token)

    async def count(self) -> int:
        """Live links."""
        return await self.store.live()

    async def wait_fetched(self, timeout_s: float) -> int:
        """Wait, at most ``timeout_s``, until every live link made here was fetched at least once;
        the number still waiting. Twilio fetches a file after the message naming it was created,
        so stopping the server at once would lose a file sent just before."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            waiting = await self.store.unfetched(sorted(self._mine)) if self._mine else 0
            if not waiting or loop.time() >= deadline:
                return waiting
            await asyncio.sleep(0.05)

    # --- serving --------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        link = await self.store.get(token)
        if link is None or link.name != request.match_info["name"]:
            raise web.HTTPNotFound()
        if not link.live:
            log.info("media link for %s expired before it was fetched (TALON_MEDIA_URL_TTL=%gs)",
                     link.name, self.ttl_s)
            raise web.HTTPNotFound()
        headers = {
            "Content-Type": link.mime,
            "Content-Disposition": content_disposition(link.name),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Content-Length": str(link.size),
        }
        if link.path is None:
            try:
                body = await self.store.body(link)
            except AttachmentError as exc:
                log.warning("media link for %s: %s", link.name, exc)
                raise web.HTTPNotFound() from None
            if isinstance(body, bytes):
                response: web.StreamResponse = web.Response(
                    body=None if request.method == "HEAD" else body, headers=headers)
                await self._fetched(request, token)
                return response
            fh: BinaryIO = await asyncio.to_thread(open, body, "rb")
        else:
            boundary = self.media_root / link.root if link.root is not None else self.media_root
            try:
                checked = await asyncio.to_thread(open_checked_media, self.media_root / link.path, boundary)
            except MediaPathError as exc:
                log.warning("media link for %s refused at fetch time: %s", link.name, exc)
                raise web.HTTPNotFound() from None
            fh = checked.file
            if _identity(fh.fileno()) != link.identity:
                fh.close()
                log.warning("media link for %s refused: the file changed after the link was made", link.name)
                raise web.HTTPNotFound()
        with fh:
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            if request.method != "HEAD":
                remaining = link.size
                while remaining > 0:
                    chunk = await asyncio.to_thread(fh.read, min(_CHUNK, remaining))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                    await response.write(chunk)
            await response.write_eof()
        await self._fetched(request, token)
        return response

    async def _fetched(self, request: web.Request, token: str) -> None:
        if request.method != "HEAD":
            await self.store.fetched(token)
