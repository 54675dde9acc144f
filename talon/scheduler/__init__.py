"""Scheduled tasks: "remind me at 8", "every Monday send me the report".

- ``when``: reading a schedule (ISO 8601 date-times and durations, words, cron) and its next run,
  in a chat's time zone (``zoneinfo``; cron follows daylight-saving changes).
- ``service``: the ``Scheduler``: due runs become messages in the durable inbox, once across
  workers; each run's outcome is recorded; ``/tasks``.
- ``tools``: the agent's ``schedule_task``, ``list_tasks``, ``cancel_task`` and ``set_timezone``.

The tasks themselves live in a ``talon.storage.tasks.TaskStore``.
"""

from talon.scheduler.service import Scheduler, SchedulerSettings
from talon.scheduler.tools import scheduler_tools

__all__ = ["Scheduler", "SchedulerSettings", "scheduler_tools"]
