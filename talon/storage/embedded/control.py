"""Usage and approvals in one embedded SQLite database (``TALON_DATA_DIR/control.sqlite3``).

Both are small, written rarely (once per model call, once per approval) and read by the same
features (caps, /usage, approvals), so they share one file and one thread.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

from talon.storage.approvals import Approval, Grant, Status
from talon.storage.sqlite import SqliteRunner
from talon.storage.usage import GrantUnit, UsageRecord, UsageTotals

# Approvals are keyed by (turn, call id, digest): see talon.storage.approvals.
_APPROVALS_TABLE = """
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY, channel TEXT NOT NULL, chat_id TEXT NOT NULL, platform_chat TEXT NOT NULL,
    thread_id TEXT, requester TEXT NOT NULL, turn_id TEXT NOT NULL, call_id TEXT NOT NULL,
    tool TEXT NOT NULL, kind TEXT NOT NULL, summary TEXT NOT NULL, created REAL NOT NULL,
    expires REAL NOT NULL, status TEXT NOT NULL, decided_by TEXT NOT NULL, decided_at REAL,
    prompt_id TEXT, digest TEXT NOT NULL DEFAULT '', in_group INTEGER NOT NULL DEFAULT 0,
    UNIQUE (turn_id, call_id, digest)
);
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, channel TEXT NOT NULL, chat_id TEXT NOT NULL,
    person TEXT NOT NULL, model TEXT NOT NULL, purpose TEXT NOT NULL, input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, cost REAL,
    estimated INTEGER NOT NULL DEFAULT 0, extra_share INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_at ON usage (at);
CREATE INDEX IF NOT EXISTS usage_person ON usage (channel, person, at);
CREATE INDEX IF NOT EXISTS usage_chat ON usage (channel, chat_id, at);
CREATE TABLE IF NOT EXISTS usage_grants (
    id INTEGER PRIMARY KEY, channel TEXT NOT NULL, person TEXT NOT NULL, unit TEXT NOT NULL,
    amount REAL NOT NULL, at REAL NOT NULL
);
""" + _APPROVALS_TABLE + """
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (channel, chat_id, status);
CREATE TABLE IF NOT EXISTS approval_always (
    channel TEXT NOT NULL, chat_id TEXT NOT NULL, tool TEXT NOT NULL, decided_by TEXT NOT NULL,
    at REAL NOT NULL, PRIMARY KEY (channel, chat_id, tool)
);
"""

# The columns of the first version (approvals keyed by (turn, call id) alone); a database made
# then is rebuilt at open with the digest and in_group columns (its old rows get digest '', which
# no call has, so a call they were for is asked about again).
_V1_APPROVAL_COLUMNS = ("id, channel, chat_id, platform_chat, thread_id, requester, turn_id, call_id, tool, "
                        "kind, summary, created, expires, status, decided_by, decided_at, prompt_id")
APPROVAL_COLUMNS = _V1_APPROVAL_COLUMNS + ", digest, in_group"
APPROVAL_MARKS = len(APPROVAL_COLUMNS.split(","))


def approval_row(a: Approval) -> tuple[object, ...]:
    return (a.id, a.channel, a.chat_id, a.platform_chat, a.thread_id, a.requester, a.turn_id, a.call_id,
            a.tool, a.kind, a.summary, a.created, a.expires, a.status, a.decided_by, a.decided_at, a.prompt_id,
            a.digest, bool(a.in_group))


def approval_of(row: tuple[object, ...]) -> Approval:
    approval = Approval(*row)  # type: ignore[arg-type]  # the columns are in the dataclass's order
    return dataclasses.replace(approval, in_group=bool(approval.in_group))


def _rebuild_v1_approvals(conn: sqlite3.Connection) -> None:
    """A database made before approvals had a digest: the table again, with the new key."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(approvals)")}
    if not columns or "digest" in columns:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("ALTER TABLE approvals RENAME TO approvals_v1")
        conn.execute("DROP INDEX IF EXISTS approvals_pending")
        conn.execute(_APPROVALS_TABLE)
        conn.execute(f"INSERT INTO approvals ({_V1_APPROVAL_COLUMNS}) SELECT {_V1_APPROVAL_COLUMNS} FROM approvals_v1")
        conn.execute("DROP TABLE approvals_v1")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def usage_where(since: float, channel: str | None, chat_id: str | None, person: str | None,
                mark: str = "?") -> tuple[str, list[object]]:
    clauses: list[str] = [f"at >= {mark}"]
    params: list[object] = [since]
    for column, value in (("channel", channel), ("chat_id", chat_id), ("person", person)):
        if value is not None:
            clauses.append(f"{column} = {mark}")
            params.append(value)
    return " AND ".join(clauses), params


def usage_sums(per_person: bool) -> str:
    """The sums of ``UsageTotals`` (``... FROM`` the table follows). A call shared by several people
    is one call of the conversation (its further shares are not counted as calls) and one call of
    each person who shared it. Plain sums over the index's range: no DISTINCT to sort."""
    call = "" if per_person else " AND NOT extra_share"
    calls = "count(*)" if per_person else "count(*) - coalesce(sum(CASE WHEN extra_share THEN 1 ELSE 0 END), 0)"
    return (f"SELECT {calls}, coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), "
            "coalesce(sum(cached_tokens), 0), coalesce(sum(cost), 0), "
            f"coalesce(sum(CASE WHEN cost IS NULL{call} THEN 1 ELSE 0 END), 0), "
            f"coalesce(sum(CASE WHEN estimated{call} THEN 1 ELSE 0 END), 0), "
            "coalesce(sum(CASE WHEN estimated THEN input_tokens + output_tokens ELSE 0 END), 0) FROM ")


USAGE_SPEND = "SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), coalesce(sum(cost), 0) FROM "


def spend_of(row: tuple[Any, ...] | None) -> UsageTotals:
    inp, out, cost = row if row is not None else (0, 0, 0.0)
    return UsageTotals(input_tokens=int(inp), output_tokens=int(out), cost=float(cost))


USAGE_INSERT = ("INSERT INTO {table} (at, channel, chat_id, person, model, purpose, input_tokens, output_tokens, "
                "cached_tokens, cost, estimated, extra_share) VALUES ({marks})")


def usage_row(r: UsageRecord) -> tuple[object, ...]:
    return (r.at, r.channel, r.chat_id, r.person, r.model, r.purpose, r.input_tokens, r.output_tokens,
            r.cached_tokens, r.cost, r.estimated, r.extra_share)


def totals_of(row: tuple[Any, ...] | None) -> UsageTotals:
    if row is None:
        return UsageTotals()
    calls, inp, out, cached, cost, unpriced, estimated, estimated_tokens = row
    return UsageTotals(int(calls), int(inp), int(out), int(cached), float(cost), int(unpriced), int(estimated),
                       int(estimated_tokens))


def _setup(conn: sqlite3.Connection) -> None:
    _rebuild_v1_approvals(conn)
    # A file from before estimated usage: its usage table gains the columns (old rows: reported,
    # each its own call). Before the script, whose CREATE TABLE leaves an existing table as it is.
    columns = {row[1] for row in conn.execute("PRAGMA table_info(usage)")}
    if columns and "estimated" not in columns:
        conn.execute("ALTER TABLE usage ADD COLUMN estimated INTEGER NOT NULL DEFAULT 0")
        conn.execute("ALTER TABLE usage ADD COLUMN extra_share INTEGER NOT NULL DEFAULT 0")
    conn.executescript(_SCHEMA)


def open_control_db(path: Path | str) -> SqliteRunner:
    return SqliteRunner(path, _setup)


class SqliteUsageStore:
    def __init__(self, runner: SqliteRunner) -> None:
        self.runner = runner

    async def record(self, record: UsageRecord) -> None:
        await self.runner.run(lambda conn: conn.execute(
            USAGE_INSERT.format(table="usage", marks=", ".join("?" * 12)), usage_row(record)))

    async def totals(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                     person: str | None = None) -> UsageTotals:
        where, params = usage_where(since, channel, chat_id, person)
        row = await self.runner.run(lambda conn: conn.execute(f"{usage_sums(person is not None)} usage WHERE {where}", params).fetchone())
        return totals_of(row)

    async def by_model(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                       person: str | None = None) -> dict[str, UsageTotals]:
        where, params = usage_where(since, channel, chat_id, person)
        sums = usage_sums(person is not None).replace("SELECT ", "SELECT model, ", 1)
        rows = await self.runner.run(lambda conn: conn.execute(
            f"{sums} usage WHERE {where} GROUP BY model ORDER BY model", params).fetchall())
        return {str(row[0]): totals_of(tuple(row[1:])) for row in rows}

    async def spend(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                    person: str | None = None) -> UsageTotals:
        where, params = usage_where(since, channel, chat_id, person)
        return spend_of(await self.runner.run(
            lambda conn: conn.execute(f"{USAGE_SPEND} usage WHERE {where}", params).fetchone()))

    async def grant(self, channel: str, person: str, amount: float, unit: GrantUnit, at: float) -> None:
        await self.runner.run(lambda conn: conn.execute(
            "INSERT INTO usage_grants (channel, person, unit, amount, at) VALUES (?, ?, ?, ?, ?)",
            (channel, person, unit, amount, at)))

    async def granted(self, channel: str, person: str, unit: GrantUnit, since: float) -> float:
        row = await self.runner.run(lambda conn: conn.execute(
            "SELECT coalesce(sum(amount), 0) FROM usage_grants WHERE channel = ? AND person = ? AND unit = ? "
            "AND at >= ?", (channel, person, unit, since)).fetchone())
        return float(row[0])


class SqliteApprovalStore:
    def __init__(self, runner: SqliteRunner) -> None:
        self.runner = runner

    async def add(self, approval: Approval) -> Approval:
        def add(conn: sqlite3.Connection) -> Approval:
            conn.execute(f"INSERT OR IGNORE INTO approvals ({APPROVAL_COLUMNS}) VALUES "
                         f"({', '.join('?' * APPROVAL_MARKS)})", approval_row(approval))
            row = conn.execute(f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE turn_id = ? AND call_id = ? "
                               "AND digest = ?", (approval.turn_id, approval.call_id, approval.digest)).fetchone()
            return approval_of(row)

        return await self.runner.run(add)

    async def get(self, approval_id: str) -> Approval | None:
        row = await self.runner.run(lambda conn: conn.execute(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?", (approval_id,)).fetchone())
        return approval_of(row) if row else None

    async def set_prompt(self, approval_id: str, prompt_id: str) -> None:
        await self.runner.run(lambda conn: conn.execute(
            "UPDATE approvals SET prompt_id = ? WHERE id = ?", (prompt_id, approval_id)))

    async def decide(self, approval_id: str, status: Status, by: str, at: float) -> bool:
        cur = await self.runner.run(lambda conn: conn.execute(
            "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ? WHERE id = ? AND status = 'pending'",
            (status, by, at, approval_id)))
        return bool(cur.rowcount)

    async def pending(self, channel: str, chat_id: str) -> list[Approval]:
        rows = await self.runner.run(lambda conn: conn.execute(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE channel = ? AND chat_id = ? AND status = 'pending' "
            "ORDER BY created", (channel, chat_id)).fetchall())
        return [approval_of(row) for row in rows]

    async def allow_always(self, channel: str, chat_id: str, tool: str, by: str, at: float) -> None:
        await self.runner.run(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO approval_always (channel, chat_id, tool, decided_by, at) VALUES (?, ?, ?, ?, ?)",
            (channel, chat_id, tool, by, at)))

    async def always_allowed(self, channel: str, chat_id: str, tool: str) -> bool:
        row = await self.runner.run(lambda conn: conn.execute(
            "SELECT 1 FROM approval_always WHERE channel = ? AND chat_id = ? AND tool = ?",
            (channel, chat_id, tool)).fetchone())
        return row is not None

    async def grants(self, channel: str, chat_id: str) -> list[Grant]:
        rows = await self.runner.run(lambda conn: conn.execute(
            "SELECT channel, chat_id, tool, decided_by, at FROM approval_always WHERE channel = ? AND chat_id = ? "
            "ORDER BY at, tool", (channel, chat_id)).fetchall())
        return [Grant(*row) for row in rows]

    async def revoke(self, channel: str, chat_id: str, tool: str | None = None) -> int:
        cur = await self.runner.run(lambda conn: conn.execute(
            "DELETE FROM approval_always WHERE channel = ? AND chat_id = ? AND (? IS NULL OR tool = ?)",
            (channel, chat_id, tool, tool)))
        return int(cur.rowcount)
