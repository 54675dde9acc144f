"""WhatsApp's window, waiting messages, receipts and button tokens in one embedded SQLite file
(``TALON_DATA_DIR/whatsapp.sqlite3``); see ``talon.storage.whatsapp``. Written on its own thread
(``SqliteRunner``), so the event loop never waits on the disk."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from talon.storage.sqlite import SqliteRunner
from talon.storage.whatsapp import (SENT_COLUMNS, STATUS_RANK, ButtonToken, PendingPart, SentRecord, rank_case,
                                    sent_of)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS wa_windows (
    chat_id TEXT PRIMARY KEY, last_inbound REAL, last_read REAL, holder TEXT, until REAL, last_refused REAL
);
CREATE TABLE IF NOT EXISTS wa_pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT, chat_id TEXT NOT NULL, created REAL NOT NULL, payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS wa_pending_chat ON wa_pending (chat_id, id);
CREATE TABLE IF NOT EXISTS wa_sent (
    sid TEXT PRIMARY KEY, chat_id TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
    sent_at REAL NOT NULL, status TEXT NOT NULL, error_code INTEGER, error_message TEXT NOT NULL,
    updated REAL NOT NULL, retried INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS wa_sent_failed ON wa_sent (chat_id, updated) WHERE status IN ('failed', 'undelivered');
CREATE TABLE IF NOT EXISTS wa_tokens (
    token TEXT PRIMARY KEY, choice TEXT NOT NULL, approval_id TEXT NOT NULL, digest TEXT NOT NULL,
    chat_id TEXT NOT NULL, expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS wa_tokens_approval ON wa_tokens (approval_id);
"""

# Messages sent are remembered this long (receipts arrive within minutes; /status shows the last failure).
SENT_KEEP_S = 30 * 86400


def setup_schema(conn: sqlite3.Connection) -> None:
    """Create the store's tables (if absent) on ``conn`` (also used to build a backup's copy)."""
    conn.executescript(_SCHEMA)


class SqliteWhatsAppStore:
    def __init__(self, path: Path | str) -> None:
        self.runner = SqliteRunner(path, setup_schema)

    async def close(self) -> None:
        await self.runner.aclose()

    # --- the window ---------------------------------------------------------------------------
    async def seen(self, chat_id: str, at: float) -> None:
        await self.runner.run(lambda c: c.execute(
            "INSERT INTO wa_windows (chat_id, last_inbound) VALUES (?, ?) ON CONFLICT (chat_id) DO UPDATE SET "
            "last_inbound = max(coalesce(last_inbound, 0), excluded.last_inbound)", (chat_id, at)))

    async def last_inbound(self, chat_id: str) -> float | None:
        row = await self.runner.run(lambda c: c.execute(
            "SELECT last_inbound FROM wa_windows WHERE chat_id = ?", (chat_id,)).fetchone())
        return float(row[0]) if row is not None and row[0] is not None else None

    async def refused(self, chat_id: str, at: float) -> None:
        await self.runner.run(lambda c: c.execute(
            "INSERT INTO wa_windows (chat_id, last_refused) VALUES (?, ?) ON CONFLICT (chat_id) DO UPDATE SET "
            "last_refused = max(coalesce(last_refused, 0), excluded.last_refused)", (chat_id, at)))

    async def last_refused(self, chat_id: str) -> float | None:
        row = await self.runner.run(lambda c: c.execute(
            "SELECT last_refused FROM wa_windows WHERE chat_id = ?", (chat_id,)).fetchone())
        return float(row[0]) if row is not None and row[0] is not None else None

    async def mark_read(self, chat_id: str, at: float) -> None:
        await self.runner.run(lambda c: c.execute(
            "INSERT INTO wa_windows (chat_id, last_read) VALUES (?, ?) ON CONFLICT (chat_id) DO UPDATE SET "
            "last_read = max(coalesce(last_read, 0), excluded.last_read)", (chat_id, at)))

    async def last_read(self, chat_id: str) -> float | None:
        row = await self.runner.run(lambda c: c.execute(
            "SELECT last_read FROM wa_windows WHERE chat_id = ?", (chat_id,)).fetchone())
        return float(row[0]) if row is not None and row[0] is not None else None

    # --- waiting messages ---------------------------------------------------------------------
    async def add_pending(self, chat_id: str, payloads: list[str], at: float) -> None:
        def add(c: sqlite3.Connection) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany("INSERT INTO wa_pending (chat_id, created, payload) VALUES (?, ?, ?)",
                              [(chat_id, at, p) for p in payloads])
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self.runner.run(add)

    async def pending(self, chat_id: str) -> list[PendingPart]:
        rows = await self.runner.run(lambda c: c.execute(
            "SELECT id, chat_id, created, payload FROM wa_pending WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall())
        return [PendingPart(int(r[0]), str(r[1]), float(r[2]), str(r[3])) for r in rows]

    async def pending_count(self, chat_id: str | None = None) -> int:
        if chat_id is None:
            row = await self.runner.run(lambda c: c.execute("SELECT count(*) FROM wa_pending").fetchone())
        else:
            row = await self.runner.run(lambda c: c.execute(
                "SELECT count(*) FROM wa_pending WHERE chat_id = ?", (chat_id,)).fetchone())
        return int(row[0])

    async def chats_with_pending(self) -> list[str]:
        rows = await self.runner.run(lambda c: c.execute(
            "SELECT chat_id FROM wa_pending GROUP BY chat_id ORDER BY min(id)").fetchall())
        return [str(r[0]) for r in rows]

    async def remove_pending(self, part_id: int) -> None:
        await self.runner.run(lambda c: c.execute("DELETE FROM wa_pending WHERE id = ?", (part_id,)))

    async def expire_pending(self, before: float) -> list[PendingPart]:
        rows = await self.runner.run(lambda c: c.execute(
            "DELETE FROM wa_pending WHERE created < ? RETURNING id, chat_id, created, payload", (before,)).fetchall())
        return sorted((PendingPart(int(r[0]), str(r[1]), float(r[2]), str(r[3])) for r in rows), key=lambda p: p.id)

    async def claim(self, chat_id: str, holder: str, until: float, now: float) -> bool:
        def take(c: sqlite3.Connection) -> bool:
            c.execute("INSERT INTO wa_windows (chat_id) VALUES (?) ON CONFLICT (chat_id) DO NOTHING", (chat_id,))
            cur = c.execute("UPDATE wa_windows SET holder = ?, until = ? WHERE chat_id = ? AND "
                            "(holder IS NULL OR holder = ? OR until < ?)", (holder, until, chat_id, holder, now))
            return cur.rowcount == 1

        return await self.runner.run(take)

    async def release(self, chat_id: str, holder: str) -> None:
        await self.runner.run(lambda c: c.execute(
            "UPDATE wa_windows SET holder = NULL, until = NULL WHERE chat_id = ? AND holder = ?", (chat_id, holder)))

    # --- receipts -----------------------------------------------------------------------------
    async def record_sent(self, sid: str, chat_id: str, kind: str, payload: str, at: float) -> None:
        def add(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM wa_sent WHERE sent_at < ?", (at - SENT_KEEP_S,))
            c.execute(f"INSERT INTO wa_sent ({SENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, 'accepted', NULL, '', ?, 0) "
                      "ON CONFLICT (sid) DO NOTHING", (sid, chat_id, kind, payload, at, at))

        await self.runner.run(add)

    async def record_status(self, sid: str, status: str, error_code: int | None, error_message: str,
                            at: float) -> SentRecord | None:
        rank = STATUS_RANK.get(status, 0)

        def update(c: sqlite3.Connection) -> SentRecord | None:
            c.execute(f"UPDATE wa_sent SET status = ?, error_code = ?, error_message = ?, updated = ? "
                      f"WHERE sid = ? AND {rank_case('status')} <= ?", (status, error_code, error_message, at, sid, rank))
            return sent_of(c.execute(f"SELECT {SENT_COLUMNS} FROM wa_sent WHERE sid = ?", (sid,)).fetchone())

        return await self.runner.run(update)

    async def mark_retried(self, sid: str) -> bool:
        cur = await self.runner.run(lambda c: c.execute(
            "UPDATE wa_sent SET retried = 1 WHERE sid = ? AND retried = 0", (sid,)))
        return bool(cur.rowcount == 1)

    async def last_failure(self, chat_id: str | None = None) -> SentRecord | None:
        where = "status IN ('failed', 'undelivered')" + (" AND chat_id = ?" if chat_id is not None else "")
        params = (chat_id,) if chat_id is not None else ()
        return await self.runner.run(lambda c: sent_of(c.execute(
            f"SELECT {SENT_COLUMNS} FROM wa_sent WHERE {where} ORDER BY updated DESC LIMIT 1", params).fetchone()))

    # --- approval buttons ---------------------------------------------------------------------
    async def add_tokens(self, tokens: list[ButtonToken]) -> None:
        def add(c: sqlite3.Connection) -> None:
            c.execute("BEGIN IMMEDIATE")
            try:
                if tokens:
                    c.execute("DELETE FROM wa_tokens WHERE expires < ?", (min(t.expires for t in tokens) - 86400,))
                c.executemany("INSERT INTO wa_tokens (token, choice, approval_id, digest, chat_id, expires) "
                              "VALUES (?, ?, ?, ?, ?, ?)",
                              [(t.token, t.choice, t.approval_id, t.digest, t.chat_id, t.expires) for t in tokens])
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

        await self.runner.run(add)

    async def take_token(self, token: str, chat_id: str, now: float) -> ButtonToken | None:
        def take(c: sqlite3.Connection) -> ButtonToken | None:
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute("SELECT token, choice, approval_id, digest, chat_id, expires FROM wa_tokens "
                                "WHERE token = ? AND chat_id = ?", (token, chat_id)).fetchone()
                found = None
                if row is not None:
                    c.execute("DELETE FROM wa_tokens WHERE approval_id = ?", (row[2],))
                    if float(row[5]) >= now:
                        found = ButtonToken(str(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]),
                                            float(row[5]))
                c.execute("COMMIT")
                return found
            except BaseException:
                c.execute("ROLLBACK")
                raise

        return await self.runner.run(take)
