"""The steps channel adapters share. What a channel provides to the core (``Channel``) and what
it may call on the bridge (``BridgeHandle``) are the core's, in ``talon/ports.py``; they are
named here too so that a channel finds everything it builds on in one place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import httpx

from talon.config import Limits
from talon.content import AttachmentRef, InboundFile
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import DownloadError, DownloadTooLarge, MediaError
from talon.ports import BridgeHandle, Channel, ChannelHealth, PartCallback
from talon.storage.attachments import AttachmentStore

if TYPE_CHECKING:
    from talon.storage.approvals import Approval

__all__ = ["BridgeHandle", "Channel", "ChannelHealth", "ForwardsApprovals", "ForwardsDelivery",
           "ForwardsDownloads", "ForwardsLiveReplies", "ForwardsReactions", "ForwardsTyping", "PartCallback",
           "PartsChannel", "deliver_parts", "download_into_store", "store_response"]

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


async def download_into_store(http: httpx.AsyncClient, url: str | None, remote: RemoteFile, store: AttachmentStore,
                              limits: Limits, *, headers: dict[str, str] | None = None) -> InboundFile:
    """A file a person shared, fetched with one GET into ``store`` (``store_response``), as Discord,
    Matrix and Slack fetch theirs. ``url`` is None when the channel does not fetch the file's
    address (a host it does not trust with its token). Refused before any request when the event
    already says the file is over the download cap. Failures come back as the file with a notice."""
    base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
    name = remote.name or remote.kind
    if remote.size is not None and remote.size > limits.download_max_bytes:
        return base.model_copy(update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
    if url is None:
        return base.model_copy(update={"notice": f"{name} has an address Talon does not fetch"})
    try:
        async with http.stream("GET", url, headers=headers) as resp:
            if resp.status_code != 200:
                raise DownloadError(f"download of {name} failed: HTTP {resp.status_code}")
            mime = remote.mime or resp.headers.get("content-type") or "application/octet-stream"
            ref = await store_response(resp, store, remote, limit=limits.download_max_bytes, mime=mime)
    except httpx.HTTPError as exc:
        return base.model_copy(update={"notice": f"download of {name} failed: {type(exc).__name__}"})
    except MediaError as exc:
        return base.model_copy(update={"notice": str(exc)})
    return base.model_copy(update={"ref": ref, "size": ref.bytes})

# --- a channel made of parts -------------------------------------------------------------------
# The platform channels hold one object per job (``approvals``, ``delivery``, ``downloads``, ``live``,
# ``reactions``) and answer the ``Channel`` methods by asking the part whose job it is. The
# forwarding is written once here, as mixins typed against the parts' shapes below; each channel
# composes the ones it has (listed before ``Channel``) and keeps its parts in its own package.


class ApprovalPart(Protocol):
    def bind(self, bridge: BridgeHandle) -> None: ...

    async def ask_approval(self, approval: Approval, text: str) -> str | None: ...

    async def settle_approval(self, approval: Approval, text: str) -> None: ...


class DeliveryPart(Protocol):
    def reply_parts(self, reply: OutboundReply) -> Sequence[object]: ...

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None: ...


class TypingPart(DeliveryPart, Protocol):
    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None: ...


class DownloadPart(Protocol):
    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile: ...


class LivePart(Protocol):
    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None: ...


class ReactionPart(Protocol):
    async def acknowledge(self, message: InboundMessage) -> None: ...

    async def unacknowledge(self, message: InboundMessage) -> None: ...


class ForwardsApprovals(Channel):
    """Approval prompts shown and settled by ``self.approvals``."""

    approvals: ApprovalPart

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        return await self.approvals.ask_approval(approval, text)

    async def settle_approval(self, approval: Approval, text: str) -> None:
        await self.approvals.settle_approval(approval, text)


class ForwardsDelivery(Channel):
    """A reply's parts planned and sent by ``self.delivery``."""

    delivery: DeliveryPart

    def reply_parts(self, reply: OutboundReply) -> Sequence[object]:
        return self.delivery.reply_parts(reply)

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        await self.delivery.deliver(chat_id, reply, skip_parts=skip_parts, on_part=on_part)


class ForwardsTyping(ForwardsDelivery):
    """The typing indicator sent by ``self.delivery`` too (platforms that have one)."""

    delivery: TypingPart

    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self.delivery.send_typing(chat_id, thread_id)


class ForwardsDownloads(Channel):
    """Files fetched by ``self.downloads``."""

    downloads: DownloadPart

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        return await self.downloads.download(remote, store, limits)


class ForwardsLiveReplies(Channel):
    """Answers shown while they are written by ``self.live``."""

    live: LivePart

    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        return self.live.live_reply(message, placed=placed, resume_id=resume_id)


class ForwardsReactions(Channel):
    """The acknowledgement reaction put and taken away by ``self.reactions``."""

    reactions: ReactionPart

    async def acknowledge(self, message: InboundMessage) -> None:
        await self.reactions.acknowledge(message)

    async def unacknowledge(self, message: InboundMessage) -> None:
        await self.reactions.unacknowledge(message)


class PartsChannel(ForwardsApprovals, ForwardsDelivery, ForwardsDownloads, ForwardsLiveReplies, Channel):
    """The parts every chat platform with edited live views has (Telegram, Matrix, Slack, Discord)."""
