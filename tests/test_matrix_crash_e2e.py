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
    from tests.test_cli_process import start_talon, stop_talon

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
