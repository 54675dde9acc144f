"""The WhatsApp store (window, waiting messages, receipts, button tokens): one behaviour, two
implementations (embedded SQLite, a real PostgreSQL), so the channel cannot tell which it has."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from talon.storage.whatsapp import ButtonToken


@pytest_asyncio.fixture(params=["embedded", "postgres"])
async def store(request: Any, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "embedded":
        from talon.storage.embedded.whatsapp import SqliteWhatsAppStore

        s = SqliteWhatsAppStore(tmp_path / "whatsapp.sqlite3")
        try:
            yield s
        finally:
            await s.close()
        return
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import migrate_schema
    from talon.storage.postgres.whatsapp import PgWhatsAppStore

    db = AsyncDatabase(request.getfixturevalue("pg_url"), max_size=4)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgWhatsAppStore(db)
    finally:
        await db.close()


async def test_the_window_only_moves_forward(store: Any) -> None:
    assert await store.last_inbound("+1555") is None
    await store.seen("+1555", 1000.0)
    await store.seen("+1555", 900.0)  # a late webhook of an older message
    assert await store.last_inbound("+1555") == 1000.0
    await store.seen("+1555", 2000.0)
    assert await store.last_inbound("+1555") == 2000.0
    assert await store.last_inbound("+1666") is None
    await store.mark_read("+1555", 50.0)
    await store.mark_read("+1555", 40.0)
    assert await store.last_read("+1555") == 50.0
    assert await store.last_inbound("+1555") == 2000.0
    assert await store.last_refused("+1555") is None
    await store.refused("+1555", 2500.0)
    await store.refused("+1555", 2400.0)
    assert await store.last_refused("+1555") == 2500.0 and await store.last_inbound("+1555") == 2000.0


async def test_pending_parts_keep_their_order_per_chat_and_expire(store: Any) -> None:
    await store.add_pending("+1555", ["a1", "a2"], 100.0)
    await store.add_pending("+1666", ["b1"], 150.0)
    await store.add_pending("+1555", ["a3"], 200.0)
    assert [p.payload for p in await store.pending("+1555")] == ["a1", "a2", "a3"]
    assert await store.pending_count("+1555") == 3 and await store.pending_count() == 4
    assert await store.chats_with_pending() == ["+1555", "+1666"]
    first = (await store.pending("+1555"))[0]
    await store.remove_pending(first.id)
    assert [p.payload for p in await store.pending("+1555")] == ["a2", "a3"]
    gone = await store.expire_pending(160.0)
    assert [(p.chat_id, p.payload) for p in gone] == [("+1555", "a2"), ("+1666", "b1")]
    assert [p.payload for p in await store.pending("+1555")] == ["a3"]
    assert await store.chats_with_pending() == ["+1555"]


async def test_one_holder_delivers_a_chats_pending_parts_until_its_claim_lapses(store: Any) -> None:
    assert await store.claim("+1555", "w1", 110.0, 100.0)
    assert await store.claim("+1555", "w1", 120.0, 105.0)  # renewed by its holder
    assert not await store.claim("+1555", "w2", 130.0, 110.0)
    assert await store.claim("+1666", "w2", 130.0, 110.0)  # another chat is free
    assert await store.claim("+1555", "w2", 140.0, 121.0)  # w1's claim lapsed (a dead worker)
    await store.release("+1555", "w1")  # not w1's any more: nothing changes
    assert not await store.claim("+1555", "w1", 150.0, 122.0)
    await store.release("+1555", "w2")
    assert await store.claim("+1555", "w1", 150.0, 123.0)


async def test_concurrent_claims_have_one_winner(store: Any) -> None:
    wins = await asyncio.gather(*(store.claim("+1777", f"w{i}", 200.0, 100.0) for i in range(8)))
    assert sum(wins) == 1


async def test_receipts_move_forward_and_only_for_our_messages(store: Any) -> None:
    sid = "SM" + "a" * 32
    assert await store.record_status(sid, "delivered", None, "", 10.0) is None  # not ours
    await store.record_sent(sid, "+1555", "answer", '{"kind": "text"}', 100.0)
    got = await store.record_status(sid, "delivered", None, "", 101.0)
    assert got.status == "delivered" and got.kind == "answer" and got.payload == '{"kind": "text"}'
    late = await store.record_status(sid, "sent", None, "", 102.0)  # arrived after "delivered"
    assert late.status == "delivered"
    read = await store.record_status(sid, "read", None, "", 103.0)
    assert read.status == "read"
    assert await store.last_failure("+1555") is None
    bad = "SM" + "b" * 32
    await store.record_sent(bad, "+1555", "answer", "", 110.0)
    failed = await store.record_status(bad, "undelivered", 63016, "outside the window", 111.0)
    assert (failed.status, failed.error_code, failed.error_message) == ("undelivered", 63016, "outside the window")
    assert (await store.last_failure("+1555")).sid == bad
    assert (await store.last_failure()).sid == bad
    assert await store.last_failure("+1666") is None
    assert await store.mark_retried(bad) and not await store.mark_retried(bad)


async def test_button_tokens_are_one_time_and_bound_to_their_chat(store: Any) -> None:
    tokens = [ButtonToken("tok-yes", "approve", "ap1", "d" * 64, "+1555", 1000.0),
              ButtonToken("tok-no", "deny", "ap1", "d" * 64, "+1555", 1000.0)]
    await store.add_tokens(tokens)
    assert await store.take_token("tok-yes", "+1666", 10.0) is None  # another chat's press: refused...
    got = await store.take_token("tok-yes", "+1555", 10.0)  # ...and the token is still there
    assert got is not None and (got.choice, got.approval_id, got.digest) == ("approve", "ap1", "d" * 64)
    assert await store.take_token("tok-yes", "+1555", 11.0) is None  # replayed
    assert await store.take_token("tok-no", "+1555", 11.0) is None  # one press decides
    assert await store.take_token("forged", "+1555", 11.0) is None
    await store.add_tokens([ButtonToken("old", "approve", "ap2", "e" * 64, "+1555", 5.0)])
    assert await store.take_token("old", "+1555", 6.0) is None  # expired
    assert await store.take_token("old", "+1555", 4.0) is None  # and gone
