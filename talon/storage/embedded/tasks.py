"""Scheduled tasks in SQLite (``TALON_DATA_DIR/tasks.sqlite3``), on a thread of their own.

One process uses the file, and the runner runs its calls one at a time, so a claim needs no lock
beyond the version check; writes that read first (``record``) still take ``BEGIN IMMEDIATE`` so
a second process opened on the same file by mistake cannot interleave with them.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from talon.storage.sqlite import SqliteRunner
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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY, channel TEXT NOT NULL, chat_id TEXT NOT NULL, thread_id TEXT,
    owner_id TEXT NOT NULL, text TEXT NOT NULL, kind TEXT NOT NULL, spec TEXT NOT NULL,
    timezone TEXT NOT NULL, next_run REAL, status TEXT NOT NULL, created REAL NOT NULL,
    origin TEXT NOT NULL, version INTEGER NOT NULL, failures INTEGER NOT NULL,
    last_due REAL, last_status TEXT NOT NULL, last_reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (status, next_run);
CREATE INDEX IF NOT EXISTS tasks_chat ON tasks (channel, chat_id);
CREATE TABLE IF NOT EXISTS task_runs (
    task_id TEXT NOT NULL, due_ms INTEGER NOT NULL, due REAL NOT NULL, status TEXT NOT NULL,
    reason TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (task_id, due_ms)
);
CREATE INDEX IF NOT EXISTS task_runs_status ON task_runs (status, updated);
CREATE TABLE IF NOT EXISTS chat_zones (
    channel TEXT NOT NULL, chat_id TEXT NOT NULL, zone TEXT NOT NULL,
    PRIMARY KEY (channel, chat_id)
);
"""
_PLACEHOLDERS = ", ".join("?" * len(TASK_COLUMNS.split(",")))
_RUN = "task_id, due, status, reason, updated"


def _setup(conn: sqlite3.Connection) -> None:
    conn.executescript(_SCHEMA)


def _run_from_row(row: tuple[object, ...]) -> TaskRun:
    return TaskRun(*row)  # type: ignore[arg-type]


class SqliteTaskStore:
    def __init__(self, path: Path) -> None:
        self._db = SqliteRunner(path, _setup)

    async def add(self, task: Task, *, max_active: int) -> bool:
        def go(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                (live,) = conn.execute(
                    "SELECT count(*) FROM tasks WHERE channel=? AND chat_id=? AND status IN (?, ?)",
                    (task.channel, task.chat_id, ACTIVE, PAUSED)).fetchone()
                if live < max_active:
                    conn.execute(f"INSERT INTO tasks ({TASK_COLUMNS}) VALUES ({_PLACEHOLDERS})",
                                 task_values(task))
                conn.execute("COMMIT")
                return bool(live < max_active)
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        return await self._db.run(go)

    async def get(self, task_id: str) -> Task | None:
        row = await self._db.run(
            lambda c: c.execute(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id=?", (task_id,)).fetchone())
        return task_from_row(row) if row else None

    async def for_chat(self, channel: str, chat_id: str, thread_id: str | None, *,
                       any_thread: bool = False) -> list[Task]:
        if any_thread:
            rows = await self._db.run(lambda c: c.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE channel=? AND chat_id=? ORDER BY created, id",
                (channel, chat_id)).fetchall())
        else:
            rows = await self._db.run(lambda c: c.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE channel=? AND chat_id=? AND thread_id IS ? "
                "ORDER BY created, id", (channel, chat_id, thread_id)).fetchall())
        return [task_from_row(r) for r in rows]

    async def every_chat(self, limit: int = 500) -> list[Task]:
        rows = await self._db.run(lambda c: c.execute(
            f"SELECT {TASK_COLUMNS} FROM tasks ORDER BY status NOT IN ('active', 'paused'), created DESC "
            "LIMIT ?", (limit,)).fetchall())
        return [task_from_row(r) for r in rows]

    async def set_status(self, task_id: str, status: str, *, next_run: float | None = None,
                         only_from: tuple[str, ...] = (ACTIVE, PAUSED)) -> Task | None:
        marks = ", ".join("?" * len(only_from))

        def go(conn: sqlite3.Connection) -> Task | None:
            if status == ACTIVE:
                sql = (f"UPDATE tasks SET status=?, version=version+1, next_run=?, failures=0 "
                       f"WHERE id=? AND status IN ({marks})")
                params: tuple[object, ...] = (status, next_run, task_id, *only_from)
            else:
                sql = f"UPDATE tasks SET status=?, version=version+1 WHERE id=? AND status IN ({marks})"
                params = (status, task_id, *only_from)
            if conn.execute(sql, params).rowcount == 0:
                return None
            row = conn.execute(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id=?", (task_id,)).fetchone()
            return task_from_row(row)

        return await self._db.run(go)

    async def due(self, now: float, limit: int = 100) -> list[Task]:
        rows = await self._db.run(lambda c: c.execute(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE status=? AND next_run <= ? ORDER BY next_run LIMIT ?",
            (ACTIVE, now, limit)).fetchall())
        return [task_from_row(r) for r in rows]

    async def claim(self, task: Task, next_run: float | None, run: TaskRun) -> bool:
        def go(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                moved = conn.execute(
                    "UPDATE tasks SET next_run=?, status=?, version=version+1, last_due=?, last_status=?, "
                    "last_reason=? WHERE id=? AND version=? AND status=?",
                    (next_run, ACTIVE if next_run is not None else DONE, run.due, run.status, run.reason,
                     task.id, task.version, ACTIVE)).rowcount
                if moved:
                    conn.execute(
                        "INSERT OR IGNORE INTO task_runs (task_id, due_ms, due, status, reason, updated) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (task.id, run.due_ms, run.due, run.status, run.reason, run.updated))
                conn.execute("COMMIT")
                return bool(moved)
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        return await self._db.run(go)

    async def record(self, task_id: str, due: float, status: str, reason: str = "", *,
                     pause_after: int = 3) -> tuple[Task | None, bool]:
        before = moves_from(status)
        marks = ", ".join("?" * len(before))

        def go(conn: sqlite3.Connection) -> tuple[Task | None, bool]:
            conn.execute("BEGIN IMMEDIATE")
            try:
                changed = conn.execute(
                    "UPDATE task_runs SET status=?, reason=?, updated=? WHERE task_id=? AND due_ms=? "
                    f"AND status IN ({marks})",
                    (status, reason, time.time(), task_id, due_ms(due), *before)).rowcount
                row = conn.execute(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id=?", (task_id,)).fetchone()
                if not changed or row is None:
                    conn.execute("COMMIT")
                    return None, False
                task, paused = apply_record(task_from_row(row), due, status, reason, pause_after)
                conn.execute(
                    "UPDATE tasks SET status=?, version=?, failures=?, last_due=?, last_status=?, "
                    "last_reason=? WHERE id=?",
                    (task.status, task.version, task.failures, task.last_due, task.last_status,
                     task.last_reason, task_id))
                conn.execute("COMMIT")
                return task, paused
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        return await self._db.run(go)

    async def claimed_before(self, when: float) -> list[tuple[Task, TaskRun]]:
        def go(conn: sqlite3.Connection) -> list[tuple[Task, TaskRun]]:
            rows = conn.execute(
                f"SELECT {_RUN} FROM task_runs WHERE status=? AND updated < ? ORDER BY due",
                (CLAIMED, when)).fetchall()
            out = []
            for row in rows:
                run = _run_from_row(row)
                task = conn.execute(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id=?", (run.task_id,)).fetchone()
                if task is not None:
                    out.append((task_from_row(task), run))
            return out

        return await self._db.run(go)

    async def runs(self, task_id: str, limit: int = 20) -> list[TaskRun]:
        rows = await self._db.run(lambda c: c.execute(
            f"SELECT {_RUN} FROM task_runs WHERE task_id=? ORDER BY due DESC LIMIT ?",
            (task_id, limit)).fetchall())
        return [_run_from_row(r) for r in rows]

    async def timezone(self, channel: str, chat_id: str) -> str | None:
        row = await self._db.run(lambda c: c.execute(
            "SELECT zone FROM chat_zones WHERE channel=? AND chat_id=?", (channel, chat_id)).fetchone())
        return str(row[0]) if row else None

    async def set_timezone(self, channel: str, chat_id: str, zone: str) -> None:
        await self._db.run(lambda c: c.execute(
            "INSERT INTO chat_zones (channel, chat_id, zone) VALUES (?, ?, ?) "
            "ON CONFLICT (channel, chat_id) DO UPDATE SET zone=excluded.zone", (channel, chat_id, zone)))

    async def aclose(self) -> None:
        await self._db.aclose()
