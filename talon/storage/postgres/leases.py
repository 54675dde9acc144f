"""Leases in PostgreSQL: one row per lease; taking it is one conditional upsert, renewing the
leases a worker uses is one statement. Expiry is the database's clock."""

from __future__ import annotations

from talon.storage.leases import LeaseSummary
from talon.storage.postgres.db import AsyncDatabase

# Take ``name`` for ``holder``: succeeds when the row is absent, expired, or already theirs.
ACQUIRE = ("INSERT INTO talon_leases (name, holder, expires) "
           "VALUES (%s, %s, clock_timestamp() + make_interval(secs => %s)) "
           "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires = EXCLUDED.expires "
           "WHERE talon_leases.expires <= clock_timestamp() OR talon_leases.holder = EXCLUDED.holder "
           "RETURNING 1")


class PgLeases:
    def __init__(self, db: AsyncDatabase, holder: str, ttl_s: float) -> None:
        self.db = db
        self.holder = holder
        self.ttl_s = ttl_s

    async def acquire(self, name: str) -> bool:
        return await self.db.fetchone(ACQUIRE, (name, self.holder, self.ttl_s)) is not None

    async def renew(self, names: list[str]) -> set[str]:
        rows = await self.db.fetchall(
            "UPDATE talon_leases SET expires = clock_timestamp() + make_interval(secs => %s) "
            "WHERE holder = %s AND name = ANY(%s) AND expires > clock_timestamp() RETURNING name",
            (self.ttl_s, self.holder, names), urgent=True)
        return {str(r[0]) for r in rows}

    async def release(self, name: str) -> None:
        await self.db.execute("DELETE FROM talon_leases WHERE name = %s AND holder = %s", (name, self.holder))

    async def release_all(self) -> None:
        await self.db.execute("DELETE FROM talon_leases WHERE holder = %s", (self.holder,), urgent=True)

    async def holder_of(self, name: str) -> str | None:
        row = await self.db.fetchone(
            "SELECT holder FROM talon_leases WHERE name = %s AND expires > clock_timestamp()", (name,))
        return str(row[0]) if row else None

    async def summary(self) -> LeaseSummary:
        row = await self.db.fetchone(
            "SELECT count(*) FILTER (WHERE expires > clock_timestamp()), "
            "count(*) FILTER (WHERE expires <= clock_timestamp()), "
            "count(DISTINCT holder) FILTER (WHERE expires > clock_timestamp()) FROM talon_leases")
        assert row is not None
        return LeaseSummary(int(row[0]), int(row[1]), int(row[2]))
