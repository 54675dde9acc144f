"""Scheduled tasks in PostgreSQL (schema script 5), through the bounded async pool.

A claim is one ``UPDATE ... WHERE version = <read>`` and the run's insert, in one transaction: of
two workers that read the same due task, the second one's update matches no row, so each due run
is claimed once across all workers.
"""

from __future__ import annotations

import time
from typing import Any

from talon.storage.postgres.db import AsyncDatabase
from talon.storage.tasks import (
    ACTIVE,
    CLAIMED,
    DONE,
    PAUSED,
    TASK_COLUMNS,
    Task,
    TaskRun,
    apply_record,
    due_ms,
    moves_from,
    task_from_row,
    task_values,
)

_PLACEHOLDERS = ", ".join(["%s"] * len(TASK_COLUMNS.split(",")))
_RUN = "task_id, due, status, reason, updated"


def _run_from_row(row: tuple[Any, ...]) -> TaskRun:
    return TaskRun(*row)


class PgTaskStore:
    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db

    async def add(self, task: Task, *, max_active: int) -> bool:
        async def go() -> bool:
            async with self._db.transaction() as conn:
                self._db.count(3)
                # One chat's adds wait for each other, so two at once cannot both pass the count.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                                   (f"talon-tasks:{task.channel}:{task.chat_id}",))
                row = await (await conn.execute(
                    "SELECT count(*) FROM talon_tasks WHERE channel=%s AND chat_id=%s AND status IN (%s, %s)",
                    (task.channel, task.chat_id, ACTIVE, PAUSED))).fetchone()
                if row is not None and int(row[0]) >= max_active:
                    return False
                await conn.execute(f"INSERT INTO talon_tasks ({TASK_COLUMNS}) VALUES ({_PLACEHOLDERS})",
                                   task_values(task))
                return True

        return bool(await self._db.bounded(go()))

    async def get(self, task_id: str) -> Task | None:
        row = await self._db.fetchone(f"SELECT {TASK_COLUMNS} FROM talon_tasks WHERE id=%s", (task_id,))
        return task_from_row(row) if row else None

    async def for_chat(self, channel: str, chat_id: str, thread_id: str | None, *,
                       any_thread: bool = False) -> list[Task]:
        if any_thread:
            rows = await self._db.fetchall(
                f"SELECT {TASK_COLUMNS} FROM talon_tasks WHERE channel=%s AND chat_id=%s ORDER BY created, id",
                (channel, chat_id))
            return [task_from_row(r) for r in rows]
        rows = await self._db.fetchall(
            f"SELECT {TASK_COLUMNS} FROM talon_tasks WHERE channel=%s AND chat_id=%s "
            "AND thread_id IS NOT DISTINCT FROM %s ORDER BY created, id", (channel, chat_id, thread_id))
        return [task_from_row(r) for r in rows]

    async def every_chat(self, limit: int = 500) -> list[Task]:
        rows = await self._db.fetchall(
            f"SELECT {TASK_COLUMNS} FROM talon_tasks ORDER BY status NOT IN ('active', 'paused'), created DESC "
            "LIMIT %s", (limit,))
        return [task_from_row(r) for r in rows]

    async def set_status(self, task_id: str, status: str, *, next_run: float | None = None,
                         only_from: tuple[str, ...] = (ACTIVE, PAUSED)) -> Task | None:
        if status == ACTIVE:
            row = await self._db.fetchone(
                f"UPDATE talon_tasks SET status=%s, version=version+1, next_run=%s, failures=0 "
                f"WHERE id=%s AND status = ANY(%s) RETURNING {TASK_COLUMNS}",
                (status, next_run, task_id, list(only_from)))
        else:
            row = await self._db.fetchone(
                f"UPDATE talon_tasks SET status=%s, version=version+1 WHERE id=%s AND status = ANY(%s) "
                f"RETURNING {TASK_COLUMNS}", (status, task_id, list(only_from)))
        return task_from_row(row) if row else None

    async def due(self, now: float, limit: int = 100) -> list[Task]:
        rows = await self._db.fetchall(
            f"SELECT {TASK_COLUMNS} FROM talon_tasks WHERE status=%s AND next_run <= %s "
            "ORDER BY next_run LIMIT %s", (ACTIVE, now, limit))
        return [task_from_row(r) for r in rows]

    async def claim(self, task: Task, next_run: float | None, run: TaskRun) -> bool:
        async def go() -> bool:
            async with self._db.transaction() as conn:
                self._db.count(2)
                cur = await conn.execute(
                    "UPDATE talon_tasks SET next_run=%s, status=%s, version=version+1, last_due=%s, "
                    "last_status=%s, last_reason=%s WHERE id=%s AND version=%s AND status=%s",
                    (next_run, ACTIVE if next_run is not None else DONE, run.due, run.status, run.reason,
                     task.id, task.version, ACTIVE))
                if cur.rowcount == 0:
                    return False
                await conn.execute(
                    "INSERT INTO talon_task_runs (task_id, due_ms, due, status, reason, updated) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (task.id, run.due_ms, run.due, run.status, run.reason, run.updated))
                return True

        return bool(await self._db.bounded(go()))

    async def record(self, task_id: str, due: float, status: str, reason: str = "", *,
                     pause_after: int = 3) -> tuple[Task | None, bool]:
        async def go() -> tuple[Task | None, bool]:
            async with self._db.transaction() as conn:
                self._db.count(3)
                cur = await conn.execute(
                    "UPDATE talon_task_runs SET status=%s, reason=%s, updated=%s WHERE task_id=%s AND due_ms=%s "
                    "AND status = ANY(%s)", (status, reason, time.time(), task_id, due_ms(due),
                                             list(moves_from(status))))
                if cur.rowcount == 0:
                    return None, False
                row = await (await conn.execute(
                    f"SELECT {TASK_COLUMNS} FROM talon_tasks WHERE id=%s FOR UPDATE", (task_id,))).fetchone()
                if row is None:
                    return None, False
                task, paused = apply_record(task_from_row(row), due, status, reason, pause_after)
                await conn.execute(
                    "UPDATE talon_tasks SET status=%s, version=%s, failures=%s, last_due=%s, last_status=%s, "
                    "last_reason=%s WHERE id=%s",
                    (task.status, task.version, task.failures, task.last_due, task.last_status,
                     task.last_reason, task_id))
                return task, paused

        result: tuple[Task | None, bool] = await self._db.bounded(go())
        return result

    async def claimed_before(self, when: float) -> list[tuple[Task, TaskRun]]:
        columns = ", ".join(f"t.{c.strip()}" for c in TASK_COLUMNS.split(","))
        rows = await self._db.fetchall(
            f"SELECT {columns}, r.task_id, r.due, r.status, r.reason, r.updated FROM talon_task_runs r "
            "JOIN talon_tasks t ON t.id = r.task_id WHERE r.status=%s AND r.updated < %s ORDER BY r.due",
            (CLAIMED, when))
        width = len(TASK_COLUMNS.split(","))
        return [(task_from_row(r[:width]), _run_from_row(r[width:])) for r in rows]

    async def runs(self, task_id: str, limit: int = 20) -> list[TaskRun]:
        rows = await self._db.fetchall(
            f"SELECT {_RUN} FROM talon_task_runs WHERE task_id=%s ORDER BY due DESC LIMIT %s", (task_id, limit))
        return [_run_from_row(r) for r in rows]

    async def timezone(self, channel: str, chat_id: str) -> str | None:
        row = await self._db.fetchone("SELECT zone FROM talon_chat_zones WHERE channel=%s AND chat_id=%s",
                                      (channel, chat_id))
        return str(row[0]) if row else None

    async def set_timezone(self, channel: str, chat_id: str, zone: str) -> None:
        await self._db.execute(
            "INSERT INTO talon_chat_zones (channel, chat_id, zone) VALUES (%s, %s, %s) "
            "ON CONFLICT (channel, chat_id) DO UPDATE SET zone = EXCLUDED.zone", (channel, chat_id, zone))

    async def aclose(self) -> None:
        return None  # the pool belongs to the Stores
