"""WhatsApp's window, waiting messages, receipts and button tokens in PostgreSQL (schema script 9),
shared by every worker; see ``talon.storage.whatsapp``."""

from __future__ import annotations

from talon.storage.embedded.whatsapp import SENT_KEEP_S
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.whatsapp import (SENT_COLUMNS, STATUS_RANK, ButtonToken, PendingPart, SentRecord, rank_case,
                                    sent_of)


class PgWhatsAppStore:
    def __init__(self, db: AsyncDatabase) -> None:
        self.db = db

    async def close(self) -> None:
        return None  # the pool is the Stores'

    async def seen(self, chat_id: str, at: float) -> None:
        await self.db.execute(
            "INSERT INTO talon_wa_windows (chat_id, last_inbound) VALUES (%s, %s) ON CONFLICT (chat_id) DO UPDATE "
            "SET last_inbound = greatest(coalesce(talon_wa_windows.last_inbound, 0), EXCLUDED.last_inbound)",
            (chat_id, at))

    async def last_inbound(self, chat_id: str) -> float | None:
        row = await self.db.fetchone("SELECT last_inbound FROM talon_wa_windows WHERE chat_id = %s", (chat_id,))
        return float(row[0]) if row is not None and row[0] is not None else None

    async def refused(self, chat_id: str, at: float) -> None:
        await self.db.execute(
            "INSERT INTO talon_wa_windows (chat_id, last_refused) VALUES (%s, %s) ON CONFLICT (chat_id) DO UPDATE "
            "SET last_refused = greatest(coalesce(talon_wa_windows.last_refused, 0), EXCLUDED.last_refused)",
            (chat_id, at))

    async def last_refused(self, chat_id: str) -> float | None:
        row = await self.db.fetchone("SELECT last_refused FROM talon_wa_windows WHERE chat_id = %s", (chat_id,))
        return float(row[0]) if row is not None and row[0] is not None else None

    async def mark_read(self, chat_id: str, at: float) -> None:
        await self.db.execute(
            "INSERT INTO talon_wa_windows (chat_id, last_read) VALUES (%s, %s) ON CONFLICT (chat_id) DO UPDATE "
            "SET last_read = greatest(coalesce(talon_wa_windows.last_read, 0), EXCLUDED.last_read)", (chat_id, at))

    async def last_read(self, chat_id: str) -> float | None:
        row = await self.db.fetchone("SELECT last_read FROM talon_wa_windows WHERE chat_id = %s", (chat_id,))
        return float(row[0]) if row is not None and row[0] is not None else None

    async def add_pending(self, chat_id: str, payloads: list[str], at: float) -> None:
        if not payloads:
            return
        # One statement: the parts arrive together, in order (ids in the array's order).
        await self.db.execute(
            "INSERT INTO talon_wa_pending (chat_id, created, payload) "
            "SELECT %s, %s, p FROM unnest(%s::text[]) WITH ORDINALITY AS t(p, n) ORDER BY n",
            (chat_id, at, payloads))

    async def pending(self, chat_id: str) -> list[PendingPart]:
        rows = await self.db.fetchall("SELECT id, chat_id, created, payload FROM talon_wa_pending WHERE chat_id = %s "
                                      "ORDER BY id", (chat_id,))
        return [PendingPart(int(r[0]), str(r[1]), float(r[2]), str(r[3])) for r in rows]

    async def pending_count(self, chat_id: str | None = None) -> int:
        if chat_id is None:
            row = await self.db.fetchone("SELECT count(*) FROM talon_wa_pending")
        else:
            row = await self.db.fetchone("SELECT count(*) FROM talon_wa_pending WHERE chat_id = %s", (chat_id,))
        return int(row[0]) if row else 0

    async def chats_with_pending(self) -> list[str]:
        rows = await self.db.fetchall("SELECT chat_id FROM talon_wa_pending GROUP BY chat_id ORDER BY min(id)")
        return [str(r[0]) for r in rows]

    async def remove_pending(self, part_id: int) -> None:
        await self.db.execute("DELETE FROM talon_wa_pending WHERE id = %s", (part_id,))

    async def expire_pending(self, before: float) -> list[PendingPart]:
        rows = await self.db.fetchall("DELETE FROM talon_wa_pending WHERE created < %s "
                                      "RETURNING id, chat_id, created, payload", (before,))
        return sorted((PendingPart(int(r[0]), str(r[1]), float(r[2]), str(r[3])) for r in rows), key=lambda p: p.id)

    async def claim(self, chat_id: str, holder: str, until: float, now: float) -> bool:
        touched = await self.db.execute(
            "INSERT INTO talon_wa_windows (chat_id, holder, until) VALUES (%s, %s, %s) ON CONFLICT (chat_id) DO UPDATE "
            "SET holder = EXCLUDED.holder, until = EXCLUDED.until WHERE talon_wa_windows.holder IS NULL "
            "OR talon_wa_windows.holder = EXCLUDED.holder OR talon_wa_windows.until < %s",
            (chat_id, holder, until, now))
        return touched == 1

    async def release(self, chat_id: str, holder: str) -> None:
        await self.db.execute("UPDATE talon_wa_windows SET holder = NULL, until = NULL WHERE chat_id = %s "
                              "AND holder = %s", (chat_id, holder))

    async def record_sent(self, sid: str, chat_id: str, kind: str, payload: str, at: float) -> None:
        await self.db.execute(
            "WITH gone AS (DELETE FROM talon_wa_sent WHERE sent_at < %s) "
            f"INSERT INTO talon_wa_sent ({SENT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, 'accepted', NULL, '', %s, FALSE) "
            "ON CONFLICT (sid) DO NOTHING", (at - SENT_KEEP_S, sid, chat_id, kind, payload, at, at))

    async def record_status(self, sid: str, status: str, error_code: int | None, error_message: str,
                            at: float) -> SentRecord | None:
        rank = STATUS_RANK.get(status, 0)
        async with self.db.transaction() as conn:
            await conn.execute(
                f"UPDATE talon_wa_sent SET status = %s, error_code = %s, error_message = %s, updated = %s "
                f"WHERE sid = %s AND {rank_case('status')} <= %s", (status, error_code, error_message, at, sid, rank))
            cur = await conn.execute(f"SELECT {SENT_COLUMNS} FROM talon_wa_sent WHERE sid = %s", (sid,))
            return sent_of(await cur.fetchone())

    async def mark_retried(self, sid: str) -> bool:
        return await self.db.execute("UPDATE talon_wa_sent SET retried = TRUE WHERE sid = %s AND NOT retried",
                                     (sid,)) == 1

    async def last_failure(self, chat_id: str | None = None) -> SentRecord | None:
        where = "status IN ('failed', 'undelivered')" + (" AND chat_id = %s" if chat_id is not None else "")
        params = (chat_id,) if chat_id is not None else ()
        return sent_of(await self.db.fetchone(
            f"SELECT {SENT_COLUMNS} FROM talon_wa_sent WHERE {where} ORDER BY updated DESC LIMIT 1", params))

    async def add_tokens(self, tokens: list[ButtonToken]) -> None:
        if not tokens:
            return
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM talon_wa_tokens WHERE expires < %s",
                               (min(t.expires for t in tokens) - 86400,))
            for t in tokens:
                await conn.execute("INSERT INTO talon_wa_tokens (token, choice, approval_id, digest, chat_id, expires) "
                                   "VALUES (%s, %s, %s, %s, %s, %s)",
                                   (t.token, t.choice, t.approval_id, t.digest, t.chat_id, t.expires))

    async def take_token(self, token: str, chat_id: str, now: float) -> ButtonToken | None:
        async with self.db.transaction() as conn:
            cur = await conn.execute("SELECT token, choice, approval_id, digest, chat_id, expires FROM talon_wa_tokens "
                                     "WHERE token = %s AND chat_id = %s FOR UPDATE", (token, chat_id))
            row = await cur.fetchone()
            if row is None:
                return None
            gone = await conn.execute("DELETE FROM talon_wa_tokens WHERE approval_id = %s", (row[2],))
            if gone.rowcount < 1 or float(row[5]) < now:
                return None
            return ButtonToken(str(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), float(row[5]))
