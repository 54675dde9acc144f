"""Pairing state in PostgreSQL: the same rules (``talon.storage.access``), shared by every worker
and by ``talon pair`` on any host. Writes are serialized across workers by an advisory lock."""

from __future__ import annotations

from talon.storage.access import (CODE_TTL_S, MAX_PENDING, REPLY_INTERVAL_S, Approval, PendingRequest,
                                  format_code, new_code)
from talon.storage.postgres.db import AsyncDatabase

# pg_advisory_xact_lock key for pairing writes ("talonpai").
_PAIRING_LOCK = 0x74616C6F6E706169 & 0x7FFFFFFFFFFFFFFF


class PgPairing:
    def __init__(self, db: AsyncDatabase, *, owns_db: bool = False) -> None:
        self.db = db
        self.owns_db = owns_db  # talon pair: this store's database is its own

    async def is_approved(self, channel: str, ids: list[str]) -> bool:
        return await self.db.fetchone("SELECT 1 FROM talon_approved WHERE channel = %s AND sender_id = ANY(%s)",
                                      (channel, ids)) is not None

    async def issue_code(self, channel: str, sender_id: str, name: str, now: float) -> tuple[str, bool]:
        async def go() -> tuple[str, bool]:
            async with self.db.transaction() as conn:
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PAIRING_LOCK,))
                await conn.execute("DELETE FROM talon_pairing_pending WHERE created <= %s", (now - CODE_TTL_S,))
                await conn.execute("DELETE FROM talon_pairing_replied WHERE at <= %s", (now - REPLY_INTERVAL_S,))
                cur = await conn.execute("SELECT code FROM talon_pairing_pending WHERE channel = %s AND sender_id = %s",
                                         (channel, sender_id))
                row = await cur.fetchone()
                if row is not None:
                    code = str(row[0])
                else:
                    while True:
                        code = new_code()
                        cur = await conn.execute("SELECT 1 FROM talon_pairing_pending WHERE code = %s", (code,))
                        if await cur.fetchone() is None:
                            break
                    await conn.execute("INSERT INTO talon_pairing_pending (channel, sender_id, name, code, created) "
                                       "VALUES (%s, %s, %s, %s, %s)", (channel, sender_id, name, code, now))
                    await conn.execute("DELETE FROM talon_pairing_pending WHERE id NOT IN (SELECT id FROM "
                                       "talon_pairing_pending ORDER BY created DESC, id DESC LIMIT %s)", (MAX_PENDING,))
                cur = await conn.execute("INSERT INTO talon_pairing_replied (channel, sender_id, at) "
                                         "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                                         (channel, sender_id, now))
                recent = await cur.fetchone() is None
            return code, recent

        result: tuple[str, bool] = await self.db.bounded(go())
        self.db.count(8)
        return result

    async def approve(self, raw_code: str, now: float) -> Approval | None:
        async def go() -> Approval | None:
            async with self.db.transaction() as conn:
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PAIRING_LOCK,))
                cur = await conn.execute("SELECT channel, sender_id, name FROM talon_pairing_pending "
                                         "WHERE code = %s AND created > %s", (raw_code, now - CODE_TTL_S))
                row = await cur.fetchone()
                if row is None:
                    return None
                channel, sender_id, name = row
                await conn.execute(
                    "INSERT INTO talon_approved (channel, sender_id, name, approved_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (channel, sender_id) DO UPDATE SET name = EXCLUDED.name, "
                    "approved_at = EXCLUDED.approved_at", (channel, sender_id, name, now))
                await conn.execute("DELETE FROM talon_pairing_pending WHERE channel = %s AND sender_id = %s",
                                   (channel, sender_id))
                await conn.execute("DELETE FROM talon_pairing_replied WHERE channel = %s AND sender_id = %s",
                                   (channel, sender_id))
            return Approval(channel, sender_id, name, now)

        result: Approval | None = await self.db.bounded(go())
        self.db.count(5)
        return result

    async def reject(self, raw_code: str) -> PendingRequest | None:
        row = await self.db.fetchone("DELETE FROM talon_pairing_pending WHERE code = %s "
                                     "RETURNING channel, sender_id, name, code, created", (raw_code,))
        return PendingRequest(row[0], row[1], row[2], format_code(row[3]), row[4]) if row is not None else None

    async def revoke(self, channel: str, sender_id: str) -> Approval | None:
        row = await self.db.fetchone("DELETE FROM talon_approved WHERE channel = %s AND sender_id = %s "
                                     "RETURNING channel, sender_id, name, approved_at", (channel, sender_id))
        return Approval(*row) if row is not None else None

    async def pending(self, now: float) -> list[PendingRequest]:
        rows = await self.db.fetchall("SELECT channel, sender_id, name, code, created FROM talon_pairing_pending "
                                      "WHERE created > %s ORDER BY created, id", (now - CODE_TTL_S,))
        return [PendingRequest(r[0], r[1], r[2], format_code(r[3]), r[4]) for r in rows]

    async def approvals(self) -> list[Approval]:
        rows = await self.db.fetchall("SELECT channel, sender_id, name, approved_at FROM talon_approved "
                                      "ORDER BY approved_at")
        return [Approval(*r) for r in rows]

    async def close(self) -> None:
        if self.owns_db:
            await self.db.close()
