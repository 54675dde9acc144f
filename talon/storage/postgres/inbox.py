"""The durable inbox in PostgreSQL: dedup by message key across every worker, arrival order by
``seq`` (a sequence), and per-chat reads for the worker that holds the chat's lease. The
``chat_id`` column holds the message's lane (``inbox_lane``): its chat, or a background job's own
lane for the job's run."""

from __future__ import annotations

import time

from talon.envelope import InboundMessage
from talon.storage.inbox import INBOX_COLUMNS, InboxItem, inbox_lane, item_from_row
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.postgres.leases import ACQUIRE



class PgInbox:
    def __init__(self, db: AsyncDatabase, *, keep_done_s: float = 7 * 24 * 3600) -> None:
        self.db = db
        self.keep_done_s = keep_done_s

    async def prune(self) -> None:
        """Forget finished rows older than ``keep_done_s`` (at start)."""
        await self.db.execute("DELETE FROM talon_inbox WHERE status = 'done' AND finished < %s",
                              (time.time() - self.keep_done_s,))

    async def add(self, message: InboundMessage) -> InboxItem | None:
        row = await self.db.fetchone(
            "INSERT INTO talon_inbox (key, channel, chat_id, payload, created) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (key) DO NOTHING RETURNING seq",
            (message.key, message.channel, inbox_lane(message), message.model_dump_json(), time.time()))
        if row is None:
            return None
        return InboxItem(seq=int(row[0]), message=message, attempts=0, delivered_parts=0)

    async def add_and_lease(self, message: InboundMessage, lease: str, holder: str,
                            ttl_s: float) -> tuple[InboxItem | None, bool]:
        # The lease is tried whether or not the message is new: a redelivered message whose
        # chat nobody serves (its worker died) is taken up here.
        row = await self.db.fetchone(
            "WITH added AS (INSERT INTO talon_inbox (key, channel, chat_id, payload, created) "
            "  VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING seq), "
            f"leased AS ({ACQUIRE}) "
            "SELECT (SELECT seq FROM added), EXISTS (SELECT 1 FROM leased)",
            (message.key, message.channel, inbox_lane(message), message.model_dump_json(), time.time(),
             lease, holder, ttl_s))
        assert row is not None
        seq, leased = row
        item = InboxItem(seq=int(seq), message=message, attempts=0, delivered_parts=0) if seq is not None else None
        return item, bool(leased)

    async def claim_next(self, channel: str, chat_id: str, tried: list[int]) -> InboxItem | None:
        row = await self.db.fetchone(
            "WITH next AS (SELECT seq FROM talon_inbox WHERE channel = %s AND chat_id = %s AND status = 'pending' "
            "  ORDER BY seq LIMIT 1) "
            "UPDATE talon_inbox t SET attempts = t.attempts + CASE WHEN t.seq = ANY(%s) THEN 0 ELSE 1 END "
            f"FROM next WHERE t.seq = next.seq RETURNING {', '.join('t.' + c for c in INBOX_COLUMNS.split(', '))}",
            (channel, chat_id, tried))
        return item_from_row(row) if row else None

    async def finish(self, key: str, delivered_parts: int, lease: str, holder: str) -> bool:
        row = await self.db.fetchone(
            "WITH done AS (UPDATE talon_inbox SET status = 'done', finished = %s, delivered_parts = %s "
            "  WHERE key = %s RETURNING channel, chat_id), "
            "waiting AS (SELECT 1 FROM talon_inbox i JOIN done d ON i.channel = d.channel AND i.chat_id = d.chat_id "
            "  WHERE i.status = 'pending' AND i.key <> %s LIMIT 1), "
            "released AS (DELETE FROM talon_leases WHERE name = %s AND holder = %s "
            "  AND NOT EXISTS (SELECT 1 FROM waiting) RETURNING 1) "
            "SELECT EXISTS (SELECT 1 FROM released)",
            (time.time(), delivered_parts, key, key, lease, holder))
        return bool(row and row[0])

    async def seen(self, key: str) -> bool:
        return await self.db.fetchone("SELECT 1 FROM talon_inbox WHERE key = %s", (key,)) is not None

    async def pending(self) -> list[InboxItem]:
        rows = await self.db.fetchall(f"SELECT {INBOX_COLUMNS} FROM talon_inbox WHERE status = 'pending' ORDER BY seq")
        return [item_from_row(r) for r in rows]

    async def next_pending(self, channel: str, chat_id: str) -> InboxItem | None:
        row = await self.db.fetchone(
            f"SELECT {INBOX_COLUMNS} FROM talon_inbox "
            "WHERE channel = %s AND chat_id = %s AND status = 'pending' ORDER BY seq LIMIT 1",
            (channel, chat_id))
        return item_from_row(row) if row else None

    async def pending_chats(self, channels: list[str], limit: int) -> list[tuple[str, str]]:
        rows = await self.db.fetchall(
            "SELECT channel, chat_id FROM (SELECT channel, chat_id, min(seq) AS first FROM talon_inbox "
            "  WHERE status = 'pending' AND channel = ANY(%s) GROUP BY channel, chat_id) p "
            "WHERE NOT EXISTS (SELECT 1 FROM talon_leases l WHERE l.name = 'chat:' || p.channel || ':' || p.chat_id "
            "  AND l.expires > clock_timestamp()) ORDER BY first LIMIT %s",
            (channels, limit), urgent=True)
        return [(str(r[0]), str(r[1])) for r in rows]

    async def begin_attempt(self, key: str) -> InboxItem | None:
        row = await self.db.fetchone(
            f"UPDATE talon_inbox SET attempts = attempts + 1 WHERE key = %s RETURNING {INBOX_COLUMNS}", (key,))
        return item_from_row(row) if row else None

    async def give_back_attempt(self, key: str) -> None:
        await self.db.execute(
            "UPDATE talon_inbox SET attempts = attempts - 1 WHERE key = %s AND attempts > 1", (key,))

    async def set_delivered_parts(self, key: str, parts: int) -> None:
        await self.db.execute("UPDATE talon_inbox SET delivered_parts = %s WHERE key = %s", (parts, key))

    async def set_live_message(self, key: str, message_id: str) -> None:
        await self.db.execute("UPDATE talon_inbox SET live_message_id = %s WHERE key = %s", (message_id, key))

    async def replace_pending(self, message: InboundMessage) -> bool:
        row = await self.db.fetchone(
            "UPDATE talon_inbox SET payload = %s WHERE key = %s AND status = 'pending' AND attempts = 0 "
            "RETURNING seq", (message.model_dump_json(), message.key))
        return row is not None

    async def mark_done(self, key: str, *, delivered_parts: int | None = None) -> None:
        await self.db.execute(
            "UPDATE talon_inbox SET status = 'done', finished = %s, "
            "delivered_parts = coalesce(%s, delivered_parts) WHERE key = %s", (time.time(), delivered_parts, key))

    async def status(self, key: str) -> str | None:
        row = await self.db.fetchone("SELECT status FROM talon_inbox WHERE key = %s", (key,))
        return str(row[0]) if row else None

    async def close(self) -> None:
        """The database is closed by its owner (the factory's ``Stores``), after every store."""
