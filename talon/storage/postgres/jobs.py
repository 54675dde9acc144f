"""Background jobs in PostgreSQL (schema script 12), through the bounded async pool."""

from __future__ import annotations

from talon.storage.jobs import JOB_COLUMNS, UNFINISHED, Job, job_from_row, job_values
from talon.storage.postgres.db import AsyncDatabase

_PLACEHOLDERS = ", ".join(["%s"] * len(JOB_COLUMNS.split(",")))
_UNFINISHED = ", ".join(["%s"] * len(UNFINISHED))


class PgJobs:
    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db

    async def add(self, job: Job, *, max_unfinished: int) -> bool:
        async def go() -> bool:
            async with self._db.transaction() as conn:
                self._db.count(3)
                # One chat's adds wait for each other, so two at once cannot both pass the count.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                                   (f"talon-jobs:{job.channel}:{job.conversation}",))
                row = await (await conn.execute(
                    "SELECT count(*) FROM talon_jobs WHERE channel=%s AND conversation=%s "
                    f"AND status IN ({_UNFINISHED})",
                    (job.channel, job.conversation, *UNFINISHED))).fetchone()
                if row is not None and int(row[0]) >= max_unfinished:
                    return False
                await conn.execute(f"INSERT INTO talon_jobs ({JOB_COLUMNS}) VALUES ({_PLACEHOLDERS})",
                                   job_values(job))
                return True

        return bool(await self._db.bounded(go()))

    async def get(self, channel: str, conversation: str, job_id: str) -> Job | None:
        row = await self._db.fetchone(
            f"SELECT {JOB_COLUMNS} FROM talon_jobs WHERE id=%s AND channel=%s AND conversation=%s",
            (job_id, channel, conversation))
        return job_from_row(tuple(row)) if row else None

    async def for_chat(self, channel: str, conversation: str) -> list[Job]:
        rows = await self._db.fetchall(
            f"SELECT {JOB_COLUMNS} FROM talon_jobs WHERE channel=%s AND conversation=%s ORDER BY created, id",
            (channel, conversation))
        return [job_from_row(tuple(r)) for r in rows]

    async def update(self, channel: str, conversation: str, job_id: str, *, status: str | None = None,
                     result: str | None = None, delivered: bool | None = None, now: float,
                     only_from: tuple[str, ...] = ()) -> Job | None:
        guard = f" AND status IN ({', '.join(['%s'] * len(only_from))})" if only_from else ""
        row = await self._db.fetchone(
            f"UPDATE talon_jobs SET status=COALESCE(%s, status), result=COALESCE(%s, result), "
            f"delivered=COALESCE(%s, delivered), updated=%s WHERE id=%s AND channel=%s AND conversation=%s{guard} "
            f"RETURNING {JOB_COLUMNS}",
            (status, result, None if delivered is None else int(delivered), now, job_id, channel, conversation,
             *only_from))
        return job_from_row(tuple(row)) if row else None

    async def close(self) -> None:
        return None
