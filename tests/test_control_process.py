"""Approvals across a restart and on the console: `talon run` / `talon chat` as real processes
against the loopback fakes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ALICE, TOKEN, settings_env
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import Call, FakeTelegram
from tests.support.process import start_talon, stop_talon
@pytest.fixture
def fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def has_keyboard(call: Call) -> bool:
    return bool(call.params.get("reply_markup"))


def tool_results(body: dict) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m.get("role") == "tool"]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_an_approval_survives_a_restart_and_the_press_afterwards_decides_it(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI], how: signal.Signals) -> None:
    tg, llm = fakes
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo kept > kept.txt && echo ran-after-restart"}),
              "Ran it after the restart.")
    env = settings_env(tmp_path, tg.base_url, llm.base_url, TALON_SHELL_TOOL="true", TALON_SHELL_UNSANDBOXED="true",
                       TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false")
    proc, first_log = start_talon(tmp_path, env, "first.log")
    try:
        tg.push_update(tg.text_message(ALICE, "keep this", user_id=ALICE))
        [prompt] = tg.wait_for_sync("sendMessage", has_keyboard, timeout=30)
        # Killed between the send and the store's note of it, the next run would send the prompt
        # again (same buttons): wait until the prompt is on record, then kill.
        wait_for_line(first_log, "waits for a decision")
    finally:
        proc.send_signal(how)
        proc.wait(timeout=30)
    approve = next(b["callback_data"] for row in prompt.params["reply_markup"]["inline_keyboard"] for b in row
                   if b["text"] == "Approve")
    proc, second_log = start_talon(tmp_path, env, "second.log")
    try:
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], approve, user_id=ALICE,
                                       first_name="Alice"))
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "Ran it after the restart.", timeout=30)
    finally:
        stop_talon(proc)
    logs = first_log.read_text() + second_log.read_text()
    workspace = tmp_path / "media_root" / "telegram" / str(ALICE)
    assert (workspace / "kept.txt").read_text() == "kept\n", logs
    assert len([c for c in tg.sent("sendMessage") if has_keyboard(c)]) == 1, logs  # not asked twice
    assert len(llm.requests) == 2  # the turn resumed at its tool call; the model was not asked again for it
    assert "ran-after-restart" in tool_results(llm.requests[1].json)[0]
    [edit] = tg.sent("editMessageText")
    assert edit.params["message_id"] == prompt.result["message_id"] and "Approved by Alice" in edit.params["text"]


def wait_for_line(log: Path, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared in the log:\n{log.read_text()}")
        time.sleep(0.05)


def _console_env(tmp_path: Path, llm: FakeOpenAI, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update({
        "TALON_MODEL": "openai:fake-model", "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_MODEL_MAX_RETRIES": "0", "TALON_MODEL_DISCOVERY": "false", "TALON_SPEECH_WARMUP": "false",
        "TALON_SHELL_TOOL": "true", "TALON_SHELL_UNSANDBOXED": "true", **extra,
    })
    return env


def test_console_yes_and_no_answer_the_approval_without_starting_a_turn(tmp_path: Path) -> None:
    from tests.terminal import ChatTerminal

    with FakeOpenAI() as llm:
        llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo yes-ran"}), "First done.",
                  FakeOpenAI.tool_call("shell", {"command": "touch no.txt"}), "Second not run.")
        # On a terminal, as a person answers: each line typed once its prompt is shown.
        term = ChatTerminal(tmp_path, {**_console_env(tmp_path, llm),
                                       "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        try:
            term.wait_for("you> ", 60)
            term.type("first")
            asked = term.wait_for("Reply yes to allow it or no to refuse", 60)
            term.type("yes")
            done = term.wait_for("First done.", 60, after=asked)
            term.type("second")
            asked = term.wait_for("Reply yes to allow it or no to refuse", 60, after=done)
            term.type("no")
            term.wait_for("Second not run.", 60, after=asked)
            term.wait_for("you> ", 60, after=asked)
            term.ctrl_d()
            assert term.wait(60) == 0
        finally:
            term.close()
        requests = [r.json for r in llm.requests]
    out = term.output
    assert out.count("Reply yes to allow it or no to refuse") == 2, out
    assert "Approved by console" in out and "Denied by console" in out
    assert len(requests) == 4  # yes and no never became turns of their own
    assert "yes-ran" in tool_results(requests[1])[0]
    assert "denied by the user" in tool_results(requests[3])[-1]
    assert not list((tmp_path / "media_root").rglob("no.txt"))


def test_talon_usage_grant_is_stored_and_bad_input_is_refused(tmp_path: Path) -> None:
    from talon.storage.embedded.control import SqliteUsageStore, open_control_db

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update({"TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data")})

    def usage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "talon.cli", "usage", *args], text=True, capture_output=True,
                              cwd=tmp_path, env=env, timeout=60)

    granted = usage("--grant", "telegram:111", "50k")
    assert granted.returncode == 0, granted.stderr
    assert "granted 50,000 tokens to telegram:111" in granted.stdout
    assert usage("--grant", "whatsapp:+1 415 555", "$2").returncode == 0
    bad_who = usage("--grant", "111", "5000")
    assert bad_who.returncode == 2 and "CHANNEL:ID" in bad_who.stderr
    bad_amount = usage("--grant", "telegram:111", "lots")
    assert bad_amount.returncode == 2 and "is not an amount" in bad_amount.stderr
    shown = usage()
    assert shown.returncode == 0 and "today: 0 tokens" in shown.stdout
    runner = open_control_db(tmp_path / "data" / "control.sqlite3")
    try:
        store = SqliteUsageStore(runner)
        assert asyncio.run(store.granted("telegram", "111", "tokens", 0.0)) == 50000
        assert asyncio.run(store.granted("whatsapp", "+1415555", "usd", 0.0)) == 2
    finally:
        runner.close()


def test_talon_run_refuses_a_money_cap_without_a_price_and_a_bad_kind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update(settings_env(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", TALON_LIMIT_TOTAL="$5/day"))
    run = subprocess.run([sys.executable, "-m", "talon.cli", "run"], text=True, capture_output=True, cwd=tmp_path,
                         env=env, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "TALON_LIMIT_TOTAL sets an amount of money, but the model 'fake-model' has no known price" in run.stderr
    # TALON_LIMIT_TOTAL is set (its problem is named above): only the unset TALON_PRICES is missing.
    assert "missing settings: TALON_PRICES (" in run.stderr
    env.update(TALON_LIMIT_TOTAL="", TALON_APPROVAL="shell,writes")
    run = subprocess.run([sys.executable, "-m", "talon.cli", "run"], text=True, capture_output=True, cwd=tmp_path,
                         env=env, timeout=60)
    assert run.returncode == 2 and "TALON_APPROVAL: 'writes' is not a kind of tool call" in run.stderr
