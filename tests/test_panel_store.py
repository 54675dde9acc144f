"""The web panel's store: one behaviour, embedded SQLite and a real PostgreSQL (schema script 10), so
any worker of a scaled-out Talon serves any panel request from the same state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.storage.approvals import Approval
from talon.storage.panel import AuditEntry, PanelSession
from talon.storage.usage import UsageRecord
from tests.conftest import ALICE
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.panel import client_for, page_csrf, panel_settings, running_panel, sign_in


@pytest_asyncio.fixture(params=["embedded", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, Any, Any]]:
    """(panel store, usage store, approval store) on one database."""
    if request.param == "embedded":
        from talon.storage.embedded.control import SqliteApprovalStore, SqliteUsageStore, open_control_db
        from talon.storage.embedded.panel import SqlitePanelStore

        runner = open_control_db(tmp_path / "control.sqlite3")
        try:
            yield SqlitePanelStore(runner), SqliteUsageStore(runner), SqliteApprovalStore(runner)
        finally:
            runner.close()
        return
    from talon.storage.postgres.control import PgApprovalStore, PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.panel import PgPanelStore
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(request.getfixturevalue("pg_url"), max_size=4)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgPanelStore(db), PgUsageStore(db), PgApprovalStore(db)
    finally:
        await db.close()


async def test_sessions_links_and_failures(stores: tuple[Any, Any, Any]) -> None:
    panel, _, _ = stores
    now = time.time()
    await panel.add_session(PanelSession("h1", "c1", "password", "127.0.0.1", now - 100, now - 100))
    assert (await panel.session("h1")).csrf == "c1"
    await panel.touch_session("h1", now)
    assert (await panel.session("h1")).last_seen == pytest.approx(now)
    await panel.touch_session("h1", now - 50)  # never backwards
    assert (await panel.session("h1")).last_seen == pytest.approx(now)
    assert await panel.prune_sessions(now - 10) == 0
    await panel.end_session("h1")
    assert await panel.session("h1") is None
    # A link signs in once, and only while it lives; two workers racing for it: one wins.
    await panel.add_link("L", now + 600)
    results = await asyncio.gather(panel.use_link("L", now), panel.use_link("L", now))
    assert sorted(results) == [False, True]
    await panel.add_link("old", now - 1)
    assert await panel.use_link("old", now) is False
    for _ in range(3):
        await panel.add_failure("10.0.0.1", now)
    await panel.add_failure("10.0.0.2", now)
    assert await panel.failures("10.0.0.1", now - 60) == 3
    assert await panel.failures("10.0.0.1", now + 1) == 0


async def test_audit_chat_index_and_the_views_of_usage_and_approvals(stores: tuple[Any, Any, Any]) -> None:
    panel, usage, approvals = stores
    now = time.time()
    await panel.audit(AuditEntry(now - 5, "operator (password)", "signed in", "by password", "127.0.0.1"))
    await panel.audit(AuditEntry(now, "operator (password)", "task cancel", "t1", "127.0.0.1"))
    assert [e.action for e in await panel.audit_log()] == ["task cancel", "signed in"]
    await panel.note_message("telegram", "111", "Alice", "Alice (111)", now - 60)
    await panel.note_message("telegram", "111", "Alice", "Alice (111)", now - 30)
    await panel.note_message("telegram", "-100", "Team 50%_off", "Bob (222)", now - 10)
    await panel.note_message("telegram", "-100", "", "Alice (111)", now)
    await usage.record(UsageRecord(now, "telegram", "111", "111", "m1", 1000, 200))
    await usage.record(UsageRecord(now, "telegram", "-100", "222", "m2", 50, 5))
    rows = await panel.chats()
    assert [(r.chat_id, r.title, r.messages, r.tokens) for r in rows] == [("-100", "Team 50%_off", 2, 55),
                                                                         ("111", "Alice", 2, 1200)]
    assert rows[0].people == "Bob (222), Alice (111)"
    assert [r.chat_id for r in await panel.chats("50%_")] == ["-100"]  # LIKE's wildcards are literal
    assert [r.chat_id for r in await panel.chats("bob")] == ["-100"]
    assert await panel.chats("nobody") == []
    assert (await panel.chat("telegram", "111")).tokens == 1200
    assert await panel.chat_count() == 2
    # The chart counts messages answered, not received: four received, none answered yet.
    assert sum(n for _, n in await panel.per_day(now - 86400)) == 0
    today = time.strftime("%Y-%m-%d", time.gmtime(now))
    await panel.note_messages([], {today: 3})
    await panel.note_messages([], {today: 1})
    assert await panel.per_day(now - 86400) == [(today, 4)]
    people = await panel.usage_by("person", 0)
    assert [(r.key, r.tokens) for r in people] == [("telegram:111", 1200), ("telegram:222", 55)]
    assert [r.key for r in await panel.usage_by("model", 0)] == ["m1", "m2"]
    assert (await panel.usage_by("day", 0))[0].tokens == 1255
    base = dict(channel="telegram", chat_id="111", platform_chat="111", thread_id=None, requester="111",
                turn_id="k", tool="shell", kind="shell", summary="run: ls", created=now, expires=now + 600)
    await approvals.add(Approval(id="a1", call_id="c1", **base))
    await approvals.add(Approval(id="a2", call_id="c2", **base))
    await approvals.decide("a2", "denied", "panel (operator)", now + 1)
    assert [a.id for a in await panel.pending_approvals()] == ["a1"]
    [decided] = await panel.decided_approvals()
    assert decided.id == "a2" and decided.status == "denied" and decided.decided_by == "panel (operator)"


async def test_with_postgresql_the_panel_lists_chats_and_usage_from_the_shared_stores(
        pg_url: str, tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    """Talon on PostgreSQL (the scaled-out bridge): the chat index and the usage rollup fill as a
    message is answered, and a second worker's panel (its own process state, same database) sees
    them and the first worker's session."""
    llm.queue(FakeOpenAI.reply("Hello from PostgreSQL.", usage={"prompt_tokens": 700, "completion_tokens": 7}))
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_DATABASE_URL=pg_url)
    async with running_panel(settings) as first:
        tg.push_update(tg.text_message(ALICE, "hi", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "Hello from PostgreSQL." in str(c.params.get("text")))
        async with client_for(first) as client:
            page_csrf((await sign_in(client)).text)
            for _ in range(100):  # the index is written beside the turn, in the background
                if f"/ui/chats/telegram:{ALICE}" in (await client.get("/ui/chats")).text:
                    break
                await asyncio.sleep(0.05)
            async with running_panel(settings, telegram=False) as second, client_for(second) as other:
                other.cookies.set("talon_ui", client.cookies["talon_ui"], domain="127.0.0.1", path="/ui/")
                chats = await other.get("/ui/chats")
                assert chats.status_code == 200 and f"/ui/chats/telegram:{ALICE}" in chats.text
                assert "707" in (await other.get("/ui/usage")).text
