"""An async PostgreSQL pool whose every wait is bounded.

psycopg 3's ``AsyncConnectionPool`` keeps the event loop free while the database works. A database
that hangs (its process stopped, a lock held, the network gone) must not hang the worker either:
getting a connection waits at most ``timeout_s`` and every statement at most ``statement_s``; past
that the call raises ``StoreUnavailable`` and the caller answers "later" (a webhook 503, a turn that
waits), never drops what it holds. A connection abandoned mid-statement is discarded by the pool.

``round_trips`` counts statements sent, for the round-trip benchmark.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from talon.errors import ConfigError, StoreUnavailable

log = logging.getLogger(__name__)


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


class AsyncDatabase:
    """A pool of autocommit connections to ``url``. Create it, then ``await open()``."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, timeout_s: float = 5.0,
                 statement_s: float = 10.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.statement_s = statement_s
        self.round_trips = 0
        self.pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout_s,
                                        kwargs={"autocommit": True}, open=False, name="talon-async")

    async def open(self) -> None:
        """Connect; a database that cannot be used is a ``ConfigError`` with the server's own
        first error (one direct attempt, so "database does not exist" is said at once instead of
        after the pool's retries)."""
        try:
            conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(self.url, autocommit=True),
                                          self.timeout_s)
            await conn.close()
        except (OSError, psycopg.Error, TimeoutError) as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else "no answer in time"
            raise ConfigError(f"TALON_DATABASE_URL={redact(self.url)}: {why}", []) from None
        await self.pool.open(wait=True, timeout=self.timeout_s)

    def count(self, n: int = 1) -> None:
        """Account for ``n`` statements sent on a connection from ``transaction()``."""
        self.round_trips += n

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            async with self.pool.connection(timeout=self.timeout_s) as conn:
                yield conn
        except PoolTimeout:
            raise StoreUnavailable(f"the database gave no connection within {self.timeout_s:g}s") from None
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the database refused: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}") from None

    async def _bounded(self, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self.statement_s)
        except TimeoutError:
            raise StoreUnavailable(f"the database did not answer within {self.statement_s:g}s") from None

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it touched."""
        self.count()
        async with self.connection() as conn:
            cur = await self._bounded(conn.execute(sql, params))
            return int(cur.rowcount)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self.count()
        async with self.connection() as conn:

            async def go() -> tuple[Any, ...] | None:
                cur = await conn.execute(sql, params)
                return await cur.fetchone()

            return await self._bounded(go())

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.count()
        async with self.connection() as conn:

            async def go() -> list[tuple[Any, ...]]:
                cur = await conn.execute(sql, params)
                return await cur.fetchall()

            return await self._bounded(go())

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection inside one transaction, committed on success. Statements on it are not
        bounded one by one: bound the whole block with ``bounded()`` where it matters, and count
        its statements with ``count``."""
        async with self.connection() as conn:
            async with conn.transaction():
                yield conn

    async def bounded(self, coro: Any) -> Any:
        """Await ``coro`` for at most the statement limit, else ``StoreUnavailable``."""
        return await self._bounded(coro)

    async def ping(self, timeout_s: float = 2.0) -> str | None:
        """None when the database answers within ``timeout_s``, else what went wrong."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self.pool.connection(timeout=timeout_s) as conn:
                    await conn.execute("SELECT 1")
        except TimeoutError:
            return f"no answer within {timeout_s:g}s"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    async def close(self) -> None:
        await self.pool.close(timeout=self.timeout_s)
