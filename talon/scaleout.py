"""Many workers, one order per chat: the bridge when the stores are shared (PostgreSQL).

A worker serves a chat only while it holds the chat's lease (``talon.storage.leases``): a row that says
who serves it until when. The worker that stores a message tries to take the lease and, if it
gets it, serves the chat's pending messages from the shared inbox one at a time, oldest first,
until none is left, then gives the lease back. If another worker holds it, that worker finds the
new message when it asks the inbox for the chat's next one. Every worker also scans the inbox
every ``scan_interval_s`` for chats with pending messages and no live lease (a worker died, or a
message arrived while the lease was being given back), and renews its leases every third of the
lease time. A worker that could not renew a lease in time stops serving that chat: someone else
may have it by now.

A worker that dies (SIGKILL, power) loses its chats when their leases expire
(``TALON_LEASE_SECONDS``); other workers carry on from the inbox. A message whose reply was sent
but not yet recorded when the worker died is answered again: that send-then-record window is the
only source of duplicates (see docs/decisions.md).

The unit of order and lease is the message's lane (``talon.storage.inbox.inbox_lane``): its chat,
except for a background job's run, which has a lane (and lease) of its own, so a running job never
holds its chat; the job's answer comes back as a message of the chat's lane.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from talon.bounded import BoundedMap
from talon.storage.sessions import ChatKey
from talon.bridge import Bridge, command_of, conversation_key
from talon.envelope import InboundMessage
from talon.errors import StoreUnavailable
from talon.storage.inbox import InboxItem, SharedInbox, inbox_lane
from talon.storage.leases import Leases, chat_lease

log = logging.getLogger(__name__)


@dataclass
class SharedBridge(Bridge):
    leases: Leases | None = None
    worker_id: str = ""
    scan_interval_s: float = 0.5
    # A chat whose message could not be finished here (delivery kept failing) is left to the
    # scan (of any worker) again only after this long.
    retry_after_s: float = 30.0

    # A background job runs in the place of its run's message, in a lane of its own in the shared
    # inbox (``inbox_lane``: its own lease, so the chat goes on meanwhile); its answer is a message
    # of the chat's lane, delivered in the chat's order.
    jobs_inline = True

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.leases is not None and isinstance(self.inbox, SharedInbox)
        self._shared_inbox: SharedInbox = self.inbox
        self._leases: Leases = self.leases
        self._coordinator: asyncio.Task[None] | None = None
        self._lease_watch: asyncio.Task[None] | None = None
        self._retry_at: BoundedMap[ChatKey, float] = BoundedMap("scaleout_retry_at")
        # How many times each chat's lease was taken here: a renewal that started before the
        # latest taking says nothing about it.
        self._taken: dict[ChatKey, int] = {}
        self._takings = 0  # counts every taking and giving back, for ``_taken``
        self._renewed = time.monotonic()  # leases taken from now on are fresh
        self._claiming: set[ChatKey] = set()  # chats whose lease is being taken now
        self._released: dict[ChatKey, bool] = {}  # chats whose lease closing a message gave back
        # Chats whose lease this worker holds as far as it knows (taken, not yet given back): a
        # worker task still winding down after giving its lease back has not lost it.
        self._holding: set[ChatKey] = set()

    # --- intake ---------------------------------------------------------------------------
    async def submit(self, message: InboundMessage) -> bool:
        chat = ChatKey(message.channel, inbox_lane(message))
        # A yes/no that may answer a waiting approval is not taken as the chat's next turn until
        # the approvals said nothing waits for it (``_queue_ordinary``).
        claim = self._reply_choice(message) is None and self._may_claim(chat)
        leased = False
        if claim:
            # Stored and the chat's lease tried in one round trip.
            self._claiming.add(chat)
            try:
                item, leased = await self._shared_inbox.add_and_lease(
                    message, chat_lease(chat.channel, chat.chat_id), self._leases.holder, self._leases.ttl_s)
                if leased:
                    self._took(chat, holding=True)
                    self._start(chat)
            finally:
                self._claiming.discard(chat)
        else:
            item = await self.inbox.add(message)
        if item is None:
            log.info("duplicate message %s ignored", message.key)
            return False
        self.metrics.received.labels(message.channel).inc()
        self._observe(message)
        if self._maybe_approval_reply(item):
            return True
        # /stop (and a new message in interrupt mode) cancels the turn when this worker runs it;
        # a turn running on another worker finishes there, and the /stop is answered after it.
        command = command_of(message)
        if command == "/stop":
            self._stop(message)
        elif (self.busy_mode == "interrupt" and not command and message.edited_at is None
              and message.scheduled is None and message.job is None):
            self._cancel(conversation_key(message), "interrupt")
        return True

    def _queue_ordinary(self, item: InboxItem) -> None:
        # Pending in the shared inbox: this worker serves the chat if its lease is free.
        self._aside(self._claim(ChatKey(item.message.channel, inbox_lane(item.message))))

    async def recover(self) -> int:
        """Nothing to queue here: pending messages are found by the scan once channels start."""
        return 0

    def channel_started(self, name: str) -> None:
        super().channel_started(name)
        if self._coordinator is None and not self._stopped:
            self._coordinator = asyncio.create_task(self._coordinate(), name="talon-coordinator")
            self._lease_watch = asyncio.create_task(self._watch_leases(), name="talon-lease-watch")

    def _may_claim(self, chat: ChatKey) -> bool:
        """Whether to try for the chat's lease: nothing here serves it or is taking it now (a
        worker serving it asks the inbox for the chat's next message after each one)."""
        if self._stopped or chat.channel not in self._started or chat in self._claiming:
            return False
        worker = self._workers.get(chat)
        return worker is None or worker.done()

    async def _claim(self, chat: ChatKey) -> None:
        if not self._may_claim(chat):
            return
        self._claiming.add(chat)
        try:
            if await self._take(chat):
                self._start(chat)
        finally:
            self._claiming.discard(chat)

    def _start(self, chat: ChatKey) -> None:
        if not self._stopped:
            self._workers[chat] = asyncio.create_task(self._work(chat), name=f"chat-{chat}")

    def _took(self, chat: ChatKey, *, holding: bool | None = None) -> None:
        """The chat's lease was taken (``holding``), is being given back (``holding=False``) or may
        be (None): a renewal that began before says nothing of it."""
        self._takings += 1
        self._taken[chat] = self._takings
        if holding:
            self._holding.add(chat)
        elif holding is not None:
            self._holding.discard(chat)

    async def _take(self, chat: ChatKey) -> bool:
        if not await self._leases.acquire(chat_lease(chat.channel, chat.chat_id)):
            return False
        self._took(chat, holding=True)
        return True

    # --- serving one chat -------------------------------------------------------------------
    async def _work(self, chat: ChatKey) -> None:
        name = chat_lease(chat.channel, chat.chat_id)
        tried: set[int] = set()
        try:
            while not self._stopped:
                try:
                    if await self._serve_next(chat, name, tried):
                        return
                except StoreUnavailable as exc:
                    # The database hangs or is away: no message is at fault. The chat's next one
                    # is tried again, in its place, once the database answers (while the lease
                    # holds; past it, the watchdog gives the chat up).
                    log.warning("chat %s waits for the database (%s)", chat, exc)
                    await asyncio.sleep(self.store_retry_s)
        finally:
            if self._workers.get(chat) is asyncio.current_task():
                self._workers.pop(chat, None)
                self._taken.pop(chat, None)
                self._released.pop(chat, None)
                self._holding.discard(chat)

    async def _serve_next(self, chat: ChatKey, name: str, tried: set[int]) -> bool:
        """Answer the chat's next message; True when there is none left to answer here."""
        # The next message and its attempt in one round trip (not counted again for a message
        # whose delivery failed here already).
        item = await self._shared_inbox.claim_next(chat.channel, chat.chat_id, sorted(tried))
        if item is None or item.seq in tried:
            if item is not None:  # its delivery failed for now; give others a go later
                self._retry_at[chat] = time.monotonic() + self.retry_after_s
            self._took(chat, holding=False)
            await self._leases.release(name)
            if item is not None:
                return True
            # A message stored by a worker that found the lease still held must not wait for
            # the scan: look once more now that the lease is free.
            again = await self._shared_inbox.next_pending(chat.channel, chat.chat_id)
            return again is None or not await self._take(chat)
        tried.add(item.seq)
        try:
            await self._process(item, attempted=True)
        except StoreUnavailable:
            tried.discard(item.seq)
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("chat %s: message %s failed unexpectedly", chat, item.message.message_id)
        # Closing the message gave the lease back when nothing else waited: done here.
        return self._released.pop(chat, False)

    async def _finish(self, message: InboundMessage, delivered_parts: int) -> None:
        chat = ChatKey(message.channel, inbox_lane(message))
        if self._workers.get(chat) is not asyncio.current_task():
            await super()._finish(message, delivered_parts)
            return
        # Closed, and the lease given back if the chat has nothing else pending, in one round trip.
        self._took(chat)
        if await self._shared_inbox.finish(message.key, delivered_parts, chat_lease(chat.channel, chat.chat_id),
                                           self._leases.holder):
            self._released[chat] = True
            self._holding.discard(chat)

    # --- leases and the scan --------------------------------------------------------------
    async def _coordinate(self) -> None:
        """Renewals and the scan, each in a loop of its own: a scan that waits for a busy pool
        (it takes leases one by one) must not hold back the renewal of the leases held."""
        renewals = asyncio.create_task(self._keep_renewing(), name="talon-lease-renewals")
        try:
            while not self._stopped:
                try:
                    await self._scan()
                except Exception as exc:  # the database is away: keep trying, the leases tell the rest
                    log.error("worker %s: scanning the inbox failed (%s); retrying", self.worker_id, exc)
                await asyncio.sleep(self.scan_interval_s)
        finally:
            renewals.cancel()
            await asyncio.gather(renewals, return_exceptions=True)

    async def _keep_renewing(self) -> None:
        while not self._stopped:
            try:
                await self._renew()
            except Exception as exc:  # the watchdog gives the chats up if this lasts past the lease
                log.error("worker %s: renewing the leases failed (%s); retrying", self.worker_id, exc)
            await asyncio.sleep(min(self.scan_interval_s, self._leases.ttl_s / 6))

    async def _renew(self) -> None:
        now = time.monotonic()
        if now - self._renewed < self._leases.ttl_s / 3:
            return
        # Only the chats served now, as they are now: a chat taken while the renewal runs has a
        # fresh lease, and a lease row of ours that nothing here serves any more must expire.
        serving = dict(self._workers)
        taken = dict(self._taken)
        names = [chat_lease(chat.channel, chat.chat_id) for chat in serving]
        held = await self._leases.renew(names) if names else set()
        self._renewed = now
        for chat, task in serving.items():
            if (chat_lease(chat.channel, chat.chat_id) not in held and not task.done()
                    and self._workers.get(chat) is task and self._taken.get(chat) == taken.get(chat)
                    and chat in self._holding):
                log.error("worker %s: lost the lease of chat %s (not renewed within %gs); another worker "
                          "serves it now", self.worker_id, chat, self._leases.ttl_s)
                self._holding.discard(chat)  # cancelled once: its winding down is not cut short again
                task.cancel()

    async def _watch_leases(self) -> None:
        """Past the lease time without a renewal (the database does not answer, and the renewal
        waits for it), every lease of ours may be someone else's now: stop serving those chats.
        A task of its own, since the coordinator is the one that is stuck waiting."""
        while not self._stopped:
            await asyncio.sleep(min(0.2, self._leases.ttl_s / 3))
            if self._workers and time.monotonic() - self._renewed > self._leases.ttl_s:
                given_up = [(chat, task) for chat, task in self._workers.items() if chat in self._holding]
                if given_up:
                    log.error("worker %s: leases not renewed for over %gs; stops serving its %d chat(s)",
                              self.worker_id, self._leases.ttl_s, len(given_up))
                for chat, task in given_up:
                    self._holding.discard(chat)  # cancelled once: its winding down is not cut short again
                    task.cancel()

    async def _scan(self) -> None:
        channels = sorted(self._started)
        if not channels:
            return
        waiting = await self._shared_inbox.pending_chats(channels, 100)
        now = time.monotonic()
        for channel, chat_id in waiting:
            chat = ChatKey(channel, chat_id)
            if self._retry_at.get(chat, 0.0) > now:
                continue
            self._retry_at.pop(chat, None)
            await self._claim(chat)

    async def stop(self) -> None:
        self._stopped = True
        for task in (self._coordinator, self._lease_watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await super().stop()
        try:
            await self._leases.release_all()  # the other workers take the chats over at once
        except Exception as exc:
            log.warning("worker %s: could not give its leases back (%s); they expire in %gs",
                        self.worker_id, exc, self._leases.ttl_s)

    # --- chat commands ----------------------------------------------------------------------
    async def _command(self, chat: ChatKey, message: InboundMessage) -> str | None:
        text = await super()._command(chat, message)
        word = message.text.strip().split(maxsplit=1)[0].lower() if message.text.strip() else ""
        if text is not None and word.split("@", 1)[0] == "/status":
            text += f"\nWorker: {self.worker_id}"
        return text
