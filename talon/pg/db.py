"""The PostgreSQL connection pool and the schema, applied at start under a lock.

psycopg 3 with ``psycopg_pool``. Talon's store interfaces are synchronous (SQLite answers them in
microseconds), so the PostgreSQL stores use the pool's blocking API: every store call is one short
statement or one short transaction, a single round trip on the loopback or LAN. ``round_trips``
counts them, for the benchmark.

Schema versions are numbered SQL scripts (``MIGRATIONS``). ``migrate_schema`` applies the missing
ones in one transaction under a transaction-scoped advisory lock, so workers that start together
wait for each other instead of racing, and a failed upgrade leaves the previous version intact.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from talon.errors import ConfigError
from talon.storage.postgres.schema import MIGRATIONS

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key for schema changes: any fixed 64-bit number ("talonsch" in ASCII).
_SCHEMA_LOCK = 0x74616C6F6E736368 & 0x7FFFFFFFFFFFFFFF

SCHEMA_VERSION = len(MIGRATIONS)


class Database:
    """A pool of connections to ``url``, in autocommit: each call is its own transaction unless it
    runs inside ``transaction()``."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, timeout_s: float = 10.0) -> None:
        self.url = url
        self._count_lock = threading.Lock()
        self.round_trips = 0
        self.pool = ConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout_s,
                                   kwargs={"autocommit": True}, open=False, name="talon")
        try:
            self.pool.open(wait=True, timeout=timeout_s)
        except Exception as exc:
            self.pool.close()
            raise ConfigError(f"cannot reach the database TALON_DATABASE_URL={redact(url)}: {exc}",
                              ["TALON_DATABASE_URL"]) from None

    def _count(self, n: int = 1) -> None:
        with self._count_lock:
            self.round_trips += n

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it touched."""
        self._count()
        with self.pool.connection() as conn:
            return conn.execute(sql, params).rowcount

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._count()
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchone()

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._count()
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection inside one transaction (committed on success); counted as one round trip
        per statement by ``count``."""
        with self.pool.connection() as conn:
            with conn.transaction():
                yield conn

    def count(self, n: int = 1) -> None:
        """Account for ``n`` round trips made on a connection from ``transaction()``."""
        self._count(n)

    def ping(self, timeout_s: float = 2.0) -> str | None:
        """None when the database answers, else what went wrong."""
        try:
            with self.pool.connection(timeout=timeout_s) as conn:
                conn.execute("SELECT 1")
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def close(self) -> None:
        self.pool.close()


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(url)
    except Exception:
        return "<unparsable URL>"
    if "password" in params:
        params["password"] = "***"
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def schema_version(db: Database) -> int:
    row = db.fetchone("SELECT to_regclass('talon_meta') IS NOT NULL")
    if not row or not row[0]:
        return 0
    found = db.fetchone("SELECT value FROM talon_meta WHERE key = 'schema_version'")
    return int(found[0]) if found else 0


def migrate_schema(db: Database, target: int = SCHEMA_VERSION) -> tuple[int, int]:
    """Bring the schema to ``target``; (version before, version after)."""
    if not 0 < target <= SCHEMA_VERSION:
        raise ValueError(f"no schema version {target} (known: 1..{SCHEMA_VERSION})")
    with db.transaction() as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        exists = conn.execute("SELECT to_regclass('talon_meta') IS NOT NULL").fetchone()
        before = 0
        if exists and exists[0]:
            row = conn.execute("SELECT value FROM talon_meta WHERE key = 'schema_version'").fetchone()
            before = int(row[0]) if row else 0
        if before > SCHEMA_VERSION:
            raise ConfigError(f"the database has schema version {before}, newer than this Talon knows "
                              f"({SCHEMA_VERSION}): upgrade Talon on this worker", ["TALON_DATABASE_URL"])
        for version in range(before + 1, target + 1):
            conn.execute(MIGRATIONS[version - 1])
            conn.execute("INSERT INTO talon_meta (key, value) VALUES ('schema_version', %s) "
                         "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", (str(version),))
            log.info("database schema upgraded to version %d", version)
        db.count(3 + 2 * max(0, target - before))
        return before, max(before, target)
