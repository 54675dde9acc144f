"""Pairing state in SQLite (``TALON_DATA_DIR/access.sqlite3``), on a thread of its own. WAL and a
busy timeout: ``talon pair`` writes while ``talon run`` reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from talon.storage.access import (CODE_TTL_S, MAX_PENDING, REPLY_INTERVAL_S, Approval, PendingRequest,
                                  format_code, new_code)
from talon.storage.sqlite import SqliteRunner

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    name TEXT NOT NULL,
    code TEXT UNIQUE NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE IF NOT EXISTS replied (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE IF NOT EXISTS approved (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    name TEXT NOT NULL,
    approved_at REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
"""


class SqlitePairing:
    def __init__(self, path: Path) -> None:
        self.path = path
        def setup(conn: sqlite3.Connection) -> None:
            conn.executescript(_SCHEMA)

        self.db = SqliteRunner(path, setup)

    async def is_approved(self, channel: str, ids: list[str]) -> bool:
        marks = ",".join("?" * len(ids))
        row = await self.db.run(lambda c: c.execute(
            f"SELECT 1 FROM approved WHERE channel=? AND sender_id IN ({marks})", (channel, *ids)).fetchone())
        return row is not None

    async def issue_code(self, channel: str, sender_id: str, name: str, now: float) -> tuple[str, bool]:
        def go(c: sqlite3.Connection) -> tuple[str, bool]:
            with c:
                c.execute("BEGIN IMMEDIATE")
                c.execute("DELETE FROM pending WHERE created <= ?", (now - CODE_TTL_S,))
                c.execute("DELETE FROM replied WHERE at <= ?", (now - REPLY_INTERVAL_S,))
                row = c.execute("SELECT code FROM pending WHERE channel=? AND sender_id=?",
                                (channel, sender_id)).fetchone()
                if row is not None:
                    code = str(row[0])
                else:
                    code = new_code()
                    while c.execute("SELECT 1 FROM pending WHERE code=?", (code,)).fetchone() is not None:
                        code = new_code()
                    c.execute("INSERT INTO pending(channel, sender_id, name, code, created) VALUES (?,?,?,?,?)",
                              (channel, sender_id, name, code, now))
                    # Oldest requests go first; rowid breaks ties between codes of the same instant.
                    c.execute("DELETE FROM pending WHERE rowid NOT IN (SELECT rowid FROM pending "
                              "ORDER BY created DESC, rowid DESC LIMIT ?)", (MAX_PENDING,))
                recent = c.execute("SELECT 1 FROM replied WHERE channel=? AND sender_id=?",
                                   (channel, sender_id)).fetchone()
                if recent is None:
                    c.execute("INSERT INTO replied(channel, sender_id, at) VALUES (?,?,?)", (channel, sender_id, now))
            return code, recent is not None

        return await self.db.run(go)

    async def approve(self, raw_code: str, now: float) -> Approval | None:
        def go(c: sqlite3.Connection) -> Approval | None:
            with c:
                c.execute("BEGIN IMMEDIATE")
                row = c.execute("SELECT channel, sender_id, name FROM pending WHERE code=? AND created > ?",
                                (raw_code, now - CODE_TTL_S)).fetchone()
                if row is None:
                    return None
                channel, sender_id, name = row
                c.execute("INSERT OR REPLACE INTO approved(channel, sender_id, name, approved_at) VALUES (?,?,?,?)",
                          (channel, sender_id, name, now))
                c.execute("DELETE FROM pending WHERE channel=? AND sender_id=?", (channel, sender_id))
                c.execute("DELETE FROM replied WHERE channel=? AND sender_id=?", (channel, sender_id))
            return Approval(channel, sender_id, name, now)

        return await self.db.run(go)

    async def reject(self, raw_code: str) -> PendingRequest | None:
        row = await self.db.run(lambda c: c.execute(
            "DELETE FROM pending WHERE code=? RETURNING channel, sender_id, name, code, created",
            (raw_code,)).fetchone())
        return PendingRequest(row[0], row[1], row[2], format_code(row[3]), row[4]) if row is not None else None

    async def revoke(self, channel: str, sender_id: str) -> Approval | None:
        row = await self.db.run(lambda c: c.execute(
            "DELETE FROM approved WHERE channel=? AND sender_id=? RETURNING channel, sender_id, name, approved_at",
            (channel, sender_id)).fetchone())
        return Approval(*row) if row is not None else None

    async def pending(self, now: float) -> list[PendingRequest]:
        rows = await self.db.run(lambda c: c.execute(
            "SELECT channel, sender_id, name, code, created FROM pending WHERE created > ? ORDER BY created, rowid",
            (now - CODE_TTL_S,)).fetchall())
        return [PendingRequest(r[0], r[1], r[2], format_code(r[3]), r[4]) for r in rows]

    async def approvals(self) -> list[Approval]:
        rows = await self.db.run(lambda c: c.execute(
            "SELECT channel, sender_id, name, approved_at FROM approved ORDER BY approved_at").fetchall())
        return [Approval(*r) for r in rows]

    async def close(self) -> None:
        await self.db.aclose()
