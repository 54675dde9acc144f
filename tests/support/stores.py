"""Stores the tests run three ways: in memory, embedded SQLite, a real PostgreSQL (``pg_url``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.storage.approvals import MemoryApprovalStore
from talon.storage.embedded.tasks import SqliteTaskStore
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.postgres.schema import migrate_schema
from talon.storage.postgres.tasks import PgTaskStore
from talon.storage.tasks import MemoryTaskStore, TaskStore
from talon.storage.usage import MemoryUsageStore


@pytest_asyncio.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TaskStore]:
    if request.param == "memory":
        yield MemoryTaskStore()
    elif request.param == "sqlite":
        sqlite = SqliteTaskStore(tmp_path / "tasks.sqlite3")
        yield sqlite
        await sqlite.aclose()
    else:
        url = request.getfixturevalue("pg_url")
        adb = AsyncDatabase(url, max_size=4)
        await adb.open()
        await migrate_schema(adb)
        yield PgTaskStore(adb)
        await adb.close()


@pytest_asyncio.fixture(params=["memory", "embedded", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    if request.param == "memory":
        yield MemoryUsageStore(), MemoryApprovalStore()
        return
    if request.param == "embedded":
        from talon.storage.embedded.control import SqliteApprovalStore, SqliteUsageStore, open_control_db

        runner = open_control_db(tmp_path / "control.sqlite3")
        try:
            yield SqliteUsageStore(runner), SqliteApprovalStore(runner)
        finally:
            runner.close()
        return
    from talon.storage.postgres.control import PgApprovalStore, PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import migrate_schema

    url = request.getfixturevalue("pg_url")
    db = AsyncDatabase(url, max_size=4)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgUsageStore(db), PgApprovalStore(db)
    finally:
        await db.close()
