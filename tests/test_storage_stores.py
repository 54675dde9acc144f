"""Each store interface, one shared test run against every implementation: in memory, embedded
(SQLite, JSONL, files) and PostgreSQL (a real server, tests/pg.py)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.content import Message, TextBlock
from talon.envelope import InboundMessage
from talon.errors import AttachmentError, DownloadTooLarge, PairingError
from talon.storage.access import CODE_TTL_S, REPLY_INTERVAL_S, AccessGate, MemoryPairing
from talon.storage.attachments import MemoryAttachments
from talon.storage.embedded.access import SqlitePairing
from talon.storage.embedded.attachments import FileAttachments
from talon.storage.embedded.inbox import SqliteInbox
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.inbox import MemoryInbox
from talon.storage.leases import MemoryLeases
from talon.storage.media_links import MemoryMediaLinks
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.sessions import ChatKey, MemorySessions

KINDS = ["memory", "embedded", "postgres"]


@pytest_asyncio.fixture(params=KINDS)
async def kind(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """What a store needs: its kind, a directory, and for PostgreSQL an open, migrated pool."""
    env: dict[str, Any] = {"kind": request.param, "dir": tmp_path}
    if request.param != "postgres":
        yield env
        return
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(request.getfixturevalue("pg_url"))
    await db.open()
    await migrate_schema(db)
    env["db"] = db
    yield env
    await db.close()


def inbox_of(env: dict[str, Any]) -> Any:
    if env["kind"] == "memory":
        return MemoryInbox()
    if env["kind"] == "embedded":
        return SqliteInbox(env["dir"] / "inbox.sqlite3")
    from talon.storage.postgres.inbox import PgInbox

    return PgInbox(env["db"])


def msg(chat: str, n: int, text: str = "") -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id=chat, message_id=str(n), sender_id=chat, text=text or f"m{n}")


async def test_inbox(kind: dict[str, Any]) -> None:
    inbox = inbox_of(kind)
    first = await inbox.add(msg("1", 1))
    assert first is not None and first.attempts == 0
    assert await inbox.add(msg("1", 1)) is None  # a redelivery
    second = await inbox.add(msg("1", 2))
    third = await inbox.add(msg("2", 1))
    assert first.seq < second.seq < third.seq
    assert [i.message.key for i in await inbox.pending()] == [m.key for m in (msg("1", 1), msg("1", 2), msg("2", 1))]
    assert await inbox.seen(msg("1", 2).key) and not await inbox.seen("nope")
    # An edit replaces a message whose turn has not started, not one that has.
    assert await inbox.replace_pending(msg("1", 2, "edited"))
    state = await inbox.begin_attempt(msg("1", 1).key)
    assert state is not None and (state.attempts, state.delivered_parts, state.live_message) == (1, 0, None)
    assert not await inbox.replace_pending(msg("1", 1, "too late"))
    await inbox.set_delivered_parts(msg("1", 1).key, 2)
    await inbox.set_live_message(msg("1", 1).key, "777")
    state = await inbox.begin_attempt(msg("1", 1).key)
    assert state is not None and (state.attempts, state.delivered_parts, state.live_message) == (2, 2, "777")
    assert state.message.text == "m1"
    await inbox.mark_done(msg("1", 1).key, delivered_parts=3)
    assert await inbox.status(msg("1", 1).key) == "done" and await inbox.status("nope") is None
    assert await inbox.begin_attempt("nope") is None
    pending = await inbox.pending()
    assert [i.message.text for i in pending] == ["edited", "m1"]
    assert await inbox.add(msg("1", 1)) is None  # still recognised once done
    await inbox.close()


async def test_embedded_inbox_survives_a_restart(tmp_path: Path) -> None:
    inbox = SqliteInbox(tmp_path / "inbox.sqlite3")
    await inbox.add(msg("1", 1))
    await inbox.close()
    again = SqliteInbox(tmp_path / "inbox.sqlite3")
    assert [i.message.text for i in await again.pending()] == ["m1"]
    assert (tmp_path / "inbox.sqlite3").stat().st_mode & 0o777 == 0o600
    await again.close()


def sessions_of(env: dict[str, Any]) -> Any:
    if env["kind"] == "memory":
        return MemorySessions(env["dir"])
    if env["kind"] == "embedded":
        return JsonlSessions(env["dir"])
    from talon.storage.postgres.sessions import PgSessions

    return PgSessions(env["db"], env["dir"])


async def test_sessions(kind: dict[str, Any]) -> None:
    sessions = sessions_of(kind)
    chat, other = ChatKey("telegram", "42"), ChatKey("whatsapp", "+1555")
    assert await sessions.load_current(chat) == ("main", [])
    one = Message(role="user", content=[TextBlock(text="one")], meta={"turn_id": "t1"})
    two = Message(role="assistant", content=[TextBlock(text="two")], meta={"turn_id": "t1", "final": True})
    await sessions.append(chat, one, two)
    await sessions.append(other, Message.user("elsewhere"))
    loaded = await sessions.load(chat)
    assert [m.text for m in loaded] == ["one", "two"] and loaded[1].meta == two.meta
    await sessions.append(chat, Message.user("three"), thread="main")
    assert [m.text for m in await sessions.load(chat)] == ["one", "two", "three"]
    assert await sessions.size_bytes(chat) == sum(len(m.to_json().encode()) + 1 for m in await sessions.load(chat))
    thread = await sessions.new_thread(chat)
    assert thread != "main" and await sessions.current_thread(chat) == thread
    assert await sessions.load_current(chat) == (thread, [])
    await sessions.append(chat, Message.user("fresh"))
    assert [m.text for m in await sessions.load(chat)] == ["fresh"]
    assert [m.text for m in await sessions.load(chat, "main")] == ["one", "two", "three"]
    assert [m.text for m in await sessions.load(other)] == ["elsewhere"]
    # Context files live under the data dir, per chat, whatever holds the log.
    assert sessions.archive_path(chat, thread) == kind["dir"].absolute() / "sessions" / "telegram" / "42" / "context" / f"{thread}.archive.md"
    assert sessions.results_dir(other).parent == sessions.context_dir(other)
    await sessions.close()


async def test_embedded_sessions_append_off_the_loop(tmp_path: Path) -> None:
    sessions = JsonlSessions(tmp_path)
    seen: list[int] = []
    original = sessions._append

    def spy(chat: ChatKey, path: Path, messages: list[Message]) -> None:
        seen.append(threading.get_ident())
        original(chat, path, messages)

    sessions._append = spy  # type: ignore[method-assign]
    await sessions.append(ChatKey("telegram", "1"), Message.user("hi"))
    assert seen and seen[0] != threading.get_ident()
    await sessions.close()


def attachments_of(env: dict[str, Any]) -> Any:
    if env["kind"] == "memory":
        return MemoryAttachments(env["dir"] / "spill")
    if env["kind"] == "embedded":
        return FileAttachments(env["dir"] / "attachments")
    from talon.storage.postgres.attachments import PgAttachments

    return PgAttachments(env["db"], env["dir"] / "cache")


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_attachments(kind: dict[str, Any]) -> None:
    store = attachments_of(kind)
    ref = await store.put_stream(_chunks(b"hello ", b"world"), mime="text/plain", name="a.txt")
    assert ref.id == hashlib.sha256(b"hello world").hexdigest() and ref.bytes == 11 and ref.name == "a.txt"
    assert await store.read_bytes(ref) == b"hello world"
    assert (await store.file_path(ref.id)).read_bytes() == b"hello world"
    assert await store.exists(ref.id) and not await store.exists("0" * 64)
    image = await store.put_bytes(b"\x89PNG...", mime="image/png", width=3, height=2)
    assert (image.width, image.height, image.mime) == (3, 2, "image/png")
    with pytest.raises(DownloadTooLarge):
        await store.put_stream(_chunks(b"x" * 10, b"y" * 10), mime="text/plain", name="big", limit=15)
    with pytest.raises(AttachmentError, match="missing"):
        await store.read_bytes("1" * 64)
    with pytest.raises(AttachmentError, match="not an attachment id"):
        await store.file_path("../../etc/passwd")
    # Media code on a worker thread uses the blocking side.
    frame = await asyncio.to_thread(store.blocking.put_bytes, b"frame", mime="image/jpeg")
    chunked = await asyncio.to_thread(store.blocking.put_chunks, iter([b"fr", b"ame"]), mime="image/jpeg")
    assert frame.id == chunked.id and await store.read_bytes(frame) == b"frame"
    assert (await asyncio.to_thread(store.blocking.file_path, frame)).read_bytes() == b"frame"
    await store.close()


async def test_file_attachments_leave_no_temp_behind(tmp_path: Path) -> None:
    store = FileAttachments(tmp_path / "attachments")
    with pytest.raises(DownloadTooLarge):
        await store.put_stream(_chunks(b"x" * (2 << 20)), mime="text/plain", limit=1 << 20)

    async def broken() -> AsyncIterator[bytes]:
        yield b"start"
        raise ConnectionError("peer went away")

    with pytest.raises(ConnectionError):
        await store.put_stream(broken(), mime="text/plain")
    await store.close()  # waits for the discarding of the partial files
    assert list((tmp_path / "attachments" / "tmp").iterdir()) == []


def gate_of(env: dict[str, Any], clock: Any) -> AccessGate:
    if env["kind"] == "memory":
        store: Any = MemoryPairing()
    elif env["kind"] == "embedded":
        store = SqlitePairing(env["dir"] / "access.sqlite3")
    else:
        from talon.storage.postgres.access import PgPairing

        store = PgPairing(env["db"])
    return AccessGate(store, {"telegram": {"111", "@Bob"}}, pairing=True, clock=clock)


async def test_access_and_pairing(kind: dict[str, Any]) -> None:
    now = [1_000_000.0]
    gate = gate_of(kind, lambda: now[0])
    assert await gate.allowed("telegram", ["111"]) and await gate.allowed("telegram", ["999", "@bob"])
    assert not await gate.allowed("telegram", ["999"]) and not await gate.allowed("whatsapp", ["111"])
    first = await gate.request_pairing("telegram", "999", "Eve\x07")
    assert first is not None and first.reply is not None and first.code in first.reply
    again = await gate.request_pairing("telegram", "999")
    assert again is not None and again.code == first.code and again.reply is None  # no spam
    now[0] += REPLY_INTERVAL_S + 1
    later = await gate.request_pairing("telegram", "999")
    assert later is not None and later.code == first.code and later.reply is not None
    [pending] = await gate.pending()
    assert (pending.sender_id, pending.name, pending.code) == ("999", "Eve", first.code)
    approval = await gate.approve(first.code.lower().replace("-", " "))
    assert approval.sender_id == "999" and await gate.allowed("telegram", ["999"])
    assert await gate.pending() == [] and [a.sender_id for a in await gate.approvals()] == ["999"]
    with pytest.raises(PairingError, match="no pending request"):
        await gate.approve(first.code)
    expired = await gate.request_pairing("telegram", "555")
    assert expired is not None
    now[0] += CODE_TTL_S + 1
    with pytest.raises(PairingError):
        await gate.approve(expired.code)
    assert await gate.revoke("telegram", "999") is not None and not await gate.allowed("telegram", ["999"])
    assert await gate.revoke("telegram", "999") is None
    await gate.close()


def links_of(env: dict[str, Any], clock: Any) -> Any:
    if env["kind"] != "postgres":
        return MemoryMediaLinks(clock=clock)  # one process: the embedded default is in memory
    from talon.storage.postgres.attachments import PgAttachments
    from talon.storage.postgres.media_links import PgMediaLinks

    return PgMediaLinks(env["db"], PgAttachments(env["db"], env["dir"] / "cache"))


async def test_media_links(kind: dict[str, Any]) -> None:
    store = links_of(kind, clock=lambda: 0.0)
    token = await store.add_file("a.pdf", "application/pdf", "chat/a.pdf", "chat", (12, 345, 678), 60)
    derived = await store.add_bytes(b"voice", "v.ogg", "audio/ogg", 60)
    assert len(token) >= 43 and token != derived
    link = await store.get(token)
    assert link is not None and link.live and (link.name, link.mime, link.size) == ("a.pdf", "application/pdf", 345)
    assert (link.path, link.root, link.identity) == ("chat/a.pdf", "chat", (12, 345, 678))
    made = await store.get(derived)
    body = await store.body(made)
    assert (body if isinstance(body, bytes) else body.read_bytes()) == b"voice"
    assert await store.get("unknown") is None
    assert await store.live() == 2 and await store.unfetched([token, derived]) == 2
    await store.fetched(token)
    assert await store.unfetched([token, derived]) == 1
    await store.forget(derived)
    assert await store.get(derived) is None and await store.live() == 1
    short = await store.add_bytes(b"x", "x.bin", "application/octet-stream", 0.001)
    deadline = asyncio.get_running_loop().time() + 5
    while (link := await store.get(short)) is not None and link.live:
        if kind["kind"] != "postgres":
            store.clock = lambda: 1.0  # the memory store's clock moves on
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert link is not None and not link.live  # expired, still known (a late fetch is logged)


def leases_of(env: dict[str, Any], holder: str, ttl: float, table: dict[str, Any]) -> Any:
    if env["kind"] != "postgres":
        return MemoryLeases(holder, ttl, table)
    from talon.storage.postgres.leases import PgLeases

    return PgLeases(env["db"], holder, ttl)


async def test_leases(kind: dict[str, Any]) -> None:
    table: dict[str, Any] = {}
    w1, w2 = leases_of(kind, "w1", 30, table), leases_of(kind, "w2", 30, table)
    assert await w1.acquire("chat:a") and await w1.acquire("chat:a")
    assert not await w2.acquire("chat:a") and await w2.acquire("chat:b")
    assert await w1.holder_of("chat:a") == "w1" and await w1.holder_of("chat:zzz") is None
    assert await w1.renew(["chat:a", "chat:b"]) == {"chat:a"}
    summary = await w1.summary()
    assert (summary.live, summary.holders) == (2, 2)
    await w1.release("chat:b")  # not ours: nothing happens
    assert await w2.holder_of("chat:b") == "w2"
    await w2.release_all()
    assert await w1.acquire("chat:b")
    await w1.release("chat:a")
    assert await w2.acquire("chat:a")
