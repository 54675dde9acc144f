"""Timestamps and full-text search in every session store (memory, embedded FTS5, PostgreSQL
tsvector): what is found, in which chat, and the hostile queries that must find nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.content import AttachmentRef, AudioBlock, FileBlock, Message, TextBlock
from talon.storage.embedded.search import INDEX_FILE, SearchIndex, index_files
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.search import chat_token, query_words
from talon.storage.sessions import ChatKey, MemorySessions

KINDS = ["memory", "embedded", "postgres"]
A = ChatKey("telegram", "100")
B = ChatKey("telegram", "200")
CANARY = "zebracanary"


@pytest_asyncio.fixture(params=KINDS)
async def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemorySessions(tmp_path)
        return
    if request.param == "embedded":
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


async def test_every_stored_message_has_its_time_and_old_lines_still_load(sessions: Any) -> None:
    before = time.time()
    await sessions.append(A, Message.user("hello", sender="7"), Message.assistant("hi"))
    given = Message.user("with a time of its own")
    given.at = 1_600_000_000.0
    await sessions.append(A, given)
    loaded = await sessions.load(A)
    assert [m.text for m in loaded] == ["hello", "hi", "with a time of its own"]
    assert all(m.at is not None and before - 1 <= m.at <= time.time() + 1 for m in loaded[:2])
    assert loaded[2].at == 1_600_000_000.0  # a stamp it had is kept
    # A line from before stamps existed (no "at") loads, with no time.
    old = json.dumps({"role": "user", "content": [{"type": "text", "text": "old line"}]})
    assert Message.from_json(old).at is None and "at" not in Message.from_json(old).to_json()


async def test_search_finds_this_chats_messages_in_every_thread_with_when_and_who(sessions: Any) -> None:
    await sessions.append(A, Message.user("The boiler makes a knocking noise", sender="7"))
    await sessions.append(A, Message.assistant("Bleed the radiators and check the boiler pressure."))
    await sessions.new_thread(A)  # an earlier session: the words are no longer in the current thread
    await sessions.append(A, Message.user("something else entirely"))
    await sessions.append(B, Message.user(f"boiler {CANARY} in chat B"))
    hits = await sessions.search(A, "BOILER")
    assert [h.text for h in hits] == ["Bleed the radiators and check the boiler pressure.",
                                      "The boiler makes a knocking noise"]
    assert hits[1].role == "user" and hits[1].sender == "7" and hits[1].thread == "main"
    assert hits[0].at is not None and "UTC" in hits[0].describe(["boiler"])
    assert await sessions.search(A, "boiler pressure") and not await sessions.search(A, "boiler kettle")
    assert len(await sessions.search(A, "boiler", limit=1)) == 1
    assert [h.text for h in await sessions.search(B, "boiler")] == [f"boiler {CANARY} in chat B"]


async def test_transcripts_captions_and_file_names_are_indexed_tool_output_is_not(sessions: Any) -> None:
    ref = AttachmentRef(id="a" * 64, mime="application/pdf", bytes=10, name="invoice-march.pdf")
    voice = AttachmentRef(id="b" * 64, mime="audio/ogg", bytes=10)
    await sessions.append(A, Message(role="user", content=[FileBlock(ref=ref), TextBlock(text="caption here")]))
    await sessions.append(A, Message(role="user", content=[AudioBlock(ref=voice, transcript="call the plumber")]))
    await sessions.append(A, Message(role="tool", content=[TextBlock(text="secretoutput")], tool_call_id="x",
                                     tool_name="shell"))
    assert len(await sessions.search(A, "invoice")) == 1
    assert len(await sessions.search(A, "caption")) == 1
    assert len(await sessions.search(A, "plumber")) == 1
    assert await sessions.search(A, "secretoutput") == []


async def test_multilingual_words_are_found_as_written(sessions: Any) -> None:
    await sessions.append(A, Message.user("Το καλοριφέρ δεν ζεσταίνει"))
    await sessions.append(A, Message.user("Котёл шумит по ночам"))
    await sessions.append(A, Message.user("running runs"))
    assert len(await sessions.search(A, "καλοριφέρ")) == 1
    assert len(await sessions.search(A, "шумит")) == 1
    # No English stemming: "run" is not "running".
    assert await sessions.search(A, "run") == []


HOSTILE = [
    CANARY, f'"{CANARY}"', f"{CANARY}*", f"boiler OR {CANARY}", f"NEAR(boiler {CANARY})",
    f"chat_tag : {CANARY}", f"body:{CANARY}", f"' OR 1=1 -- {CANARY}", f"{CANARY}\") OR (\"x",
    f"chat_id = 200 {CANARY}", f"{CANARY} | boiler", f"!{CANARY}", f"{CANARY} & !boiler",
    f"{CANARY}:*", "*", '"', "OR", "NEAR", "", "   ", "%", "_", f"{chat_token(B)} {CANARY}",
    chat_token(B), f"telegram:200 {CANARY}", f"{CANARY}; DROP TABLE lines",
]


@pytest.mark.parametrize("query", HOSTILE)
async def test_a_canary_in_another_chat_is_never_found_whatever_the_query(sessions: Any, query: str) -> None:
    await sessions.append(A, Message.user("boiler noise in chat A"))
    await sessions.append(B, Message.user(f"the secret {CANARY} boiler of chat B"))
    hits = await sessions.search(A, query, limit=50)
    assert all(CANARY not in h.text for h in hits), query
    # The store still works after the query (nothing was dropped or broken).
    assert len(await sessions.search(B, CANARY)) == 1


def test_query_words_are_plain_words() -> None:
    assert query_words('"boiler" OR NEAR(x*) chat_id=5') == ["boiler", "or", "near", "x", "chat", "id", "5"]
    assert query_words("***") == []
    assert len(query_words(" ".join(f"w{i}" for i in range(100)))) == 16


async def test_existing_logs_are_indexed_once_and_a_lost_index_is_rebuilt(tmp_path: Path) -> None:
    store = JsonlSessions(tmp_path, index=False)  # logs written before the index existed
    await store.append(A, Message.user("a line about the boiler"), Message.user("and the kettle"))
    await store.append(ChatKey("telegram", "-100:7"), Message.user("boiler in a topic"))
    await store.close()
    assert not (tmp_path / INDEX_FILE).exists()
    index = SearchIndex(tmp_path / INDEX_FILE)
    try:
        assert index_files(index, tmp_path / "sessions") == (3, 3)
        assert index_files(index, tmp_path / "sessions") == (0, 0)  # again: nothing left to read
        # The chat's real id comes from its CHAT file, not the made-safe directory name.
        assert len(index.search(ChatKey("telegram", "-100:7"), ["boiler"], 10)) == 1
    finally:
        index.close()
    store = JsonlSessions(tmp_path)
    try:
        assert [h.text for h in await store.search(A, "boiler")] == ["a line about the boiler"]
    finally:
        await store.close()


async def test_pg_lines_stored_before_the_index_are_indexed_by_migrate(pg_url: str, tmp_path: Path) -> None:
    from talon.storage.postgres.schema import migrate_schema
    from talon.storage.postgres.sessions import PgSessions, index_unindexed

    db = AsyncDatabase(pg_url)
    await db.open()
    try:
        await migrate_schema(db, 8)
        line = Message.user("boiler from version 8").to_json()
        await db.execute("INSERT INTO talon_session_lines (channel, chat_id, thread, n, body) "
                         "VALUES ('telegram', '100', 'main', 1, %s)", (line,))
        await migrate_schema(db)
        store = PgSessions(db, tmp_path)
        assert await store.search(A, "boiler") == []
        assert await index_unindexed(db) == 1
        assert await index_unindexed(db) == 0
        assert [h.text for h in await store.search(A, "boiler")] == ["boiler from version 8"]
        assert await store.search(B, "boiler") == []
    finally:
        await db.close()


async def test_embedded_search_indexes_what_the_index_missed_first(tmp_path: Path) -> None:
    old = JsonlSessions(tmp_path, index=False)  # a log from before the index
    await old.append(A, Message.user("boiler from before the index"))
    await old.close()
    store = JsonlSessions(tmp_path)
    await store.append(A, Message.user("boiler after"))  # coverage must not jump over the old line
    # Entries lost in a crash (still pending, never written): the log has them.
    await store.append(A, Message.user("boiler lost in a crash"))
    assert store.index is not None
    store.index._pending.clear()
    store.index._covered.clear()
    texts = sorted(h.text for h in await store.search(A, "boiler"))
    assert texts == ["boiler after", "boiler from before the index", "boiler lost in a crash"]
    await store.close()
    again = JsonlSessions(tmp_path)
    try:
        assert len(await again.search(A, "boiler")) == 3  # each once
    finally:
        await again.close()


async def test_with_the_index_off_nothing_is_indexed_and_search_says_so(tmp_path: Path, pg_url: str) -> None:
    from talon.agent.tools.search import SearchConversationsTool
    from talon.envelope import TURN_MESSAGE, InboundMessage
    from talon.storage.postgres.schema import migrate_schema
    from talon.storage.postgres.sessions import PgSessions

    store = JsonlSessions(tmp_path, index=False)
    db = AsyncDatabase(pg_url)
    await db.open()
    try:
        await migrate_schema(db)
        pg = PgSessions(db, tmp_path, index=False)
        for off in (store, pg):
            await off.append(A, Message.user("boiler"))
            assert not off.search_enabled and await off.search(A, "boiler") == []
        assert not (tmp_path / INDEX_FILE).exists()
        row = await db.fetchone("SELECT search IS NULL, indexed FROM talon_session_lines")
        assert row == (True, False)  # `talon migrate` with the index on later indexes it
        token = TURN_MESSAGE.set(InboundMessage(channel="telegram", chat_id="100", message_id="1", sender_id="1",
                                                text="q"))
        try:
            result = await SearchConversationsTool(store).run({"query": "boiler"})
        finally:
            TURN_MESSAGE.reset(token)
        assert "Search is off here (TALON_SEARCH_INDEX=false)" in result.content[0].text  # type: ignore[union-attr]
    finally:
        await store.close()
        await db.close()
