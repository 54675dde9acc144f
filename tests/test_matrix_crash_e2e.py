"""SIGKILL in the middle of a streamed Matrix answer, then a restart: `talon run` as a real
process against a real Synapse (tests/support/synapse.py). The answer ends up in the room once,
in the message that was being edited: nothing lost, nothing doubled."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.support.matrix_people import Person, final_texts, from_user
from tests.support.synapse import Synapse

ANSWER = " ".join(f"Sentence {i} of a long answer about the sea." for i in range(1, 31))
LAST = "Sentence 30 of a long answer about the sea."


@pytest.fixture
def llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def wait(condition: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)  # the poll interval of a condition wait on the homeserver
    return found


def test_a_worker_killed_mid_answer_loses_nothing_and_the_restart_edits_the_same_message(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    from tests.support.process import start_talon, stop_talon
    bot = synapse.register("bot")
    alice = Person(synapse.base_url, synapse.register("alice"))
    env = {
        "MATRIX_HOMESERVER": synapse.base_url, "MATRIX_USER_ID": bot.user_id, "MATRIX_ACCESS_TOKEN": bot.access_token,
        "TALON_MATRIX_ALLOWED_USERS": alice.id, "TALON_MATRIX_STREAM_INTERVAL": "0.3",
        "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key", "TALON_MODEL": "openai:fake-model",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_MODEL_MAX_RETRIES": "0", "TALON_ACK_DELAY": "0", "TALON_LOG_LEVEL": "INFO",
        "TALON_MODEL_DISCOVERY": "false", "TALON_SPEECH_WARMUP": "false",
    }
    llm.chunk_delay = 0.3
    llm.queue(ANSWER, ANSWER)
    try:
        proc, log = start_talon(tmp_path, env, "first.log")
        try:
            dm = alice.create_room([bot.user_id], direct=True)
            wait(lambda: bot.user_id in alice.members(dm), "the bot to join")
            alice.say(dm, "tell me about the sea")
            wait(lambda: sum(1 for e in from_user(alice.timeline(dm), bot.user_id)
                             if (e["content"].get("m.relates_to") or {}).get("rel_type") == "m.replace") >= 2,
                 "two edits of the live answer")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        [partial] = final_texts(alice.timeline(dm), bot.user_id)
        assert not partial.endswith(LAST), log.read_text()
        llm.chunk_delay = 0.01
        proc, log = start_talon(tmp_path, env, "second.log")
        try:
            wait(lambda: any(t.endswith(LAST) for t in final_texts(alice.timeline(dm), bot.user_id)),
                 "the whole answer")
        finally:
            stop_talon(proc)
        events = alice.timeline(dm)
    finally:
        alice.close()
    assert final_texts(events, bot.user_id) == [ANSWER], log.read_text()  # one message, edited to the end
    assert len(llm.requests) == 2  # the turn was taken up again after the restart


async def test_on_many_workers_one_syncs_and_the_next_goes_on_from_its_token_when_it_dies(
        synapse: Synapse, tmp_path: Path) -> None:
    import asyncio

    from channels.matrix import MatrixChannel
    from talon.config import Settings
    from talon.runtime import build_runtime
    from talon.storage.leases import MemoryLeases

    class DiesHolding(MemoryLeases):
        async def release(self, name: str) -> None:  # a killed worker never gets to release its lease
            return None

    bot = synapse.register("bot")
    alice = Person(synapse.base_url, synapse.register("alice"))
    async with FakeOpenAI() as llm:
        llm.queue("First.", "Second.")

        def settings(worker: str) -> Settings:
            return Settings(_env_file=None, MATRIX_HOMESERVER=synapse.base_url, MATRIX_USER_ID=bot.user_id,  # type: ignore[call-arg]
                            MATRIX_ACCESS_TOKEN=bot.access_token, TALON_MATRIX_ALLOWED_USERS=alice.id,
                            TALON_MATRIX_STREAMING=False, TALON_MATRIX_ACK_REACTION="",
                            OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="k", TALON_MODEL="openai:fake-model",
                            TALON_MODEL_MAX_RETRIES=0, TALON_ACK_DELAY=0, TALON_MODEL_DISCOVERY=False,
                            TALON_MEDIA_ROOT=str(tmp_path / worker / "media"),
                            TALON_DATA_DIR=str(tmp_path / worker / "data"))  # nothing shared on disk

        table: dict[str, tuple[str, float]] = {}
        first, second = MatrixChannel(settings("one")), MatrixChannel(settings("two"))
        first.share_updates(DiesHolding("worker-1", 1.0, table))
        second.share_updates(MemoryLeases("worker-2", 1.0, table))
        runtime1 = build_runtime(settings("one"), [first])
        runtime2 = build_runtime(settings("two"), [second])
        await runtime1.start()
        await runtime2.start()
        try:
            standing_by = second.health()
            dm = alice.create_room([bot.user_id], direct=True)
            await alice.wait_for(dm, lambda _: bot.user_id in alice.members(dm), what="the bot to join")
            alice.say(dm, "one")
            await alice.wait_for(dm, lambda ev: final_texts(ev, bot.user_id), what="the first answer")
            assert first._leading is not None  # noqa: SLF001
            first._leading.cancel()  # the syncing worker dies, holding its lease  # noqa: SLF001
            await asyncio.gather(first._leading, return_exceptions=True)  # noqa: SLF001
            alice.say(dm, "two")  # said while nobody syncs
            await alice.wait_for(dm, lambda ev: len(final_texts(ev, bot.user_id)) >= 2, what="the second answer")
            took_over = second.health()
            events = alice.timeline(dm)
        finally:
            await runtime2.stop()
            await runtime1.stop()
            alice.close()
    assert standing_by.ok and "standing by" in standing_by.detail
    assert final_texts(events, bot.user_id) == ["First.", "Second."]
    assert len(llm.requests) == 2  # "one" was not taken up again by the second worker
    # The token came from the homeserver (the second data dir holds no sync token; only the key
    # store it opened, unusable for a device whose keys are in the first one's: channels/matrix/crypto.py).
    assert took_over.ok and not list((tmp_path / "two" / "data" / "matrix").glob("sync-*"))
