"""The storage base: SQLite served off the event loop in order, and the bounded async PostgreSQL
pool against a real server (tests/pg.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import psycopg
import pytest

from talon.errors import ConfigError, StoreUnavailable
from talon.storage import SqliteRunner
from talon.storage.postgres.db import AsyncDatabase


def _setup(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")


async def test_sqlite_runs_off_the_loop_in_submission_order(tmp_path: Path) -> None:
    runner = SqliteRunner(tmp_path / "db" / "x.sqlite3", _setup)
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def insert(n: int):
        def go(conn: sqlite3.Connection) -> int:
            seen.append(threading.get_ident())
            conn.execute("INSERT INTO t VALUES (?)", (n,))
            return n
        return go

    results = await asyncio.gather(*(runner.run(insert(n)) for n in range(50)))
    assert results == list(range(50))
    assert loop_thread not in seen and len(set(seen)) == 1
    rows = await runner.run(lambda c: [r[0] for r in c.execute("SELECT n FROM t ORDER BY rowid")])
    assert rows == list(range(50))
    assert (tmp_path / "db" / "x.sqlite3").stat().st_mode & 0o777 == 0o600
    runner.close()
    runner.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await runner.run(lambda c: 1)


async def test_sqlite_errors_reach_the_caller(tmp_path: Path) -> None:
    runner = SqliteRunner(tmp_path / "x.sqlite3", _setup)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await runner.run(lambda c: c.execute("SELECT * FROM missing"))
    assert await runner.run(lambda c: c.execute("SELECT 1").fetchone()[0]) == 1
    await runner.aclose()


async def test_sqlite_call_finishes_when_its_caller_is_cancelled(tmp_path: Path) -> None:
    runner = SqliteRunner(tmp_path / "x.sqlite3", _setup)
    started = threading.Event()
    release = threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)
        conn.execute("INSERT INTO t VALUES (7)")

    task = asyncio.create_task(runner.run(slow))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await runner.run(lambda c: c.execute("SELECT n FROM t").fetchall()) == [(7,)]
    await runner.aclose()


async def test_async_database_round_trips(pg_url: str) -> None:
    db = AsyncDatabase(pg_url, max_size=2)
    await db.open()
    try:
        await db.execute("CREATE TABLE t (n INTEGER)")
        assert await db.execute("INSERT INTO t VALUES (1), (2)") == 2
        assert await db.fetchone("SELECT count(*) FROM t") == (2,)
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO t VALUES (3)")
        assert await db.fetchall("SELECT n FROM t ORDER BY n") == [(1,), (2,), (3,)]
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with db.transaction() as conn:
                await conn.execute("CREATE UNIQUE INDEX ON t (n)")
                await conn.execute("INSERT INTO t VALUES (3)")
        assert await db.fetchone("SELECT count(*) FROM t") == (3,)  # rolled back
        assert await db.ping() is None
        assert db.round_trips >= 5
    finally:
        await db.close()


async def test_async_database_missing_database_says_so_at_once(pg_server: str) -> None:
    url = psycopg.conninfo.make_conninfo(pg_server, dbname="talon_no_such_db")
    db = AsyncDatabase(url, timeout_s=5)
    with pytest.raises(ConfigError, match='database "talon_no_such_db" does not exist'):
        await db.open()


async def test_async_database_bounds_a_statement(pg_url: str) -> None:
    db = AsyncDatabase(pg_url, max_size=2, statement_s=0.3)
    await db.open()
    try:
        with pytest.raises(StoreUnavailable, match="did not answer within 0.3s"):
            await db.fetchone("SELECT pg_sleep(5)")
        assert await db.fetchone("SELECT 1") == (1,)  # the pool recovered a usable connection
    finally:
        await db.close()
