"""Scheduled tasks and their runs: the interface, and the in-memory implementation for tests.

A task belongs to the conversation it was scheduled from (a chat, or a forum topic) and to the
person who asked for it. ``next_run`` is when it is due next (epoch seconds, None once it will
not run again). Every run is a row of its own, keyed by the task and the time it was due, with
what became of it: ``claimed`` (taken by one worker, on its way to the inbox), ``due`` (in the
durable inbox), ``started``, ``delivered``, ``failed`` (with the reason) or ``missed``.

Claiming is a compare-and-set on the task's ``version``: of two workers that find the same due
task, one moves it on and records the run, the other's claim changes nothing and says so. The
run's inbox key is made of the task id and the due time, so even a run handed to the inbox twice
is answered once.

Implementations: ``MemoryTaskStore`` here, ``talon.storage.embedded.tasks.SqliteTaskStore``
(SQLite off the loop) and ``talon.storage.postgres.tasks.PgTaskStore`` (the async pool).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Protocol

# Task states. Only an active task is ever due.
ACTIVE, PAUSED, CANCELLED, DONE = "active", "paused", "cancelled", "done"
# Run states, in the order a run goes through them (failed and missed end it early).
CLAIMED, DUE, STARTED, DELIVERED, FAILED, MISSED = "claimed", "due", "started", "delivered", "failed", "missed"
FINAL_RUN_STATES = frozenset({DELIVERED, FAILED, MISSED})
_RANK = {CLAIMED: 0, DUE: 1, STARTED: 2, DELIVERED: 3, FAILED: 3, MISSED: 3}


def moves_from(status: str) -> tuple[str, ...]:
    """The run states a run may go to ``status`` from: forward only, and never out of an outcome
    (so a late "due" cannot overwrite "delivered", whatever order the workers' writes land in)."""
    return tuple(s for s, rank in _RANK.items() if s not in FINAL_RUN_STATES and rank <= _RANK[status])


@dataclass(frozen=True)
class Task:
    id: str
    channel: str
    chat_id: str
    thread_id: str | None
    owner_id: str
    text: str
    kind: str  # "once", "every" (spec: seconds) or "cron" (spec: five-field expression)
    spec: str
    timezone: str  # IANA name the schedule is read in
    next_run: float | None
    status: str = ACTIVE
    created: float = 0.0
    # The scheduling message as JSON (an ``InboundMessage`` without text): chat type and title,
    # topic, the owner's name and username. A run is that message again, with the task's text.
    origin: str = "{}"
    version: int = 0  # bumped by every claim and state change: the compare-and-set of claims
    failures: int = 0  # failed runs in a row
    last_due: float | None = None
    last_status: str = ""
    last_reason: str = ""

    @property
    def repeats(self) -> bool:
        return self.kind != "once"


@dataclass(frozen=True)
class TaskRun:
    task_id: str
    due: float  # when it was due (epoch seconds)
    status: str
    reason: str = ""
    updated: float = 0.0  # when it last changed; a claim gives the claiming worker's clock

    @property
    def due_ms(self) -> int:
        return due_ms(self.due)


def due_ms(due: float) -> int:
    """A run's identity within its task: the due time in whole milliseconds."""
    return int(round(due * 1000))


class TaskStore(Protocol):
    async def add(self, task: Task, *, max_active: int) -> bool:
        """Store a new task; False (and nothing stored) when its chat already has ``max_active``
        active or paused tasks."""
        ...

    async def get(self, task_id: str) -> Task | None: ...

    async def for_chat(self, channel: str, chat_id: str, thread_id: str | None, *,
                       any_thread: bool = False) -> list[Task]:
        """The conversation's tasks, oldest first (finished ones included); with ``any_thread``
        those of every topic of the chat."""
        ...

    async def every_chat(self, limit: int = 500) -> list[Task]:
        """Tasks of every conversation (the web panel): active and paused first, then the latest."""
        ...

    async def set_status(self, task_id: str, status: str, *, next_run: float | None = None,
                         only_from: tuple[str, ...] = (ACTIVE, PAUSED)) -> Task | None:
        """Change a task's state (cancel, pause, resume with its ``next_run``) when it is in one of
        ``only_from``; the updated task, or None when there is no such task in such a state."""
        ...

    async def due(self, now: float, limit: int = 100) -> list[Task]:
        """Active tasks whose ``next_run`` is at or before ``now``, earliest first."""
        ...

    async def claim(self, task: Task, next_run: float | None, run: TaskRun) -> bool:
        """Atomically: if ``task`` is unchanged since it was read (same version, still active),
        move it on to ``next_run`` (None: it is done) and record ``run``. False when another
        worker (or a cancel) got there first."""
        ...

    async def record(self, task_id: str, due: float, status: str, reason: str = "", *,
                     pause_after: int = 3) -> tuple[Task | None, bool]:
        """Set a run's state, and the task's last outcome. A failure counts towards pausing:
        after ``pause_after`` failed runs in a row an active task is paused. The task, and
        whether this call paused it."""
        ...

    async def claimed_before(self, when: float) -> list[tuple[Task, TaskRun]]:
        """Runs claimed before ``when`` that never reached the inbox (the worker died between)."""
        ...

    async def runs(self, task_id: str, limit: int = 20) -> list[TaskRun]:
        """The task's runs, latest first."""
        ...

    async def timezone(self, channel: str, chat_id: str) -> str | None: ...

    async def set_timezone(self, channel: str, chat_id: str, zone: str) -> None: ...

    async def aclose(self) -> None: ...


def apply_record(task: Task, due: float, status: str, reason: str, pause_after: int) -> tuple[Task, bool]:
    """The task after one of its runs reached ``status``: the one rule every store follows."""
    failures = task.failures
    if status == FAILED:
        failures += 1
    elif status == DELIVERED:
        failures = 0
    pause = status == FAILED and task.status == ACTIVE and failures >= pause_after
    latest = task.last_due is None or due >= task.last_due
    updated = dataclasses.replace(
        task, failures=failures, status=PAUSED if pause else task.status,
        version=task.version + (1 if pause else 0),
        last_due=due if latest else task.last_due,
        last_status=status if latest else task.last_status,
        last_reason=reason if latest else task.last_reason)
    return updated, pause


class MemoryTaskStore:
    """Tasks in a dict: for tests (one process; nothing survives it)."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._runs: dict[tuple[str, int], TaskRun] = {}
        self._zones: dict[tuple[str, str], str] = {}

    async def add(self, task: Task, *, max_active: int) -> bool:
        live = [t for t in self._tasks.values() if (t.channel, t.chat_id) == (task.channel, task.chat_id)
                and t.status in (ACTIVE, PAUSED)]
        if len(live) >= max_active:
            return False
        self._tasks[task.id] = task
        return True

    async def get(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    async def for_chat(self, channel: str, chat_id: str, thread_id: str | None, *,
                       any_thread: bool = False) -> list[Task]:
        return sorted((t for t in self._tasks.values()
                       if (t.channel, t.chat_id) == (channel, chat_id)
                       and (any_thread or t.thread_id == thread_id)),
                      key=lambda t: (t.created, t.id))

    async def every_chat(self, limit: int = 500) -> list[Task]:
        return sorted(self._tasks.values(), key=lambda t: (t.status not in (ACTIVE, PAUSED), -t.created))[:limit]

    async def set_status(self, task_id: str, status: str, *, next_run: float | None = None,
                         only_from: tuple[str, ...] = (ACTIVE, PAUSED)) -> Task | None:
        task = self._tasks.get(task_id)
        if task is None or task.status not in only_from:
            return None
        changes: dict[str, object] = {"status": status, "version": task.version + 1}
        if status == ACTIVE:
            changes.update(next_run=next_run, failures=0)
        task = self._tasks[task_id] = dataclasses.replace(task, **changes)  # type: ignore[arg-type]
        return task

    async def due(self, now: float, limit: int = 100) -> list[Task]:
        due = [t for t in self._tasks.values()
               if t.status == ACTIVE and t.next_run is not None and t.next_run <= now]
        return sorted(due, key=lambda t: t.next_run or 0.0)[:limit]

    async def claim(self, task: Task, next_run: float | None, run: TaskRun) -> bool:
        current = self._tasks.get(task.id)
        if current is None or current.version != task.version or current.status != ACTIVE:
            return False
        self._tasks[task.id] = dataclasses.replace(
            current, next_run=next_run, status=ACTIVE if next_run is not None else DONE,
            version=current.version + 1, last_due=run.due, last_status=run.status, last_reason=run.reason)
        self._runs[(task.id, run.due_ms)] = run
        return True

    async def record(self, task_id: str, due: float, status: str, reason: str = "", *,
                     pause_after: int = 3) -> tuple[Task | None, bool]:
        key = (task_id, due_ms(due))
        run = self._runs.get(key)
        task = self._tasks.get(task_id)
        if run is None or task is None or run.status not in moves_from(status):
            return None, False
        self._runs[key] = dataclasses.replace(run, status=status, reason=reason, updated=time.time())
        task, paused = apply_record(task, due, status, reason, pause_after)
        self._tasks[task_id] = task
        return task, paused

    async def claimed_before(self, when: float) -> list[tuple[Task, TaskRun]]:
        return [(self._tasks[r.task_id], r) for r in self._runs.values()
                if r.status == CLAIMED and r.updated < when and r.task_id in self._tasks]

    async def runs(self, task_id: str, limit: int = 20) -> list[TaskRun]:
        runs = [r for (tid, _), r in self._runs.items() if tid == task_id]
        return sorted(runs, key=lambda r: r.due, reverse=True)[:limit]

    async def timezone(self, channel: str, chat_id: str) -> str | None:
        return self._zones.get((channel, chat_id))

    async def set_timezone(self, channel: str, chat_id: str, zone: str) -> None:
        self._zones[(channel, chat_id)] = zone

    async def aclose(self) -> None:
        return None


# The column order both SQL stores read and write tasks in.
TASK_COLUMNS = ("id, channel, chat_id, thread_id, owner_id, text, kind, spec, timezone, next_run, status, "
                "created, origin, version, failures, last_due, last_status, last_reason")


def task_from_row(row: tuple[object, ...]) -> Task:
    return Task(*row)  # type: ignore[arg-type]


def task_values(task: Task) -> tuple[object, ...]:
    return dataclasses.astuple(task)
