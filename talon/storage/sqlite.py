"""SQLite off the event loop: one connection owned by one thread, calls run there in order.

A commit with ``synchronous=FULL`` waits for an fsync (milliseconds, far more on a slow or busy
disk). Run on the event loop it would stall every chat, every webhook and ``/healthz``; run here it
stalls only this database's queue. One thread per database keeps SQLite's single-writer model and
the order of writes exactly as they were submitted, so a store can rely on "added before marked
done" without locks of its own.

A call already handed to the thread finishes even if the coroutine awaiting it is cancelled: a
write the caller gave up on is still either wholly done or not started, never half done.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from talon.permissions import create_private_file, private_dir

T = TypeVar("T")

Setup = Callable[[sqlite3.Connection], None]


class SqliteRunner:
    """A SQLite database at ``path`` (or ``":memory:"``) served by its own thread.

    ``setup`` runs first on that thread (pragmas, ``CREATE TABLE IF NOT EXISTS``). The connection is
    in autocommit mode (``isolation_level=None``): a function that needs a transaction says
    ``BEGIN IMMEDIATE`` / ``COMMIT`` itself, or uses ``with conn:`` after ``BEGIN``.
    """

    def __init__(self, path: Path | str, setup: Setup | None = None, *, wal: bool = True,
                 synchronous: str = "FULL") -> None:
        self.path = str(path)
        name = Path(self.path).name or "memory"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-{name}")
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        # Opening happens at start-up, before the loop serves anything: waiting for it here keeps
        # a broken file (wrong permissions, not a database) a start-up error with its own message.
        self._executor.submit(self._open, wal, synchronous, setup).result()

    def _open(self, wal: bool, synchronous: str, setup: Setup | None) -> None:
        if self.path != ":memory:":
            file = Path(self.path)
            private_dir(file.parent)
            create_private_file(file)  # SQLite gives its -wal and -shm files this file's mode
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if wal and self.path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        if setup is not None:
            setup(conn)
        self._conn = conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` on the database's thread; its result or its exception."""
        if self._closed:
            raise RuntimeError(f"the database {self.path} is closed")
        conn = self._conn
        assert conn is not None
        return await asyncio.wrap_future(self._executor.submit(fn, conn))

    def run_blocking(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The same, for code with no event loop (command-line tools). Never call it on the loop."""
        if self._closed:
            raise RuntimeError(f"the database {self.path} is closed")
        conn = self._conn
        assert conn is not None
        return self._executor.submit(fn, conn).result()

    def close(self) -> None:
        """Finish the queued calls, then close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()

        self._executor.submit(_close).result()
        self._executor.shutdown(wait=True)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
