"""Operating many workers: /status names the worker, GET /healthz follows the database, `talon
doctor` reports schema and leases, a worker without the shared media root refuses to start, and a
worker that lost a chat's lease stops serving it."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psycopg
import pytest

from talon.cli import main
from talon.config import Settings
from talon.errors import ConfigError
from talon.storage.postgres.schema import SCHEMA_VERSION
from talon.runtime import Runtime, build_runtime, configured_channels, shared_http_server
from talon.scaleout import SharedBridge
from talon.storage.factory import open_stores
from talon.storage.marker import MARKER
from tests.conftest import ALICE
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.telegram_webhook import post, to_alice, update, wh_settings
@contextlib.asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[Runtime]:
    http = shared_http_server(settings)
    stores = open_stores(settings)
    runtime = build_runtime(settings, configured_channels(settings, http, stores), http=http, stores=stores)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


async def healthz(runtime: Runtime) -> tuple[int, str]:
    assert runtime.http is not None
    async with aiohttp.ClientSession() as session:
        async with session.get(runtime.http.local_url + "/healthz") as resp:
            return resp.status, await resp.text()


def block_connections(server_url: str, url: str, allow: bool) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


async def test_status_names_the_worker_and_healthz_follows_the_database(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, pg_server: str, pg_url: str
) -> None:
    settings = wh_settings(tmp_path, tg, llm, TALON_DATABASE_URL=pg_url, TALON_WORKER_ID="worker-7")
    async with worker(settings) as runtime:
        assert isinstance(runtime.bridge, SharedBridge)
        [channel] = [c for c in runtime.channels if c.name == "telegram"]  # the panel adds its web chat
        assert await post(channel, update(tg, 1, tg.text_message(ALICE, "/status", user_id=ALICE))) == (200, "ok")  # type: ignore[arg-type]
        [reply] = await tg.wait_for("sendMessage", to_alice, timeout=10)
        assert "Worker: worker-7" in reply.params["text"]
        status, body = await healthz(runtime)
        assert status == 200, body
        assert "ok   database: reachable" in body and "ok   worker: worker-7" in body
        block_connections(pg_server, pg_url, allow=False)
        try:
            for _ in range(100):  # the database monitor notices within a probe or two
                status, body = await healthz(runtime)
                if status == 503:
                    break
                await asyncio.sleep(0.1)
            assert status == 503 and "FAIL database: unavailable" in body, body
        finally:
            block_connections(pg_server, pg_url, allow=True)
        for _ in range(50):  # the pool reconnects by itself
            status, body = await healthz(runtime)
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200, body


def doctor_rows(out: str) -> dict[str, str]:
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines() if "  " in line)


def test_doctor_reports_the_database(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    # Not a coroutine: `talon doctor` runs its own event loop, as on the command line.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TALON_DATABASE_URL", pg_url)
    monkeypatch.setenv("TALON_TRANSCRIBER", "off")
    assert main(["doctor"]) == 1  # no model is configured here; the database rows are what counts
    captured = capsys.readouterr()
    out = captured.out
    assert "problems with model" in captured.err and "database" not in captured.err
    assert doctor_rows(out)["database schema"] == f"version 0 of {SCHEMA_VERSION}: the next `talon run` upgrades it"
    async def a_worker() -> None:
        stores = open_stores(Settings(_env_file=None, TALON_DATABASE_URL=pg_url,  # type: ignore[call-arg]
                                      TALON_DATA_DIR=str(tmp_path / "d"), TALON_MEDIA_ROOT=str(tmp_path / "m")))
        await stores.start()
        try:
            assert stores.leases is not None and await stores.leases.acquire("chat:telegram:1")
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("INSERT INTO talon_leases VALUES ('chat:telegram:2', 'dead-worker', "
                             "now() - interval '1 s')")
        finally:
            await stores.aclose()

    asyncio.run(a_worker())
    assert main(["doctor"]) == 1  # still no model, and nothing wrong with the database
    rows = doctor_rows(capsys.readouterr().out)
    assert rows["database schema"] == f"ok: version {SCHEMA_VERSION}"
    assert rows["leases"] == "1 live, held by 1 worker(s); 1 expired and not yet taken over (a worker died or is stuck)"
    assert rows["inbox"] == "nothing pending"
    monkeypatch.setenv("TALON_DATABASE_URL", f"host={tmp_path} dbname=none")
    assert main(["doctor"]) == 1
    captured = capsys.readouterr()
    assert doctor_rows(captured.out)["database status"].startswith("UNREACHABLE: cannot reach the database")
    assert "database status" in captured.err  # named among the problems


async def test_worker_without_the_shared_media_root_refuses_to_start(tmp_path: Path, pg_url: str) -> None:
    first = Settings(_env_file=None, TALON_DATABASE_URL=pg_url, TALON_DATA_DIR=str(tmp_path / "nfs" / "data"),  # type: ignore[call-arg]
                     TALON_MEDIA_ROOT=str(tmp_path / "nfs" / "media_root"))

    async def start(settings: Settings) -> None:
        stores = open_stores(settings)
        try:
            await stores.start()
        finally:
            await stores.aclose()

    await start(first)
    assert (tmp_path / "nfs" / "media_root" / MARKER).is_file()
    await start(first)  # a second worker on the same share starts
    local = first.model_copy(update={"media_root": tmp_path / "local" / "media_root"})
    with pytest.raises(ConfigError) as err:
        await start(local)
    assert err.value.missing == ["TALON_MEDIA_ROOT"]
    assert "has no marker file (.talon-deployment)" in str(err.value)


async def test_a_worker_that_lost_a_chat_lease_stops_serving_it(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, pg_url: str
) -> None:
    settings = wh_settings(tmp_path, tg, llm, TALON_DATABASE_URL=pg_url, TALON_WORKER_ID="slow",
                           TALON_LEASE_SECONDS=1)
    llm.hang = True
    async with worker(settings) as runtime:
        [channel] = [c for c in runtime.channels if c.name == "telegram"]  # the panel adds its web chat
        bridge = runtime.bridge
        assert isinstance(bridge, SharedBridge)
        await post(channel, update(tg, 1, tg.text_message(ALICE, "take your time", user_id=ALICE)))  # type: ignore[arg-type]
        await llm.wait_for_requests(1)
        # Another worker took the chat over (as after this one stalled past its lease).
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE talon_leases SET holder = 'other', expires = now() + interval '1 min' "
                         "WHERE name = %s", (f"chat:telegram:{ALICE}",))
        for _ in range(60):
            if not bridge._workers:
                break
            await asyncio.sleep(0.05)
        assert not bridge._workers  # the turn was cancelled here: 'other' serves the chat now
        llm.release()
        await asyncio.sleep(0.3)
        assert not tg.sent("sendMessage")
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT status FROM talon_inbox").fetchone() == ("pending",)


async def test_talon_pair_approves_in_the_shared_database(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TALON_DATABASE_URL", pg_url)
    monkeypatch.setenv("TALON_PAIRING", "true")
    settings = Settings(_env_file=None, TALON_DATABASE_URL=pg_url, TALON_PAIRING=True,  # type: ignore[call-arg]
                        TALON_DATA_DIR=str(tmp_path / "d"), TALON_MEDIA_ROOT=str(tmp_path / "m"))
    stores = open_stores(settings)  # a worker
    await stores.start()
    try:
        pairing = await stores.gate.request_pairing("telegram", "4242", "Dana")
        assert pairing is not None
        # The owner, on any host with the same settings (a process with its own event loop).
        assert await asyncio.to_thread(main, ["pair"]) == 0
        assert pairing.code in capsys.readouterr().out
        assert await asyncio.to_thread(main, ["pair", pairing.code]) == 0
        assert "approved telegram:4242 (Dana)" in capsys.readouterr().out
        assert await stores.gate.allowed("telegram", ["4242"])  # at once, for the running worker
        assert not (tmp_path / "data" / "access.sqlite3").exists() and not (tmp_path / ".talon").exists()
    finally:
        await stores.aclose()


async def test_a_worker_cut_off_from_the_database_stops_serving_its_chats(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, pg_server: str, pg_url: str
) -> None:
    settings = wh_settings(tmp_path, tg, llm, TALON_DATABASE_URL=pg_url, TALON_WORKER_ID="cut-off",
                           TALON_LEASE_SECONDS=1)
    llm.hang = True
    async with worker(settings) as runtime:
        [channel] = [c for c in runtime.channels if c.name == "telegram"]  # the panel adds its web chat
        bridge = runtime.bridge
        await post(channel, update(tg, 1, tg.text_message(ALICE, "are you there", user_id=ALICE)))  # type: ignore[arg-type]
        await llm.wait_for_requests(1)
        assert bridge._workers
        block_connections(pg_server, pg_url, allow=False)
        try:
            for _ in range(100):
                if not bridge._workers:
                    break
                await asyncio.sleep(0.05)
            # Its lease may be another worker's by now: the turn here was given up.
            assert not bridge._workers
            assert not tg.sent("sendMessage")
        finally:
            block_connections(pg_server, pg_url, allow=True)
        llm.hang = False
        llm.release()
        # The database is back: the message, still pending, is answered, once.
        [reply] = await tg.wait_for("sendMessage", to_alice, timeout=20)
        assert reply.params["text"] == "echo: are you there"
        await asyncio.sleep(0.5)
        assert len(tg.sent("sendMessage")) == 1


async def test_chats_taken_while_a_renewal_runs_are_not_given_up(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    users = [7100 + i for i in range(12)]
    settings = wh_settings(tmp_path, tg, llm, TALON_DATABASE_URL=pg_url, TALON_WORKER_ID="busy",
                           TALON_LEASE_SECONDS=3, TALON_TELEGRAM_ALLOWED_USERS=",".join(map(str, users)))
    # Every turn spans several renewals. The lease is long enough that a busy machine's loop lag
    # cannot expire it; what is tested is the race between a renewal and chats taken meanwhile.
    llm.delay = 3.0
    async with worker(settings) as runtime:
        [channel] = [c for c in runtime.channels if c.name == "telegram"]  # the panel adds its web chat
        bridge = runtime.bridge
        assert isinstance(bridge, SharedBridge)
        leases = bridge._leases
        real = leases.renew

        async def slow_renew(names: list[str]) -> set[str]:
            held = await real(names)
            await asyncio.sleep(0.25)  # the answer is late: chats are taken meanwhile
            return held

        leases.renew = slow_renew  # type: ignore[method-assign]
        for n, user in enumerate(users):
            await post(channel, update(tg, n + 1, tg.text_message(user, f"hi {user}", user_id=user)))  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
        for user in users:
            await tg.wait_for("sendMessage", lambda c, u=user: str(c.params.get("chat_id")) == str(u), timeout=20)
    assert "lost the lease" not in caplog.text
    assert sorted(int(c.params["chat_id"]) for c in tg.sent("sendMessage")) == users
