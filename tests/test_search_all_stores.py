"""``search_all`` (the panel's search over every chat) in every session store: each hit names its
chat, every chat is searched, the words are words (FTS5 or tsquery syntax is not obeyed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.content import Message
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.sessions import ChatKey

A = ChatKey("telegram", "100")
B = ChatKey("whatsapp", "+15550001:x")


@pytest_asyncio.fixture(params=["memory", "embedded", "postgres"])
async def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        from talon.storage.sessions import MemorySessions

        yield MemorySessions(tmp_path)
        return
    if request.param == "embedded":
        from talon.storage.embedded.sessions import JsonlSessions

        store = JsonlSessions(tmp_path)
        yield store
        await store.close()
        return
    from talon.storage.postgres.schema import migrate_schema
    from talon.storage.postgres.sessions import PgSessions

    db = AsyncDatabase(request.getfixturevalue("pg_url"))
    await db.open()
    await migrate_schema(db)
    yield PgSessions(db, tmp_path)
    await db.close()


async def test_search_all_finds_every_chats_messages_and_names_each_chat(sessions: Any) -> None:
    await sessions.append(A, Message.user("The boiler makes a knocking noise", sender="7"))
    await sessions.append(B, Message.assistant("Replace the boiler valve."))
    await sessions.append(B, Message.user("nothing to see"))
    hits = await sessions.search_all("BOILER")
    assert {(str(h.chat), h.text) for h in hits} == {("telegram:100", "The boiler makes a knocking noise"),
                                                   ("whatsapp:+15550001:x", "Replace the boiler valve.")}
    assert [str(h.chat) for h in await sessions.search_all("boiler valve")] == ["whatsapp:+15550001:x"]
    assert len(await sessions.search_all("boiler", limit=1)) == 1
    for hostile in ['boiler" OR "nothing', "boiler OR nothing", "* NEAR(boiler", "'; DROP TABLE x; --", '"', ""]:
        found = await sessions.search_all(hostile)
        assert all("boiler" in h.text.lower() and "nothing" not in h.text.lower() for h in found), hostile
    assert [h.text for h in await sessions.search_all("knocking")] == ["The boiler makes a knocking noise"]
    # A chat's own search still sees only that chat.
    assert [h.text for h in await sessions.search(A, "boiler")] == ["The boiler makes a knocking noise"]
