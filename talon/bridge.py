"""The bridge: gate -> normalize -> agent -> extract -> deliver, one turn at a time per chat.

Ordering and durability live here. ``submit`` writes the message to the durable inbox first,
then queues it on its chat's worker; each chat has at most one worker, so its messages are
handled strictly in order, while different chats run concurrently. A message is marked done
only after its reply was delivered; anything pending at start-up is replayed in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from talon.agent.hooks import TurnHooks
from talon.agent.loop import Agent
from talon.bounded import BoundedMap
from talon.storage.sessions import ChatKey
from talon.config import Limits
from talon.content import ContentBlock, InboundFile, Message, TextBlock
from talon.envelope import TURN_MESSAGE, BackgroundJobRun, InboundMessage, OutboundReply
from talon.errors import (
    AuthRejected,
    CapReached,
    ContextOverflow,
    DeliveryError,
    ModelNotFound,
    ModelTimedOut,
    ProviderError,
    ProviderUnavailable,
    QuotaExceeded,
    RateLimited,
    StoreUnavailable,
)
from talon.groups import group_prompt_note, group_turn_text
from talon.control import TurnGuard
from talon.control.files import hold_files
from talon.media import defang_untrusted, extract_markdown_media
from talon.metrics import Metrics
from talon.storage.access import AccessGate
from talon.storage.attachments import AttachmentStore
from talon.storage.inbox import InboxItem, InboxStore

if TYPE_CHECKING:  # channels depend on the bridge, not the other way round
    from talon.ports import BridgeHandle, Channel
    from talon.control import Control
    from talon.jobs import Jobs
    from talon.scheduler import Scheduler
    from talon.speech.voice_replies import VoiceReplies

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
# A reply this short is planned into its parts a second time at no real cost (see ``_deliver``).
SHORT_REPLY_CHARS = 8000

# Commands the bridge answers itself, without the model.
COMMANDS = frozenset({"/start", "/help", "/new", "/status", "/stop", "/tasks", "/usage", "/approve", "/deny",
                       "/approvals", "/search", "/skills", "/context", "/jobs"})

Normalizer = Callable[[InboundMessage, str, list[InboundFile]], Awaitable[list[ContentBlock]]]
"""Turns a message's text and downloaded files into the content the agent sees."""


async def text_only(message: InboundMessage, text: str, files: list[InboundFile]) -> list[ContentBlock]:
    return [TextBlock(text=text)]


def quoted_text(message: InboundMessage) -> str:
    """The message text, with the message it replies to quoted for context."""
    text = message.text
    if message.reply_to_text:
        # Someone else's words (or the bot's, which may echo anyone's): defanged like every
        # other outside block, so a quote cannot close or open one of Talon's markers.
        quote = "\n".join("> " + line for line in defang_untrusted(message.reply_to_text).splitlines()[:20])
        sender = defang_untrusted(message.reply_to_sender) if message.reply_to_sender else ""
        head = f"In reply to {sender}:" if sender else "In reply to:"
        text = f"({head}\n{quote}\n)\n{text}" if text else f"({head}\n{quote}\n)"
    return text


def command_of(message: InboundMessage) -> str:
    """The bridge command a message is (``/status@talon_bot`` is ``/status``), or ""."""
    if message.files or not message.text.strip():
        return ""
    word = message.text.strip().split(maxsplit=1)[0].lower().split("@", 1)[0]
    return word if word in COMMANDS else ""


def edit_note(message: InboundMessage, *, while_running: bool) -> str:
    """What the model is told about an edited message, before its new text."""
    if while_running:
        return "(The person has just edited the message you are answering. It now reads:)"
    return "(The person edited a message of theirs that you already answered. It now reads:)"


@dataclass
class _Running:
    """The turn a conversation's worker is running now."""

    item: InboxItem
    task: "asyncio.Task[OutboundReply] | None" = None
    stopped: str = ""  # why it was cancelled: "stop" (/stop) or "interrupt" (a new message)
    streamed: list[str] = field(default_factory=list)  # the current model step's reply, as streamed so far
    absorbed: list[InboxItem] = field(default_factory=list)  # messages that joined it (steer)
    acknowledged: bool = False  # the acknowledgement reaction was shown (and is to be cleared)

    @property
    def partial(self) -> str:
        """The current model step's reply so far (joined when asked: appending each delta to one
        string copied the whole reply every time, quadratic in a long answer)."""
        return "".join(self.streamed)


@dataclass
class Bridge:
    agent: Agent
    inbox: InboxStore
    store: AttachmentStore
    limits: Limits
    media_root: Path
    # Who may talk to the agent; channels ask it per message, before anything reaches the inbox.
    gate: AccessGate
    normalize: Normalizer = text_only
    channels: dict[str, "Channel"] = field(default_factory=dict)
    model_label: str = ""
    # Waits between in-run retries of a reply whose delivery failed for a transient reason.
    delivery_backoff_s: tuple[float, ...] = (5.0, 20.0, 60.0)
    # Longest a turn (downloads, transcription, every model call and tool) may take before the
    # person gets an apology instead of waiting forever.
    turn_timeout_s: float = 900.0
    # How long stop waits for a reply already being delivered before cutting it off.
    stop_grace_s: float = 10.0
    # TALON_ACK_DELAY: the reaction, the typing indicator and the first live draft come this long
    # into a turn, not at once: an answer ready sooner arrives alone (fewer Bot API calls, none
    # of them spent on a flicker). 0: at once. A bare Bridge shows them at once.
    ack_delay_s: float = 0.0
    # Voice replies (TALON_VOICE_REPLIES); None: answers are text only.
    voice: "VoiceReplies | None" = None
    # A message that arrives while its conversation's turn runs (TALON_BUSY_MODE): "steer" joins
    # the turn at its next model step (if its sender is under their caps; it then shares the
    # turn's later calls), "queue" waits, "interrupt" stops the turn and goes next.
    # The runtime passes the setting (default steer); a bare Bridge keeps strict order.
    busy_mode: str = "queue"
    # Wait before trying a store again that did not answer (a database that hangs or is down).
    store_retry_s: float = 1.0
    # TALON_APPROVERS: sender ids (or @usernames) that may stop any turn, in any chat.
    approvers: frozenset[str] = frozenset()
    # Scheduled tasks: answers /tasks, and hears how each run's turn went (talon.scheduler).
    scheduler: "Scheduler | None" = None
    # Approvals, usage and caps (talon.control); None: none of them.
    control: "Control | None" = None
    # Background delegations (talon.jobs): answers /jobs; None: none here.
    jobs: "Jobs | None" = None
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        self._queues: dict[ChatKey, deque[InboxItem]] = {}
        self._running: dict[ChatKey, _Running] = {}
        # Per message, each removed when its message is answered; bounded and dropped when idle
        # all the same (a message that never comes back must not keep its entry for weeks).
        self._stops: BoundedMap[str, str] = BoundedMap("bridge_stops")  # /stop key -> "stopped", "idle" or "refused"
        self._workers: dict[ChatKey, asyncio.Task[None]] = {}
        self._asides: set[asyncio.Task[None]] = set()
        # Told of every new message once the inbox has it (the web panel's chat index), in the
        # background: a slow or failing observer never holds a message up.
        self.observers: list[Callable[[InboundMessage], Awaitable[None]]] = []
        # Told of every message answered (the agent's reply delivered), the same way.
        self.answer_observers: list[Callable[[InboundMessage], Awaitable[None]]] = []
        # Channels whose messages may be handled now. A chat's worker starts only once its channel
        # has started: a message recovered at start-up must not be downloaded or answered
        # through a channel whose clients do not exist yet.
        self._started: set[str] = set()
        self._stopped = False
        self._delivering: set[ChatKey] = set()  # chats whose reply is being sent right now
        self._live_ids: BoundedMap[str, str] = BoundedMap("bridge_live_ids")  # message key -> its live message
        self._refused: BoundedMap[str, str] = BoundedMap("bridge_refused")  # run's key -> why its reply was refused
        self.turns_started = 0
        self._answering: set[asyncio.Task[None]] = set()  # yes/no replies being matched to approvals

    def add_channel(self, channel: "Channel", *, started: bool = True) -> None:
        """Register a channel; with ``started=False`` its messages wait in their queues until
        ``channel_started`` (the runtime recovers the inbox before the channels start)."""
        self.channels[channel.name] = channel
        if started:
            self.channel_started(channel.name)

    def channel_started(self, name: str) -> None:
        self._started.add(name)
        for chat in list(self._queues):
            if chat.channel == name:
                self._start_worker(chat)

    # --- intake ---------------------------------------------------------------------------
    async def submit(self, message: InboundMessage) -> bool:
        """Persist and queue a message. False when it is a duplicate (already seen).

        ``/stop`` cancels the conversation's running turn and is answered before anything else
        queued; in ``interrupt`` mode any other message does the same (it is answered next). An
        edited message (``edited_at``) replaces its original if that has not started yet.
        """
        item = await self.inbox.add(message)
        if item is None:
            log.info("duplicate message %s ignored", message.key)
            return False
        self.metrics.received.labels(message.channel).inc()
        self._observe(message)
        if self._maybe_approval_reply(item):
            return True
        chat = conversation_key(message)
        running = self._running.get(chat)
        command = command_of(message)
        if message.edited_at is not None and await self._replace_queued(chat, message):
            await self.inbox.mark_done(message.key)  # the original, not yet started, now carries it
            return True
        if command == "/stop":
            self._stop(message)
            if self._stops[message.key] == "refused":
                # The turn goes on, and the refusal does not wait for it to end.
                self._aside(self._process(item))
            else:
                self._enqueue(item, first=True)
            return True
        if (self.busy_mode == "interrupt" and running is not None and not command
                and message.edited_at is None and message.scheduled is None and message.job is None):
            self._cancel(chat, "interrupt")
        self._enqueue(item)
        return True

    def _observe(self, message: InboundMessage) -> None:
        """Tell the observers of a new message (stored in the inbox, not a duplicate)."""
        for observer in self.observers:
            self._aside(_observed(observer, message))

    def _aside(self, work: Coroutine[Any, Any, None]) -> None:
        """Handle one message beside its conversation's worker (a refused /stop's answer)."""
        task = asyncio.create_task(work)
        self._asides.add(task)
        task.add_done_callback(self._asides.discard)

    def _maybe_approval_reply(self, item: InboxItem) -> bool:
        """A yes/no (or /approve, /deny) while an approval may wait in its conversation: it is
        matched against the store (another worker, or a run before a restart, may have asked), and
        only if nothing waits is it queued as an ordinary message. It never starts a turn itself."""
        choice = self._reply_choice(item.message)
        if choice is None:
            return False
        message = item.message
        task = asyncio.create_task(self._approval_reply(item, choice), name=f"approval-reply-{message.key}")
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        return True

    def _reply_choice(self, message: InboundMessage) -> str | None:
        """"yes"/"no" when ``message`` may answer a waiting approval (approvals on, plain text)."""
        from talon.control.approvals import reply_choice

        if (self.control is None or not self.control.approvals.enabled or message.files
                or message.edited_at is not None):
            return None
        return reply_choice(message.text)

    async def _approval_reply(self, item: InboxItem, choice: str) -> None:
        message = item.message
        assert self.control is not None
        approvals = self.control.approvals
        chat = conversation_key(message)
        try:
            answer = await approvals.answer_reply(message.channel, chat.chat_id, message.sender_id,
                                                  message.sender_name or "", choice,  # type: ignore[arg-type]
                                                  message.sender_username)
        except Exception:
            log.exception("message %s: could not match the reply to an approval; answering it as a message",
                          message.key)
            answer = None
        if answer is None:
            self._queue_ordinary(item)  # nothing waits: an ordinary message (or /approve with nothing to approve)
            return
        channel = self.channels.get(message.channel)
        if answer.outcome == "decided" and answer.approval is not None and channel is not None:
            await approvals.settle(channel, answer.approval)
            await self.inbox.mark_done(message.key)
        elif channel is not None:
            await self._deliver(channel, message, OutboundReply(text=answer.note), item=item)
        else:
            await self.inbox.mark_done(message.key)

    def _queue_ordinary(self, item: InboxItem) -> None:
        self._enqueue(item)

    def backlog(self) -> tuple[int, float | None]:
        """Messages queued or being answered on this worker, and when the oldest arrived."""
        items = [i for q in self._queues.values() for i in q] + [r.item for r in self._running.values()]
        oldest = min((i.message.received_at for i in items if i.message.received_at), default=None)
        return len(items), oldest

    async def _replace_queued(self, chat: ChatKey, edit: InboundMessage) -> bool:
        """Put an edit's text into its original while that still waits in the queue."""
        for index, queued in enumerate(self._queues.get(chat, ())):
            if queued.message.key == edit.original_key and queued.attempts == 0:
                updated = edit.model_copy(update={"edited_at": None, "received_at": queued.message.received_at})
                if not await self.inbox.replace_pending(updated):
                    return False
                self._queues[chat][index] = dataclasses.replace(queued, message=updated)
                log.info("message %s was edited before its turn; the new text is answered", edit.original_key)
                return True
        return False

    def _stop(self, message: InboundMessage) -> None:
        """Act on a ``/stop`` now; its answer (``_command``) says what came of it."""
        chat = conversation_key(message)
        if not self.may_stop(chat, message):
            log.info("%s: /stop from %s refused: the turn is someone else's", message.key, message.sender_id)
            self._stops[message.key] = "refused"
            return
        self._stops[message.key] = "stopped" if self._cancel(chat, "stop") else "idle"

    def may_stop(self, chat: ChatKey, message: InboundMessage) -> bool:
        """In a group, a turn is stopped only by whoever started it, an administrator of the group
        (the channel checked: ``sender_admin``) or one of TALON_APPROVERS; in a private chat, by
        the person in it."""
        if not message.is_group or message.sender_admin:
            return True
        who = {message.sender_id} | ({f"@{message.sender_username.lower()}"} if message.sender_username else set())
        if who & self.approvers:
            return True
        running = self._running.get(chat)
        return running is None or running.item.message.sender_id == message.sender_id

    def _cancel(self, chat: ChatKey, why: str) -> bool:
        """Stop the conversation's running turn (not a reply being delivered)."""
        running = self._running.get(chat)
        if running is None or running.task is None or running.task.done() or running.stopped:
            return False
        running.stopped = why
        running.task.cancel()
        return True

    async def recover(self) -> int:
        """Queue every message left pending by an earlier run, in arrival order."""
        items = await self.inbox.pending()
        for item in items:
            if item.message.channel not in self.channels:
                log.warning("pending message %s waits for channel %s, which is not running",
                            item.message.key, item.message.channel)
                continue
            self._enqueue(item)
        if items:
            log.info("recovered %d pending message(s) from the inbox", len(items))
        return len(items)

    def _enqueue(self, item: InboxItem, *, first: bool = False) -> None:
        chat = conversation_key(item.message)
        queue = self._queues.setdefault(chat, deque())
        if first:
            queue.appendleft(item)
        else:
            queue.append(item)
        self._start_worker(chat)

    def _start_worker(self, chat: ChatKey) -> None:
        # After stop, a message that still arrives (a webhook in flight, an album flushed by its
        # channel) is only stored: it is in the inbox and is answered at the next start.
        if self._stopped or chat.channel not in self._started:
            return
        worker = self._workers.get(chat)
        if worker is None or worker.done():
            self._workers[chat] = asyncio.create_task(self._work(chat), name=f"chat-{chat}")

    async def _work(self, chat: ChatKey) -> None:
        queue = self._queues[chat]
        while True:
            try:
                if self._stopped:  # the rest stays pending in the inbox for the next start
                    raise IndexError
                item = queue.popleft()
            except IndexError:
                # No await between the empty check and the removal: a new message cannot
                # slip in and find a worker that is about to leave.
                self._workers.pop(chat, None)
                self._queues.pop(chat, None)
                return
            try:
                await self._process(item)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("chat %s: message %s failed unexpectedly", chat, item.message.message_id)

    async def idle(self) -> None:
        """Wait until every queued message has been handled (tests and shutdown)."""
        while self._workers or self._asides or self._answering:
            await asyncio.gather(*list(self._workers.values()), *list(self._asides), *list(self._answering),
                                 return_exceptions=True)

    async def stop(self) -> None:
        """Start no new turns; cancel those in flight (their messages stay pending and are
        resumed at the next start), but let a reply that is being delivered finish, for up to
        ``stop_grace_s``: cut off between a send and its record, a part would be sent twice."""
        self._stopped = True
        for aside in list(self._asides):
            aside.cancel()
        workers = dict(self._workers)
        delivering = [task for chat, task in workers.items() if chat in self._delivering]
        for chat, task in workers.items():
            if chat not in self._delivering:
                task.cancel()
        if delivering:
            await asyncio.wait(delivering, timeout=self.stop_grace_s)
        for task in workers.values():
            task.cancel()
        await asyncio.gather(*workers.values(), return_exceptions=True)
        self._workers.clear()

    # --- one message ----------------------------------------------------------------------
    async def _process(self, item: InboxItem, *, attempted: bool = False) -> None:
        """Answer one message (``attempted``: its attempt was counted already, ``item`` is its
        state after that)."""
        message = item.message
        channel = self.channels[message.channel]
        chat = conversation_key(message)
        ids = f"channel={message.channel} chat={message.conversation_id} message={message.message_id}"
        if message.job is not None:
            await self._job_step(item, channel, chat, attempted=attempted)
            return
        if not attempted:
            state = await self.inbox.begin_attempt(message.key)
            if state is None:
                log.error("%s: not in the inbox any more; skipped", ids)
                return
            item = dataclasses.replace(item, attempts=state.attempts, delivered_parts=state.delivered_parts,
                                       live_message=state.live_message)
        try:
            await self._attempt(item, channel, chat, ids)
        except asyncio.CancelledError:
            # Stopping, or (many workers) the chat's lease was lost: not the message's fault.
            await self._give_back_attempt(message.key)
            raise

    async def _give_back_attempt(self, key: str) -> None:
        """Uncount the attempt cut short (best effort, within a second: the database may be what
        cut it short; then the attempt stays counted)."""
        undo = asyncio.ensure_future(self.inbox.give_back_attempt(key))
        undo.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(asyncio.shield(undo), 1.0)
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises its own cancellation
            log.warning("message %s: could not give its interrupted attempt back (%s)", key,
                        type(exc).__name__)

    async def _attempt(self, item: InboxItem, channel: "Channel", chat: ChatKey, ids: str) -> None:
        """Answer a message whose attempt is counted."""
        message = item.message
        attempts = item.attempts
        if attempts > 1 and await self._joined_earlier(chat, message):
            await self.inbox.mark_done(message.key)  # answered by the turn it joined, before a restart
            return
        if attempts > MAX_ATTEMPTS:
            log.error("%s: giving up after %d attempts", ids, attempts - 1)
            await self._report(message, "failed", f"gave up after {attempts - 1} attempts")
            await self._close_approvals(channel, chat, message)
            await self._deliver(channel, message, OutboundReply(
                text="Sorry, I could not process your message (it failed several times). "
                     "Please send it again or rephrase it."), item=item)
            self._refused.pop(message.key, None)
            return

        command = await self._command(chat, message)
        if command is not None:
            await self._deliver(channel, message, OutboundReply(text=command), item=item)
            return

        started = time.monotonic()
        self.turns_started += 1
        await self._report(message, "started")
        running = self._running[chat] = _Running(item)
        try:
            outcome = await self._run_and_deliver(channel, chat, message, item, running, ids)
        finally:
            self._running.pop(chat, None)
            for done in ([item] if running.acknowledged else []) + running.absorbed:
                await self._acknowledge(channel, done.message, clear=True)
        self.metrics.turns.labels(message.channel, outcome).inc()
        self.metrics.turn_seconds.labels(message.channel).observe(time.monotonic() - started)
        log.info("%s: answered in %.1fs", ids, time.monotonic() - started)

    async def _run_and_deliver(self, channel: "Channel", chat: ChatKey, message: InboundMessage,
                               item: InboxItem, running: _Running, ids: str) -> str:
        """Run the turn and deliver its reply; how it ended (for the metrics)."""
        ended = "answered"
        failure = ""  # why a scheduled run failed although its apology was delivered
        async with self._signs_of_work(channel, message, running):
            running.task = asyncio.create_task(self._turn(channel, chat, message, running, item),
                                               name=f"turn-{message.key}")
            try:
                reply = await asyncio.wait_for(running.task, self.turn_timeout_s)
            except asyncio.CancelledError:
                if not running.stopped or self._stopped:
                    raise  # shutting down: the message stays pending for the next start
                # /stop, or a new message in interrupt mode: what was said so far is kept.
                await self.agent.record_interrupted(chat, message.key, running.partial)
                if self.voice is not None:
                    self.voice.forget(message)
                log.info("%s: turn stopped (%s)", ids, running.stopped)
                await self._close_approvals(channel, chat, message)
                for done in [item, *running.absorbed]:
                    await self.inbox.mark_done(done.message.key)
                await self._report(message, "failed", f"stopped ({running.stopped})")
                return "stopped"
            except TimeoutError:
                log.error("%s: turn stopped after %.0fs (TALON_TURN_TIMEOUT)", ids, self.turn_timeout_s)
                await self._close_approvals(channel, chat, message)
                failure = f"the turn took over {self.turn_timeout_s:g}s (TALON_TURN_TIMEOUT)"
                ended = "timeout"
                reply = OutboundReply(
                    text=f"Sorry, that took too long (over {self.turn_timeout_s / 60:.0f} min), so I stopped "
                         "working on it. Please try again, or ask for a smaller piece at a time.")
            except ProviderError as exc:
                log.error("%s: model failed: %s", ids, exc)
                failure = f"model error: {type(exc).__name__}: {exc}"
                reply = OutboundReply(text=apology(exc))
                ended = "model_error"
            except StoreUnavailable:
                raise  # not the message's fault: it stays pending and is answered when the database is back
            except CapReached as exc:
                # One line, and the message is closed: it is answered again only if asked again.
                reply = OutboundReply(text=str(exc))
                failure = str(exc)
                ended = "cap_reached"
            except Exception as exc:
                ended = "failed"
                log.exception("%s: turn failed", ids)
                failure = f"error: {type(exc).__name__}: {exc}"
                reply = OutboundReply(
                    text=f"Sorry, something went wrong while handling that message ({type(exc).__name__}). "
                         "Please try again.")
        if self.voice is not None:
            self.voice.forget(message)  # a turn that failed never read what was heard
        outcome = await self._deliver(channel, message, reply, item=item)
        for joined in running.absorbed:  # answered by the same reply
            await self.inbox.mark_done(joined.message.key)
        refused = self._refused.pop(message.key, "")
        if outcome == "refused":
            await self._report(message, "failed", f"delivery refused: {refused}")
        elif outcome == "sent":
            await self._report(message, "failed" if failure else "delivered", failure)
            if ended == "answered":
                for answered in [message, *(joined.message for joined in running.absorbed)]:
                    for observer in self.answer_observers:
                        self._aside(_observed(observer, answered))
        return ended

    @contextlib.asynccontextmanager
    async def _signs_of_work(self, channel: "Channel", message: InboundMessage,
                             running: _Running) -> AsyncIterator[None]:
        """The acknowledgement reaction, then the typing indicator for as long as the block runs,
        both from ``ack_delay_s`` into it: a turn done sooner shows neither."""
        if self.ack_delay_s <= 0:
            running.acknowledged = True
            await self._acknowledge(channel, message)
            async with channel.typing(message.chat_id, message.thread_id):
                yield
            return
        done = asyncio.Event()

        async def show() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.ack_delay_s)
                return  # answered in time: no sign needed
            running.acknowledged = True
            await self._acknowledge(channel, message)
            if not done.is_set():
                async with channel.typing(message.chat_id, message.thread_id):
                    await done.wait()

        signs = asyncio.create_task(show(), name=f"signs-{message.key}")
        try:
            yield
        finally:
            done.set()
            # A reaction call in flight is let finish (never cancelled mid-request: see
            # Channel.typing); the clearing after the turn must come after it.
            with contextlib.suppress(Exception):
                await asyncio.shield(signs)

    async def _close_approvals(self, channel: "Channel", chat: ChatKey, message: InboundMessage) -> None:
        """A turn that ends without finishing (/stop, its time limit, given up after crashes)
        leaves no approval waiting for it: a later press would decide nothing."""
        if self.control is None or not self.control.approvals.enabled:
            return
        try:
            await self.control.approvals.stop_turn(message.channel, chat.chat_id, message.key, channel)
        except Exception:
            log.exception("message %s: could not close the turn's waiting approvals", message.key)

    async def _acknowledge(self, channel: "Channel", message: InboundMessage, *, clear: bool = False) -> None:
        try:
            if clear:
                await channel.unacknowledge(message)
            else:
                await channel.acknowledge(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a reaction is a courtesy; the turn goes on without it
            log.warning("message %s: could not %s the acknowledgement: %s", message.key,
                        "clear" if clear else "show", exc)

    async def _joined_earlier(self, chat: ChatKey, message: InboundMessage) -> bool:
        """Did this message join another turn (steer) that was answered before a restart?"""
        return any(m.role == "user" and m.meta.get("joined") == message.key
                   for m in await self.agent.sessions.load(chat))

    async def _user_message(self, channel: "Channel", chat: ChatKey, message: InboundMessage, *,
                            running: bool = False) -> Message:
        """A platform message as the agent sees it: files downloaded and normalized, the quoted
        reply, the speaker and chatter in groups, a note when it is an edit."""
        files = [await channel.download(remote, self.store, self.limits) for remote in message.files]
        text = quoted_text(message)
        if message.edited_at is not None and await self.inbox.seen(message.original_key):
            text = f"{edit_note(message, while_running=running)}\n{text}"
        if message.is_group:
            # Who speaks, and what the group said meanwhile; the prompt says where the agent is.
            # A scheduled run says itself who set it: nobody speaks.
            if message.scheduled is None:
                text = group_turn_text(message, text)
            self.agent.chat_notes[chat] = group_prompt_note(message)
        content = await self.normalize(message, text, files)
        return Message(role="user", content=content,
                       meta={"message_id": message.message_id, "sender": message.sender_id})

    def _steerable(self, chat: ChatKey, running: _Running, *, take: bool = True,
                   admitted: set[str] | None = None) -> list[InboxItem]:
        """Queued messages that join the running turn now: in steer mode every plain message,
        in any mode an edit of a message this turn answers. ``take=False`` only looks;
        ``admitted``: only these (by key) join, and nothing after the first that may not."""
        answering = {running.item.message.key, *(i.message.key for i in running.absorbed)}
        queue = self._queues.get(chat)
        if not queue:
            return []
        taken: list[InboxItem] = []
        for queued in list(queue):
            m = queued.message
            if admitted is not None and m.key not in admitted:
                break  # its sender is at a cap: it keeps its place and gets its own turn
            if command_of(m) or m.scheduled is not None or m.job is not None:
                break  # a command or a scheduled run keeps its place: it has its own turn
            if m.edited_at is not None and m.original_key in answering:
                taken.append(queued)
            elif self.busy_mode == "steer" and queued.attempts == 0:
                taken.append(queued)
            else:
                break  # order is kept: nothing jumps over a message that waits
        if take:
            for queued in taken:
                queue.remove(queued)
        return taken

    async def _admitted(self, chat: ChatKey, running: _Running, guard: "TurnGuard | None") -> set[str] | None:
        """The keys of the steerable messages whose senders may join the turn (each under their
        own cap); None: no caps to ask."""
        if guard is None:
            return None
        admitted: set[str] = set()
        for queued in self._steerable(chat, running, take=False):
            try:
                await guard.admit(queued.message.sender_id)
            except CapReached:
                log.info("chat %s: message %s does not join the running turn: its sender is at a cap; it is "
                         "answered on its own", chat, queued.message.message_id)
                break
            admitted.add(queued.message.key)
        return admitted

    async def _turn(self, channel: "Channel", chat: ChatKey, message: InboundMessage,
                    running: _Running | None = None, item: InboxItem | None = None) -> OutboundReply:
        """Download, normalize, run the agent: everything between a message and its reply."""
        item = item or InboxItem(0, message, 0, 0)
        running = running or _Running(item)
        TURN_MESSAGE.set(message)  # this task's own context: tools see whose turn it is
        user = await self._user_message(channel, chat, message)
        key = message.key

        async def placed(message_id: str) -> None:
            self._live_ids[key] = message_id
            await self.inbox.set_live_message(key, message_id)

        live = channel.live_reply(message, placed=placed, resume_id=item.live_message)
        # The first live draft waits for TALON_ACK_DELAY too (unless a draft is on screen already,
        # from before a restart): text streamed sooner is held, and an answer finished by then
        # goes out as one plain message.
        quiet_until = time.monotonic() + self.ack_delay_s if item.live_message is None else 0.0
        held: list[str] = []

        async def on_text(delta: str) -> None:
            running.streamed.append(delta)
            if live is None:
                return
            if quiet_until and time.monotonic() < quiet_until:
                held.append(delta)
                return
            if held:
                delta = "".join(held) + delta
                held.clear()
            await live.on_text(delta)

        async def on_step(asked_for_tools: bool) -> None:
            if asked_for_tools:
                running.streamed.clear()  # the preamble is in the session with its tool calls
                held.clear()  # a preamble never shown needs no replacing either
            if live is not None and live.on_step is not None:
                await live.on_step(asked_for_tools)

        hooks = self.control.hooks_for(message, channel, chat.chat_id) if self.control is not None else None
        guard = hooks.guard if hooks is not None and isinstance(hooks.guard, TurnGuard) else None

        async def notice(line: str) -> None:
            """One line in the chat about the turn's work (a delegation), outside the reply."""
            try:
                await channel.deliver(message.chat_id, OutboundReply(text=line, thread_id=message.thread_id))
            except Exception as exc:  # a line of progress is not worth failing the turn for
                log.warning("chat %s: a progress line could not be shown: %s", chat, exc)

        hooks = dataclasses.replace(hooks or TurnHooks(), notice=notice)

        async def steer() -> list[Message]:
            joined = []
            # A message joins only if its sender may use the model now: a person at their cap
            # never rides on someone else's turn (their message gets its own turn, and the line).
            admitted = await self._admitted(chat, running, guard)
            for queued in self._steerable(chat, running, admitted=admitted):
                m = queued.message
                if guard is not None:
                    guard.joined(m.sender_id)  # the turn's later calls are shared with them
                await self.inbox.begin_attempt(m.key)
                running.absorbed.append(queued)
                await self._acknowledge(channel, m)
                user_joined = await self._user_message(channel, chat, m, running=True)
                user_joined.meta["joined"] = m.key
                joined.append(user_joined)
                log.info("chat %s: message %s joins the running turn %s", chat, m.message_id, key)
            return joined

        try:
            result = await self.agent.run_turn(chat, user, turn_id=key, on_text=on_text,
                                               on_step=on_step, steer=steer, hooks=hooks)
        finally:
            if live is not None and live.close is not None:
                await live.close()
        reply = prepare_reply(result.text)
        if reply.media and hooks is not None and hooks.approve is not None:
            reply = await hold_files(reply, hooks.approve)  # TALON_APPROVAL=send
        if self.voice is not None:
            turn = result.messages
            if result.replayed:  # the speak tool may have been called before the restart
                turn = [m for m in await self.agent.sessions.load(chat) if m.meta.get("turn_id") == message.key]
            reply.voice = self.voice.wish(message, turn)
        return reply

    async def _deliver(self, channel: "Channel", message: InboundMessage, reply: OutboundReply, *,
                       item: InboxItem) -> str:
        """Deliver a reply, resuming after the last part that arrived (``item``: the message's
        inbox state when its attempt began); "sent", "refused" or "pending".

        A transient failure (network, long rate limit) is retried here with backoff while the
        chat waits, so its order holds; if it persists, the message stays pending and is
        resumed at the next start. A permanent refusal (the user blocked the bot, the chat is
        gone) is logged and the message closed: retrying could never succeed.
        """
        chat = conversation_key(message)
        if message.is_group:  # the answer goes to the message's topic, as a reply to it
            own = message.scheduled is not None or message.job is not None  # a run or a job: a message of its own
            reply = dataclasses.replace(reply, thread_id=message.thread_id,
                                        reply_to_message_id=None if own else message.message_id)
        if message.scheduled is not None and reply.scheduled_task is None:
            # A channel that must ask leave to speak (WhatsApp's window) names the task in its reminder.
            reply = dataclasses.replace(reply, scheduled_task=message.scheduled.task_text or message.text)
        live_id = self._live_ids.pop(message.key, None) or item.live_message
        if live_id is not None and reply.live_message_id is None:
            # The streamed message becomes the answer (also after a restart): edited, not doubled.
            reply = dataclasses.replace(reply, live_message_id=live_id)
        self._delivering.add(chat)
        # Parts known delivered, counted here: this worker alone delivers this message now.
        delivered = [item.delivered_parts]
        spoken = self._start_voice(channel, message, reply, item.delivered_parts)
        try:
            # The last part's record is left to the one that closes the message: a round trip less.
            # Counted for short replies only: listing a long reply's parts renders it once more.
            last = None
            if spoken is None and len(reply.text) <= SHORT_REPLY_CHARS:
                with contextlib.suppress(NotImplementedError):
                    last = len(channel.reply_parts(reply))
            outcome = await self._deliver_reply(channel, message, reply, delivered, last=last)
            if outcome == "sent" and spoken is not None:
                # The voice note's parts come after the text's, so a resumed delivery skips
                # exactly what arrived; it is made while the text was being sent.
                offset = len(channel.reply_parts(reply))
                voice_reply = await spoken
                if voice_reply is not None:
                    outcome = await self._deliver_reply(channel, message, voice_reply, delivered, offset=offset)
            if outcome != "pending":
                await self._record(lambda: self._finish(message, delivered[0]))
            self.metrics.deliveries.labels(message.channel, outcome).inc()
            if outcome == "sent":
                self.metrics.answered.labels(message.channel).inc()
            return outcome
        finally:
            if spoken is not None and not spoken.done():
                spoken.cancel()
            self._delivering.discard(chat)

    async def _finish(self, message: InboundMessage, delivered_parts: int) -> None:
        """Close a message whose reply was delivered (or refused for good)."""
        await self.inbox.mark_done(message.key, delivered_parts=delivered_parts)

    async def _record(self, write: Callable[[], Awaitable[None]]) -> None:
        """Record what was delivered, waiting out a database that does not answer: the platform
        has the reply, so giving up here would send it again later."""
        while True:
            try:
                await write()
                return
            except StoreUnavailable as exc:
                log.warning("delivered, but not recorded yet (%s); trying again", exc)
                await asyncio.sleep(self.store_retry_s)

    def _start_voice(self, channel: "Channel", message: InboundMessage, reply: OutboundReply,
                     delivered_parts: int) -> "asyncio.Task[OutboundReply | None] | None":
        """Start making the voice note now, unless there is none or it already arrived."""
        if self.voice is None or reply.voice is None:
            return None
        try:
            text_parts = len(channel.reply_parts(reply))
        except NotImplementedError:
            log.warning("no voice note for %s: the channel cannot list reply parts", message.key)
            return None
        if delivered_parts > text_parts:
            return None  # delivered before a restart
        return asyncio.create_task(self.voice.make(message, reply), name=f"voice-{message.key}")

    async def _deliver_reply(self, channel: "Channel", message: InboundMessage, reply: OutboundReply,
                             delivered: list[int], *, offset: int = 0, last: int | None = None) -> str:
        """Deliver one reply whose parts are counted from ``offset`` in the inbox: "sent",
        "refused" (permanently: the message is closed) or "pending" (resumed at the next start).
        ``delivered[0]`` is the count of parts delivered so far, kept up to date; the ``last``
        part's arrival is recorded by the caller, with the message's end."""
        key = message.key
        ids = f"channel={message.channel} chat={message.conversation_id} message={message.message_id}"
        if reply.delivery_key is None:
            reply = dataclasses.replace(reply, delivery_key=f"{key}#{offset}")

        async def progress(parts: int) -> None:
            delivered[0] = offset + parts
            if last is None or offset + parts < offset + last:
                await self._record(lambda: self.inbox.set_delivered_parts(key, offset + parts))

        for attempt in range(len(self.delivery_backoff_s) + 1):
            skip = max(0, delivered[0] - offset)
            try:
                await channel.deliver(message.chat_id, reply, skip_parts=skip, on_part=progress)
            except DeliveryError as exc:
                if exc.permanent:
                    log.error("%s: the platform refused the reply (%s); not retrying", ids, exc)
                    if message.scheduled is not None:  # the run's record says why
                        self._refused[key] = str(exc)
                    return "refused"
                if attempt == len(self.delivery_backoff_s):
                    log.error("%s: reply still undeliverable (%s); it stays pending and is resumed "
                              "at the next start", ids, exc)
                    return "pending"
                delay = self.delivery_backoff_s[attempt]
                self.metrics.delivery_retries.labels(message.channel).inc()
                log.warning("%s: delivery failed (%s); retrying in %.0fs", ids, exc, delay)
                await asyncio.sleep(delay)
            else:
                break
        return "sent"

    # --- chat commands ----------------------------------------------------------------------
    async def _command(self, chat: ChatKey, message: InboundMessage) -> str | None:
        if message.files or message.scheduled is not None:
            return None
        word = message.text.strip().split(maxsplit=1)[0].lower() if message.text.strip() else ""
        word = word.split("@", 1)[0]  # /status@talon_bot in groups
        if word == "/start" or word == "/help":
            return ("Hi! I'm Talon. Send me text, photos, documents or voice notes.\n"
                    "/new starts a fresh conversation; /status shows the model and context use; "
                    "/context shows what fills the model's context; "
                    "/usage shows how much of the model you used; /stop stops what I am doing; "
                    "/tasks lists scheduled tasks; /jobs lists background jobs; "
                    "/skills lists the skills I can load; "
                    "/approvals lists the tools allowed without asking; "
                    "/search words finds earlier messages of this chat.")
        if word == "/new":
            thread = await self.agent.sessions.new_thread(chat)
            return f"Started a new conversation ({thread}). The previous one is kept on disk."
        if word == "/status":
            await self.agent.discover()  # what the server says now (bounded; never fails /status)
            text = await self.agent.status_text(chat, self.model_label)
            channel = self.channels.get(message.channel)
            extra = await channel.status_lines(message.chat_id) if channel is not None else []
            return "\n".join([text, *extra]) if extra else text
        if word == "/stop":
            # The running turn was cancelled when /stop arrived (see submit); this answers it.
            outcome = self._stops.pop(message.key, "idle")
            if outcome == "stopped":
                return "Stopped."
            if outcome == "refused":
                return ("Only the person who asked, an administrator of this group or an approver "
                        "can stop what I am doing.")
            return "Nothing to stop: I was not working on anything."
        if word == "/skills":
            return await self.agent.skills_text(chat)
        if word == "/context":
            return await self.agent.context_text(chat)
        if word == "/jobs":
            if self.jobs is None:
                return "Background jobs are not available here."
            return await self.jobs.command(message)
        if word == "/tasks":
            if self.scheduler is None:
                return "Scheduled tasks are not available here."
            return await self.scheduler.command(message)
        if word == "/usage":
            if self.control is None:
                return "Usage is not recorded here."
            return await self.control.usage_text(message, chat.chat_id)
        if word == "/approvals":
            if self.control is None:
                return "Approvals are not used here."
            return await self.control.approvals.grants_command(message.channel, chat.chat_id, message.text)
        if word == "/search":
            from talon.storage.search import SEARCH_OFF, format_hits

            if not self.agent.sessions.search_enabled:
                return SEARCH_OFF
            query = message.text.strip().split(maxsplit=1)[1] if len(message.text.split()) > 1 else ""
            if not query.strip():
                return "Say what to look for: /search boiler March"
            # This conversation's own history only, every thread of it (talon.storage.search).
            return format_hits(query, await self.agent.sessions.search(chat, query, 10))
        if word in ("/approve", "/deny"):
            # A waiting approval takes these at once (see submit); here nothing was waiting.
            return "Nothing is waiting for approval in this chat."
        return None

    # --- background jobs (talon.jobs) ---------------------------------------------------------
    # Run a job's sub-agent in the place of its message instead of beside it, and hand its answer
    # to the chat's queue as a message of its own (``BackgroundJobRun.answer``): the shared bridge,
    # whose inbox gives a job's run a lane (and lease) of its own (``talon.storage.inbox.inbox_lane``).
    jobs_inline = False

    async def _job_step(self, item: InboxItem, channel: "Channel", chat: ChatKey, *, attempted: bool = False) -> None:
        """A background job's message reached the head of its queue: deliver its answer if it has
        one, else start its sub-agent beside the chat's turns (the queue goes on at once), or with
        ``jobs_inline`` in its place (the shared inbox's job lane) and hand the answer to the chat's
        queue as a message of its own."""
        message = item.message
        jobs = self.jobs
        job = await jobs.job_of(message) if jobs is not None else None
        if jobs is None or job is None or job.delivered:
            await self.inbox.mark_done(message.key)
            return
        from talon.storage.jobs import CANCELLED, FAILED, FINISHED

        answer = message.job is not None and message.job.answer  # the message delivering its answer
        if job.status == CANCELLED or (answer and job.status not in FINISHED):
            await self.inbox.mark_done(message.key)
            return
        if self.jobs_inline and not answer and job.status in FINISHED:
            await self._job_answered(item, channel)  # ended before its answer was handed over
            return
        if job.id in jobs.active:
            return  # already running on this worker
        state = item if attempted else await self.inbox.begin_attempt(message.key)
        if state is None:
            return
        item = dataclasses.replace(item, attempts=state.attempts, delivered_parts=state.delivered_parts,
                                   live_message=state.live_message)
        if job.status in FINISHED:
            outcome = await self._deliver(channel, message, OutboundReply(text=jobs.result_message(job)), item=item)
            if outcome != "pending":
                await jobs.delivered(job)
            return
        if state.attempts > MAX_ATTEMPTS:
            log.error("chat %s: background job %s was cut off %d times; reporting it failed", chat, job.id,
                      state.attempts - 1)
            failed = await jobs.set(job, FAILED, f"it was cut off {state.attempts - 1} times (Talon restarted while "
                                                 "it ran); ask again if it is still wanted")
            if failed is not None:
                await self._job_answered(item, channel)
            return
        if state.attempts > 1:
            log.warning("chat %s: background job %s was cut off by a restart; starting it again", chat, job.id)
        if self.jobs_inline:
            await self._job_child(item, channel, chat)
        else:
            self._aside(self._job_child(item, channel, chat))

    async def _job_child(self, item: InboxItem, channel: "Channel", chat: ChatKey) -> None:
        from talon.agent.hooks import guarding
        from talon.storage.jobs import CANCELLED, FAILED, QUEUED, RUNNING

        message = item.message
        jobs = self.jobs
        assert jobs is not None
        job = await jobs.job_of(message)
        if job is None:
            return
        job = await jobs.set(job, RUNNING, only_from=(QUEUED, RUNNING))
        if job is None:  # cancelled meanwhile
            await self.inbox.mark_done(message.key)
            return
        TURN_MESSAGE.set(message)  # the tools act for the person who asked, in their chat
        hooks = self.control.hooks_for(message, channel, chat.chat_id) if self.control is not None else TurnHooks()
        ctx = dataclasses.replace(self.agent.tool_context(chat), hooks=hooks)
        try:
            with guarding(hooks.guard):
                status, text = await jobs.run_child(job, ctx)
        except asyncio.CancelledError:
            now = await jobs.job_of(message)
            if now is None or now.status != CANCELLED or self._stopped:
                await self._give_back_attempt(message.key)  # a stop is not the job's fault
                raise  # shutting down: the message stays pending and the job starts again
            await self._close_approvals(channel, chat, message)
            await self.inbox.mark_done(message.key)
            return
        except StoreUnavailable:
            raise
        except Exception as exc:  # a cap reached, a tool crashing: the job failed, the chat is told
            log.warning("chat %s: background job %s failed: %s", chat, job.id, exc)
            status, text = FAILED, str(exc) or type(exc).__name__
        if await jobs.set(job, status, text, only_from=(RUNNING,)) is None:
            await self.inbox.mark_done(message.key)  # cancelled as it ended
            return
        log.info("chat %s: background job %s %s", chat, job.id, status)
        await self._job_answered(item, channel)

    async def _job_answered(self, item: InboxItem, channel: "Channel") -> None:
        """A job ended: its answer goes into the chat's queue, to be sent in the chat's order (inline:
        now, as its message is still at the head of the queue)."""
        if not self.jobs_inline:
            self._enqueue(dataclasses.replace(item, attempts=0))
            return
        # The answer goes into the chat's queue as a message of its own (its key makes a second
        # hand-over after a crash a duplicate), then the job's message is closed.
        run = item.message
        assert run.job is not None
        answer = run.model_copy(update={"message_id": f"{run.message_id}-answer",
                                        "job": BackgroundJobRun(job_id=run.job.job_id, answer=True)})
        added = await self.inbox.add(answer)
        if added is not None:
            self._queue_ordinary(added)
        await self.inbox.mark_done(run.key)

    async def _report(self, message: InboundMessage, status: str, reason: str = "") -> None:
        """Tell the scheduler how a scheduled run's turn went; its store failing costs the record,
        never the answer."""
        if message.scheduled is None or self.scheduler is None:
            return
        try:
            await self.scheduler.observe(message, status, reason)
        except Exception as exc:
            log.error("task %s: could not record its run as %s (%s)", message.scheduled.task_id, status, exc)


def conversation_key(message: InboundMessage) -> ChatKey:
    """Sessions, ordering and workspaces are per conversation: a chat, or a forum topic."""
    return ChatKey(message.channel, message.conversation_id)


def prepare_reply(text: str) -> OutboundReply:
    """Split the agent's answer into text and the media it references (code is never mined).

    The references are resolved and contained by the channel at send time, so a file that
    vanished or escapes the media root becomes a "Could not attach" line, not silence.
    """
    body, refs = extract_markdown_media(text)
    return OutboundReply(text=body, media=refs)


def apology(exc: ProviderError) -> str:
    """What the person is told when the model could not answer: what happened, and what helps."""
    said = exc.refusal.short(200) if exc.refusal is not None else ""
    if isinstance(exc, RateLimited):
        wait = f" (it asks to wait {exc.retry_after:.0f} s)" if exc.retry_after else ""
        return f"Sorry, the model server is rate limiting me right now{wait}. Please try again in a moment."
    if isinstance(exc, ProviderUnavailable):
        if exc.refusal is not None:
            return (f"Sorry, the model server failed while answering ({said}). "
                    "Please try again in a moment.")
        if isinstance(exc, ModelTimedOut):
            return ("Sorry, the model took too long to answer, so I stopped waiting (it was not asked "
                    "twice). Please try again, or ask for something shorter.")
        return ("Sorry, I couldn't reach the language model just now, so I can't answer this "
                "message. Please try again in a moment.")
    if isinstance(exc, ContextOverflow):
        window = f" ({exc.window:,} tokens)" if exc.window else ""
        return (f"Sorry, that is too long for the model's context window{window}, even after I cut "
                "and summarized what I could. Please send a shorter text or a smaller file, or "
                "/new to start a fresh conversation.")
    if isinstance(exc, ModelNotFound):
        return (f"Sorry, the model server has no such model ({said}). The bot's owner needs to fix "
                "TALON_MODEL.")
    if isinstance(exc, AuthRejected):
        return "Sorry, the model server refused the bot's API key. The bot's owner needs to fix it."
    if isinstance(exc, QuotaExceeded):
        return "Sorry, the model account is out of credit or quota. The bot's owner needs to top it up."
    if said:
        return (f"Sorry, the model server refused this message: {said}. "
                "Your next message will be answered without it.")
    return ("Sorry, the language model could not answer this message. Your next message will be "
            "answered without it.")


if TYPE_CHECKING:
    def _a_bridge_is_a_handle(bridge: Bridge) -> BridgeHandle:
        return bridge  # mypy: Bridge satisfies what channels may call on it (talon.ports)


async def _observed(observer: Callable[[InboundMessage], Awaitable[None]], message: InboundMessage) -> None:
    try:
        await observer(message)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("message %s: an observer failed (%s: %s); the message goes on", message.key,
                    type(exc).__name__, exc)
