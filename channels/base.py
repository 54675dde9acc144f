"""The steps channel adapters share. What a channel provides to the core (``Channel``) and what
it may call on the bridge (``BridgeHandle``) are the core's, in ``talon/ports.py``; they are
named here too so that a channel finds everything it builds on in one place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import httpx

from talon.storage.attachments import AttachmentStore
from talon.content import AttachmentRef
from talon.envelope import RemoteFile
from talon.errors import DownloadTooLarge
from talon.ports import BridgeHandle, Channel, ChannelHealth, PartCallback

__all__ = ["BridgeHandle", "Channel", "ChannelHealth", "PartCallback", "deliver_parts", "store_response"]

_P = TypeVar("_P")


async def deliver_parts(parts: Sequence[_P], send: Callable[[int, _P], Awaitable[None]], *,
                        skip_parts: int = 0, on_part: PartCallback | None = None) -> None:
    """Send ``parts`` in order, ``send(index, part)`` each, from index ``skip_parts`` on, and
    report progress after each. The parts must be derived from the reply alone, so that
    ``skip_parts`` means the same thing when a delivery is resumed after a restart."""
    for index, part in enumerate(parts):
        if index < skip_parts:
            continue
        await send(index, part)
        if on_part is not None:
            await on_part(index + 1)


async def store_response(resp: httpx.Response, store: AttachmentStore, remote: RemoteFile, *,
                         mime: str, limit: int) -> AttachmentRef:
    """Stream a 200 response's body into ``store`` without buffering it whole; over ``limit``
    bytes, ``DownloadTooLarge`` naming the file. A Content-Length over the cap is refused before a
    byte is read; a body that grows past it is cut off there and the store removes the partial
    file. Fetching (auth, redirects, host checks, retries) stays with each channel."""
    name = remote.name or remote.kind
    declared = resp.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise DownloadTooLarge(name, int(declared), limit)
    try:
        return await store.put_stream(resp.aiter_bytes(), mime=mime, name=remote.name, limit=limit)
    except DownloadTooLarge as exc:
        raise DownloadTooLarge(name, remote.size, exc.limit) from None
