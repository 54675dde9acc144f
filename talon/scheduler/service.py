"""The scheduler: due runs become inbox messages, once, and every run's outcome is recorded.

Every ``poll_s`` each worker asks the task store for due tasks and claims each (a compare-and-set
in the store: one worker wins). A claimed run is handed to the bridge's ``submit``, the same door a
person's message comes through: the durable inbox keeps it across a crash, answers it once (its
key is the task id and due time) and in order with the chat's other messages, on whichever worker
serves the chat. A run claimed by a worker that died before the inbox had it is found again (it
stays ``claimed``) and handed over by the next poll of any worker.

A run due longer ago than the misfire grace (Talon was down) is recorded as missed, said in the
log and, where possible, in the chat; a repeating task then goes on from now, never running the
backlog. A run whose conversation the channel no longer serves (``Channel.serves``: a group
delisted from TALON_TELEGRAM_ALLOWED_CHATS) or whose owner is no longer allowed fails with that
reason, in the log too, and a repeating task is paused at once. A one-off task made by a
scheduled run runs no sooner than TALON_TASK_MIN_INTERVAL after the chat's latest one-off run, so
a chain of tasks scheduling themselves cannot fire faster than a repeat may. The
bridge reports each run's turn (started, delivered, failed with the reason) through
``observe``; after ``pause_after`` failed runs in a row the task is paused and its owner told.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from talon.envelope import InboundMessage, OutboundReply, ScheduledRun
from talon.errors import DeliveryError, ScheduleError
from talon.scheduler import when as w
from talon.storage.tasks import (
    ACTIVE,
    CANCELLED,
    CLAIMED,
    DELIVERED,
    DONE,
    DUE,
    FAILED,
    MISSED,
    PAUSED,
    STARTED,
    Task,
    TaskRun,
    TaskStore,
)

if TYPE_CHECKING:
    from talon.bridge import Bridge
    from talon.storage.access import AccessGate

log = logging.getLogger(__name__)

TASK_TEXT_MAX = 2000
# A run claimed this long ago and still not in the inbox was left by a worker that died.
RESUBMIT_AFTER_S = 15.0
# How many finished tasks /tasks still shows, latest first.
SHOWN_FINISHED = 5
ACCESS_REVOKED = "access revoked"


@dataclass(frozen=True)
class SchedulerSettings:
    misfire_grace_s: float = 3600.0
    tasks_per_chat: int = 50
    min_interval_s: float = 300.0
    timezone: str = "UTC"
    poll_s: float = 5.0
    pause_after: int = 3


def _who(origin: InboundMessage) -> str:
    if origin.sender_name and origin.sender_username:
        return f"{origin.sender_name} (@{origin.sender_username})"
    return origin.sender_name or (f"@{origin.sender_username}" if origin.sender_username else origin.sender_id)


def _origin_of(task: Task) -> InboundMessage:
    return InboundMessage.model_validate_json(task.origin)


class Scheduler:
    def __init__(self, store: TaskStore, gate: "AccessGate", settings: SchedulerSettings, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.gate = gate
        self.settings = settings
        self.clock = clock
        self.default_zone = w.zone_named(settings.timezone)
        self.bridge: "Bridge | None" = None
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False
        self.ticks = 0  # polls finished: how tests (and operators) see the loop is alive

    def attach(self, bridge: "Bridge") -> None:
        """The bridge runs are submitted to (built after the agent, which holds our tools)."""
        self.bridge = bridge

    # --- what the tools and /tasks do ------------------------------------------------------
    async def zone_for(self, channel: str, chat_id: str) -> ZoneInfo:
        """The chat's time zone: the one its person set, else TALON_TIMEZONE."""
        name = await self.store.timezone(channel, chat_id)
        if name:
            try:
                return w.zone_named(name)
            except ScheduleError:
                log.warning("chat %s:%s: stored time zone %r is unknown here; using %s", channel, chat_id,
                            name, self.default_zone.key)
        return self.default_zone

    async def set_zone(self, message: InboundMessage, name: str) -> ZoneInfo:
        zone = w.zone_named(name)
        await self.store.set_timezone(message.channel, message.chat_id, zone.key)
        log.info("chat %s:%s: time zone set to %s", message.channel, message.chat_id, zone.key)
        return zone

    async def schedule(self, message: InboundMessage, when: str, text: str,
                       zone_name: str | None = None) -> Task:
        """A new task for the conversation ``message`` came from, owned by its sender."""
        text = text.strip()
        if not text:
            raise ScheduleError("task is empty: say in words what is to be done when it runs")
        if len(text) > TASK_TEXT_MAX:
            raise ScheduleError(f"task is {len(text)} characters long; at most {TASK_TEXT_MAX} fit. "
                                "Write the details to a file in the workspace and refer to it")
        zone = w.zone_named(zone_name) if zone_name else await self.zone_for(message.channel, message.chat_id)
        now = self.clock()
        plan = w.parse_when(when, zone, now, min_interval_s=self.settings.min_interval_s)
        if plan.kind == w.ONCE and message.scheduled is not None:
            plan = await self._spaced(message, plan, zone)
        origin = message.model_copy(update={
            "text": "", "files": [], "chatter": [], "reply_to_text": None, "reply_to_sender": None,
            "edited_at": None, "scheduled": None})
        task = Task(id=secrets.token_hex(4), channel=message.channel, chat_id=message.chat_id,
                    thread_id=message.thread_id, owner_id=message.sender_id, text=text, kind=plan.kind,
                    spec=plan.spec, timezone=zone.key, next_run=plan.first, created=now,
                    origin=origin.model_dump_json())
        if not await self.store.add(task, max_active=self.settings.tasks_per_chat):
            raise ScheduleError(f"this chat already has {self.settings.tasks_per_chat} scheduled tasks, the "
                                "limit (TALON_TASKS_PER_CHAT): cancel one first")
        log.info("task %s scheduled in %s:%s by %s: %s, first run %s", task.id, task.channel,
                 message.conversation_id, message.sender_id, w.describe(task.kind, task.spec),
                 w.iso_local(plan.first, zone))
        return task

    async def _spaced(self, message: InboundMessage, plan: w.Schedule, zone: ZoneInfo) -> w.Schedule:
        """A one-off task made by a scheduled run (a task scheduling a task) runs no sooner than
        TALON_TASK_MIN_INTERVAL after the latest run, past or planned, of any one-off task of the
        chat (all its topics) and after the run that made it: a chain of tasks that schedule
        themselves "in 1 second" fires at most once per interval, like a repeating task."""
        assert message.scheduled is not None
        latest = message.scheduled.due
        for other in await self.store.for_chat(message.channel, message.chat_id, message.thread_id,
                                               any_thread=True):
            if other.kind != w.ONCE:
                continue
            for at in (other.last_due, other.next_run if other.status in (ACTIVE, PAUSED) else None):
                if at is not None:
                    latest = max(latest, at)
        earliest = latest + self.settings.min_interval_s
        if plan.first >= earliest:
            return plan
        log.info("task scheduled by task %s in %s:%s moved from %s to %s: one-off tasks made by a task run at "
                 "least %s apart (TALON_TASK_MIN_INTERVAL)", message.scheduled.task_id, message.channel,
                 message.conversation_id, w.iso_local(plan.first, zone), w.iso_local(earliest, zone),
                 w.format_seconds(self.settings.min_interval_s))
        return w.Schedule(plan.kind, plan.spec, earliest)

    async def tasks_of(self, message: InboundMessage) -> list[Task]:
        return await self.store.for_chat(message.channel, message.chat_id, message.thread_id)

    async def cancel(self, message: InboundMessage, task_id: str) -> Task:
        task_id = task_id.strip().lower()
        found = next((t for t in await self.tasks_of(message) if t.id == task_id), None)
        if found is None:
            raise ScheduleError(f"there is no task {task_id!r} in this chat; /tasks lists them")
        if found.status not in (ACTIVE, PAUSED):
            raise ScheduleError(f"task {task_id} is already {found.status}")
        task = await self.store.set_status(task_id, CANCELLED)
        if task is None:
            raise ScheduleError(f"task {task_id} finished meanwhile; /tasks shows it")
        log.info("task %s cancelled in %s:%s by %s", task_id, message.channel, message.conversation_id,
                 message.sender_id)
        return task

    async def cancel_all(self, message: InboundMessage) -> list[Task]:
        """Cancel every active or paused task of the conversation (``/tasks cancel all``)."""
        cancelled = []
        for found in await self.tasks_of(message):
            if found.status in (ACTIVE, PAUSED):
                task = await self.store.set_status(found.id, CANCELLED)
                if task is not None:
                    cancelled.append(task)
        log.info("tasks %s cancelled in %s:%s by %s (/tasks cancel all)",
                 ", ".join(t.id for t in cancelled) or "(none)", message.channel, message.conversation_id,
                 message.sender_id)
        return cancelled

    async def resume(self, message: InboundMessage, task_id: str) -> Task:
        task_id = task_id.strip().lower()
        found = next((t for t in await self.tasks_of(message) if t.id == task_id), None)
        if found is None or found.status != PAUSED:
            raise ScheduleError(f"there is no paused task {task_id!r} in this chat; /tasks lists them")
        now = self.clock()
        zone = w.zone_named(found.timezone)
        nxt = w.next_run(found.kind, found.spec, zone, now) if found.repeats else now
        task = await self.store.set_status(task_id, ACTIVE, next_run=nxt, only_from=(PAUSED,))
        if task is None:
            raise ScheduleError(f"task {task_id} changed meanwhile; /tasks shows it")
        return task

    async def listing(self, message: InboundMessage) -> str:
        """The conversation's tasks, times in its zone: what ``/tasks`` and ``list_tasks`` say."""
        zone = await self.zone_for(message.channel, message.chat_id)
        now = self.clock()
        tasks = await self.tasks_of(message)
        live = [t for t in tasks if t.status in (ACTIVE, PAUSED) or _in_flight(t)]
        finished = sorted((t for t in tasks if t not in live),
                          key=lambda t: t.last_due or t.created, reverse=True)[:SHOWN_FINISHED]
        head = f"It is now {w.local_time(now, zone)} (time zone {zone.key})."
        if not live and not finished:
            return f"{head}\nNo scheduled tasks in this chat."
        lines = [head]
        if live:
            lines.append(f"Scheduled tasks ({len(live)}):")
            lines += [self._line(t, zone) for t in live]
        if finished:
            lines.append("Finished:")
            lines += [self._line(t, zone) for t in finished]
        lines.append("/tasks cancel ID cancels one, /tasks cancel all every one; /tasks resume ID resumes a "
                     "paused one.")
        return "\n".join(lines)

    def _line(self, task: Task, zone: ZoneInfo) -> str:
        text = task.text if len(task.text) <= 80 else task.text[:79] + "\u2026"
        parts = [f"- {task.id}: {text!r} ({w.describe(task.kind, task.spec)})"]
        if task.status == ACTIVE and task.next_run is not None:
            parts.append(f"next {w.local_time(task.next_run, zone)}")
        elif task.status == PAUSED and task.last_reason.startswith(ACCESS_REVOKED):
            parts.append("PAUSED: access revoked (the last run says why)")
        elif task.status == PAUSED:
            parts.append(f"PAUSED after {task.failures} failed runs in a row")
        elif not _in_flight(task):
            parts.append(task.status)
        if task.last_status and task.last_due is not None:
            last = f"last run {w.local_time(task.last_due, zone)}: {_outcome_word(task.last_status)}"
            if task.last_reason:
                last += f" ({task.last_reason})"
            parts.append(last)
        return " \u00b7 ".join(parts)

    async def command(self, message: InboundMessage) -> str:
        """``/tasks``, ``/tasks cancel ID``, ``/tasks cancel all``, ``/tasks resume ID``."""
        words = message.text.split()[1:]
        try:
            if not words:
                return await self.listing(message)
            if words[0].lower() in ("cancel", "resume") and len(words) == 2:
                if words[0].lower() == "cancel" and words[1].lower() == "all":
                    gone = await self.cancel_all(message)
                    if not gone:
                        return "There was no active or paused task to cancel in this chat."
                    return (f"Cancelled {len(gone)} task{'s' if len(gone) != 1 else ''}: "
                            f"{', '.join(t.id for t in gone)}. None of them will run again.")
                if words[0].lower() == "cancel":
                    task = await self.cancel(message, words[1])
                    return f"Cancelled task {task.id} ({task.text[:80]!r})."
                task = await self.resume(message, words[1])
                zone = await self.zone_for(message.channel, message.chat_id)
                when = w.local_time(task.next_run, zone) if task.next_run is not None else "now"
                return f"Resumed task {task.id}; next run {when}."
        except ScheduleError as exc:
            return f"Could not do that: {exc}."
        return ("Usage: /tasks lists this chat's scheduled tasks; /tasks cancel ID; /tasks cancel all; "
                "/tasks resume ID.")

    # --- the loop --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._loop is None:
            self._stopping = False
            self._loop = asyncio.create_task(self._run(), name="talon-scheduler")

    async def stop(self) -> None:
        self._stopping = True
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: the runs wait in it, try again
                log.error("scheduler: could not check for due tasks (%s); retrying", exc)
            await asyncio.sleep(self.settings.poll_s)

    async def tick(self) -> int:
        """Hand every due run to the inbox; how many were handed over here."""
        now = self.clock()
        handed = 0
        for task, run in await self.store.claimed_before(now - RESUBMIT_AFTER_S):
            handed += await self._guarded(task, self._hand_over(task, run, now))
        for task in await self.store.due(now):
            handed += await self._guarded(task, self._fire(task, now))
        self.ticks += 1
        return handed

    async def _guarded(self, task: Task, step: Awaitable[int]) -> int:
        """One task's step; its failure (a store error, a broken row) holds up no other task."""
        try:
            return await step
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("task %s in %s:%s: could not be handled now (%s: %s); trying again at the next poll",
                      task.id, task.channel, task.chat_id, type(exc).__name__, exc)
            return 0

    async def _hand_over(self, task: Task, run: TaskRun, now: float) -> int:
        """A run claimed by a worker that died before the inbox had it."""
        if now - run.due > self.settings.misfire_grace_s:
            log.warning("task %s: the run due %s was claimed but never reached the inbox; it is too late now",
                        task.id, w.iso_local(run.due, w.UTC))
            await self._record(task.id, run.due, MISSED, "claimed by a worker that stopped before running it")
            return 0
        denied = await self._denied(task)
        if denied:
            log.error("task %s in %s:%s does not run (due %s): %s", task.id, task.channel, task.chat_id,
                      w.iso_local(run.due, w.UTC), denied)
            await self._record(task.id, run.due, FAILED, denied)
            return 0
        log.warning("task %s: the run due %s was claimed but never reached the inbox; handing it over",
                    task.id, w.iso_local(run.due, w.UTC))
        return await self._submit(task, run.due)

    async def _fire(self, task: Task, now: float) -> int:
        assert task.next_run is not None
        due = task.next_run
        zone = w.zone_named(task.timezone)
        after = w.next_run_from(task.kind, task.spec, zone, due, now)
        late = now - due
        if late > self.settings.misfire_grace_s:
            reason = (f"it was due {w.format_seconds(late)} ago, while Talon was not running; over the "
                      f"grace of {w.format_seconds(self.settings.misfire_grace_s)}")
            if await self.store.claim(task, after, TaskRun(task.id, due, MISSED, reason, now)):
                log.warning("task %s in %s:%s missed its run due %s: %s", task.id, task.channel, task.chat_id,
                            w.iso_local(due, zone), reason)
                more = (f" Next run: {w.local_time(after, zone)}." if after is not None else "")
                await self._tell(task, f"I missed the scheduled task {task.id} ({task.text[:80]!r}) due "
                                       f"{w.local_time(due, zone)}: Talon was not running then.{more}")
            return 0
        if not await self.store.claim(task, after, TaskRun(task.id, due, CLAIMED, updated=now)):
            return 0  # another worker has it, or it was cancelled meanwhile
        denied = await self._denied(task)
        if denied:
            log.error("task %s in %s:%s does not run (due %s): %s", task.id, task.channel, task.chat_id,
                      w.iso_local(due, zone), denied)
            await self._record(task.id, due, FAILED, denied)
            if after is not None and await self.store.set_status(task.id, PAUSED, only_from=(ACTIVE,)):
                log.error("task %s in %s:%s paused: %s; once that changes, /tasks resume %s in the chat starts "
                          "it again", task.id, task.channel, task.chat_id, denied, task.id)
            return 0
        return await self._submit(task, due)

    async def _denied(self, task: Task) -> str:
        """Why the task may not run now; "" when it may. The channel says whether it still serves
        the conversation (a group delisted from TALON_TELEGRAM_ALLOWED_CHATS is not); on a gated
        channel the owner of a private chat's task must still pass the access gate."""
        origin = _origin_of(task)
        channel = self.bridge.channels.get(task.channel) if self.bridge is not None else None
        if channel is None:
            return f"{ACCESS_REVOKED}: the {task.channel} channel is not running here"
        refused = channel.serves(origin)
        if refused:
            return f"{ACCESS_REVOKED}: {refused}"
        if not channel.gated or origin.is_group:
            return ""
        identities = [origin.sender_id] + ([f"@{origin.sender_username}"] if origin.sender_username else [])
        if await self.gate.allowed(task.channel, identities):
            return ""
        return f"{ACCESS_REVOKED}: {_who(origin)} is no longer allowed to use this bot"

    def run_message(self, task: Task, due: float) -> InboundMessage:
        """The inbox message of the run of ``task`` due at ``due``."""
        origin = _origin_of(task)
        zone = w.zone_named(task.timezone)
        note = (f"[Scheduled task {task.id}, set by {_who(origin)} ({w.describe(task.kind, task.spec)}), due "
                f"{w.local_time(due, zone)}; it is now {w.local_time(self.clock(), zone)}. This is not a new "
                "message from the person: do what the task says; your answer is sent to the chat.]")
        return origin.model_copy(update={
            "message_id": f"task-{task.id}-{round(due * 1000)}", "text": f"{note}\n{task.text}",
            "received_at": self.clock(), "scheduled": ScheduledRun(task_id=task.id, due=due, task_text=task.text)})

    async def _submit(self, task: Task, due: float) -> int:
        if self.bridge is None:
            raise RuntimeError("the scheduler has no bridge to submit runs to")
        message = self.run_message(task, due)
        # The one door into the inbox; a run handed over twice is a duplicate there (same key).
        fresh = await self.bridge.submit(message)
        await self._record(task.id, due, DUE)
        if fresh:
            log.info("task %s: run due %s is in the inbox as %s", task.id,
                     w.iso_local(due, w.zone_named(task.timezone)), message.key)
        return 1 if fresh else 0

    # --- outcomes --------------------------------------------------------------------------
    async def observe(self, message: InboundMessage, status: str, reason: str = "") -> None:
        """The bridge's report on a run's turn: started, delivered, or failed with the reason."""
        run = message.scheduled
        if run is None:
            return
        due = w.iso_local(run.due, w.UTC)
        if status == FAILED:
            log.error("task %s in %s:%s: run due %s failed: %s", run.task_id, message.channel,
                      message.conversation_id, due, reason)
        elif status == DELIVERED:
            log.info("task %s in %s:%s: run due %s delivered", run.task_id, message.channel,
                     message.conversation_id, due)
        await self._record(run.task_id, run.due, status, reason)

    async def _record(self, task_id: str, due: float, status: str, reason: str = "") -> None:
        task, paused = await self.store.record(task_id, due, status, reason,
                                               pause_after=self.settings.pause_after)
        if task is None or not paused:
            return
        log.error("task %s in %s:%s paused after %d failed runs in a row (last: %s); the owner can resume "
                  "it with /tasks resume %s", task.id, task.channel, task.chat_id, task.failures, reason,
                  task.id)
        if reason.startswith(ACCESS_REVOKED):
            return  # the chat is no longer served: nothing is sent to it
        await self._tell(task, f"I paused the scheduled task {task.id} ({task.text[:80]!r}) after "
                               f"{task.failures} failed runs in a row (last: {reason}). "
                               f"/tasks resume {task.id} starts it again.")

    async def _tell(self, task: Task, text: str) -> None:
        """A notice to the task's chat and topic, sent directly (best effort; the log has it too)."""
        channel = self.bridge.channels.get(task.channel) if self.bridge is not None else None
        if channel is None:
            return
        try:
            await channel.deliver(task.chat_id, OutboundReply(text=text, thread_id=task.thread_id))
        except (DeliveryError, OSError) as exc:
            log.warning("task %s: could not tell the chat %s:%s (%s)", task.id, task.channel, task.chat_id, exc)


def _in_flight(task: Task) -> bool:
    """A task with no run ahead whose last run is still on its way (a one-off being answered)."""
    return task.status == DONE and task.last_status in (CLAIMED, DUE, STARTED)


def _outcome_word(status: str) -> str:
    return {CLAIMED: "due", DUE: "due, waiting its turn", STARTED: "running"}.get(status, status)


__all__ = ["Scheduler", "SchedulerSettings"]
