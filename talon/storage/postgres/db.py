"""An async PostgreSQL pool whose every wait is bounded.

psycopg 3's ``AsyncConnectionPool`` keeps the event loop free while the database works. A database
that hangs (its process stopped, a lock held, the network gone) must not hang the worker either:
getting a connection waits at most ``timeout_s`` and every statement at most ``statement_s``; past
that the call raises ``StoreUnavailable`` and the caller answers "later" (a webhook 503, a turn that
waits), never drops what it holds. A connection abandoned mid-statement is discarded by the pool.

A caller never waits for psycopg to give up: a call is a task of its own, and past its limit the
caller gets ``StoreUnavailable`` at once while the task is cancelled in the background (psycopg then
tries to cancel the query on the server, which itself can hang while the server does).

A monitor (``start_monitor``) asks the database ``SELECT 1`` on a connection of its own every
``probe_interval_s``; when no answer comes within ``probe_s`` the database is marked unavailable:
``problem`` says why (``/healthz`` reports it without waiting), calls in flight give up at once, and
new calls fail fast until a probe is answered again.

``round_trips`` counts statements sent, for the round-trip benchmark.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from talon.errors import ConfigError, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


# Refusals that a moment's wait can cure: worth waiting for, like a server that is not up yet.
_TRANSIENT = ("the database system is starting up", "the database system is shutting down",
              "the database system is in recovery mode", "too many clients")


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n", 1)[0].split())
    return text.removeprefix("connection failed: ").removeprefix("connection is bad: ")


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
                 statement_s: float = 10.0, probe_s: float = 2.0, probe_interval_s: float = 0.5) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.statement_s = statement_s
        self.probe_s = probe_s
        self.probe_interval_s = probe_interval_s
        self.round_trips = 0
        # The loop the pool lives on (set by ``open``): code on worker threads hands it work.
        self.loop: asyncio.AbstractEventLoop | None = None
        # Why the database is unavailable (None: it answers), and since when (monotonic).
        self.problem: str | None = None
        self.down_since = 0.0
        # Resolved when the monitor finds the database gone: calls in flight stop waiting.
        self._outage: asyncio.Future[None] | None = None
        self._abandoned: set[asyncio.Task[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._probe_conn: psycopg.AsyncConnection[Any] | None = None
        self.pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout_s,
                                        kwargs={"autocommit": True}, open=False, name="talon-async")
        # Coordination (lease renewal, the scan for waiting chats) has connections of its own: a
        # renewal queued behind a busy pool would let the leases expire while all is well.
        self.lane = AsyncConnectionPool(url, min_size=1, max_size=2, timeout=timeout_s,
                                        kwargs={"autocommit": True}, open=False, name="talon-lane")

    async def open(self) -> None:
        """Connect. A server that refuses us (the database does not exist, a wrong password or
        role) is a ``ConfigError`` at once, in the server's own words, instead of the pool's
        "initialization incomplete" after its whole timeout; a server that cannot be reached yet
        (booting, starting up) is waited for up to ``timeout_s``, then named with the last error."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.2
        while True:
            left = max(0.5, deadline - time.monotonic())
            try:
                conn = await asyncio.wait_for(
                    psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=max(2, round(left))),
                    left)
                await conn.close()
                break
            except (OSError, psycopg.Error, TimeoutError) as exc:
                first = _first_line(exc) or "no answer in time"
                refused = first.split("FATAL:", 1)[1].strip() if "FATAL:" in first else None
                if refused is not None and not any(t in refused for t in _TRANSIENT):
                    raise ConfigError(f"TALON_DATABASE_URL={redact(self.url)}: the database server refused "
                                      f"the connection: {refused}", ["TALON_DATABASE_URL"]) from None
                if time.monotonic() + delay >= deadline:
                    raise ConfigError(f"cannot reach the database TALON_DATABASE_URL={redact(self.url)} within "
                                      f"{self.timeout_s:g}s: {first}", ["TALON_DATABASE_URL"]) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        await self.pool.open(wait=True, timeout=self.timeout_s)
        await self.lane.open(wait=True, timeout=self.timeout_s)
        self.loop = asyncio.get_running_loop()

    def count(self, n: int = 1) -> None:
        """Account for ``n`` statements sent on a connection from ``transaction()``."""
        self.round_trips += n

    # --- bounded calls ----------------------------------------------------------------------
    def _abandon(self, task: "asyncio.Task[Any]") -> None:
        """Let ``task`` finish being cancelled on its own; its outcome is dropped."""
        task.cancel()
        self._abandoned.add(task)

        def done(t: "asyncio.Task[Any]") -> None:
            self._abandoned.discard(t)
            if not t.cancelled():
                t.exception()  # retrieved: an abandoned call's error is not news

        task.add_done_callback(done)

    async def _call(self, make: Callable[[], Awaitable[T]], limit: float) -> T:
        if self.problem is not None:
            raise StoreUnavailable(f"the database is unavailable ({self.problem})")
        task: asyncio.Task[T] = asyncio.ensure_future(make())
        waits: set[asyncio.Future[Any]] = {task}
        if self._outage is not None:
            waits.add(self._outage)
        try:
            await asyncio.wait(waits, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._abandon(task)  # the caller was cancelled: it does not wait for psycopg either
            raise
        if task.done():
            return task.result()
        self._abandon(task)
        if self.problem is not None:
            raise StoreUnavailable(f"the database stopped answering ({self.problem})")
        raise StoreUnavailable(f"the database did not answer within {limit:g}s")

    async def bounded(self, coro: Awaitable[T]) -> T:
        """Await ``coro`` (work on a connection of the pool) for at most the statement limit,
        else ``StoreUnavailable``. A call refused before it starts (the database is known to be
        down) closes ``coro`` unstarted, so it is not left to be reported as never awaited."""
        started = False

        def start() -> Awaitable[T]:
            nonlocal started
            started = True
            return coro

        try:
            return await self._call(start, self.statement_s)
        finally:
            if not started and inspect.iscoroutine(coro):
                coro.close()

    @asynccontextmanager
    async def connection(self, *, urgent: bool = False) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the pool (``urgent``: of the coordination lane)."""
        try:
            async with (self.lane if urgent else self.pool).connection(timeout=self.timeout_s) as conn:
                yield conn
        except PoolTimeout:
            raise StoreUnavailable(f"the database gave no connection within {self.timeout_s:g}s") from None
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the database refused: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}") from None

    async def _statement(self, sql: str, params: Sequence[Any], fetch: str, urgent: bool) -> Any:
        self.count()

        async def go() -> Any:
            async with self.connection(urgent=urgent) as conn:
                cur = await conn.execute(sql, params)
                if fetch == "one":
                    return await cur.fetchone()
                if fetch == "all":
                    return await cur.fetchall()
                return int(cur.rowcount)

        return await self._call(go, self.statement_s)

    async def execute(self, sql: str, params: Sequence[Any] = (), *, urgent: bool = False) -> int:
        """Run one statement; the number of rows it touched. ``urgent``: on the coordination lane."""
        result: int = await self._statement(sql, params, "", urgent)
        return result

    async def fetchone(self, sql: str, params: Sequence[Any] = (), *,
                       urgent: bool = False) -> tuple[Any, ...] | None:
        result: tuple[Any, ...] | None = await self._statement(sql, params, "one", urgent)
        return result

    async def fetchall(self, sql: str, params: Sequence[Any] = (), *,
                       urgent: bool = False) -> list[tuple[Any, ...]]:
        result: list[tuple[Any, ...]] = await self._statement(sql, params, "all", urgent)
        return result

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection inside one transaction, committed on success. Statements on it are not
        bounded one by one: run the whole block through ``bounded()`` where it matters, and count
        its statements with ``count``."""
        async with self.connection() as conn:
            async with conn.transaction():
                yield conn

    # --- health ---------------------------------------------------------------------------
    async def ping(self, timeout_s: float = 2.0) -> str | None:
        """None when the database answers within ``timeout_s`` on a pooled connection, else what
        went wrong."""
        async def go() -> None:
            async with self.pool.connection(timeout=timeout_s) as conn:
                await conn.execute("SELECT 1")

        task = asyncio.ensure_future(go())
        await asyncio.wait({task}, timeout=timeout_s)
        if not task.done():
            self._abandon(task)
            return f"no answer within {timeout_s:g}s"
        exc = task.exception()
        return None if exc is None else f"{type(exc).__name__}: {exc}"

    def start_monitor(self) -> None:
        """Watch the database from now on (``problem``); stopped by ``close``."""
        if self._monitor is None:
            self._monitor = asyncio.create_task(self._watch(), name="talon-database-monitor")

    async def _probe(self) -> str | None:
        async def go() -> None:
            if self._probe_conn is None or self._probe_conn.closed:
                self._probe_conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            await self._probe_conn.execute("SELECT 1")

        task = asyncio.ensure_future(go())
        await asyncio.wait({task}, timeout=self.probe_s)
        if task.done() and task.exception() is None:
            return None
        if not task.done():
            self._abandon(task)
            problem = f"no answer within {self.probe_s:g}s"
        else:
            exc = task.exception()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            problem = f"refused: {first}"
        conn, self._probe_conn = self._probe_conn, None
        if conn is not None:  # a new connection next time; this one may be stuck
            closing = asyncio.ensure_future(conn.close())
            self._abandoned.add(closing)
            closing.add_done_callback(self._abandoned.discard)
        return problem

    async def _watch(self) -> None:
        while True:
            problem = await self._probe()
            if problem is None and self.problem is not None:
                log.warning("the database answers again (it was unavailable for %.1fs)",
                            time.monotonic() - self.down_since)
                self.problem = None
                self._outage = None
            elif problem is not None and self.problem is None:
                log.error("the database is unavailable: %s; webhooks answer 503 and turns wait", problem)
                self.problem = problem
                self.down_since = time.monotonic()
                outage, self._outage = self._outage, None
                if outage is not None and not outage.done():
                    outage.set_result(None)
            if self.problem is None and self._outage is None:
                self._outage = asyncio.get_running_loop().create_future()
            await asyncio.sleep(self.probe_interval_s)

    async def wait_available(self) -> None:
        """Return once the database answers again (at once when it does)."""
        while self.problem is not None:
            await asyncio.sleep(self.probe_interval_s / 2)

    async def close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
            self._monitor = None
        if self._probe_conn is not None:
            conn, self._probe_conn = self._probe_conn, None
            await asyncio.wait({asyncio.ensure_future(conn.close())}, timeout=1.0)
        for task in list(self._abandoned):
            task.cancel()
        await self.lane.close(timeout=self.timeout_s)
        await self.pool.close(timeout=self.timeout_s)
