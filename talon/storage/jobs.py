"""Background jobs' records (``talon.jobs``): one row per ``delegate(task, background=true)``.

A job is ``queued`` when made, ``running`` while its sub-agent works, then ``done`` (its answer
kept in ``result``), ``failed`` (``result`` says why) or ``cancelled``; ``delivered`` is set once
its message reached the chat. Every read is scoped to the chat (channel and conversation): a job
id from another chat is simply not found.

Implementations: ``MemoryJobs`` (tests) and ``talon.storage.embedded.jobs.SqliteJobs``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

QUEUED = "queued"
RUNNING = "running"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"
UNFINISHED = (QUEUED, RUNNING)
FINISHED = (DONE, FAILED, CANCELLED)


@dataclass(frozen=True)
class Job:
    id: str
    channel: str
    conversation: str  # the conversation id (chat, or chat and forum topic)
    owner_id: str
    task: str
    tools: str  # JSON list of tool names ("[]": all)
    status: str
    created: float
    updated: float
    result: str = ""
    delivered: bool = False


JOB_COLUMNS = "id, channel, conversation, owner_id, task, tools, status, created, updated, result, delivered"


def job_values(job: Job) -> tuple[object, ...]:
    return (job.id, job.channel, job.conversation, job.owner_id, job.task, job.tools, job.status, job.created,
            job.updated, job.result, int(job.delivered))


def job_from_row(row: tuple[object, ...]) -> Job:
    (id_, channel, conversation, owner, task, tools, status, created, updated, result, delivered) = row
    return Job(id=str(id_), channel=str(channel), conversation=str(conversation), owner_id=str(owner),
               task=str(task), tools=str(tools), status=str(status), created=float(created),  # type: ignore[arg-type]
               updated=float(updated), result=str(result), delivered=bool(delivered))  # type: ignore[arg-type]


class JobStore(Protocol):
    async def add(self, job: Job, *, max_unfinished: int) -> bool:
        """Store a new job unless its chat already has ``max_unfinished`` queued or running."""

    async def get(self, channel: str, conversation: str, job_id: str) -> Job | None:
        """The chat's job ``job_id``; None for an unknown id or another chat's job."""

    async def for_chat(self, channel: str, conversation: str) -> list[Job]:
        """The chat's jobs, oldest first."""

    async def update(self, channel: str, conversation: str, job_id: str, *, status: str | None = None,
                     result: str | None = None, delivered: bool | None = None, now: float,
                     only_from: tuple[str, ...] = ()) -> Job | None:
        """Change a job (only from the states ``only_from`` names, if any); None when it did not."""

    async def close(self) -> None: ...


class MemoryJobs:
    """Jobs in a dict, for tests: the same answers as the durable store."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    async def add(self, job: Job, *, max_unfinished: int) -> bool:
        live = [j for j in self._jobs.values()
                if (j.channel, j.conversation) == (job.channel, job.conversation) and j.status in UNFINISHED]
        if len(live) >= max_unfinished or job.id in self._jobs:
            return False
        self._jobs[job.id] = job
        return True

    async def get(self, channel: str, conversation: str, job_id: str) -> Job | None:
        job = self._jobs.get(job_id)
        return job if job is not None and (job.channel, job.conversation) == (channel, conversation) else None

    async def for_chat(self, channel: str, conversation: str) -> list[Job]:
        return sorted((j for j in self._jobs.values() if (j.channel, j.conversation) == (channel, conversation)),
                      key=lambda j: (j.created, j.id))

    async def update(self, channel: str, conversation: str, job_id: str, *, status: str | None = None,
                     result: str | None = None, delivered: bool | None = None, now: float,
                     only_from: tuple[str, ...] = ()) -> Job | None:
        job = await self.get(channel, conversation, job_id)
        if job is None or (only_from and job.status not in only_from):
            return None
        job = replace(job, status=status if status is not None else job.status,
                      result=result if result is not None else job.result,
                      delivered=delivered if delivered is not None else job.delivered, updated=now)
        self._jobs[job_id] = job
        return job

    async def close(self) -> None:
        return None
