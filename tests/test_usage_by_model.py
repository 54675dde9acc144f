"""Usage per model (model failover: TALON_MODEL_FALLBACKS), the same in the three usage stores
(memory, embedded SQLite, a real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.storage.usage import MemoryUsageStore, UsageRecord


@pytest_asyncio.fixture(params=["memory", "embedded", "postgres"])
async def usage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryUsageStore()
        return
    if request.param == "embedded":
        from talon.storage.embedded.control import SqliteUsageStore, open_control_db

        runner = open_control_db(tmp_path / "control.sqlite3")
        try:
            yield SqliteUsageStore(runner)
        finally:
            runner.close()
        return
    from talon.storage.postgres.control import PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(request.getfixturevalue("pg_url"), max_size=2)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgUsageStore(db)
    finally:
        await db.close()


def call(at: float, person: str, model: str, inp: int, out: int, cost: float | None = None) -> UsageRecord:
    return UsageRecord(at=at, channel="telegram", chat_id=person, person=person, model=model,
                       input_tokens=inp, output_tokens=out, cached_tokens=0, cost=cost)


async def test_usage_is_summed_per_model(usage: Any) -> None:
    assert await usage.by_model(0.0) == {}
    await usage.record(call(100.0, "alice", "gpt-4.1", 1000, 100, cost=0.01))
    await usage.record(call(200.0, "alice", "claude-3-5-haiku-latest", 800, 80))
    await usage.record(call(300.0, "alice", "claude-3-5-haiku-latest", 200, 20))
    await usage.record(call(300.0, "bob", "gpt-4.1", 5, 5))
    alice = await usage.by_model(0.0, channel="telegram", person="alice")
    assert list(alice) == ["claude-3-5-haiku-latest", "gpt-4.1"]
    claude = alice["claude-3-5-haiku-latest"]
    assert (claude.calls, claude.input_tokens, claude.output_tokens, claude.unpriced_calls) == (2, 1000, 100, 2)
    assert alice["gpt-4.1"].cost == pytest.approx(0.01) and alice["gpt-4.1"].tokens == 1100
    assert list(await usage.by_model(250.0, channel="telegram", person="alice")) == ["claude-3-5-haiku-latest"]
    assert (await usage.by_model(0.0))["gpt-4.1"].calls == 2
