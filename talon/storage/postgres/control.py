"""Usage and approvals in PostgreSQL (schema scripts 6, 7 and 8), through the async pool."""

from __future__ import annotations

from talon.storage.approvals import Approval, Grant, Status
from talon.storage.embedded.control import (
    APPROVAL_COLUMNS,
    APPROVAL_MARKS,
    USAGE_INSERT,
    USAGE_SPEND,
    approval_of,
    approval_row,
    spend_of,
    totals_of,
    usage_row,
    usage_sums,
    usage_where,
)
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.usage import GrantUnit, UsageRecord, UsageTotals


class PgUsageStore:
    def __init__(self, db: AsyncDatabase) -> None:
        self.db = db

    async def record(self, record: UsageRecord) -> None:
        await self.db.execute(USAGE_INSERT.format(table="talon_usage", marks=", ".join(["%s"] * 12)),
                              usage_row(record))

    async def totals(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                     person: str | None = None) -> UsageTotals:
        where, params = usage_where(since, channel, chat_id, person, mark="%s")
        return totals_of(await self.db.fetchone(f"{usage_sums(person is not None)} talon_usage WHERE {where}", params))

    async def by_model(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                       person: str | None = None) -> dict[str, UsageTotals]:
        where, params = usage_where(since, channel, chat_id, person, mark="%s")
        sums = usage_sums(person is not None).replace("SELECT ", "SELECT model, ", 1)
        rows = await self.db.fetchall(f"{sums} talon_usage WHERE {where} GROUP BY model ORDER BY model", params)
        return {str(row[0]): totals_of(tuple(row[1:])) for row in rows}

    async def spend(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                    person: str | None = None) -> UsageTotals:
        where, params = usage_where(since, channel, chat_id, person, mark="%s")
        return spend_of(await self.db.fetchone(f"{USAGE_SPEND} talon_usage WHERE {where}", params))

    async def grant(self, channel: str, person: str, amount: float, unit: GrantUnit, at: float) -> None:
        await self.db.execute(
            "INSERT INTO talon_usage_grants (channel, person, unit, amount, at) VALUES (%s, %s, %s, %s, %s)",
            (channel, person, unit, amount, at))

    async def granted(self, channel: str, person: str, unit: GrantUnit, since: float) -> float:
        row = await self.db.fetchone(
            "SELECT coalesce(sum(amount), 0) FROM talon_usage_grants WHERE channel = %s AND person = %s "
            "AND unit = %s AND at >= %s", (channel, person, unit, since))
        return float(row[0]) if row else 0.0


class PgApprovalStore:
    def __init__(self, db: AsyncDatabase) -> None:
        self.db = db

    async def add(self, approval: Approval) -> Approval:
        await self.db.execute(
            f"INSERT INTO talon_approvals ({APPROVAL_COLUMNS}) VALUES ({', '.join(['%s'] * APPROVAL_MARKS)}) "
            "ON CONFLICT DO NOTHING", approval_row(approval))
        row = await self.db.fetchone(
            f"SELECT {APPROVAL_COLUMNS} FROM talon_approvals WHERE turn_id = %s AND call_id = %s AND digest = %s",
            (approval.turn_id, approval.call_id, approval.digest))
        assert row is not None  # inserted, or there already
        return approval_of(row)

    async def get(self, approval_id: str) -> Approval | None:
        row = await self.db.fetchone(f"SELECT {APPROVAL_COLUMNS} FROM talon_approvals WHERE id = %s", (approval_id,))
        return approval_of(row) if row else None

    async def set_prompt(self, approval_id: str, prompt_id: str) -> None:
        await self.db.execute("UPDATE talon_approvals SET prompt_id = %s WHERE id = %s", (prompt_id, approval_id))

    async def decide(self, approval_id: str, status: Status, by: str, at: float) -> bool:
        return bool(await self.db.execute(
            "UPDATE talon_approvals SET status = %s, decided_by = %s, decided_at = %s "
            "WHERE id = %s AND status = 'pending'", (status, by, at, approval_id)))

    async def pending(self, channel: str, chat_id: str) -> list[Approval]:
        rows = await self.db.fetchall(
            f"SELECT {APPROVAL_COLUMNS} FROM talon_approvals WHERE channel = %s AND chat_id = %s "
            "AND status = 'pending' ORDER BY created", (channel, chat_id))
        return [approval_of(row) for row in rows]

    async def allow_always(self, channel: str, chat_id: str, tool: str, by: str, at: float) -> None:
        await self.db.execute(
            "INSERT INTO talon_approval_always (channel, chat_id, tool, decided_by, at) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (channel, chat_id, tool) DO UPDATE SET decided_by = EXCLUDED.decided_by, at = EXCLUDED.at",
            (channel, chat_id, tool, by, at))

    async def always_allowed(self, channel: str, chat_id: str, tool: str) -> bool:
        row = await self.db.fetchone(
            "SELECT 1 FROM talon_approval_always WHERE channel = %s AND chat_id = %s AND tool = %s",
            (channel, chat_id, tool))
        return row is not None

    async def grants(self, channel: str, chat_id: str) -> list[Grant]:
        rows = await self.db.fetchall(
            "SELECT channel, chat_id, tool, decided_by, at FROM talon_approval_always WHERE channel = %s "
            "AND chat_id = %s ORDER BY at, tool", (channel, chat_id))
        return [Grant(str(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]

    async def revoke(self, channel: str, chat_id: str, tool: str | None = None) -> int:
        if tool is None:
            return int(await self.db.execute(
                "DELETE FROM talon_approval_always WHERE channel = %s AND chat_id = %s", (channel, chat_id)) or 0)
        return int(await self.db.execute(
            "DELETE FROM talon_approval_always WHERE channel = %s AND chat_id = %s AND tool = %s",
            (channel, chat_id, tool)) or 0)
