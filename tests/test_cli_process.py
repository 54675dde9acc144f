"""`talon run` as a real process against loopback fakes: allowlist, SIGKILL recovery, config errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ALICE, MALLORY, settings_env
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.conftest import TOKEN
from tests.support.process import closed_port, start_talon, stop_talon
from tests.support.telegram import to_chat


@pytest.fixture
def fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def test_talon_run_answers_allowed_and_ignores_others(tmp_path: Path, fakes) -> None:
    tg, llm = fakes
    proc, log_path = start_talon(tmp_path, settings_env(tmp_path, tg.base_url, llm.base_url), "run.log")
    try:
        tg.push_update(tg.text_message(MALLORY, "I am not allowed", user_id=MALLORY))
        tg.push_update(tg.text_message(ALICE, "hello from alice", user_id=ALICE))
        [reply] = tg.wait_for_sync("sendMessage", to_chat(ALICE), timeout=30)
    finally:
        code = stop_talon(proc)
    log = log_path.read_text()
    assert reply.params["text"] == "echo: hello from alice", log
    assert not tg.sent("sendMessage", chat_id=MALLORY)
    assert all("not allowed" not in last_user_text(r) for r in llm.requests)
    assert f"add {MALLORY} to TALON_TELEGRAM_ALLOWED_USERS" in log
    assert TOKEN not in log  # the bot token never reaches the log
    assert code == 0, log


def test_sigkill_between_arrival_and_reply_answers_after_restart(tmp_path: Path, fakes) -> None:
    tg, llm = fakes
    env = settings_env(tmp_path, tg.base_url, llm.base_url)
    llm.hang = True
    proc, log1 = start_talon(tmp_path, env, "first.log")
    try:
        tg.push_update(tg.text_message(ALICE, "please survive a crash", user_id=ALICE))
        llm.wait_for_requests_sync(1, timeout=30)  # the turn started: the message is in the inbox
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert not tg.sent("sendMessage", chat_id=ALICE)
    llm.hang = False
    llm.release()

    proc, log2 = start_talon(tmp_path, env, "second.log")
    try:
        [reply] = tg.wait_for_sync("sendMessage", to_chat(ALICE), timeout=30)
        # and it keeps working for new messages
        tg.push_update(tg.text_message(ALICE, "and after that?", user_id=ALICE))
        tg.wait_for_sync("sendMessage", to_chat(ALICE), count=2, timeout=30)
    finally:
        stop_talon(proc)
    assert reply.params["text"] == "echo: please survive a crash", log2.read_text()
    texts = [c.params["text"] for c in tg.sent("sendMessage", chat_id=ALICE)]
    assert texts == ["echo: please survive a crash", "echo: and after that?"]  # answered once


def test_talon_run_without_settings_names_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    result = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "TALON_MODEL" in result.stderr and "TELEGRAM_BOT_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr

    env["TALON_MODEL"] = "openai:gpt-4.1-mini"
    env["OPENAI_API_KEY"] = "sk-test"
    result = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "no channel configured" in result.stderr and "TALON_MODEL" not in result.stderr.split("missing settings")[1]


def test_bad_token_is_reported_without_traceback(tmp_path: Path, fakes) -> None:
    tg, llm = fakes
    env = settings_env(tmp_path, tg.base_url, llm.base_url, TELEGRAM_BOT_TOKEN="999:wrong")
    proc, log_path = start_talon(tmp_path, env, "bad.log")
    code = proc.wait(timeout=30)
    log = log_path.read_text()
    assert code == 2, log
    assert "TELEGRAM_BOT_TOKEN" in log and "Traceback" not in log


def _doctor(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    # doctor calls getMe: never at api.telegram.org from a test (a closed port unless a test
    # passes the fake's URL).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update({"TALON_MODEL": "openai:gpt-4.1-mini", "OPENAI_API_KEY": "sk-very-secret",
                "TELEGRAM_BOT_TOKEN": "123:also-secret", "TALON_TELEGRAM_ALLOWED_USERS": "42",
                "TELEGRAM_API_BASE_URL": f"http://127.0.0.1:{closed_port()}",
                "XDG_CONFIG_HOME": str(tmp_path / "config"), **extra})
    return subprocess.run([sys.executable, "-m", "talon.cli", "doctor"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_doctor_reports_configuration_and_the_server_without_secrets(tmp_path: Path, fakes) -> None:
    tg, llm = fakes
    result = _doctor(tmp_path, OPENAI_BASE_URL=llm.base_url, TALON_MODEL="openai:gpt-fake",
                     TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_BASE_URL=tg.base_url)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in result.stdout.splitlines() if "  " in line}
    assert rows["model"] == "ok: openai:gpt-fake"
    assert rows["telegram allowlist"] == "42"
    assert "ok (faster-whisper)" in rows["transcriber"]
    assert rows["model server"].startswith("unknown server; it states no limits")
    assert "context window 32,768 tokens (Talon's default for unknown models)" in rows["model profile"]
    assert rows["live request"].startswith("ok: answered")
    assert llm.requests and llm.requests[-1].json["max_tokens"] == 1  # one cheap request
    assert rows["model server url"] == f"{llm.base_url} (OPENAI_BASE_URL)"
    assert rows["telegram bot"] == "ok: @talon_test_bot (id 123456), getMe answered"
    assert [c.method for c in tg.calls] == ["getMe"]
    assert "secret" not in result.stdout and TOKEN not in result.stdout


def test_doctor_exits_1_when_a_required_setting_is_missing(tmp_path: Path) -> None:
    result = _doctor(tmp_path, OPENAI_API_KEY="", TALON_MODEL="openai:gpt-4.1-mini")
    assert result.returncode == 1
    assert "MISSING" in result.stdout and "OPENAI_API_KEY (for OpenAI), or OPENAI_BASE_URL" in result.stdout
    assert "problems with model" in result.stderr


def test_doctor_exits_1_when_the_model_server_cannot_be_reached(tmp_path: Path) -> None:
    port = closed_port()
    result = _doctor(tmp_path, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", TALON_MODEL_MAX_RETRIES="0")
    assert result.returncode == 1, result.stdout
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in result.stdout.splitlines() if "  " in line}
    assert rows["model server"].startswith("UNREACHABLE: not reachable")
    assert rows["live request"].startswith(f"FAILED: could not reach the model server at http://127.0.0.1:{port}/v1")
    assert rows["model server url"] == f"http://127.0.0.1:{port}/v1 (OPENAI_BASE_URL)"


def test_debug_log_never_shows_the_bot_token_or_api_key(tmp_path: Path, fakes) -> None:
    # python-telegram-bot logs its API URLs (which hold the token) at DEBUG.
    tg, llm = fakes
    env = settings_env(tmp_path, tg.base_url, llm.base_url, TALON_LOG_LEVEL="DEBUG",
                       OPENAI_API_KEY="sk-test-secret-key")
    proc, log_path = start_talon(tmp_path, env, "debug.log")
    try:
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        tg.wait_for_sync("sendMessage", to_chat(ALICE), timeout=30)
    finally:
        code = stop_talon(proc)
    log = log_path.read_text()
    assert "DEBUG telegram" in log and "[REDACTED]" in log, log
    assert TOKEN not in log and "sk-test-secret-key" not in log
    assert code == 0, log
