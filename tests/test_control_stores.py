"""The usage and approval stores: one behaviour, three implementations (memory, embedded SQLite,
a real PostgreSQL), so nothing above them can tell which it has."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from talon.storage.approvals import Approval
from talon.storage.usage import UsageRecord
from tests.support.stores import stores  # noqa: F401  (the fixture: memory, embedded, PostgreSQL)


def call(at: float, chat: str, person: str, inp: int, out: int, *, cached: int = 0, cost: float | None = None,
         channel: str = "telegram") -> UsageRecord:
    return UsageRecord(at=at, channel=channel, chat_id=chat, person=person, model="gpt-4.1-mini",
                       input_tokens=inp, output_tokens=out, cached_tokens=cached, cost=cost)


async def test_usage_sums_per_person_chat_and_period(stores: tuple[Any, Any]) -> None:
    usage, _ = stores
    assert (await usage.totals(0.0)).calls == 0
    await usage.record(call(100.0, "g1", "alice", 1000, 100, cached=400, cost=0.001))
    await usage.record(call(200.0, "g1", "bob", 500, 50, cost=None))
    await usage.record(call(300.0, "alice", "alice", 10, 5, cost=0.0005))
    await usage.record(call(300.0, "alice", "alice", 7, 7, channel="whatsapp"))
    alice = await usage.totals(0.0, channel="telegram", person="alice")
    assert (alice.calls, alice.input_tokens, alice.output_tokens, alice.cached_tokens) == (2, 1010, 105, 400)
    assert alice.cost == pytest.approx(0.0015) and alice.unpriced_calls == 0 and alice.tokens == 1115
    group = await usage.totals(0.0, channel="telegram", chat_id="g1")
    assert (group.calls, group.tokens, group.unpriced_calls) == (2, 1650, 1)
    assert (await usage.totals(150.0, channel="telegram", chat_id="g1")).calls == 1  # since
    assert (await usage.totals(0.0)).calls == 4  # the whole bot, every channel


async def test_grants_add_up_per_person_unit_and_period(stores: tuple[Any, Any]) -> None:
    usage, _ = stores
    await usage.grant("telegram", "alice", 5000, "tokens", 100.0)
    await usage.grant("telegram", "alice", 2.5, "usd", 100.0)
    await usage.grant("telegram", "alice", 1000, "tokens", 200.0)
    await usage.grant("telegram", "bob", 9, "tokens", 200.0)
    assert await usage.granted("telegram", "alice", "tokens", 0.0) == 6000
    assert await usage.granted("telegram", "alice", "tokens", 150.0) == 1000
    assert await usage.granted("telegram", "alice", "usd", 0.0) == 2.5
    assert await usage.granted("whatsapp", "alice", "tokens", 0.0) == 0


def approval(id: str, turn: str = "telegram:111:5", call_id: str = "call_1", **kw: Any) -> Approval:
    values: dict[str, Any] = dict(id=id, channel="telegram", chat_id="111", platform_chat="111", thread_id=None,
                                  requester="111", turn_id=turn, call_id=call_id, tool="shell", kind="shell",
                                  summary="run a shell command:\nls", created=10.0, expires=610.0)
    values.update(kw)
    return Approval(**values)


async def test_approvals_add_once_per_call_and_decide_once(stores: tuple[Any, Any]) -> None:
    _, approvals = stores
    first = await approvals.add(approval("a1"))
    assert first == approval("a1")
    # A resumed turn asks again for the same call: it gets the approval it had.
    again = await approvals.add(approval("a2", created=50.0))
    assert again.id == "a1"
    await approvals.set_prompt("a1", "42")
    assert (await approvals.get("a1")).prompt_id == "42"
    assert await approvals.get("nope") is None
    assert [a.id for a in await approvals.pending("telegram", "111")] == ["a1"]
    # Two presses at once (or a press and the timeout): exactly one decides.
    results = await asyncio.gather(approvals.decide("a1", "approved", "telegram:111 (Alice)", 20.0),
                                   approvals.decide("a1", "timeout", "", 21.0))
    assert sorted(results) == [False, True]
    decided = await approvals.get("a1")
    assert decided.status in ("approved", "timeout") and decided.decided_at in (20.0, 21.0)
    assert await approvals.pending("telegram", "111") == []
    assert dataclasses.replace(decided, status="pending", decided_by="", decided_at=None) == \
        dataclasses.replace(approval("a1"), prompt_id="42")


async def test_pending_is_per_conversation_oldest_first(stores: tuple[Any, Any]) -> None:
    _, approvals = stores
    await approvals.add(approval("late", call_id="c2", created=30.0))
    await approvals.add(approval("early", call_id="c1", created=20.0))
    await approvals.add(approval("other", call_id="c3", chat_id="222"))
    assert [a.id for a in await approvals.pending("telegram", "111")] == ["early", "late"]
    assert [a.id for a in await approvals.pending("telegram", "222")] == ["other"]


async def test_always_allowed_per_chat_and_tool(stores: tuple[Any, Any]) -> None:
    _, approvals = stores
    assert not await approvals.always_allowed("telegram", "111", "shell")
    await approvals.allow_always("telegram", "111", "shell", "telegram:111", 5.0)
    await approvals.allow_always("telegram", "111", "shell", "telegram:111", 6.0)  # twice is fine
    assert await approvals.always_allowed("telegram", "111", "shell")
    assert not await approvals.always_allowed("telegram", "111", "write_file")
    assert not await approvals.always_allowed("telegram", "222", "shell")


async def test_talon_migrate_copies_usage_and_approvals_once(tmp_path: Path, pg_url: str) -> None:
    from talon.storage.migrate import migrate_embedded
    from talon.storage.embedded.control import SqliteApprovalStore, SqliteUsageStore, open_control_db
    from talon.storage.postgres.control import PgApprovalStore, PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase

    data = tmp_path / "data"
    runner = open_control_db(data / "control.sqlite3")
    usage, approvals = SqliteUsageStore(runner), SqliteApprovalStore(runner)
    await usage.record(call(100.5, "g1", "alice", 1000, 100, cached=400, cost=0.001))
    await usage.record(call(200.25, "g1", "bob", 500, 50, cost=None))
    await usage.grant("telegram", "alice", 5000, "tokens", 150.0)
    await approvals.add(approval("a1"))
    await approvals.decide("a1", "denied", "telegram:111 (Alice)", 20.0)
    await approvals.add(approval("a2", call_id="c2"))
    await approvals.allow_always("telegram", "111", "shell", "telegram:111", 30.0)
    runner.close()

    db = AsyncDatabase(pg_url, max_size=2)
    await db.open()
    try:
        first = await migrate_embedded(data, db)
        again = await migrate_embedded(data, db)
    finally:
        await db.close()
    [control] = [r for r in first.stores if r.name.startswith("control")]
    assert (control.found, control.copied, control.verified, control.problems) == (6, 6, 6, [])
    [control] = [r for r in again.stores if r.name.startswith("control")]
    assert (control.copied, control.verified) == (0, 6) and again.ok
    adb = AsyncDatabase(pg_url, max_size=2)
    await adb.open()
    try:
        totals = await PgUsageStore(adb).totals(0.0)
        assert (totals.calls, totals.tokens, totals.cached_tokens, totals.unpriced_calls) == (2, 1650, 400, 1)
        assert await PgUsageStore(adb).granted("telegram", "alice", "tokens", 0.0) == 5000
        moved = PgApprovalStore(adb)
        assert (await moved.get("a1")).decided_by == "telegram:111 (Alice)"  # type: ignore[union-attr]
        assert [a.id for a in await moved.pending("telegram", "111")] == ["a2"]
        assert await moved.always_allowed("telegram", "111", "shell")
    finally:
        await adb.close()
