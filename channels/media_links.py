"""Short-lived, unguessable links to outbound files, for platforms that fetch media by URL.

Twilio cannot take an upload: a WhatsApp message names its media by URL and Twilio fetches it.
Each file gets its own link ``PUBLIC_BASE/media/<token>/<name>``: the token is 32 random bytes
(``secrets.token_urlsafe``), valid for ``ttl_s`` seconds; an unknown or expired token, or a name
that does not match, is a plain 404 that tells a prober nothing.

Only files that passed the media-root checks get a link, and they are checked again when fetched:
the path is resolved inside the media root once more, opened without following symlinks, and
must still be the very file (device, inode, size, mtime) that was checked when the link was made.
Bytes Talon derived from such a file (a re-encoded image, a transcoded voice note) are held in
memory for the life of the link.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from aiohttp import web

from talon.errors import MediaPathError
from talon.media import open_checked_media

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024
ROUTE_PREFIX = "/media"


@dataclass(frozen=True)
class _Identity:
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, fd: int) -> _Identity:
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class _Link:
    name: str
    mime: str
    expires: float
    path: Path | None = None
    identity: _Identity | None = None
    data: bytes | None = None
    root: Path | None = None  # the chat's workspace the file was checked in (else media_root)


def content_disposition(name: str) -> str:
    """``attachment`` with an ASCII fallback name and the exact name in RFC 5987 form."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name) or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


class MediaLinks:
    """The table of live links and the aiohttp handler that serves them."""

    def __init__(self, media_root: Path, public_base_url: str, ttl_s: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.media_root = Path(media_root)
        self.public_base_url = public_base_url.rstrip("/")
        self.ttl_s = ttl_s
        self.clock = clock
        self._links: dict[str, _Link] = {}
        self._unfetched: set[str] = set()  # tokens Twilio has not fetched yet

    route = f"{ROUTE_PREFIX}/{{token}}/{{name}}"

    # --- making links ---------------------------------------------------------------------
    def add_file(self, path: Path, file: BinaryIO, name: str, mime: str, *, root: Path | None = None) -> str:
        """A link to ``path``, which the caller opened through the checks of ``root`` (the chat's
        workspace; default the media root) as ``file``; it is checked there again when fetched."""
        identity = _Identity.of(file.fileno())
        return self._add(_Link(name=name, mime=mime, expires=self.clock() + self.ttl_s,
                               path=path, identity=identity, root=root))

    def add_bytes(self, data: bytes, name: str, mime: str) -> str:
        return self._add(_Link(name=name, mime=mime, expires=self.clock() + self.ttl_s, data=data))

    def _add(self, link: _Link) -> str:
        self._prune()
        token = secrets.token_urlsafe(32)
        self._links[token] = link
        self._unfetched.add(token)
        return f"{self.public_base_url}{ROUTE_PREFIX}/{token}/{quote(link.name, safe='')}"

    def forget(self, url: str) -> None:
        """Withdraw a link that was never handed to Twilio (its message was refused)."""
        token = url.rsplit("/", 2)[-2] if url.count("/") >= 2 else ""
        self._links.pop(token, None)
        self._unfetched.discard(token)

    def _prune(self) -> None:
        now = self.clock()
        for token in [t for t, link in self._links.items() if link.expires <= now]:
            del self._links[token]
            self._unfetched.discard(token)

    def __len__(self) -> int:
        self._prune()
        return len(self._links)

    async def wait_fetched(self, timeout_s: float) -> int:
        """Wait, at most ``timeout_s``, until every live link was fetched at least once; the
        number still waiting. Twilio fetches a file after the message naming it was created,
        so stopping the server at once would lose a file sent just before."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._prune()
            if not self._unfetched or loop.time() >= deadline:
                return len(self._unfetched)
            await asyncio.sleep(0.05)

    # --- serving --------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        link = self._links.get(token)
        if link is None or link.name != request.match_info["name"]:
            raise web.HTTPNotFound()
        if link.expires <= self.clock():
            self._links.pop(token, None)
            log.info("media link for %s expired before it was fetched (TALON_MEDIA_URL_TTL=%gs)",
                     link.name, self.ttl_s)
            raise web.HTTPNotFound()
        headers = {
            "Content-Type": link.mime,
            "Content-Disposition": content_disposition(link.name),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        }
        if link.data is not None:
            response: web.StreamResponse = web.Response(
                body=None if request.method == "HEAD" else link.data,
                headers={**headers, "Content-Length": str(len(link.data))})
        else:
            response = await self._serve_file(request, link, headers)
        if request.method != "HEAD":
            self._unfetched.discard(token)
        return response

    async def _serve_file(self, request: web.Request, link: _Link,
                          headers: dict[str, str]) -> web.StreamResponse:
        assert link.path is not None and link.identity is not None
        try:
            checked = await asyncio.to_thread(open_checked_media, link.path, link.root or self.media_root)
        except MediaPathError as exc:
            log.warning("media link for %s refused at fetch time: %s", link.name, exc)
            raise web.HTTPNotFound() from None
        with checked.file as fh:
            if _Identity.of(fh.fileno()) != link.identity:
                log.warning("media link for %s refused: the file changed after the link was made",
                            link.name)
                raise web.HTTPNotFound()
            response = web.StreamResponse(headers={**headers, "Content-Length": str(link.identity.size)})
            await response.prepare(request)
            if request.method != "HEAD":
                remaining = link.identity.size
                while remaining > 0:
                    chunk = await asyncio.to_thread(fh.read, min(_CHUNK, remaining))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                    await response.write(chunk)
            await response.write_eof()
            return response
