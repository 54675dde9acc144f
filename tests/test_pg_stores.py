"""The PostgreSQL stores against a real server (tests/pg.py): schema versions, inbox, leases,
sessions, access, attachments and the shared-storage marker, each seen from two workers."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from talon.content import Message, TextBlock
from talon.envelope import InboundMessage
from talon.errors import AttachmentError, ConfigError, PairingError
from talon.storage.access import AccessGate
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.leases import LeaseSummary, chat_lease
from talon.storage.marker import MARKER, check_shared_dirs
from talon.storage.postgres.access import PgPairing
from talon.storage.postgres.attachments import CHUNK, PgAttachments
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.postgres.inbox import PgInbox
from talon.storage.postgres.leases import PgLeases
from talon.storage.postgres.schema import SCHEMA_VERSION, migrate_schema, schema_version
from talon.storage.postgres.sessions import PgSessions
from talon.storage.sessions import ChatKey


async def opened(url: str, **kw: object) -> AsyncDatabase:
    database = AsyncDatabase(url, **kw)  # type: ignore[arg-type]
    await database.open()
    return database


@pytest_asyncio.fixture
async def db(pg_url: str) -> AsyncIterator[AsyncDatabase]:
    database = await opened(pg_url)
    await migrate_schema(database)
    yield database
    await database.close()


@pytest_asyncio.fixture
async def other(db: AsyncDatabase, pg_url: str) -> AsyncIterator[AsyncDatabase]:
    """A second worker's pool on the same database."""
    database = await opened(pg_url)
    yield database
    await database.close()


def msg(chat: str, n: int, channel: str = "telegram") -> InboundMessage:
    return InboundMessage(channel=channel, chat_id=chat, message_id=str(n), sender_id=chat, text=f"m{n}")


async def test_schema_from_empty_and_from_the_previous_version(pg_url: str) -> None:
    database = await opened(pg_url)
    try:
        assert await schema_version(database) == 0
        assert await migrate_schema(database, target=1) == (0, 1)
        assert await schema_version(database) == 1
        # Data written under version 1 survives the upgrade.
        await database.execute("INSERT INTO talon_inbox (key, channel, chat_id, payload, created) "
                               "VALUES ('k', 'telegram', '1', '{}', 0)")
        assert await migrate_schema(database) == (1, SCHEMA_VERSION)
        assert await schema_version(database) == SCHEMA_VERSION == 14
        assert await database.fetchone("SELECT count(*) FROM talon_inbox") == (1,)
        assert await database.fetchone("SELECT to_regclass('talon_leases') IS NOT NULL") == (True,)
        assert await migrate_schema(database) == (SCHEMA_VERSION, SCHEMA_VERSION)  # nothing left to do
    finally:
        await database.close()


async def test_workers_starting_together_apply_the_schema_once(pg_url: str) -> None:
    async def start() -> tuple[int, int]:
        database = await opened(pg_url, max_size=1)
        try:
            return await migrate_schema(database)
        finally:
            await database.close()

    results = await asyncio.gather(*(start() for _ in range(4)))
    assert sorted(results) == [(0, SCHEMA_VERSION)] + [(SCHEMA_VERSION, SCHEMA_VERSION)] * 3


async def test_unreachable_database_is_a_config_error_without_the_password(tmp_path: Path) -> None:
    database = AsyncDatabase(f"host={tmp_path} dbname=nothing user=nobody password=hunter2", timeout_s=1.0)
    with pytest.raises(ConfigError) as err:
        await database.open()
    assert "TALON_DATABASE_URL" in str(err.value) and "hunter2" not in str(err.value)


async def test_inbox_dedups_across_workers_and_keeps_order_per_chat(db: AsyncDatabase,
                                                                   other: AsyncDatabase) -> None:
    a, b = PgInbox(db), PgInbox(other)
    assert await a.add(msg("1", 1)) is not None
    assert await b.add(msg("1", 1)) is None  # the same platform message, stored by another worker
    assert await b.add(msg("1", 2)) is not None
    assert await a.add(msg("2", 1)) is not None
    first = await a.next_pending("telegram", "1")
    assert first is not None and first.message.text == "m1"
    assert [i.message.text for i in await b.pending()] == ["m1", "m2", "m1"]
    one = await a.begin_attempt(first.message.key)
    two = await b.begin_attempt(first.message.key)
    assert one is not None and one.attempts == 1 and two is not None and two.attempts == 2
    await b.set_delivered_parts(first.message.key, 2)
    state = await a.begin_attempt(first.message.key)
    assert state is not None and state.delivered_parts == 2
    await a.mark_done(first.message.key)
    assert await b.status(first.message.key) == "done" and await b.seen(first.message.key)
    after = await b.next_pending("telegram", "1")
    assert after is not None and after.message.text == "m2"
    # Chats waiting for a worker: both, until one is leased.
    assert await a.pending_chats(["telegram"], 10) == [("telegram", "1"), ("telegram", "2")]
    await PgLeases(db, "w1", 30).acquire(chat_lease("telegram", "1"))
    assert await a.pending_chats(["telegram"], 10) == [("telegram", "2")]
    assert await a.pending_chats(["whatsapp"], 10) == []


async def test_leases_one_holder_until_expiry(db: AsyncDatabase) -> None:
    w1, w2 = PgLeases(db, "w1", 0.5), PgLeases(db, "w2", 0.5)
    assert await w1.acquire("chat:x") and await w1.acquire("chat:x")  # ours: taking it again renews
    assert not await w2.acquire("chat:x")
    assert await w2.holder_of("chat:x") == "w1"
    assert await w1.renew(["chat:x", "chat:y"]) == {"chat:x"}
    deadline = time.monotonic() + 5
    while await w2.holder_of("chat:x") is not None:  # w1 "died": no renewal
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert await w2.acquire("chat:x")
    assert await w1.renew(["chat:x"]) == set()  # w1 learns it lost the lease
    assert not await w1.acquire("chat:x")
    assert await w2.summary() == LeaseSummary(1, 0, 1)
    await w2.release("chat:x")
    assert await w1.acquire("chat:x")


async def test_sessions_move_between_workers(db: AsyncDatabase, other: AsyncDatabase, tmp_path: Path) -> None:
    a = PgSessions(db, tmp_path / "a")
    b = PgSessions(other, tmp_path / "b")
    chat = ChatKey("telegram", "42")
    assert await a.load(chat) == [] and await a.current_thread(chat) == "main"
    await a.append(chat, Message(role="user", content=[TextBlock(text="one")]),
                   Message(role="assistant", content=[TextBlock(text="two")]))
    assert [m.text for m in await b.load(chat)] == ["one", "two"]
    checkpoint = Message(role="user", content=[TextBlock(text="summary")],
                         meta={"checkpoint": "summary", "replaces": 2})
    await b.append(chat, checkpoint)
    loaded = await a.load(chat)  # a's cache is extended by the row b wrote
    assert [m.text for m in loaded] == ["one", "two", "summary"]
    assert loaded[-1].meta == checkpoint.meta
    assert await a.size_bytes(chat) == sum(len(m.to_json()) + 1 for m in loaded)
    thread = await b.new_thread(chat)
    assert await a.load_current(chat) == (thread, [])
    assert [m.text for m in await a.load(chat, "main")] == ["one", "two", "summary"]
    # The context directory is the same path as the embedded store's.
    assert a.context_dir(chat) == JsonlSessions(tmp_path / "a").context_dir(chat)


async def test_pairing_on_one_worker_approved_on_another(db: AsyncDatabase, other: AsyncDatabase) -> None:
    a = AccessGate(PgPairing(db), {"telegram": {"111"}}, pairing=True)
    b = AccessGate(PgPairing(other), {"telegram": {"111"}}, pairing=True)
    assert await a.allowed("telegram", ["111"]) and not await a.allowed("telegram", ["555"])
    first = await a.request_pairing("telegram", "555", "Eve\x1b[31m")
    assert first is not None and first.reply is not None and first.code in first.reply
    again = await b.request_pairing("telegram", "555")
    assert again is not None and again.code == first.code and again.reply is None
    [pending] = await b.pending()
    assert pending.name == "Eve[31m" and pending.code == first.code
    approval = await b.approve(first.code.lower().replace("-", ""))
    assert approval.sender_id == "555"
    assert await a.allowed("telegram", ["555"]) and await a.pending() == []
    with pytest.raises(PairingError):
        await a.approve(first.code)
    assert [x.sender_id for x in await a.approvals()] == ["555"]
    assert await b.revoke("telegram", "555") is not None and not await a.allowed("telegram", ["555"])


async def test_attachments_stream_in_chunks_and_dedup_across_workers(db: AsyncDatabase, other: AsyncDatabase,
                                                                     tmp_path: Path) -> None:
    a = PgAttachments(db, tmp_path / "a")
    b = PgAttachments(other, tmp_path / "b")
    size = 20 * 1_000_000
    block = os.urandom(1 << 20)

    def pieces() -> Iterator[bytes]:
        sent = 0
        while sent < size:
            piece = block[: min(len(block), size - sent)]
            sent += len(piece)
            yield piece

    async def chunks() -> AsyncIterator[bytes]:
        for piece in pieces():
            yield piece

    expected = hashlib.sha256(b"".join(pieces())).hexdigest()
    tracemalloc.start()
    try:
        ref = await a.put_stream(chunks(), mime="application/octet-stream", name="big.bin")
        _, peak_in = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        path = await b.file_path(ref)  # the other worker has no copy: streamed from the database
        _, peak_out = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ref.id == expected and ref.bytes == size
    # The generator's 1 MB block plus a batch being written: never the 20 MB file.
    assert peak_in < 4 * 1_000_000, peak_in
    assert peak_out < 4 * 1_000_000, peak_out
    assert path.stat().st_size == size
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for piece in iter(lambda: fh.read(1 << 20), b""):
            digest.update(piece)
    assert digest.hexdigest() == expected
    assert await db.fetchone("SELECT count(*), sum(octet_length(data)) FROM talon_attachment_chunks") == (
        (size + CHUNK - 1) // CHUNK, size)
    # The same bytes stored by the other worker: kept once.
    again = await b.put_bytes(b"small", mime="text/plain")
    assert (await a.put_bytes(b"small", mime="text/plain")).id == again.id
    assert await db.fetchone("SELECT count(*) FROM talon_attachments") == (2,)
    assert await a.read_bytes(again) == b"small"
    with pytest.raises(AttachmentError):
        await b.read_bytes("0" * 64)
    # A worker thread (image resizing) stores through the blocking side; the loop does the upload.
    thread_ref = await asyncio.to_thread(a.blocking.put_bytes, b"from a thread", mime="text/plain")
    assert await b.read_bytes(thread_ref) == b"from a thread"
    with pytest.raises(RuntimeError, match="worker threads"):
        a.blocking.put_bytes(b"on the loop", mime="text/plain")
    await a.close()
    await b.close()


async def test_corrupt_blob_in_the_database_is_refused(db: AsyncDatabase, tmp_path: Path) -> None:
    a = PgAttachments(db, tmp_path / "a")
    ref = await a.put_bytes(b"genuine bytes", mime="text/plain")
    await db.execute("UPDATE talon_attachment_chunks SET data = %s", (b"tampered bytes",))
    fresh = PgAttachments(db, tmp_path / "fresh")
    with pytest.raises(AttachmentError, match="does not match"):
        await fresh.read_bytes(ref)
    assert not fresh.files.path_for(ref.id).exists()


async def test_shared_storage_marker(db: AsyncDatabase, tmp_path: Path) -> None:
    shared = tmp_path / "nfs" / "media_root"
    first = await check_shared_dirs(db, {"TALON_MEDIA_ROOT": shared})
    assert (shared / MARKER).read_text().strip() == first
    assert await check_shared_dirs(db, {"TALON_MEDIA_ROOT": shared}) == first  # a second worker, same share
    local = tmp_path / "local" / "media_root"
    local.mkdir(parents=True)
    with pytest.raises(ConfigError) as err:
        await check_shared_dirs(db, {"TALON_MEDIA_ROOT": local})
    assert err.value.missing == ["TALON_MEDIA_ROOT"]
    assert "has no marker file" in str(err.value) and str(local) in str(err.value)
    (local / MARKER).write_text("someone-else\n")
    with pytest.raises(ConfigError, match="another deployment"):
        await check_shared_dirs(db, {"TALON_MEDIA_ROOT": local})


async def test_combined_statements_of_a_worker(db: AsyncDatabase, other: AsyncDatabase) -> None:
    """Store and lease in one write, next message with its attempt, close and give back."""
    a, b = PgInbox(db), PgInbox(other)
    lease = chat_lease("telegram", "1")
    item, leased = await a.add_and_lease(msg("1", 1), lease, "w1", 30)
    assert item is not None and leased
    again, leased_b = await b.add_and_lease(msg("1", 1), lease, "w2", 30)
    assert again is None and not leased_b  # a duplicate, and w1 holds the chat
    second, leased_b = await b.add_and_lease(msg("1", 2), lease, "w2", 30)
    assert second is not None and not leased_b
    first = await a.claim_next("telegram", "1", [])
    assert first is not None and first.message.text == "m1" and first.attempts == 1
    same = await a.claim_next("telegram", "1", [first.seq])  # delivery failed here: not counted again
    assert same is not None and same.seq == first.seq and same.attempts == 1
    # Closing m1 keeps the lease: m2 waits.
    assert not await a.finish(first.message.key, 1, lease, "w1")
    assert await PgLeases(db, "x", 30).holder_of(lease) == "w1"
    state = await a.claim_next("telegram", "1", [])
    assert state is not None and state.message.text == "m2"
    assert await a.finish(state.message.key, 2, lease, "w1")  # nothing else waits: given back
    assert await PgLeases(db, "x", 30).holder_of(lease) is None
    assert await a.claim_next("telegram", "1", []) is None
    assert await b.pending() == [] and await b.status(state.message.key) == "done"
