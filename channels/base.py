"""What every channel adapter provides to the bridge, and the steps adapters share."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import httpx

from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import AttachmentRef, InboundFile
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import DownloadTooLarge

if TYPE_CHECKING:
    from talon.bridge import Bridge
    from talon.media.received import ReceivedNote
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

PartCallback = Callable[[int], Awaitable[None]]
"""Called with the number of reply parts delivered so far, after each part."""

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


# Typing pings still finishing after their turn ended (kept referenced until done).
_lingering: set[asyncio.Task[None]] = set()


@dataclass(frozen=True)
class ChannelHealth:
    """Whether a channel can do its job now (``GET /healthz``), and in one line why or why not."""

    ok: bool
    detail: str


class Channel(abc.ABC):
    name: str
    typing_interval_s: float = 4.0
    # Whether senders pass the access gate on this channel; a scheduled task's owner is checked
    # against it again before each run. The console's one person is the machine's user: no gate.
    gated: bool = True

    def health(self) -> ChannelHealth:
        """Whether messages can arrive and replies leave now, from the channel's own state (never a
        network call: /healthz is asked often). Platform channels say more; this default is for
        channels with nothing to watch (the console)."""
        return ChannelHealth(True, "running")

    @abc.abstractmethod
    async def start(self, bridge: "Bridge") -> None:
        """Begin receiving messages and hand each to ``bridge.submit``."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        """Where the answer to ``message`` is shown while it is written; None (the default):
        the chat sees only the finished reply. A live view that posts a message which the final
        reply will edit reports its id to ``placed`` at once (the bridge records it in the inbox);
        ``resume_id`` is such a message from before a restart, to be edited instead of a new one."""
        return None

    async def acknowledge(self, message: InboundMessage) -> None:  # noqa: B027 - optional
        """Show the person that ``message`` was taken up (a reaction); no-op by default."""

    async def unacknowledge(self, message: InboundMessage) -> None:  # noqa: B027 - optional
        """Take that sign away again: the reply has been delivered."""

    def show_received(self, message: InboundMessage, notes: "list[ReceivedNote]") -> None:  # noqa: B027
        """Show the person what the model got of their files (an image it could not see, a voice
        note's transcript); chat apps keep quiet (the default), the console prints them."""

    async def ask_approval(self, approval: "Approval", text: str) -> str | None:
        """Show an approval prompt; channels without buttons ask for a yes/no reply. Returns the id
        of a message that ``settle_approval`` can edit, or None (this default sends a new one)."""
        await self.deliver(approval.platform_chat, OutboundReply(
            text=f"{text}\nReply yes to allow it or no to refuse (or /approve, /deny).",
            thread_id=approval.thread_id))
        return None

    async def settle_approval(self, approval: "Approval", text: str) -> None:
        """Show how an approval ended (approved, denied, no answer, stopped) and who decided."""
        await self.deliver(approval.platform_chat, OutboundReply(text=text, thread_id=approval.thread_id))

    async def drain(self) -> None:  # noqa: B027 - optional
        """Before Talon's HTTP server stops: let the platform finish fetching what was sent."""

    @abc.abstractmethod
    async def deliver(
        self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0, on_part: PartCallback | None = None
    ) -> None:
        """Send a reply as an ordered list of parts, skipping the first ``skip_parts``
        (already delivered before a crash), reporting progress after each part."""

    def reply_parts(self, reply: OutboundReply) -> Sequence[object]:
        """The ordered parts ``deliver`` sends for ``reply``, a function of the reply alone (the
        bridge counts them to resume a voice note that follows the text). A channel that cannot
        list them gets no voice notes."""
        raise NotImplementedError(f"the {self.name} channel does not list the parts of a reply")

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        """Fetch a file into the store. Failures come back as an InboundFile with a notice."""
        return InboundFile(
            kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size,
            notice=f"the {self.name} channel cannot download files",
        )

    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:  # noqa: B027 - optional
        """Show that the agent is working (no-op where the platform has no such thing);
        ``thread_id`` is the topic of the chat the turn belongs to, where there are topics."""

    @contextlib.asynccontextmanager
    async def typing(self, chat_id: str, thread_id: str | None = None) -> AsyncIterator[None]:
        """Keep the typing indicator alive for as long as the block runs."""

        done = asyncio.Event()

        async def keep_alive() -> None:
            while not done.is_set():
                try:
                    await self.send_typing(chat_id, thread_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a lost typing ping is cosmetic
                    log.debug("typing indicator for %s failed: %s", chat_id, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), self.typing_interval_s)

        task = asyncio.create_task(keep_alive())
        try:
            yield
        finally:
            # A ping in flight is let finish, never cancelled: httpcore 1.0.9 can lose a pool slot
            # for a request cancelled while it waits for a connection (encode/httpcore#1093), and
            # with every slot lost all sends fail with PoolTimeout. The reply does not wait for it.
            done.set()
            if not task.done():
                _lingering.add(task)
                task.add_done_callback(_lingering.discard)
