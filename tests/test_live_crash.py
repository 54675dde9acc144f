"""SIGKILL in the middle of a streamed answer, then a restart: `talon run` as a real process
against the loopback fakes. The answer ends up in the chat exactly once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ALICE, TOKEN, settings_env
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.process import start_talon, stop_talon
from tests.support.telegram import to_chat
GROUP = -1001234567890
ANSWER = " ".join(f"Sentence {i} of a long answer about the sea." for i in range(1, 31))
LAST = "Sentence 30 of a long answer about the sea."


@pytest.fixture
def fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def env_for(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> dict[str, str]:
    return settings_env(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                        TALON_TELEGRAM_STREAM_INTERVAL="0.3", TALON_MODEL_DISCOVERY="false")


def killed_mid_stream(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, update: dict, method: str) -> None:
    """Start Talon, send ``update``, SIGKILL it once ``method`` (a live update) has arrived."""
    llm.chunk_delay = 0.3  # ~35 chunks: about 10 s for the whole answer
    llm.queue(ANSWER, ANSWER)  # the same answer is written again after the restart
    proc, log = start_talon(tmp_path, env_for(tmp_path, tg, llm), "first.log")
    try:
        tg.push_update(update)
        tg.wait_for_sync(method, count=2, timeout=30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert llm.requests[0].end is None or llm.requests[0].status != 200, log.read_text()  # cut mid-stream
    llm.chunk_delay = 0.01


def test_sigkill_mid_stream_in_a_group_then_restart_edits_the_same_message(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    update = tg.text_message(GROUP, "@talon_test_bot tell me about the sea", user_id=ALICE,
                             chat_type="supergroup")
    killed_mid_stream(tmp_path, tg, llm, update, "editMessageText")
    [streamed] = tg.sent("sendMessage", GROUP)
    proc, log = start_talon(tmp_path, env_for(tmp_path, tg, llm), "second.log")
    try:
        tg.wait_for_sync("editMessageText", lambda c: str(c.params.get("text", "")).endswith(LAST),
                         timeout=30)
    finally:
        stop_talon(proc)
    mid = streamed.result["message_id"]
    assert len(tg.sent("sendMessage", GROUP)) == 1, tg.summary()  # no second copy
    assert {e.params["message_id"] for e in tg.sent("editMessageText", GROUP)} == {mid}
    assert tg.messages[(GROUP, mid)]["text"] == ANSWER, log.read_text()


def test_sigkill_mid_draft_then_restart_sends_the_answer_once(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    killed_mid_stream(tmp_path, tg, llm, tg.text_message(ALICE, "tell me about the sea", user_id=ALICE),
                      "sendMessageDraft")
    assert not tg.sent("sendMessage", ALICE)
    proc, log = start_talon(tmp_path, env_for(tmp_path, tg, llm), "second.log")
    try:
        [final] = tg.wait_for_sync("sendMessage", to_chat(ALICE), timeout=30)
        tg.push_update(tg.text_message(ALICE, "thanks", user_id=ALICE))
        tg.wait_for_sync("sendMessage", to_chat(ALICE), count=2, timeout=30)
    finally:
        stop_talon(proc)
    texts = [c.params["text"] for c in tg.sent("sendMessage", ALICE)]
    assert texts[0] == ANSWER and len(texts) == 2, log.read_text()
    assert final.params["text"] == ANSWER
