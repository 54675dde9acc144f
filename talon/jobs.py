"""Background delegation: ``delegate(task, background=true)`` as a durable job.

The tool call stores a job record (``talon.storage.jobs``) and hands the bridge an inbox message
(``InboundMessage.job``, key ``job-<id>``) through ``submit``, the same door a person's message
and a scheduled run come through, so the inbox keeps it across a crash. The tool returns at once
with the job's id, and the agent loop ends the turn after that step (``talon.agent.loop``).

The bridge runs the job's sub-agent beside the chat's turns (the chat keeps talking meanwhile;
``/stop`` stops the chat's turn, never a job) with the hooks of the person who asked: their caps and
usage, approvals asked in the chat. When it ends, its answer is stored on the record and the same
inbox message goes back into the chat's queue, where it is delivered as a message of its own, in
the chat's order (after the reply being written, if any). With many workers (``talon.scaleout``)
the job runs from a lane of its own in the shared inbox and its answer is a new message of the
chat's lane (``key job-<id>-answer``; ``talon.storage.inbox.inbox_lane``). A restart while it runs finds the
message pending: the job is started again from its task (counted as an attempt; after
``MAX_ATTEMPTS`` it is reported to the chat as failed), never lost silently. A finished job whose
message had not reached the chat is delivered then.

Limits: a chat has at most ``TALON_SUBAGENTS`` unfinished jobs (more are refused), and a job's
sub-agent shares the chat's slots with foreground delegations and its ``TALON_SUBAGENT_TIMEOUT``.
Every look-up is scoped to the chat: another chat's job id is "no such job".
``job_status(id)``/``cancel_job(id)`` serve the agent, ``/jobs`` and ``/jobs cancel ID`` the person.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from talon.agent.tools.registry import Tool, ToolContext, ToolResult
from talon.envelope import TURN_MESSAGE, BackgroundJobRun, InboundMessage
from talon.errors import JobError, ToolError
from talon.storage.jobs import CANCELLED, DONE, FAILED, FINISHED, QUEUED, RUNNING, UNFINISHED, Job, JobStore

if TYPE_CHECKING:
    from talon.agent.tools.delegate import DelegateTool
    from talon.bridge import Bridge

log = logging.getLogger(__name__)

SHOWN_FINISHED = 5


class Jobs:
    def __init__(self, store: JobStore, *, max_per_chat: int = 3, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.max_per_chat = max_per_chat
        self.clock = clock
        self.bridge: "Bridge | None" = None
        self.delegate: "DelegateTool | None" = None
        self.active: dict[str, asyncio.Task[Any]] = {}  # job id -> its sub-agent's task, on this worker

    def attach(self, bridge: "Bridge") -> None:
        self.bridge = bridge

    def may_cancel(self, message: InboundMessage, job: Job) -> bool:
        """As with /stop: in a group, whoever started the job, an administrator of the group or one
        of TALON_APPROVERS; in a private chat, the person in it."""
        if not message.is_group or message.sender_admin or message.sender_id == job.owner_id:
            return True
        approvers = self.bridge.approvers if self.bridge is not None else frozenset()
        who = {message.sender_id} | ({f"@{message.sender_username.lower()}"} if message.sender_username else set())
        return bool(who & approvers)

    # --- starting, asking, cancelling ----------------------------------------------------------
    async def start(self, message: InboundMessage, task: str, tools: list[str]) -> Job:
        if self.bridge is None:
            raise JobError("background jobs are not available here")
        now = self.clock()
        job = Job(id=secrets.token_hex(4), channel=message.channel, conversation=message.conversation_id,
                  owner_id=message.sender_id, task=task, tools=json.dumps(tools), status=QUEUED,
                  created=now, updated=now)
        if not await self.store.add(job, max_unfinished=self.max_per_chat):
            raise JobError(f"this chat already has {self.max_per_chat} background jobs unfinished, the limit "
                           "(TALON_SUBAGENTS): wait for one or cancel one")
        run = message.model_copy(update={
            "message_id": f"job-{job.id}", "text": "", "files": [], "chatter": [], "reply_to_text": None,
            "reply_to_sender": None, "edited_at": None, "scheduled": None, "received_at": now,
            "job": BackgroundJobRun(job_id=job.id)})
        await self.bridge.submit(run)
        log.info("chat %s:%s: background job %s started by %s: %.80s", job.channel, job.conversation, job.id,
                 message.sender_id, task)
        return job

    async def of(self, message: InboundMessage, job_id: str) -> Job:
        job = await self.store.get(message.channel, message.conversation_id, job_id.strip().lower())
        if job is None:
            raise JobError(f"there is no job {job_id.strip()!r} in this chat; /jobs lists them")
        return job

    async def cancel(self, message: InboundMessage, job_id: str) -> Job:
        job = await self.of(message, job_id)
        if job.status not in UNFINISHED:
            raise JobError(f"job {job.id} is already {job.status}")
        if not self.may_cancel(message, job):
            raise JobError(f"job {job.id} was started by someone else; only they, an administrator of this group "
                           "or an approver can cancel it")
        done = await self.store.update(job.channel, job.conversation, job.id, status=CANCELLED,
                                       result=f"cancelled by {message.sender_id}", now=self.clock(),
                                       only_from=UNFINISHED)
        if done is None:
            raise JobError(f"job {job.id} finished meanwhile; /jobs shows it")
        running = self.active.get(job.id)
        if running is not None:
            running.cancel()
        log.info("chat %s:%s: background job %s cancelled by %s", job.channel, job.conversation, job.id,
                 message.sender_id)
        return done

    async def listing(self, message: InboundMessage) -> str:
        jobs = await self.store.for_chat(message.channel, message.conversation_id)
        live = [j for j in jobs if j.status in UNFINISHED]
        finished = sorted((j for j in jobs if j.status in FINISHED), key=lambda j: j.updated,
                          reverse=True)[:SHOWN_FINISHED]
        if not live and not finished:
            return "No background jobs in this chat."
        lines = []
        if live:
            lines.append(f"Background jobs running ({len(live)}):")
            lines += [self._line(j) for j in live]
        if finished:
            lines.append("Finished:")
            lines += [self._line(j) for j in finished]
        lines.append("/jobs cancel ID cancels one.")
        return "\n".join(lines)

    def _line(self, job: Job) -> str:
        text = job.task if len(job.task) <= 80 else job.task[:79] + "\u2026"
        since = max(0, round(self.clock() - job.created))
        return f"- {job.id}: {text!r} \u00b7 {job.status} \u00b7 started {since}s ago"

    async def command(self, message: InboundMessage) -> str:
        """``/jobs`` and ``/jobs cancel ID``."""
        words = message.text.split()[1:]
        try:
            if not words:
                return await self.listing(message)
            if len(words) == 2 and words[0].lower() == "cancel":
                job = await self.cancel(message, words[1])
                return f"Cancelled background job {job.id} ({job.task[:80]!r})."
        except JobError as exc:
            return f"Could not do that: {exc}."
        return "Usage: /jobs lists this chat's background jobs; /jobs cancel ID cancels one."

    def status_text(self, job: Job) -> str:
        head = f"Job {job.id} ({job.task[:80]!r}): {job.status}"
        if job.status == DONE:
            return f"{head}. Its answer:\n{job.result}"
        if job.status in (FAILED, CANCELLED):
            return f"{head}: {job.result}"
        return f"{head}, started {max(0, round(self.clock() - job.created))}s ago."

    @staticmethod
    def result_message(job: Job) -> str:
        """What the chat is sent when a job ends."""
        if job.status == DONE:
            return f"Background job {job.id} finished:\n\n{job.result}"
        return f"Background job {job.id} failed: {job.result}"

    # --- what the bridge calls ---------------------------------------------------------------
    async def job_of(self, message: InboundMessage) -> Job | None:
        assert message.job is not None
        return await self.store.get(message.channel, message.conversation_id, message.job.job_id)

    async def set(self, job: Job, status: str, result: str | None = None, *,
                  only_from: tuple[str, ...] = UNFINISHED) -> Job | None:
        return await self.store.update(job.channel, job.conversation, job.id, status=status, result=result,
                                       now=self.clock(), only_from=only_from)

    async def delivered(self, job: Job) -> None:
        await self.store.update(job.channel, job.conversation, job.id, delivered=True, now=self.clock())

    async def run_child(self, job: Job, ctx: ToolContext) -> tuple[str, str]:
        """Run the job's sub-agent (this task is registered for ``cancel``); its end state and text."""
        if self.delegate is None:
            return FAILED, "delegation is off here (TALON_SUBAGENT)"
        args: dict[str, Any] = {"task": job.task}
        tools = json.loads(job.tools)
        if tools:
            args["tools"] = tools
        current = asyncio.current_task()
        assert current is not None
        self.active[job.id] = current
        try:
            result = await self.delegate.invoke(args, ctx)
        except ToolError as exc:
            return FAILED, str(exc)
        finally:
            self.active.pop(job.id, None)
        text = "\n".join(getattr(b, "text", "") for b in result.content).strip()
        if result.is_error:
            return FAILED, text.removeprefix("Error: ")
        return DONE, text


class JobStatusTool(Tool):
    name = "job_status"
    description = ("The state of a background job of this chat (started with delegate(..., background=true)): "
                   "running, or its answer once done.")
    parameters = {"type": "object", "properties": {"id": {"type": "string", "description": "The job id."}},
                  "required": ["id"]}

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs

    async def run(self, args: dict[str, Any]) -> ToolResult:
        message = TURN_MESSAGE.get()
        if message is None:
            raise ToolError("job_status works only in a chat")
        try:
            job = await self.jobs.of(message, str(args.get("id", "")))
        except JobError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult.text(self.jobs.status_text(job))


class CancelJobTool(Tool):
    name = "cancel_job"
    description = "Cancel a background job of this chat that has not finished."
    parameters = {"type": "object", "properties": {"id": {"type": "string", "description": "The job id."}},
                  "required": ["id"]}

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs

    async def run(self, args: dict[str, Any]) -> ToolResult:
        message = TURN_MESSAGE.get()
        if message is None:
            raise ToolError("cancel_job works only in a chat")
        try:
            job = await self.jobs.cancel(message, str(args.get("id", "")))
        except JobError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult.text(f"Cancelled job {job.id}.")


__all__ = ["CancelJobTool", "JobError", "JobStatusTool", "Jobs", "RUNNING"]
