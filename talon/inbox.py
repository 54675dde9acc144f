"""Durable inbox: every incoming message is on disk before its turn starts.

SQLite (WAL, synchronous=FULL) gives three things at once: durability across a SIGKILL, dedup by
the platform's message key (Telegram redelivery, Twilio webhook retries), and a global order
(``seq``) so a restart replays each chat's pending messages in the order they arrived. Finished
rows are kept for a while so a late retry of an old message is still recognised.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from talon.envelope import InboundMessage
from talon.permissions import create_private_file, private_dir

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


@dataclass
class InboxItem:
    seq: int
    message: InboundMessage
    attempts: int
    delivered_parts: int


class InboxStore(Protocol):
    """What the bridge needs of an inbox: this SQLite one, or ``talon.pg.inbox.PgInbox``."""

    def add(self, message: InboundMessage) -> InboxItem | None: ...
    def seen(self, key: str) -> bool: ...
    def pending(self) -> list[InboxItem]: ...
    def begin_attempt(self, key: str) -> int: ...
    def delivered_parts(self, key: str) -> int: ...
    def set_delivered_parts(self, key: str, parts: int) -> None: ...
    def mark_done(self, key: str) -> None: ...
    def status(self, key: str) -> str | None: ...
    def set_live_message(self, key: str, message_id: str) -> None: ...
    def live_message(self, key: str) -> str | None: ...
    def replace_pending(self, message: InboundMessage) -> bool: ...
    def close(self) -> None: ...


class Inbox:
    def __init__(self, path: Path, *, keep_done_s: float = 7 * 24 * 3600) -> None:
        private_dir(path.parent)
        create_private_file(path)  # SQLite gives its -wal and -shm files this file's mode
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(inbox)")}
            if "live_message_id" not in columns:
                self._db.execute(_LIVE_COLUMN)
            self._db.execute(
                "DELETE FROM inbox WHERE status='done' AND finished < ?", (time.time() - keep_done_s,)
            )

    def add(self, message: InboundMessage) -> InboxItem | None:
        """Store a new message; None when this message was seen before (a duplicate)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO inbox(key, channel, chat_id, payload, created) VALUES (?,?,?,?,?)",
                (message.key, message.channel, message.chat_id, message.model_dump_json(), time.time()),
            )
            if cur.rowcount == 0:
                return None
            return InboxItem(seq=int(cur.lastrowid or 0), message=message, attempts=0, delivered_parts=0)

    def seen(self, key: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM inbox WHERE key=?", (key,)).fetchone()
        return row is not None

    def pending(self) -> list[InboxItem]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, payload, attempts, delivered_parts FROM inbox WHERE status='pending' ORDER BY seq"
            ).fetchall()
        return [
            InboxItem(seq=r[0], message=InboundMessage.model_validate_json(r[1]), attempts=r[2], delivered_parts=r[3])
            for r in rows
        ]

    def begin_attempt(self, key: str) -> int:
        with self._lock:
            self._db.execute("UPDATE inbox SET attempts = attempts + 1 WHERE key=?", (key,))
            row = self._db.execute("SELECT attempts FROM inbox WHERE key=?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def delivered_parts(self, key: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT delivered_parts FROM inbox WHERE key=?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def set_delivered_parts(self, key: str, parts: int) -> None:
        # This record closes the window in which a crash makes a part go out twice (the platform
        # has it, the inbox does not know yet), so it is committed without waiting for an fsync:
        # in WAL mode a commit survives the process being killed, and the next FULL commit
        # flushes it to disk. Only a power cut in between could cost a resent part.
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute("UPDATE inbox SET delivered_parts=? WHERE key=?", (parts, key))
            finally:
                self._db.execute("PRAGMA synchronous=FULL")

    def set_live_message(self, key: str, message_id: str) -> None:
        """The platform message that shows this message's answer while it is written (a
        streamed message that is edited); the final reply edits it, also after a restart."""
        with self._lock:
            self._db.execute("UPDATE inbox SET live_message_id=? WHERE key=?", (message_id, key))

    def live_message(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT live_message_id FROM inbox WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def replace_pending(self, message: InboundMessage) -> bool:
        """Store an edited version of a message whose turn has not started; False otherwise."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE inbox SET payload=? WHERE key=? AND status='pending' AND attempts=0",
                (message.model_dump_json(), message.key))
        return cur.rowcount > 0

    def mark_done(self, key: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE inbox SET status='done', finished=? WHERE key=?", (time.time(), key)
            )

    def status(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT status FROM inbox WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
