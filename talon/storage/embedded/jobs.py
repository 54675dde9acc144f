"""Background jobs in SQLite (``TALON_DATA_DIR/jobs.sqlite3``), on a thread of their own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from talon.storage.jobs import JOB_COLUMNS, UNFINISHED, Job, job_from_row, job_values
from talon.storage.sqlite import SqliteRunner

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, channel TEXT NOT NULL, conversation TEXT NOT NULL, owner_id TEXT NOT NULL,
    task TEXT NOT NULL, tools TEXT NOT NULL, status TEXT NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL, result TEXT NOT NULL, delivered INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_chat ON jobs (channel, conversation);
"""
_PLACEHOLDERS = ", ".join("?" * len(JOB_COLUMNS.split(",")))


def _setup(conn: sqlite3.Connection) -> None:
    conn.executescript(_SCHEMA)


class SqliteJobs:
    def __init__(self, path: Path | str) -> None:
        self._db = SqliteRunner(path, _setup)

    async def add(self, job: Job, *, max_unfinished: int) -> bool:
        def go(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                (live,) = conn.execute(
                    f"SELECT count(*) FROM jobs WHERE channel=? AND conversation=? AND status IN "
                    f"({', '.join('?' * len(UNFINISHED))})", (job.channel, job.conversation, *UNFINISHED)).fetchone()
                fits = live < max_unfinished
                if fits:
                    conn.execute(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({_PLACEHOLDERS})", job_values(job))
                conn.execute("COMMIT")
                return bool(fits)
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        return await self._db.run(go)

    async def get(self, channel: str, conversation: str, job_id: str) -> Job | None:
        row = await self._db.run(lambda c: c.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=? AND channel=? AND conversation=?",
            (job_id, channel, conversation)).fetchone())
        return job_from_row(row) if row else None

    async def for_chat(self, channel: str, conversation: str) -> list[Job]:
        rows = await self._db.run(lambda c: c.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE channel=? AND conversation=? ORDER BY created, id",
            (channel, conversation)).fetchall())
        return [job_from_row(r) for r in rows]

    async def update(self, channel: str, conversation: str, job_id: str, *, status: str | None = None,
                     result: str | None = None, delivered: bool | None = None, now: float,
                     only_from: tuple[str, ...] = ()) -> Job | None:
        def go(conn: sqlite3.Connection) -> Job | None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=? AND channel=? AND conversation=?",
                                   (job_id, channel, conversation)).fetchone()
                if row is None or (only_from and job_from_row(row).status not in only_from):
                    conn.execute("COMMIT")
                    return None
                old = job_from_row(row)
                conn.execute("UPDATE jobs SET status=?, result=?, delivered=?, updated=? WHERE id=?",
                             (status if status is not None else old.status,
                              result if result is not None else old.result,
                              int(delivered if delivered is not None else old.delivered), now, job_id))
                new = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
                conn.execute("COMMIT")
                return job_from_row(new)
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        return await self._db.run(go)

    async def close(self) -> None:
        await self._db.aclose()
