"""A background job across a SIGKILL: `talon run` as a real process against the Bot API and OpenAI
fakes. A job whose sub-agent was working when Talon was killed is started again after the restart
and its answer reaches the chat once."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ALICE, TOKEN, settings_env
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.process import start_talon as start
from tests.support.process import stop_talon as stop
from tests.support.waiting import until_sync as wait_until


@pytest.fixture
def fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def is_child(body: dict[str, Any]) -> bool:
    return "You are a sub-agent" in str(body["messages"][0]["content"])


def test_a_job_cut_off_by_a_sigkill_is_run_again_and_answered_once(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    killed = threading.Event()

    async def held(body: dict[str, Any]) -> str:
        while not killed.is_set():  # the sub-agent's call is held until Talon is killed
            await asyncio.sleep(0.05)
        return "never read"

    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "Survey the archive.", "background": True})]), held)
    env = settings_env(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                       TALON_MODEL_DISCOVERY="false", TALON_TRANSCRIBER="off")
    proc, first = start(tmp_path, env, "first.log")
    try:
        tg.push_update(tg.text_message(ALICE, "survey the archive in the background", user_id=ALICE))
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "Started.", timeout=60)
        wait_until(lambda: len(llm.requests) >= 2 and is_child(llm.requests[1].json), 30, "the job's sub-agent")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    killed.set()
    llm.queue("The archive holds 7 boxes.")
    proc, second = start(tmp_path, env, "second.log")
    try:
        tg.wait_for_sync("sendMessage", lambda c: str(c.params.get("text")).startswith("Background job"),
                         timeout=60)
        tg.push_update(tg.text_message(ALICE, "/jobs", user_id=ALICE))
        tg.wait_for_sync("sendMessage", lambda c: str(c.params.get("text")).startswith("Finished"), timeout=30)
    finally:
        stop(proc)
    sent = [str(c.params.get("text")) for c in tg.sent("sendMessage", ALICE)]
    results = [t for t in sent if t.startswith("Background job")]
    assert len(results) == 1 and results[0].endswith("finished:\n\nThe archive holds 7 boxes."), sent
    assert "cut off by a restart" in second.read_text(), second.read_text()
    children = [r for r in llm.requests if is_child(r.json)]
    assert len(children) == 2 and all(r.json["messages"][1]["content"] == "Survey the archive." for r in children)
    assert any("· done" in t for t in sent if t.startswith("Finished")), sent
