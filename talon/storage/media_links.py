"""Media-link tokens: short-lived, unguessable names for outbound files that a platform fetches
by URL (Twilio). The HTTP side (``channels.media_links``) serves them; this is their table.

A link names either a file inside the media root (by its path relative to the root, the workspace
it was checked in, and its inode, size and mtime, so the fetch can check it is still the very same
file) or bytes Talon derived from one (a re-encoded image, a transcoded voice note).

Implementations: ``MemoryMediaLinks`` (one process: the table and derived bytes in memory for the
life of a link; the embedded default) and ``talon.storage.postgres.media_links.PgMediaLinks``
(any worker serves any link: the table in PostgreSQL, derived bytes in the attachment store).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

FileIdentity = tuple[int, int, int]  # inode, size, mtime_ns (not the device: it differs between mounts)


def new_token() -> str:
    return secrets.token_urlsafe(32)  # 256 bits


@dataclass(frozen=True)
class MediaLink:
    name: str
    mime: str
    size: int
    live: bool  # not yet expired
    path: str | None = None  # a file, relative to the media root
    root: str | None = None  # the workspace it was checked in, relative to the media root (None: the root)
    identity: FileIdentity | None = None
    sha256: str | None = None  # derived bytes in the attachment store
    data: bytes | None = None  # derived bytes held in memory


class MediaLinkStore(Protocol):
    async def add_file(self, name: str, mime: str, path: str, root: str | None, identity: FileIdentity,
                       ttl_s: float) -> str:
        """A new token for the file; valid ``ttl_s`` seconds."""

    async def add_bytes(self, data: bytes, name: str, mime: str, ttl_s: float) -> str: ...

    async def get(self, token: str) -> MediaLink | None:
        """The link (also an expired one, ``live`` False); None for an unknown token."""

    async def body(self, link: MediaLink) -> bytes | Path:
        """Derived bytes, or the local file holding them."""

    async def fetched(self, token: str) -> None:
        """Record that the platform fetched the link."""

    async def forget(self, token: str) -> None: ...

    async def live(self) -> int:
        """How many links are live."""

    async def unfetched(self, tokens: list[str]) -> int:
        """How many of ``tokens`` are live and were never fetched."""


class MemoryMediaLinks:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._links: dict[str, tuple[MediaLink, float]] = {}  # token -> (link, expires)
        self._fetched: set[str] = set()

    def _prune(self) -> None:
        # Expired links are kept an hour, so a late fetch is logged as expired, not unknown.
        cutoff = self.clock() - 3600
        for token in [t for t, (_, expires) in self._links.items() if expires < cutoff]:
            del self._links[token]
            self._fetched.discard(token)

    def _add(self, link: MediaLink, ttl_s: float) -> str:
        self._prune()
        token = new_token()
        self._links[token] = (link, self.clock() + ttl_s)
        return token

    async def add_file(self, name: str, mime: str, path: str, root: str | None, identity: FileIdentity,
                       ttl_s: float) -> str:
        return self._add(MediaLink(name, mime, identity[1], True, path=path, root=root, identity=identity), ttl_s)

    async def add_bytes(self, data: bytes, name: str, mime: str, ttl_s: float) -> str:
        return self._add(MediaLink(name, mime, len(data), True, data=data), ttl_s)

    async def get(self, token: str) -> MediaLink | None:
        found = self._links.get(token)
        if found is None:
            return None
        link, expires = found
        return replace(link, live=expires > self.clock())

    async def body(self, link: MediaLink) -> bytes | Path:
        assert link.data is not None
        return link.data

    async def fetched(self, token: str) -> None:
        self._fetched.add(token)

    async def forget(self, token: str) -> None:
        self._links.pop(token, None)
        self._fetched.discard(token)

    async def live(self) -> int:
        now = self.clock()
        return sum(1 for _, expires in self._links.values() if expires > now)

    async def unfetched(self, tokens: list[str]) -> int:
        now = self.clock()
        return sum(1 for t in tokens if t not in self._fetched and self._links.get(t, (None, 0.0))[1] > now)
