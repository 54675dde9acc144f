"""`talon migrate --to URL`: an embedded data dir (inbox, sessions with checkpoints, pairings,
attachments) copied into PostgreSQL, checked, idempotent, and then served by the PostgreSQL stores."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import pytest
from PIL import Image

from talon.cli import main
from talon.content import ImageBlock, Message, TextBlock
from talon.envelope import InboundMessage
from talon.storage.access import AccessGate
from talon.storage.embedded.access import SqlitePairing
from talon.storage.embedded.attachments import FileAttachments, FileBlobs
from talon.storage.embedded.inbox import SqliteInbox
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.postgres.access import PgPairing
from talon.storage.postgres.attachments import PgAttachments
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.postgres.inbox import PgInbox
from talon.storage.postgres.sessions import PgSessions
from talon.storage.postgres.tasks import PgTaskStore
from talon.storage.embedded.tasks import SqliteTaskStore
from talon.storage.tasks import DUE, Task, TaskRun
from talon.storage.sessions import ChatKey

# Not coroutines: `talon migrate` runs its own event loop, as on the command line.


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


async def embedded_deployment(data: Path) -> dict[str, object]:
    store = FileAttachments(data / "attachments")
    image = await store.put_bytes(png_bytes(), mime="image/png", name="chart.png")
    blob = await store.put_bytes(os.urandom(700_000), mime="application/octet-stream", name="data.bin")
    await store.close()
    sessions = JsonlSessions(data)
    chat = ChatKey("telegram", "111")
    await sessions.append(chat, Message(role="user", content=[TextBlock(text="look"), ImageBlock(ref=image)]),
                          Message(role="assistant", content=[TextBlock(text="a green box")]))
    await sessions.append(chat, Message(role="user", content=[TextBlock(text="summary of the above")],
                                        meta={"checkpoint": "summary", "replaces": 2}))
    with open(sessions.thread_path(chat), "ab") as fh:
        fh.write(b'{"role": "user", "cont')  # a torn last line, as a crash leaves it
    await sessions.new_thread(chat)
    await sessions.append(chat, Message(role="user", content=[TextBlock(text="fresh start")]))
    await sessions.append(ChatKey("whatsapp", "+15550001111"), Message(role="user", content=[TextBlock(text="hola")]))
    threads = {t: [m.to_json() for m in await sessions.load(chat, t)] for t in ("main", await sessions.current_thread(chat))}
    await sessions.close()
    inbox = SqliteInbox(data / "inbox.sqlite3")
    for n in range(3):
        await inbox.add(InboundMessage(channel="telegram", chat_id="111", message_id=str(n), sender_id="111",
                                       text=f"m{n}"))
    await inbox.mark_done("telegram:111:0")
    await inbox.close()
    gate = AccessGate(SqlitePairing(data / "access.sqlite3"), {}, pairing=True)
    approved = await gate.request_pairing("telegram", "222", "Bob")
    waiting = await gate.request_pairing("whatsapp", "+15550003333", "Carol")
    assert approved is not None and waiting is not None
    await gate.approve(approved.code)
    await gate.close()
    tasks = SqliteTaskStore(data / "tasks.sqlite3")
    task = Task(id="feedc0de", channel="telegram", chat_id="111", thread_id=None, owner_id="111", text="report",
                kind="cron", spec="0 8 * * 1", timezone="Europe/Berlin", next_run=2e9, created=1.7e9,
                origin="{}")
    assert await tasks.add(task, max_active=50)
    assert await tasks.claim(task, 2e9 + 604800, TaskRun(task.id, 2e9, DUE, updated=1.7e9))
    await tasks.set_timezone("telegram", "111", "Europe/Berlin")
    await tasks.aclose()
    return {"threads": threads, "chat": chat, "image": image, "blob": blob, "code": waiting.code}


def run_migrate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data: Path,
                url: str) -> tuple[int, str]:
    monkeypatch.chdir(data.parent)
    monkeypatch.setenv("TALON_DATA_DIR", str(data))
    code = main(["migrate", "--to", url])
    return code, capsys.readouterr().out


def test_migrate_copies_checks_and_is_idempotent(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    made = asyncio.run(embedded_deployment(data))
    code, out = run_migrate(monkeypatch, capsys, data, pg_url)
    assert code == 0, out
    rows = {line.split("  ")[1].strip(): line.split() for line in out.splitlines() if line.startswith("  ")}
    assert out.count("ok: every item is in the database and checked") == 1
    # store, found, copied now, verified
    assert rows["inbox"][-3:] == ["3", "3", "3"]
    assert rows["sessions (threads)"][-3:] == ["3", "5", "3"]  # 3 threads, 5 readable lines (torn one left)
    assert rows["access (approvals, codes)"][-3:] == ["3", "3", "3"]  # 1 approval, 1 code, 1 code reply
    assert rows["attachments"][-3:] == ["2", "2", "2"]
    assert rows["scheduled tasks (runs, zones)"][-3:] == ["3", "3", "3"]  # 1 task, 1 run, 1 zone

    code, again = run_migrate(monkeypatch, capsys, data, pg_url)
    assert code == 0, again
    rows = {line.split("  ")[1].strip(): line.split() for line in again.splitlines() if line.startswith("  ")}
    copied_again = [rows[k][-2] for k in rows if k != "store"]
    assert len(copied_again) >= 6 and set(copied_again) == {"0"}  # every store listed, nothing copied twice

    asyncio.run(check_the_copy(pg_url, tmp_path, data, made))
    assert not (data / "migrate-check").exists()


async def check_the_copy(url: str, tmp_path: Path, data: Path, made: dict[str, object]) -> None:
    """The PostgreSQL stores serve what was copied."""
    db = AsyncDatabase(url)
    await db.open()
    try:
        chat = made["chat"]
        threads = made["threads"]
        assert isinstance(chat, ChatKey) and isinstance(threads, dict)
        pg_sessions = PgSessions(db, tmp_path / "worker")
        current = await pg_sessions.current_thread(chat)
        assert current != "main" and set(threads) == {"main", current}
        for thread, lines in threads.items():
            assert [m.to_json() for m in await pg_sessions.load(chat, thread)] == lines
        assert (await pg_sessions.load(chat, "main"))[-1].meta["checkpoint"] == "summary"
        inbox = PgInbox(db)
        assert [i.message.text for i in await inbox.pending()] == ["m1", "m2"]
        assert await inbox.add(InboundMessage(channel="telegram", chat_id="111", message_id="0", sender_id="111",
                                              text="m0")) is None  # dedup carried over
        gate = AccessGate(PgPairing(db), {}, pairing=True)
        assert await gate.allowed("telegram", ["222"]) and not await gate.allowed("whatsapp", ["+15550003333"])
        await gate.approve(str(made["code"]))  # the live code still works after the move
        assert await gate.allowed("whatsapp", ["+15550003333"])
        tasks = PgTaskStore(db)
        [task] = await tasks.for_chat("telegram", "111", None)
        assert (task.id, task.next_run, task.spec, task.version) == ("feedc0de", 2e9 + 604800, "0 8 * * 1", 1)
        assert [(r.due, r.status) for r in await tasks.runs(task.id)] == [(2e9, DUE)]
        assert await tasks.timezone("telegram", "111") == "Europe/Berlin"
        attachments = PgAttachments(db, tmp_path / "worker" / "attachments")
        source = FileBlobs(data / "attachments")
        for ref in (made["image"], made["blob"]):
            assert await attachments.read_bytes(ref) == source.read_bytes(ref)  # type: ignore[arg-type]
        await attachments.close()
    finally:
        await db.close()


def test_migrate_reports_a_corrupt_attachment(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    made = asyncio.run(embedded_deployment(data))
    blob = made["blob"]
    path = FileBlobs(data / "attachments").path_for(blob.id)  # type: ignore[attr-defined]
    path.write_bytes(b"bit rot")
    code, out = run_migrate(monkeypatch, capsys, data, pg_url)
    assert code == 1
    assert f"PROBLEM: attachment {blob.id[:12]} on disk does not match its name: not copied" in out  # type: ignore[attr-defined]
    assert "NOT OK" in out


def test_migrate_without_a_url_indexes_the_embedded_stores_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TALON_DATA_DIR", str(tmp_path / "data"))
    assert main(["migrate"]) == 0
    assert "0 message line(s) read, 0 newly indexed for search" in capsys.readouterr().out
