"""Discord's gateway lease and Matrix's sync lease on a real PostgreSQL (tests/pg.py), with two
`talon run` workers as real processes (issue 32, part 1): one holds the connection, the other
stands by; when the holder is killed (SIGKILL: its lease is never released, it expires) the other
takes over; every message is answered exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fakes.discord import TOKEN, FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.scaleout_helpers import Cluster
from tests.support.matrix_people import Person, final_texts
from tests.support.synapse import Synapse

LEASE_S = "5"  # TALON_LEASE_SECONDS: how long a dead holder keeps the lease


def wait(condition: Callable[[], Any], what: str, timeout: float = 90.0, logs: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.1)  # the poll interval of a condition wait on other processes
    return found


def lease_holder(pg_url: str, name: str) -> str | None:
    with psycopg.connect(pg_url) as conn:
        if conn.execute("SELECT to_regclass('talon_leases')").fetchone() == (None,):
            return None  # the first worker has not made the schema yet
        row = conn.execute("SELECT holder FROM talon_leases WHERE name = %s AND expires > now()", (name,)).fetchone()
    return None if row is None else str(row[0])


@pytest.fixture
def llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


ALICE, DM = 600, 503


def test_discord_two_workers_on_postgres_one_gateway_taken_over_when_its_holder_is_killed(
        tmp_path: Path, pg_url: str, llm: FakeOpenAI) -> None:
    llm.queue("First answer.", "Second answer.")
    with FakeDiscord() as fake:
        fake.add_user(ALICE, "alice")
        fake.add_channel(DM, "", recipient=ALICE)
        env = {
            "DISCORD_BOT_TOKEN": TOKEN, "DISCORD_API_BASE_URL": fake.api_url, "TALON_DATABASE_URL": pg_url,
            "TALON_LEASE_SECONDS": LEASE_S, "TALON_MEDIA_ROOT": str(tmp_path / "shared-media"),
            "TALON_DATA_DIR": str(tmp_path / "shared-data"), "TALON_TRANSCRIBER": "off", "TALON_VOICE_REPLIES": "off",
            "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key",
            "TALON_MODEL": "openai:fake-model", "TALON_MODEL_MAX_RETRIES": "0", "TALON_ACK_DELAY": "0",
            "TALON_DISCORD_STREAMING": "false", "TALON_DISCORD_ACK_REACTION": "", "TALON_MODEL_DISCOVERY": "false",
            "TALON_DISCORD_ALLOWED_USERS": str(ALICE), "TALON_LOG_LEVEL": "INFO", "TALON_SPEECH_WARMUP": "false",
        }
        cluster = Cluster(tmp_path, env)

        def logs() -> str:
            return "\n".join(f"--- {w.name}\n{w.log_text()[-3000:]}" for w in cluster.workers) + fake.summary()

        def live() -> int:
            return sum(1 for s in fake._sockets if s.identified and not s.ws.closed)  # noqa: SLF001

        try:
            one = cluster.start("worker-1")
            wait(fake.connected, "worker-1's gateway connection", logs=logs)
            two = cluster.start("worker-2")
            wait(lambda: "worker-2 stands by" in two.log_text(), "worker-2 standing by", logs=logs)
            assert lease_holder(pg_url, "discord:gateway") == "worker-1"
            fake.dispatch_sync("MESSAGE_CREATE", fake.message_create(DM, ALICE, "one"))
            wait(lambda: fake.texts(DM), "the first answer", logs=logs)
            assert live() == 1, logs()  # worker-2 holds no connection: every event reached one worker
            cluster.kill(one)
            wait(lambda: lease_holder(pg_url, "discord:gateway") == "worker-2", "worker-2 to take the lease",
                 logs=logs)
            wait(lambda: live() == 1, "worker-2's gateway connection", logs=logs)
            fake.dispatch_sync("MESSAGE_CREATE", fake.message_create(DM, ALICE, "two"))
            wait(lambda: len(fake.texts(DM)) >= 2, "the second answer", logs=logs)
            assert "took the lease" in two.log_text()
        finally:
            codes = cluster.stop_all()
        assert fake.texts(DM) == ["First answer.", "Second answer."], logs()  # each once
        assert len(llm.requests) == 2
        assert all(c in (0, -9) for c in codes), logs()


def test_matrix_two_workers_on_postgres_one_sync_taken_over_when_its_holder_is_killed(
        synapse: Synapse, tmp_path: Path, pg_url: str, llm: FakeOpenAI) -> None:
    bot = synapse.register("bot")
    alice = Person(synapse.base_url, synapse.register("alice"))
    lease = f"matrix:sync:{bot.user_id}"
    llm.queue("First.", "Second.")
    env = {
        "MATRIX_HOMESERVER": synapse.base_url, "MATRIX_USER_ID": bot.user_id, "MATRIX_ACCESS_TOKEN": bot.access_token,
        "TALON_MATRIX_ALLOWED_USERS": alice.id, "TALON_MATRIX_STREAMING": "false", "TALON_MATRIX_ACK_REACTION": "",
        "TALON_DATABASE_URL": pg_url, "TALON_LEASE_SECONDS": LEASE_S, "TALON_MEDIA_ROOT": str(tmp_path / "shared-media"),
            "TALON_DATA_DIR": str(tmp_path / "shared-data"), "TALON_TRANSCRIBER": "off", "TALON_VOICE_REPLIES": "off",
        "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key", "TALON_MODEL": "openai:fake-model",
        "TALON_MODEL_MAX_RETRIES": "0", "TALON_ACK_DELAY": "0", "TALON_LOG_LEVEL": "INFO",
        "TALON_MODEL_DISCOVERY": "false", "TALON_SPEECH_WARMUP": "false",
    }
    cluster = Cluster(tmp_path, env)

    def logs() -> str:
        return "\n".join(f"--- {w.name}\n{w.log_text()[-3000:]}" for w in cluster.workers)

    try:
        one = cluster.start("worker-1")
        wait(lambda: lease_holder(pg_url, lease) == "worker-1", "worker-1 to hold the sync lease", logs=logs)
        two = cluster.start("worker-2")
        wait(lambda: "worker-2 stands by" in two.log_text(), "worker-2 standing by", logs=logs)
        dm = alice.create_room([bot.user_id], direct=True)
        wait(lambda: bot.user_id in alice.members(dm), "the bot to join", logs=logs)
        alice.say(dm, "one")
        wait(lambda: final_texts(alice.timeline(dm), bot.user_id), "the first answer", logs=logs)
        assert lease_holder(pg_url, lease) == "worker-1" and "took the lease" not in two.log_text()
        cluster.kill(one)
        alice.say(dm, "two")  # said while nobody syncs
        wait(lambda: len(final_texts(alice.timeline(dm), bot.user_id)) >= 2, "the second answer", logs=logs)
        assert lease_holder(pg_url, lease) == "worker-2"
        events = alice.timeline(dm)
    finally:
        codes = cluster.stop_all()
        alice.close()
    assert final_texts(events, bot.user_id) == ["First.", "Second."], logs()  # each once, in order
    assert len(llm.requests) == 2  # "one" was not answered again by the worker that took over
    assert all(c in (0, -9) for c in codes), logs()
