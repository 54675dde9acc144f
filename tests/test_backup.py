"""``talon backup`` / ``--verify`` / ``restore`` on real stores: a round trip keeps every
conversation, attachment, task, pairing and workspace file; a tampered, truncated or hostile
archive is refused by verify and by restore; a restore never writes over anything; a backup taken
while messages are appended holds only whole messages; embedded -> PostgreSQL -> embedded through
the same archive gives the same conversations; WhatsApp's waiting messages, windows, receipts and
button tokens survive every one of those paths (and a PostgreSQL backup restored into PostgreSQL)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from talon.cli import main
from talon.config import Settings
from talon.content import Message
from talon.errors import BackupError
from talon.storage import pg_export
from talon.storage.backup import MANIFEST, backup, restore, verify
from tests.support.archives import listing
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.factory import open_stores
from talon.storage.sessions import ChatKey
from talon.storage.tasks import Task
from talon.storage.panel import AuditEntry, PanelSession
from talon.storage.whatsapp import ButtonToken
from tests.pg import drop_database, new_database

A = ChatKey("telegram", "111")
B = ChatKey("whatsapp", "+14155550123")
PNG = bytes.fromhex("89504e470d0a1a0a") + b"fake image bytes" * 10


def settings_at(root: Path, **extra: Any) -> Settings:
    return Settings(_env_file=None, TALON_DATA_DIR=str(root / "data"), TALON_PAIRING=True,  # type: ignore[call-arg]
                    TALON_MEDIA_ROOT=str(root / "media_root"), TWILIO_ACCOUNT_SID="AC" + "0" * 32,
                    TWILIO_AUTH_TOKEN="t" * 32, TWILIO_WHATSAPP_FROM="whatsapp:+14155550100", **extra)


WA_PARTS = ['{"text": "part 1 of the answer"}', '{"text": "part 2, with \\u00e9 and a newline\\n"}',
            '{"text": "part 3"}']
WA_TOKEN = ButtonToken(token="tok-approve-1", choice="approve", approval_id="ap-1", digest="d" * 64,
                       chat_id=B.chat_id, expires=4_000_000_000.0)


async def fill(settings: Settings) -> dict[str, Any]:
    """A deployment with two chats over two threads, an image, a task, a pairing and memory."""
    stores = open_stores(settings, check_dirs=False)
    await stores.start()
    try:
        ref = await stores.attachments.put_bytes(PNG, mime="image/png", name="boiler.png")
        await stores.sessions.append(A, Message.user("The boiler pressure is 1.5 bar", sender="111"),
                                     Message.assistant("Noted."))
        await stores.sessions.new_thread(A)
        await stores.sessions.append(A, Message.user("second session"))
        await stores.sessions.append(B, Message.user("hola desde WhatsApp"))
        await stores.tasks.add(Task(id="t1", channel="telegram", chat_id="111", thread_id=None, owner_id="111",
                                    text="water the plants", kind="every", spec="3600", timezone="UTC",
                                    next_run=time.time() + 3600, created=time.time()), max_active=10)
        pairing = await stores.gate.request_pairing("telegram", "999", "Eve")
        assert pairing is not None
        await stores.gate.approve(pairing.code)
        memory = settings.media_root / "telegram" / "111" / "MEMORY.md"
        memory.parent.mkdir(parents=True, exist_ok=True)
        memory.write_text("The owner likes tea.\n")
        # WhatsApp: the window closed (refused), three parts waiting for it, a failed answer, a button.
        wa = stores.whatsapp
        assert wa is not None
        await wa.seen(B.chat_id, 1_000.5)
        await wa.mark_read(B.chat_id, 1_001.25)
        await wa.refused(B.chat_id, 90_000.0)
        await wa.add_pending(B.chat_id, WA_PARTS[:2], 90_001.0)
        await wa.add_pending("+14155550199", ["{\"text\": \"other chat\"}"], 90_001.5)
        await wa.add_pending(B.chat_id, WA_PARTS[2:], 90_002.0)
        assert await wa.claim(B.chat_id, "worker-gone", time.time() + 3600, time.time())
        await wa.record_sent("SM" + "1" * 32, B.chat_id, "answer", '{"text": "retry me"}', time.time())
        await wa.record_status("SM" + "1" * 32, "undelivered", 63016, "outside the window", time.time())
        await wa.add_tokens([WA_TOKEN])
        # The web panel: an audit entry, the chat index, and a sign-in session (not archived).
        assert stores.panel is not None
        await stores.panel.audit(AuditEntry(at=1_234.5, who="password", action="approve", detail="ap-1",
                                            address="127.0.0.1"))
        await stores.panel.note_message("whatsapp", B.chat_id, "Ana", "Ana", 5_000.0)
        await stores.panel.add_session(PanelSession("h" * 64, "c" * 32, "password", "127.0.0.1", 1.0, 2.0))
        return {"ref": ref}
    finally:
        await stores.aclose()


async def snapshot(settings: Settings, ref_id: str) -> dict[str, Any]:
    """What a Talon opened on these settings holds (the same for any store)."""
    stores = open_stores(settings, check_dirs=False)
    await stores.start()
    try:
        out: dict[str, Any] = {}
        for chat in (A, B):
            thread, messages = await stores.sessions.load_current(chat)
            out[str(chat)] = [(m.role, m.text, m.at) for m in messages]
        out["A main"] = [(m.role, m.text, m.at) for m in await stores.sessions.load(A, "main")]
        out["search"] = [h.text for h in await stores.sessions.search(A, "boiler")]
        out["tasks"] = [(t.id, t.text, t.kind) for t in await stores.tasks.for_chat("telegram", "111", None)]
        out["approved"] = sorted(a.who for a in await stores.gate.approvals())
        out["image"] = hashlib.sha256(await stores.attachments.read_bytes(ref_id)).hexdigest()
        out["memory"] = (settings.media_root / "telegram" / "111" / "MEMORY.md").read_text()
        wa = stores.whatsapp
        assert wa is not None
        out["wa pending"] = [(p.chat_id, p.created, p.payload) for p in await wa.pending(B.chat_id)]
        out["wa chats"] = await wa.chats_with_pending()
        out["wa window"] = (await wa.last_inbound(B.chat_id), await wa.last_read(B.chat_id),
                            await wa.last_refused(B.chat_id))
        assert stores.panel is not None
        out["panel audit"] = await stores.panel.audit_log()
        out["panel chats"] = [(c.key, c.title, c.people, c.last_at, c.messages) for c in await stores.panel.chats()]
        failure = await wa.last_failure(B.chat_id)
        out["wa failure"] = None if failure is None else (failure.sid, failure.status, failure.error_code,
                                                           failure.payload, failure.retried)
        return out
    finally:
        await stores.aclose()


def assert_whatsapp_kept(state: dict[str, Any]) -> None:
    """What ``fill`` stored for WhatsApp is what ``snapshot`` read (so ``after == before`` covers it)."""
    assert state["wa pending"] == [(B.chat_id, 90_001.0, WA_PARTS[0]), (B.chat_id, 90_001.0, WA_PARTS[1]),
                                   (B.chat_id, 90_002.0, WA_PARTS[2])]
    assert state["wa chats"] == [B.chat_id, "+14155550199"]
    assert state["wa window"] == (1_000.5, 1_001.25, 90_000.0)
    assert [e.action for e in state["panel audit"]] == ["approve"]
    assert state["panel chats"] == [(f"whatsapp:{B.chat_id}", "Ana", "Ana", 5_000.0, 1)]
    assert state["wa failure"] == ("SM" + "1" * 32, "undelivered", 63016, '{"text": "retry me"}', False)


async def assert_claim_not_kept(settings: Settings) -> None:
    """The source's worker claimed chat B for an hour: the restored Talon's workers are not held off;
    the panel's sign-in session is not restored."""
    stores = open_stores(settings, check_dirs=False)
    await stores.start()
    try:
        assert stores.whatsapp is not None
        assert await stores.whatsapp.claim(B.chat_id, "worker-new", time.time() + 60, time.time())
        assert stores.panel is not None and await stores.panel.session("h" * 64) is None  # sign in again
    finally:
        await stores.aclose()


async def take_button(settings: Settings) -> list[Any]:
    """The button token, pressed twice (the second press finds nothing: it is one-time)."""
    stores = open_stores(settings, check_dirs=False)
    await stores.start()
    try:
        assert stores.whatsapp is not None
        return [await stores.whatsapp.take_token(WA_TOKEN.token, B.chat_id, time.time()) for _ in range(2)]
    finally:
        await stores.aclose()


def rewrite(src: Path, dst: Path, change: Any) -> None:
    """A copy of a .tar.gz archive with ``change(name, data) -> data | None`` applied to each member."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for member in tin:
            data = tin.extractfile(member).read()  # type: ignore[union-attr]
            new = change(member.name, data)
            if new is None:
                continue
            info = tarfile.TarInfo(member.name)
            info.size = len(new)
            tout.addfile(info, io.BytesIO(new))


async def test_round_trip_keeps_everything_and_the_archive_verifies(tmp_path: Path) -> None:
    source = settings_at(tmp_path / "src")
    made = await fill(source)
    before = await snapshot(source, made["ref"].id)
    archive = tmp_path / "talon.tar.zst"
    manifest = await asyncio.to_thread(backup, archive, source.data_dir, source.media_root)
    listed = listing(archive)
    assert "data/search.sqlite3" in listed  # a snapshot, caught up on restore
    assert not any(n.startswith("data/search.sqlite3-") for n in listed)
    assert "media/telegram/111/MEMORY.md" in listed
    assert manifest.count == len(listed) and manifest.total_bytes == sum(size for size, _ in listed.values())
    assert await asyncio.to_thread(verify, archive) == manifest
    result = await asyncio.to_thread(restore, archive, tmp_path / "new" / "data")
    assert result.media_root == tmp_path / "new" / "media_root" and result.indexed == 4
    after = await snapshot(settings_at(tmp_path / "new"), made["ref"].id)
    assert after == before
    assert_whatsapp_kept(before)
    assert await take_button(settings_at(tmp_path / "new")) == [WA_TOKEN, None]
    await assert_claim_not_kept(settings_at(tmp_path / "new"))
    assert before["A main"][0][2] is not None  # the times came along
    assert oct(os.stat(tmp_path / "new" / "data").st_mode & 0o777) == "0o700"


async def test_tampered_truncated_and_hostile_archives_are_refused(tmp_path: Path) -> None:
    source = settings_at(tmp_path / "src")
    await fill(source)
    good = tmp_path / "good.tar.gz"
    await asyncio.to_thread(backup, good, source.data_dir, source.media_root)
    cases = {
        "tampered": lambda n, d: d.replace(b"tea", b"gin") if n.endswith("MEMORY.md") else d,
        "missing": lambda n, d: None if n.endswith("MEMORY.md") else d,
        "no manifest": lambda n, d: None if n == MANIFEST else d,
        "traversal": lambda n, d: d,  # renamed below
    }
    for label, change in cases.items():
        bad = tmp_path / f"{label.replace(' ', '_')}.tar.gz"
        rewrite(good, bad, change)
        if label == "traversal":
            with tarfile.open(bad, "r:gz") as t:
                members = [(m, t.extractfile(m).read()) for m in t]  # type: ignore[union-attr]
            with tarfile.open(bad, "w:gz") as t:
                evil = tarfile.TarInfo("data/../../escaped.txt")
                evil.size = 3
                t.addfile(evil, io.BytesIO(b"bad"))
                for m, d in members:
                    t.addfile(m, io.BytesIO(d))
        with pytest.raises(BackupError) as refused:
            await asyncio.to_thread(verify, bad)
        assert "refused" in str(refused.value), (label, refused.value)
        target = tmp_path / f"restore-{label.replace(' ', '_')}"
        with pytest.raises(BackupError):
            await asyncio.to_thread(restore, bad, target / "data")
        assert not target.exists() and not (tmp_path / "escaped.txt").exists()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    # Cut inside a member's data the stream is damaged; cut where tar sees a clean end (a block of
    # zeros, as SQLite files hold) the archive has no manifest: refused either way.
    with pytest.raises(BackupError, match="damaged|not a complete Talon archive"):
        await asyncio.to_thread(verify, truncated)


async def test_a_restore_never_writes_over_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = settings_at(tmp_path / "src")
    await fill(source)
    archive = tmp_path / "a.tar.gz"
    await asyncio.to_thread(backup, archive, source.data_dir, source.media_root)
    with pytest.raises(BackupError, match="exists"):
        await asyncio.to_thread(backup, archive, source.data_dir, source.media_root)
    with pytest.raises(BackupError, match="not empty"):
        await asyncio.to_thread(restore, archive, source.data_dir)
    busy = tmp_path / "busy"
    (busy / "media_root").mkdir(parents=True)
    (busy / "media_root" / "mine.txt").write_text("keep me")
    assert await asyncio.to_thread(main, ["restore", str(archive), "--data-dir", str(busy / "data")]) == 1
    assert "restore refused" in (err := capsys.readouterr().err) and "not empty" in err, err
    assert (busy / "media_root" / "mine.txt").read_text() == "keep me" and not (busy / "data").exists()
    with pytest.raises(BackupError, match="may not nest"):
        await asyncio.to_thread(restore, archive, tmp_path / "n" / "data", tmp_path / "n" / "data" / "m")
    assert await asyncio.to_thread(main, ["backup", "--verify", str(archive)]) == 0
    assert "ok: " in capsys.readouterr().out


async def test_a_backup_while_messages_arrive_holds_whole_messages(tmp_path: Path) -> None:
    settings = settings_at(tmp_path / "src")
    settings.ensure_dirs()
    sessions = JsonlSessions(settings.data_dir)
    await sessions.append(A, Message.user("first"))
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        loop = asyncio.new_event_loop()
        try:
            while not stop.is_set():
                written[0] += 1
                loop.run_until_complete(sessions.append(A, Message.user(f"message {written[0]} " + "x" * 3000)))
        finally:
            loop.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while written[0] < 20:
            await asyncio.sleep(0.01)
        archives = [tmp_path / f"live{i}.tar.gz" for i in range(3)]
        for archive in archives:
            await asyncio.to_thread(backup, archive, settings.data_dir, settings.media_root)
    finally:
        stop.set()
        thread.join()
        await sessions.close()
    for i, archive in enumerate(archives):
        result = await asyncio.to_thread(restore, archive, tmp_path / f"r{i}" / "data")
        log = (result.data_dir / "sessions" / "telegram" / "111" / "main.jsonl").read_bytes()
        assert log.endswith(b"\n")
        lines = log.decode().splitlines()
        texts = [Message.from_json(line).text for line in lines]  # every line whole
        assert texts[0] == "first" and all(t.startswith("message ") for t in texts[1:])
        numbers = [int(t.split()[1]) for t in texts[1:]]
        assert numbers == list(range(1, len(numbers) + 1))


async def test_embedded_to_postgres_and_back_through_the_same_archive(tmp_path: Path, pg_url: str,
                                                                     pg_server: str) -> None:
    source = settings_at(tmp_path / "src")
    made = await fill(source)
    before = await snapshot(source, made["ref"].id)
    first = tmp_path / "embedded.tar.zst"
    await asyncio.to_thread(backup, first, source.data_dir, source.media_root)
    result = await asyncio.to_thread(restore, first, tmp_path / "pg" / "data", database_url=pg_url)
    assert not list(result.data_dir.glob("*.sqlite3"))  # the stores are in the database now
    in_pg = settings_at(tmp_path / "pg", TALON_DATABASE_URL=pg_url)
    assert await snapshot(in_pg, made["ref"].id) == before
    assert_whatsapp_kept(before)
    await assert_claim_not_kept(in_pg)
    # A second restore into the same (no longer empty) database is refused.
    with pytest.raises(BackupError, match="already holds Talon data"):
        await asyncio.to_thread(restore, first, tmp_path / "pg2" / "data", database_url=pg_url)
    second = tmp_path / "postgres.tar.gz"
    manifest = await asyncio.to_thread(backup, second, in_pg.data_dir, in_pg.media_root, database_url=pg_url)
    assert manifest.source == "postgres"
    assert "data/whatsapp.sqlite3" in listing(second)
    await asyncio.to_thread(restore, second, tmp_path / "back" / "data")
    back = settings_at(tmp_path / "back")
    assert await snapshot(back, made["ref"].id) == before
    await assert_claim_not_kept(back)
    assert_same_rows(source.data_dir, back.data_dir)
    # The PostgreSQL archive into another PostgreSQL database: the same again.
    other_url = new_database(pg_server)
    try:
        await asyncio.to_thread(restore, second, tmp_path / "pg3" / "data", database_url=other_url)
        in_pg3 = settings_at(tmp_path / "pg3", TALON_DATABASE_URL=other_url)
        assert await snapshot(in_pg3, made["ref"].id) == before
        assert await take_button(in_pg3) == [WA_TOKEN, None]
    finally:
        drop_database(pg_server, other_url)
    assert await take_button(back) == [WA_TOKEN, None]
    assert await take_button(in_pg) == [WA_TOKEN, None]


def assert_same_rows(before: Path, after: Path) -> None:
    """Every table of every embedded store holds as many rows after the round trip as before
    (the search index aside: derived), whichever store it is, the tables named as not carried aside."""
    import sqlite3

    def rows(data_dir: Path) -> dict[str, int]:
        out = {}
        for file in sorted(data_dir.glob("*.sqlite3")):
            if file.name == "search.sqlite3":
                continue
            conn = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
            try:
                for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name != 'sqlite_sequence'").fetchall():
                    if table in pg_export.NOT_CARRIED.get(file.name, ()):
                        continue  # the panel's sign-ins (not archived) and usage rollup (rebuilt)
                    out[f"{file.name}:{table}"] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            finally:
                conn.close()
        return out

    source = rows(before)
    assert source["whatsapp.sqlite3:wa_pending"] == 4 and source["whatsapp.sqlite3:wa_tokens"] == 1
    assert source["control.sqlite3:panel_audit"] == 1 and source["control.sqlite3:panel_chats"] == 1
    assert rows(after) == source


async def test_an_older_archive_is_restored_and_a_newer_one_refused(tmp_path: Path, pg_url: str) -> None:
    from talon.storage.postgres.schema import SCHEMA_VERSION

    source = settings_at(tmp_path / "src")
    made = await fill(source)
    before = await snapshot(source, made["ref"].id)
    good = tmp_path / "good.tar.gz"
    await asyncio.to_thread(backup, good, source.data_dir, source.media_root)

    def with_schema(version: int) -> Any:
        def change(name: str, data: bytes) -> bytes:
            if name != MANIFEST:
                return data
            manifest = json.loads(data)
            manifest["schema_version"] = version
            return json.dumps(manifest).encode()
        return change

    old, new = tmp_path / "old.tar.gz", tmp_path / "new.tar.gz"
    rewrite(good, old, with_schema(1))
    rewrite(good, new, with_schema(SCHEMA_VERSION + 1))
    with pytest.raises(BackupError, match="made by a newer Talon"):
        await asyncio.to_thread(verify, new)
    await asyncio.to_thread(restore, old, tmp_path / "old" / "data", database_url=pg_url)
    assert await snapshot(settings_at(tmp_path / "old", TALON_DATABASE_URL=pg_url), made["ref"].id) == before


async def test_links_planted_in_a_workspace_are_not_followed_and_link_members_are_refused(tmp_path: Path) -> None:
    source = settings_at(tmp_path / "src")
    await fill(source)
    workspace = source.media_root / "telegram" / "111"
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("TOP SECRET")
    (workspace / "secret-link.txt").symlink_to(secret)
    (workspace / "data-link").symlink_to(source.data_dir, target_is_directory=True)
    archive = tmp_path / "a.tar.gz"
    manifest = await asyncio.to_thread(backup, archive, source.data_dir, source.media_root)
    assert not any("link" in name for name in listing(archive))
    with tarfile.open(archive, "r:gz") as t:
        assert all(b"TOP SECRET" not in (t.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                   for m in t)
    # An archive that carries a link (made by hand) is refused before anything is written.
    linked = tmp_path / "linked.tar.gz"
    with tarfile.open(archive, "r:gz") as t:
        members = [(m, t.extractfile(m).read()) for m in t]  # type: ignore[union-attr]
    with tarfile.open(linked, "w:gz") as t:
        link = tarfile.TarInfo("media/telegram/111/evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
        for m, d in members:
            t.addfile(m, io.BytesIO(d))
    with pytest.raises(BackupError, match="not a regular file"):
        await asyncio.to_thread(verify, linked)
    with pytest.raises(BackupError):
        await asyncio.to_thread(restore, linked, tmp_path / "r" / "data")
    assert not (tmp_path / "r").exists()
