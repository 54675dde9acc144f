"""The seam between the core and the channels, owned by the core.

- ``Channel`` (an ABC) is what a channel adapter implements: the bridge and the runtime call
  nothing else on it. Optional abilities have defaults here, so the core asks typed questions
  (``health()``, ``share_updates(...)``) and never probes a channel with ``hasattr``.
- ``BridgeHandle`` (a Protocol) is everything a channel may call on the bridge: hand a message in
  (``submit``), wait until the queues are idle, ask the access gate, answer an approval button.
  ``talon.bridge.Bridge`` satisfies it structurally; channels are typed against the handle, never
  against ``Bridge`` itself.

Imports point one way: channels import this module; nothing here imports a channel.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.metrics import Metrics
from talon.storage.attachments import AttachmentStore

if TYPE_CHECKING:
    from talon.control.approvals import Answer, Choice, Prompter
    from talon.media.received import ReceivedNote
    from talon.storage.access import Pairing
    from talon.storage.approvals import Approval
    from talon.storage.leases import Leases

log = logging.getLogger("channels.base")  # the name these lines have always been logged under

PartCallback = Callable[[int], Awaitable[None]]
"""Called with the number of reply parts delivered so far, after each part."""


class SenderGate(Protocol):
    """Who may talk to the agent (``talon.storage.access.AccessGate``), as a channel asks it."""

    async def allowed(self, channel: str, identities: Iterable[str]) -> bool: ...

    async def request_pairing(self, channel: str, sender_id: str, name: str = "") -> Pairing | None: ...


class ApprovalAnswers(Protocol):
    """A press of an approval button (``talon.control.approvals.Approvals``): decide, then show it."""

    async def answer(self, approval_id: str, choice: Choice, channel: str, person: str, name: str,
                     username: str | None = None, *, admin: bool = False) -> Answer: ...

    async def settle(self, prompter: Prompter, approval: Approval) -> None: ...

    async def get(self, approval_id: str) -> Approval | None: ...


class ApprovalsHost(Protocol):
    """The part of ``talon.control.Control`` a channel reaches: its approvals."""

    @property
    def approvals(self) -> ApprovalAnswers: ...


class BridgeHandle(Protocol):
    """What a channel may call on the bridge; ``talon.bridge.Bridge`` is one."""

    @property
    def gate(self) -> SenderGate: ...

    @property
    def control(self) -> ApprovalsHost | None: ...

    @property
    def metrics(self) -> Metrics: ...

    async def submit(self, message: InboundMessage) -> bool:
        """Persist and queue a message; False when it is a duplicate (already seen)."""
        ...

    async def idle(self) -> None:
        """Return once every queued message has been answered."""
        ...


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

    @abc.abstractmethod
    def serves(self, conversation: InboundMessage) -> str | None:
        """Whether this channel still serves the conversation ``conversation`` was said in (a
        scheduled task's origin, asked before each run): None when it does, else why not, in
        words for the log (a group no longer listed). Every channel answers from its own
        configuration now, never from a copy made when the task was scheduled; the person's own
        access (the gate) is checked separately where ``gated``."""

    def health(self) -> ChannelHealth:
        """Whether messages can arrive and replies leave now, from the channel's own state (never a
        network call: /healthz is asked often). Platform channels say more; this default is for
        channels with nothing to watch (the console)."""
        return ChannelHealth(True, "running")

    @abc.abstractmethod
    async def start(self, bridge: BridgeHandle) -> None:
        """Begin receiving messages and hand each to ``bridge.submit``."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    def share_updates(self, leases: Leases) -> None:  # noqa: B027 - optional
        """Workers share a database (and this channel's account): a channel whose platform lets
        only one of them fetch updates at a time takes turns through ``leases``. Called before
        ``start``; the default (updates pushed to every worker, or a single worker) does nothing."""

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

    def show_received(self, message: InboundMessage, notes: list[ReceivedNote]) -> None:  # noqa: B027
        """Show the person what the model got of their files (an image it could not see, a voice
        note's transcript); chat apps keep quiet (the default), the console prints them."""

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        """Show an approval prompt; channels without buttons ask for a yes/no reply. Returns the id
        of a message that ``settle_approval`` can edit, or None (this default sends a new one)."""
        await self.deliver(approval.platform_chat, OutboundReply(
            text=f"{text}\nReply yes to allow it or no to refuse (or /approve, /deny).",
            thread_id=approval.thread_id))
        return None

    async def settle_approval(self, approval: Approval, text: str) -> None:
        """Show how an approval ended (approved, denied, no answer, stopped) and who decided."""
        await self.deliver(approval.platform_chat, OutboundReply(text=text, thread_id=approval.thread_id))

    async def status_lines(self, chat_id: str) -> list[str]:
        """Lines the channel adds to ``/status`` for this chat (the platform's own state); none by default."""
        return []

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
