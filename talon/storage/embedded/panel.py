"""The panel's store in the embedded ``control.sqlite3`` (beside usage and approvals): see
``talon.storage.panel``. Its work runs on the control database's thread, off the event loop."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from talon.storage.approvals import Approval
from talon.storage.embedded.control import APPROVAL_COLUMNS, approval_of
from talon.storage.panel import SqlPanelQueries
from talon.storage.sqlite import SqliteRunner

PANEL_SCHEMA = """
CREATE TABLE IF NOT EXISTS panel_sessions (
    token_hash TEXT PRIMARY KEY, csrf TEXT NOT NULL, who TEXT NOT NULL, address TEXT NOT NULL,
    created REAL NOT NULL, last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS panel_links (token_hash TEXT PRIMARY KEY, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS panel_failures (address TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS panel_failures_address ON panel_failures (address, at);
CREATE TABLE IF NOT EXISTS panel_audit (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL,
    detail TEXT NOT NULL, address TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS panel_chats (
    channel TEXT NOT NULL, chat_id TEXT NOT NULL, title TEXT NOT NULL, people TEXT NOT NULL,
    last_at REAL NOT NULL, messages INTEGER NOT NULL, PRIMARY KEY (channel, chat_id)
);
CREATE INDEX IF NOT EXISTS panel_chats_last ON panel_chats (last_at);
CREATE TABLE IF NOT EXISTS panel_sent (
    channel TEXT NOT NULL, chat_id TEXT NOT NULL, sha TEXT NOT NULL, mime TEXT NOT NULL, name TEXT NOT NULL,
    path TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (channel, chat_id, sha, path)
);
CREATE TABLE IF NOT EXISTS panel_days (day TEXT PRIMARY KEY, messages INTEGER NOT NULL, answered INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS approvals_status ON approvals (status, created);
"""

# Usage summed per UTC day, person, chat and model, kept by a trigger as each call is recorded:
# the panel's usage views read a few thousand rows, not every call.
ROLLUP_SCHEMA = """
CREATE TABLE panel_usage_daily (
    day TEXT NOT NULL, channel TEXT NOT NULL, person TEXT NOT NULL, chat_id TEXT NOT NULL, model TEXT NOT NULL,
    calls INTEGER NOT NULL, person_calls INTEGER NOT NULL, input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL, cost REAL NOT NULL, PRIMARY KEY (day, channel, person, chat_id, model)
);
CREATE INDEX panel_usage_daily_chat ON panel_usage_daily (channel, chat_id);
CREATE TRIGGER panel_usage_rollup AFTER INSERT ON usage BEGIN
    INSERT INTO panel_usage_daily VALUES (strftime('%Y-%m-%d', NEW.at, 'unixepoch'), NEW.channel, NEW.person,
        NEW.chat_id, NEW.model, CASE WHEN NEW.extra_share THEN 0 ELSE 1 END, 1, NEW.input_tokens,
        NEW.output_tokens, coalesce(NEW.cost, 0))
    ON CONFLICT (day, channel, person, chat_id, model) DO UPDATE SET calls = calls + excluded.calls,
        person_calls = person_calls + 1, input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens, cost = cost + excluded.cost;
END;
INSERT INTO panel_usage_daily SELECT strftime('%Y-%m-%d', at, 'unixepoch'), channel, person, chat_id, model,
    sum(CASE WHEN extra_share THEN 0 ELSE 1 END), count(*), sum(input_tokens), sum(output_tokens),
    coalesce(sum(cost), 0) FROM usage GROUP BY 1, 2, 3, 4, 5;
"""


def setup_panel(conn: sqlite3.Connection) -> None:
    conn.executescript(PANEL_SCHEMA)
    if "answered" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(panel_days)")}:
        # A store made before the chart counted answers: its days so far show 0 answered.
        conn.execute("ALTER TABLE panel_days ADD COLUMN answered INTEGER NOT NULL DEFAULT 0")
    made = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'panel_usage_daily'").fetchone()
    if made is None:  # the first start with the panel: the calls recorded so far are summed once
        conn.executescript(f"BEGIN; {ROLLUP_SCHEMA} COMMIT;")


class SqlitePanelStore(SqlPanelQueries):
    T = {"sessions": "panel_sessions", "links": "panel_links", "failures": "panel_failures",
         "audit": "panel_audit", "chats": "panel_chats", "days": "panel_days", "sent": "panel_sent", "usage": "panel_usage_daily",
         "approvals": "approvals"}
    APPROVAL_COLUMNS = APPROVAL_COLUMNS
    FIND = "instr"

    def __init__(self, db: SqliteRunner) -> None:
        self.db = db
        db.run_blocking(setup_panel)  # at start-up, before the loop serves anything

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        query = sql.replace("%s", "?")
        return await self.db.run(lambda conn: conn.execute(query, tuple(params)).fetchall())

    async def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        query = sql.replace("%s", "?")
        return await self.db.run(lambda conn: conn.execute(query, tuple(params)).rowcount)

    async def _run_many(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        def go(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    conn.execute(sql.replace("%s", "?"), params)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        await self.db.run(go)

    def _approval(self, row: tuple[Any, ...]) -> Approval:
        return approval_of(row)

    async def close(self) -> None:
        return None  # the control database is closed with the stores
