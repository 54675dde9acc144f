"""The PostgreSQL stores against a real server (tests/pg.py): schema versions, inbox, leases,
sessions, access, attachments and the shared-storage marker, each seen from two workers."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from talon.agent.session import ChatKey, SessionStore
from talon.content import Message, TextBlock
from talon.envelope import InboundMessage
from talon.errors import AttachmentError, ConfigError, PairingError
from talon.pg.access import PgAccessGate
from talon.pg.attachments import CHUNK, PgAttachmentStore
from talon.pg.db import SCHEMA_VERSION, Database, migrate_schema, schema_version
from talon.pg.inbox import PgInbox
from talon.pg.leases import Leases, chat_lease
from talon.pg.sessions import PgSessionStore
from talon.workspace_marker import MARKER, check_shared_dirs


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url)
    migrate_schema(database)
    yield database
    database.close()


def msg(chat: str, n: int, channel: str = "telegram") -> InboundMessage:
    return InboundMessage(channel=channel, chat_id=chat, message_id=str(n), sender_id=chat, text=f"m{n}")


def test_schema_from_empty_and_from_the_previous_version(pg_url: str) -> None:
    database = Database(pg_url)
    try:
        assert schema_version(database) == 0
        assert migrate_schema(database, target=1) == (0, 1)
        assert schema_version(database) == 1
        # Data written under version 1 survives the upgrade.
        database.execute("INSERT INTO talon_inbox (key, channel, chat_id, payload, created) "
                         "VALUES ('k', 'telegram', '1', '{}', 0)")
        assert migrate_schema(database) == (1, SCHEMA_VERSION)
        assert schema_version(database) == SCHEMA_VERSION == 5
        assert database.fetchone("SELECT count(*) FROM talon_inbox") == (1,)
        assert database.fetchone("SELECT to_regclass('talon_leases') IS NOT NULL") == (True,)
        assert migrate_schema(database) == (SCHEMA_VERSION, SCHEMA_VERSION)  # nothing left to do
    finally:
        database.close()


def test_workers_starting_together_apply_the_schema_once(pg_url: str) -> None:
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def start() -> None:
        database = Database(pg_url, max_size=1)
        try:
            results.append(migrate_schema(database))
        except BaseException as exc:  # collected for the assert below
            errors.append(exc)
        finally:
            database.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results) == [(0, SCHEMA_VERSION)] + [(SCHEMA_VERSION, SCHEMA_VERSION)] * 3


def test_unreachable_database_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        Database(f"host={tmp_path} dbname=nothing user=nobody password=hunter2", timeout_s=1.0)
    assert "TALON_DATABASE_URL" in str(err.value) and "hunter2" not in str(err.value)
    assert err.value.missing == ["TALON_DATABASE_URL"]


def test_inbox_dedups_across_workers_and_keeps_order_per_chat(db: Database, pg_url: str) -> None:
    other = Database(pg_url)
    try:
        a, b = PgInbox(db), PgInbox(other)
        assert a.add(msg("1", 1)) is not None
        assert b.add(msg("1", 1)) is None  # the same platform message, stored by another worker
        assert b.add(msg("1", 2)) is not None
        assert a.add(msg("2", 1)) is not None
        first = a.next_pending("telegram", "1")
        assert first is not None and first.message.text == "m1"
        assert [i.message.text for i in b.pending()] == ["m1", "m2", "m1"]
        assert a.begin_attempt(first.message.key) == 1 and b.begin_attempt(first.message.key) == 2
        b.set_delivered_parts(first.message.key, 2)
        assert a.delivered_parts(first.message.key) == 2
        a.mark_done(first.message.key)
        assert b.status(first.message.key) == "done" and b.seen(first.message.key)
        after = b.next_pending("telegram", "1")
        assert after is not None and after.message.text == "m2"
        # Chats waiting for a worker: both, until one is leased.
        assert a.pending_chats(["telegram"], 10) == [("telegram", "1"), ("telegram", "2")]
        Leases(db, "w1", 30).acquire(chat_lease("telegram", "1"))
        assert a.pending_chats(["telegram"], 10) == [("telegram", "2")]
        assert a.pending_chats(["whatsapp"], 10) == []
    finally:
        other.close()


def test_leases_one_holder_until_expiry(db: Database) -> None:
    w1, w2 = Leases(db, "w1", 0.5), Leases(db, "w2", 0.5)
    assert w1.acquire("chat:x") and w1.acquire("chat:x")  # ours: taking it again renews
    assert not w2.acquire("chat:x")
    assert w2.holder_of("chat:x") == "w1"
    assert w1.renew(["chat:x", "chat:y"]) == {"chat:x"}
    time.sleep(0.6)  # w1 "died": no renewal
    assert w2.holder_of("chat:x") is None
    assert w2.acquire("chat:x")
    assert w1.renew(["chat:x"]) == set()  # w1 learns it lost the lease
    assert not w1.acquire("chat:x")
    assert w2.summary() == (1, 0, 1)
    w2.release("chat:x")
    assert w1.acquire("chat:x")


def test_sessions_move_between_workers(db: Database, pg_url: str, tmp_path: Path) -> None:
    other = Database(pg_url)
    try:
        a = PgSessionStore(db, tmp_path / "a")
        b = PgSessionStore(other, tmp_path / "b")
        chat = ChatKey("telegram", "42")
        assert a.load(chat) == [] and a.current_thread(chat) == "main"
        a.append(chat, Message(role="user", content=[TextBlock(text="one")]),
                 Message(role="assistant", content=[TextBlock(text="two")]))
        assert [m.text for m in b.load(chat)] == ["one", "two"]
        checkpoint = Message(role="user", content=[TextBlock(text="summary")],
                             meta={"checkpoint": "summary", "replaces": 2})
        b.append(chat, checkpoint)
        loaded = a.load(chat)  # a's cache is extended by the row b wrote
        assert [m.text for m in loaded] == ["one", "two", "summary"]
        assert loaded[-1].meta == checkpoint.meta
        assert a.size_bytes(chat) == sum(len(m.to_json()) + 1 for m in loaded)
        thread = b.new_thread(chat)
        assert a.current_thread(chat) == thread and a.load(chat) == []
        assert [m.text for m in a.load(chat, "main")] == ["one", "two", "summary"]
        # The context directory is the same path as the embedded store's.
        assert a.context_dir(chat) == SessionStore(tmp_path / "a").context_dir(chat)
    finally:
        other.close()


def test_pairing_on_one_worker_approved_on_another(db: Database, pg_url: str) -> None:
    other = Database(pg_url)
    try:
        a = PgAccessGate(db, {"telegram": {"111"}}, pairing=True)
        b = PgAccessGate(other, {"telegram": {"111"}}, pairing=True)
        assert a.allowed("telegram", ["111"]) and not a.allowed("telegram", ["555"])
        first = a.request_pairing("telegram", "555", "Eve\x1b[31m")
        assert first is not None and first.reply is not None and first.code in first.reply
        again = b.request_pairing("telegram", "555")
        assert again is not None and again.code == first.code and again.reply is None
        [pending] = b.pending()
        assert pending.name == "Eve[31m" and pending.code == first.code
        approval = b.approve(first.code.lower().replace("-", ""))
        assert approval.sender_id == "555"
        assert a.allowed("telegram", ["555"]) and a.pending() == []
        with pytest.raises(PairingError):
            a.approve(first.code)
        assert [x.sender_id for x in a.approvals()] == ["555"]
        assert b.revoke("telegram", "555") is not None and not a.allowed("telegram", ["555"])
    finally:
        other.close()


def test_attachments_stream_in_chunks_and_dedup_across_workers(db: Database, pg_url: str, tmp_path: Path) -> None:
    other = Database(pg_url)
    try:
        a = PgAttachmentStore(db, tmp_path / "a")
        b = PgAttachmentStore(other, tmp_path / "b")
        size = 20 * 1_000_000
        block = os.urandom(1 << 20)

        def chunks() -> Iterator[bytes]:
            sent = 0
            while sent < size:
                piece = block[: min(len(block), size - sent)]
                sent += len(piece)
                yield piece

        expected = hashlib.sha256(b"".join(chunks())).hexdigest()
        tracemalloc.start()
        try:
            ref = a.put_chunks(chunks(), mime="application/octet-stream", name="big.bin")
            _, peak_in = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            path = b.file_path(ref)  # the other worker has no copy: streamed from the database
            _, peak_out = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert ref.id == expected and ref.bytes == size
        # The generator's 1 MB block plus a few chunks: never the 20 MB file.
        assert peak_in < 4 * 1_000_000, peak_in
        assert peak_out < 4 * 1_000_000, peak_out
        assert path.stat().st_size == size
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for piece in iter(lambda: fh.read(1 << 20), b""):
                digest.update(piece)
        assert digest.hexdigest() == expected
        assert db.fetchone("SELECT count(*), sum(octet_length(data)) FROM talon_attachment_chunks") == (
            (size + CHUNK - 1) // CHUNK, size)
        # The same bytes stored by the other worker: kept once.
        again = b.put_bytes(b"small", mime="text/plain")
        assert a.put_bytes(b"small", mime="text/plain").id == again.id
        assert db.fetchone("SELECT count(*) FROM talon_attachments") == (2,)
        assert a.read_bytes(again) == b"small"
        with pytest.raises(AttachmentError):
            b.read_bytes("0" * 64)
    finally:
        other.close()


def test_corrupt_blob_in_the_database_is_refused(db: Database, tmp_path: Path) -> None:
    a = PgAttachmentStore(db, tmp_path / "a")
    ref = a.put_bytes(b"genuine bytes", mime="text/plain")
    db.execute("UPDATE talon_attachment_chunks SET data = %s", (b"tampered bytes",))
    fresh = PgAttachmentStore(db, tmp_path / "fresh")
    with pytest.raises(AttachmentError, match="does not match"):
        fresh.read_bytes(ref)
    assert not fresh.path_for(ref.id).exists()


def test_shared_storage_marker(db: Database, tmp_path: Path) -> None:
    shared = tmp_path / "nfs" / "media_root"
    first = check_shared_dirs(db, {"TALON_MEDIA_ROOT": shared})
    assert (shared / MARKER).read_text().strip() == first
    assert check_shared_dirs(db, {"TALON_MEDIA_ROOT": shared}) == first  # a second worker, same share
    local = tmp_path / "local" / "media_root"
    local.mkdir(parents=True)
    with pytest.raises(ConfigError) as err:
        check_shared_dirs(db, {"TALON_MEDIA_ROOT": local})
    assert err.value.missing == ["TALON_MEDIA_ROOT"]
    assert "has no marker file" in str(err.value) and str(local) in str(err.value)
    (local / MARKER).write_text("someone-else\n")
    with pytest.raises(ConfigError, match="another deployment"):
        check_shared_dirs(db, {"TALON_MEDIA_ROOT": local})
