"""A worker keeps answering when its stores do not: PostgreSQL stopped (SIGSTOP on the server and
its backends) during a burst of webhook updates, and an embedded store on a slow disk. /healthz
answers within 0.5 s throughout (a correctness bound: a request that takes longer counts as not
answered), webhooks get 503 while nothing can be stored, and afterwards every message is answered
once and in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import psutil
import psycopg

from talon.config import Settings
from talon.runtime import Runtime, build_runtime, configured_channels, shared_http_server
from talon.storage.embedded.inbox import SqliteInbox
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.factory import open_stores
from tests.conftest import ALICE, BOB
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.telegram_webhook import PATH, SECRET, wh_settings
from tests.support.waiting import until as wait_for

T = TypeVar("T")
HEALTH_BOUND_S = 0.5


@contextlib.asynccontextmanager
async def worker(settings: Settings, prepare: Callable[[Any], None] = lambda stores: None) -> AsyncIterator[Runtime]:
    http = shared_http_server(settings)
    stores = open_stores(settings)
    prepare(stores)
    runtime = build_runtime(settings, configured_channels(settings, http, stores), http=http, stores=stores)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


class HealthProbe:
    """Asks /healthz every 50 ms, each request bounded by HEALTH_BOUND_S."""

    def __init__(self, url: str) -> None:
        self.url = url + "/healthz"
        self.answers: list[tuple[float, int | None, str]] = []  # (seconds, status or None, body)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                started = time.monotonic()
                try:
                    async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=HEALTH_BOUND_S)) as resp:
                        body = await resp.text()
                        self.answers.append((time.monotonic() - started, resp.status, body))
                except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                    self.answers.append((time.monotonic() - started, None, repr(exc)))
                await asyncio.sleep(0.05)

    def __enter__(self) -> "HealthProbe":
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def unanswered(self) -> list[tuple[float, int | None, str]]:
        return [a for a in self.answers if a[1] is None]


async def post_until_taken(url: str, update: dict[str, Any], statuses: list[int], deadline_s: float = 60) -> None:
    """Post one update as Telegram does: again after a pause until it is answered 200."""
    deadline = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.post(url + PATH, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
                                        timeout=aiohttp.ClientTimeout(total=20)) as resp:
                    statuses.append(resp.status)
                    if resp.status == 200:
                        return
                    assert resp.status == 503, (resp.status, await resp.text())
            except asyncio.TimeoutError:
                statuses.append(0)
            assert time.monotonic() < deadline, f"update {update['update_id']} was never taken"
            await asyncio.sleep(0.2)


def replies_to(tg: FakeTelegram, chat: int) -> list[str]:
    return [c.params["text"] for c in tg.sent("sendMessage") if str(c.params.get("chat_id")) == str(chat)]


def server_processes(pg_url: str) -> list[psutil.Process]:
    """The PostgreSQL postmaster serving ``pg_url`` and every process it started (its backends,
    the checkpointer, the WAL writer...)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    postmaster = int((Path(str(row[0])) / "postmaster.pid").read_text().splitlines()[0])
    main = psutil.Process(postmaster)
    return [main, *main.children(recursive=True)]


def signal_all(processes: list[psutil.Process], sig: int) -> None:
    # A backend that was exiting when the server was stopped is a zombie until the postmaster,
    # continued first, reaps it: by the time its turn comes it may be gone (ProcessLookupError).
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)


async def test_postgres_stopped_during_a_burst_of_webhooks(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI,
                                                           pg_url: str) -> None:
    settings = wh_settings(tmp_path, tg, llm, TALON_DATABASE_URL=pg_url, TALON_WORKER_ID="steady",
                           TALON_TELEGRAM_ALLOWED_USERS=f"{ALICE},{BOB}")
    async with worker(settings) as runtime:
        assert runtime.http is not None
        url = runtime.http.local_url
        statuses: list[int] = []
        await post_until_taken(url, {"update_id": 1, **tg.text_message(ALICE, "before", user_id=ALICE)}, statuses)
        await wait_for(lambda: replies_to(tg, ALICE), 20, "the first message was not answered")
        burst = [(ALICE if n % 2 else BOB, f"m{n}") for n in range(8)]
        with HealthProbe(url) as probe:
            stopped = server_processes(pg_url)
            assert len(stopped) > 3  # the postmaster and at least its backends and helpers
            signal_all(stopped, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                # Telegram sends the updates in order, each again until it is taken.
                async def send_burst() -> None:
                    for n, (user, text) in enumerate(burst):
                        message = tg.text_message(user, text, user_id=user)
                        await post_until_taken(url, {"update_id": 10 + n, **message}, statuses)
                        await asyncio.sleep(0.1)

                sending = asyncio.create_task(send_burst())
                await asyncio.sleep(5.0)
                during = list(probe.answers)
            finally:
                signal_all(stopped, signal.SIGCONT)
            resumed_at = time.monotonic()
            await asyncio.wait_for(sending, 60)
            for user in (ALICE, BOB):
                texts = [t for u, t in burst if u == user]
                await wait_for(lambda u=user, n=len(texts): len(replies_to(tg, u)) >= n + (u == ALICE),
                               60, f"not every message of {user} was answered")
            await wait_for(lambda: probe.answers and probe.answers[-1][1] == 200, 20, "/healthz never recovered")
            await asyncio.sleep(1.0)  # a reply sent twice would show up now
        assert resumed_at - stopped_at >= 5.0
        assert not probe.unanswered(), probe.unanswered()[:3]
        assert max(seconds for seconds, _, _ in probe.answers) < HEALTH_BOUND_S
        failing = [body for _, status, body in during if status == 503]
        assert failing and all("FAIL database: unavailable" in body for body in failing), during[-3:]
        assert 503 in statuses  # webhooks were refused while nothing could be stored, then retried
        assert replies_to(tg, ALICE) == ["echo: before", *[f"echo: {t}" for u, t in burst if u == ALICE]]
        assert replies_to(tg, BOB) == [f"echo: {t}" for u, t in burst if u == BOB]


async def test_embedded_stores_on_a_slow_disk_keep_healthz_at_once(tmp_path: Path, tg: FakeTelegram,
                                                                   llm: FakeOpenAI) -> None:
    """Every write of the inbox and the session log takes 200 ms (a slow or busy disk)."""
    slow_writes: list[float] = []

    def slow_down(stores: Any) -> None:
        inbox, sessions = stores.inbox, stores.sessions
        assert isinstance(inbox, SqliteInbox) and isinstance(sessions, JsonlSessions)
        runner = inbox.db
        real_run = runner.run

        async def slow_run(fn: Callable[[sqlite3.Connection], T]) -> T:
            def slow(conn: sqlite3.Connection) -> T:
                time.sleep(0.2)  # on the database's own thread, as a slow fsync would
                slow_writes.append(time.monotonic())
                return fn(conn)

            return await real_run(slow)

        runner.run = slow_run  # type: ignore[method-assign]
        real_append = sessions._append

        def slow_append(*args: Any) -> None:  # whatever the store passes on
            time.sleep(0.2)
            slow_writes.append(time.monotonic())
            real_append(*args)

        sessions._append = slow_append  # type: ignore[method-assign]

    settings = wh_settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_USERS=f"{ALICE},{BOB}")
    async with worker(settings, slow_down) as runtime:
        assert runtime.http is not None
        url = runtime.http.local_url
        statuses: list[int] = []
        with HealthProbe(url) as probe:
            for n in range(4):
                user = ALICE if n % 2 else BOB
                await post_until_taken(url, {"update_id": n + 1, **tg.text_message(user, f"s{n}", user_id=user)},
                                       statuses)
            await wait_for(lambda: len(replies_to(tg, ALICE)) == 2 and len(replies_to(tg, BOB)) == 2, 60,
                           "not every message was answered")
        assert len(slow_writes) >= 12  # each message: stored, attempted, logged, marked done
        assert not probe.unanswered(), probe.unanswered()[:3]
        assert len(probe.answers) > 10 and all(status == 200 for _, status, _ in probe.answers)
        assert max(seconds for seconds, _, _ in probe.answers) < HEALTH_BOUND_S
        assert statuses == [200] * 4
        assert replies_to(tg, ALICE) == ["echo: s1", "echo: s3"] and replies_to(tg, BOB) == ["echo: s0", "echo: s2"]
