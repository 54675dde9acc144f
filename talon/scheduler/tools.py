"""The agent's scheduling tools: schedule_task, list_tasks, cancel_task and set_timezone.

They act for the person whose turn is running, in that conversation (``TURN_MESSAGE``, set by the
bridge): a task belongs to the chat or topic it was made in and to the person who asked.
"""

from __future__ import annotations

from typing import Any

from talon.agent.tools.registry import Tool, ToolResult
from talon.envelope import TURN_MESSAGE, InboundMessage
from talon.errors import ScheduleError, ToolError
from talon.scheduler import when as w
from talon.scheduler.service import Scheduler


def _turn() -> InboundMessage:
    message = TURN_MESSAGE.get()
    if message is None:
        raise ToolError("scheduling works only in a chat, while answering a person")
    return message


def _text(args: dict[str, Any], name: str, *, required: bool = True) -> str:
    value = args.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ToolError(f"{name} must be a non-empty string")
    return value


class _SchedulerTool(Tool):
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler


class ScheduleTaskTool(_SchedulerTool):
    name = "schedule_task"
    description = (
        "Run a task later in this chat (reminder, report, check); when due you get `task` as a scheduled "
        "turn and your answer is sent here. For today's date and time call list_tasks."
    )
    parameters = {
        "type": "object",
        "properties": {
            "when": {"type": "string",
                     "description": "ISO date-time with offset, a delay (PT90S, in 2 hours), or a repeat: "
                                    "'every 6 hours' or cron '0 8 * * 1-5' (chat's time zone)."},
            "task": {"type": "string", "description": "What to do then, in words."},
            "timezone": {"type": "string", "description": "IANA zone; default the chat's."},
        },
        "required": ["when", "task"],
    }

    async def run(self, args: dict[str, Any]) -> ToolResult:
        message = _turn()
        zone_name = _text(args, "timezone", required=False).strip() or None
        try:
            task = await self.scheduler.schedule(message, _text(args, "when"), _text(args, "task"), zone_name)
        except ScheduleError as exc:
            raise ToolError(f"not scheduled: {exc}") from None
        zone = w.zone_named(task.timezone)
        assert task.next_run is not None
        repeat = "" if not task.repeats else f", repeating ({w.describe(task.kind, task.spec)})"
        spaced = ""
        if message.scheduled is not None and not task.repeats:
            spaced = (" A one-off task made by a scheduled task runs at least "
                      f"{w.format_seconds(self.scheduler.settings.min_interval_s)} after the chat's previous "
                      "one (TALON_TASK_MIN_INTERVAL).")
        return ToolResult.text(
            f"Scheduled task {task.id}: next run {w.local_time(task.next_run, zone)} "
            f"({w.iso_local(task.next_run, zone)}, time zone {zone.key}){repeat}.{spaced} Tell the person its "
            "id and time; they can list tasks with /tasks and cancel one with /tasks cancel ID.")


class ListTasksTool(_SchedulerTool):
    name = "list_tasks"
    description = "This chat's scheduled tasks (ids, next run, last outcome) and the current time."
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}

    async def run(self, args: dict[str, Any]) -> ToolResult:
        return ToolResult.text(await self.scheduler.listing(_turn()))


class CancelTaskTool(_SchedulerTool):
    name = "cancel_task"
    description = "Cancel one of this chat's scheduled tasks."
    parameters = {
        "type": "object",
        "properties": {"id": {"type": "string", "description": "The task's id."}},
        "required": ["id"],
    }

    async def run(self, args: dict[str, Any]) -> ToolResult:
        try:
            task = await self.scheduler.cancel(_turn(), _text(args, "id"))
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        return ToolResult.text(f"Cancelled task {task.id} ({task.text[:80]!r}); it will not run again.")


class SetTimezoneTool(_SchedulerTool):
    name = "set_timezone"
    description = "Set this chat's time zone when the person says where they are."
    parameters = {
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Berlin."}},
        "required": ["timezone"],
    }

    async def run(self, args: dict[str, Any]) -> ToolResult:
        try:
            zone = await self.scheduler.set_zone(_turn(), _text(args, "timezone"))
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        now = self.scheduler.clock()
        return ToolResult.text(f"This chat's time zone is now {zone.key}; it is {w.local_time(now, zone)} there. "
                               "Tasks already scheduled keep the zone they were made in.")


def scheduler_tools(scheduler: Scheduler) -> list[Tool]:
    return [ScheduleTaskTool(scheduler), ListTasksTool(scheduler), CancelTaskTool(scheduler),
            SetTimezoneTool(scheduler)]
