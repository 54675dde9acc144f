"""The inbox in SQLite (``TALON_DATA_DIR/inbox.sqlite3``): WAL, ``synchronous=FULL``, on a thread
of its own (``SqliteRunner``), so an fsync never stalls the event loop."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from talon.envelope import InboundMessage
from talon.storage.inbox import INBOX_COLUMNS, InboxItem, item_from_row
from talon.storage.sqlite import SqliteRunner

_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT UNIQUE NOT NULL,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    delivered_parts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    finished REAL
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox(status, seq);
"""
# Added later; databases made before get the column at open.
_LIVE_COLUMN = "ALTER TABLE inbox ADD COLUMN live_message_id TEXT"


class SqliteInbox:
    def __init__(self, path: Path, *, keep_done_s: float = 7 * 24 * 3600) -> None:
        def setup(conn: sqlite3.Connection) -> None:
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(inbox)")}
            if "live_message_id" not in columns:
                conn.execute(_LIVE_COLUMN)
            conn.execute("DELETE FROM inbox WHERE status='done' AND finished < ?", (time.time() - keep_done_s,))

        self.path = path
        self.db = SqliteRunner(path, setup)

    async def add(self, message: InboundMessage) -> InboxItem | None:
        payload = message.model_dump_json()

        def go(conn: sqlite3.Connection) -> InboxItem | None:
            cur = conn.execute(
                "INSERT OR IGNORE INTO inbox(key, channel, chat_id, payload, created) VALUES (?,?,?,?,?)",
                (message.key, message.channel, message.chat_id, payload, time.time()))
            if cur.rowcount == 0:
                return None
            return InboxItem(seq=int(cur.lastrowid or 0), message=message, attempts=0, delivered_parts=0)

        return await self.db.run(go)

    async def seen(self, key: str) -> bool:
        return await self.db.run(lambda c: c.execute("SELECT 1 FROM inbox WHERE key=?", (key,)).fetchone()) is not None

    async def pending(self) -> list[InboxItem]:
        rows = await self.db.run(lambda c: c.execute(
            f"SELECT {INBOX_COLUMNS} FROM inbox WHERE status='pending' ORDER BY seq").fetchall())
        return [item_from_row(r) for r in rows]

    async def begin_attempt(self, key: str) -> InboxItem | None:
        row = await self.db.run(lambda c: c.execute(
            f"UPDATE inbox SET attempts = attempts + 1 WHERE key=? RETURNING {INBOX_COLUMNS}", (key,)).fetchone())
        return item_from_row(row) if row else None

    async def give_back_attempt(self, key: str) -> None:
        await self.db.run(lambda c: c.execute(
            "UPDATE inbox SET attempts = attempts - 1 WHERE key=? AND attempts > 1", (key,)))

    async def set_delivered_parts(self, key: str, parts: int) -> None:
        # This record closes the window in which a crash makes a part go out twice (the platform
        # has it, the inbox does not know yet), so it is committed without waiting for an fsync:
        # in WAL mode a commit survives the process being killed, and the next FULL commit
        # flushes it to disk. Only a power cut in between could cost a resent part.
        def go(conn: sqlite3.Connection) -> None:
            conn.execute("PRAGMA synchronous=NORMAL")
            try:
                conn.execute("UPDATE inbox SET delivered_parts=? WHERE key=?", (parts, key))
            finally:
                conn.execute("PRAGMA synchronous=FULL")

        await self.db.run(go)

    async def set_live_message(self, key: str, message_id: str) -> None:
        await self.db.run(lambda c: c.execute("UPDATE inbox SET live_message_id=? WHERE key=?", (message_id, key)))

    async def replace_pending(self, message: InboundMessage) -> bool:
        payload = message.model_dump_json()
        cur = await self.db.run(lambda c: c.execute(
            "UPDATE inbox SET payload=? WHERE key=? AND status='pending' AND attempts=0", (payload, message.key)))
        return bool(cur.rowcount > 0)

    async def mark_done(self, key: str, *, delivered_parts: int | None = None) -> None:
        await self.db.run(lambda c: c.execute(
            "UPDATE inbox SET status='done', finished=?, delivered_parts=coalesce(?, delivered_parts) WHERE key=?",
            (time.time(), delivered_parts, key)))

    async def status(self, key: str) -> str | None:
        row = await self.db.run(lambda c: c.execute("SELECT status FROM inbox WHERE key=?", (key,)).fetchone())
        return str(row[0]) if row else None

    async def close(self) -> None:
        await self.db.aclose()
