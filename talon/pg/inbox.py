"""The durable inbox in PostgreSQL: dedup by message key across every worker, arrival order by
``seq`` (a sequence), and per-chat reads for the worker that holds the chat's lease."""

from __future__ import annotations

import time

from talon.envelope import InboundMessage
from talon.inbox import InboxItem
from talon.pg.db import Database


def _item(row: tuple[object, ...]) -> InboxItem:
    seq, payload, attempts, delivered = row
    return InboxItem(seq=int(seq),  # type: ignore[call-overload]
                     message=InboundMessage.model_validate_json(str(payload)),
                     attempts=int(attempts), delivered_parts=int(delivered))  # type: ignore[call-overload]


class PgInbox:
    def __init__(self, db: Database, *, keep_done_s: float = 7 * 24 * 3600) -> None:
        self.db = db
        db.execute("DELETE FROM talon_inbox WHERE status = 'done' AND finished < %s", (time.time() - keep_done_s,))

    def add(self, message: InboundMessage) -> InboxItem | None:
        row = self.db.fetchone(
            "INSERT INTO talon_inbox (key, channel, chat_id, payload, created) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (key) DO NOTHING RETURNING seq",
            (message.key, message.channel, message.chat_id, message.model_dump_json(), time.time()))
        if row is None:
            return None
        return InboxItem(seq=int(row[0]), message=message, attempts=0, delivered_parts=0)

    def seen(self, key: str) -> bool:
        return self.db.fetchone("SELECT 1 FROM talon_inbox WHERE key = %s", (key,)) is not None

    def pending(self) -> list[InboxItem]:
        rows = self.db.fetchall("SELECT seq, payload, attempts, delivered_parts FROM talon_inbox "
                                "WHERE status = 'pending' ORDER BY seq")
        return [_item(r) for r in rows]

    def next_pending(self, channel: str, chat_id: str) -> InboxItem | None:
        """The chat's oldest pending message (served by the worker holding the chat's lease)."""
        row = self.db.fetchone(
            "SELECT seq, payload, attempts, delivered_parts FROM talon_inbox "
            "WHERE channel = %s AND chat_id = %s AND status = 'pending' ORDER BY seq LIMIT 1",
            (channel, chat_id))
        return _item(row) if row else None

    def pending_chats(self, channels: list[str], limit: int) -> list[tuple[str, str]]:
        """Chats with pending messages whose lease is free or expired, oldest message first."""
        rows = self.db.fetchall(
            "SELECT channel, chat_id FROM (SELECT channel, chat_id, min(seq) AS first FROM talon_inbox "
            "  WHERE status = 'pending' AND channel = ANY(%s) GROUP BY channel, chat_id) p "
            "WHERE NOT EXISTS (SELECT 1 FROM talon_leases l WHERE l.name = 'chat:' || p.channel || ':' || p.chat_id "
            "  AND l.expires > clock_timestamp()) ORDER BY first LIMIT %s",
            (channels, limit))
        return [(str(r[0]), str(r[1])) for r in rows]

    def begin_attempt(self, key: str) -> int:
        row = self.db.fetchone("UPDATE talon_inbox SET attempts = attempts + 1 WHERE key = %s RETURNING attempts",
                               (key,))
        return int(row[0]) if row else 0

    def delivered_parts(self, key: str) -> int:
        row = self.db.fetchone("SELECT delivered_parts FROM talon_inbox WHERE key = %s", (key,))
        return int(row[0]) if row else 0

    def set_delivered_parts(self, key: str, parts: int) -> None:
        self.db.execute("UPDATE talon_inbox SET delivered_parts = %s WHERE key = %s", (parts, key))

    def set_live_message(self, key: str, message_id: str) -> None:
        self.db.execute("UPDATE talon_inbox SET live_message_id = %s WHERE key = %s", (message_id, key))

    def live_message(self, key: str) -> str | None:
        row = self.db.fetchone("SELECT live_message_id FROM talon_inbox WHERE key = %s", (key,))
        return str(row[0]) if row and row[0] is not None else None

    def replace_pending(self, message: InboundMessage) -> bool:
        """Store an edited version of a message whose turn has not started; False otherwise."""
        row = self.db.fetchone(
            "UPDATE talon_inbox SET payload = %s WHERE key = %s AND status = 'pending' AND attempts = 0 "
            "RETURNING seq", (message.model_dump_json(), message.key))
        return row is not None

    def mark_done(self, key: str) -> None:
        self.db.execute("UPDATE talon_inbox SET status = 'done', finished = %s WHERE key = %s", (time.time(), key))

    def status(self, key: str) -> str | None:
        row = self.db.fetchone("SELECT status FROM talon_inbox WHERE key = %s", (key,))
        return str(row[0]) if row else None

    def close(self) -> None:
        """The database is closed by its owner (the runtime), after every store."""
