"""The panel's store in PostgreSQL (schema script 10): see ``talon.storage.panel``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from talon.storage.approvals import Approval
from talon.storage.embedded.control import APPROVAL_COLUMNS, approval_of
from talon.storage.panel import SqlPanelQueries
from talon.storage.postgres.db import AsyncDatabase


class PgPanelStore(SqlPanelQueries):
    T = {"sessions": "talon_panel_sessions", "links": "talon_panel_links", "failures": "talon_panel_failures",
         "audit": "talon_panel_audit", "chats": "talon_panel_chats", "days": "talon_panel_days", "sent": "talon_panel_sent",
         "usage": "talon_panel_usage_daily", "approvals": "talon_approvals"}
    APPROVAL_COLUMNS = APPROVAL_COLUMNS
    FIND = "strpos"

    def __init__(self, db: AsyncDatabase) -> None:
        self.db = db

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self.db.fetchall(sql, tuple(params))]

    async def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self.db.execute(sql, tuple(params))

    async def _run_many(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        async def go() -> None:
            async with self.db.transaction() as conn:
                for sql, params in statements:
                    await conn.execute(sql, params)

        await self.db.bounded(go())
        self.db.count(len(statements))

    def _approval(self, row: tuple[Any, ...]) -> Approval:
        return approval_of(row)

    async def close(self) -> None:
        return None  # the pool is closed with the stores
