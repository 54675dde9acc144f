"""Shared fixtures: loopback fakes of the Telegram Bot API and an OpenAI-compatible server,
and Talon settings pointed at them. Nothing here touches the internet."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from talon.config import Settings
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.pg import pg_server, pg_url  # noqa: F401  (PostgreSQL fixtures)

if TYPE_CHECKING:
    from talon.runtime import Runtime

# Talon warms Whisper and the voice at every start; most tests start a runtime and never speak,
# so the suite turns that off (Settings reads the environment). Tests of the warm-up turn it on.
os.environ.setdefault("TALON_SPEECH_WARMUP", "false")

TOKEN = "123456:TEST-token"
ALICE = 111
BOB = 222
MALLORY = 999


@pytest_asyncio.fixture
async def tg():
    async with FakeTelegram(token=TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def llm():
    async with FakeOpenAI() as fake:
        yield fake


def make_settings(tmp_path: Path, tg_base: str, llm_base: str, **extra: object) -> Settings:
    values: dict[str, object] = dict(
        TELEGRAM_BOT_TOKEN=TOKEN,
        TELEGRAM_API_BASE_URL=tg_base,
        OPENAI_BASE_URL=llm_base,
        OPENAI_API_KEY="test-key",
        TALON_MODEL="openai:fake-model",
        TALON_MEDIA_ROOT=str(tmp_path / "media_root"),
        TALON_DATA_DIR=str(tmp_path / "data"),
        TALON_TELEGRAM_ALLOWED_USERS=f"{ALICE},@bob",
        TALON_TELEGRAM_POLL_TIMEOUT=1,
        TALON_MODEL_MAX_RETRIES=0,
        TALON_MODEL_TIMEOUT=20,
        # The signs of a turn at once, as most tests watch for them; tests/test_ack_delay.py
        # covers the default delay.
        TALON_ACK_DELAY=0,
    )
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> Settings:
    return make_settings(tmp_path, tg.base_url, llm.base_url)


def settings_env(tmp_path: Path, tg_base: str, llm_base: str, **extra: str) -> dict[str, str]:
    """The same configuration as environment variables, for `talon run` in a subprocess."""
    env = {
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "TELEGRAM_API_BASE_URL": tg_base,
        "OPENAI_BASE_URL": llm_base,
        "OPENAI_API_KEY": "test-key",
        "TALON_MODEL": "openai:fake-model",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"),
        "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_TELEGRAM_ALLOWED_USERS": f"{ALICE},@bob",
        "TALON_TELEGRAM_POLL_TIMEOUT": "1",
        "TALON_MODEL_MAX_RETRIES": "0",
        "TALON_ACK_DELAY": "0",
        "TALON_LOG_LEVEL": "INFO",
        "TALON_SPEECH_WARMUP": "false",
    }
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def running_telegram(settings: Settings, **channel_kw: object) -> AsyncIterator["Runtime"]:
    """Talon with its Telegram channel, started for the block and stopped after it."""
    from channels.telegram import TelegramChannel
    from talon.runtime import build_runtime

    runtime = build_runtime(settings, [TelegramChannel(settings, **channel_kw)])  # type: ignore[arg-type]
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


# `pytest -m "not e2e"` is the fast subset. End to end (or heavy), and so left out of it: files
# named *_e2e.py, files that start Talon or another program as a process, a real server
# (llama.cpp, PostgreSQL) or load real speech models, tests that ask for PostgreSQL or a real
# transcriber, and a few heavy tests named here. A name that no longer exists marks nothing.
_E2E_FILES = frozenset({
    "test_cli_process.py", "test_console.py", "test_pg_stores.py", "test_migrate.py",
    "test_scaleout_ops.py", "test_scaleout_whatsapp.py", "test_speech.py", "test_tts.py",
    "test_voice_replies.py", "test_typecheck.py", "test_startup.py", "test_live_crash.py",
    "test_tool_races.py", "test_agent_long_conversation.py", "test_mcp.py", "test_control_process.py",
    "test_scheduler_restart.py", "test_shell_sandbox.py", "test_console_stop.py", "test_local_model.py",
})
_E2E_FIXTURES = frozenset({"pg_url", "pg_server", "transcriber"})
_E2E_TESTS = frozenset({
    "test_photo_and_voice_note_reach_the_model",  # real Whisper through the runtime
    "test_a_1_mb_reply_is_a_few_messages_and_reply_md_on_telegram",
    "test_a_1_mb_reply_is_a_few_messages_and_reply_md_on_whatsapp",
    "test_another_chat_is_answered_while_a_catastrophic_grep_runs",
    "test_sigterm_during_a_long_grep_stops_talon_within_its_stop_grace",  # `talon run` as a process
    # `talon run` / `talon doctor` as processes (tests/test_stop_and_health.py)
    "test_run_stops_on_a_signal_while_the_bot_api_cannot_be_reached",
    "test_run_stops_on_sigterm_while_waiting_for_the_database",
    "test_run_with_a_missing_database_names_it_and_calls_nothing_missing",
    "test_a_busy_port_is_named_with_its_problem_not_called_missing",
    "test_doctor_checks_the_bot_token_with_getme",
    "test_doctor_checks_the_twilio_credentials_with_the_account_fetch",
    "test_doctor_reads_the_env_file_of_the_config_directory_and_says_so",
    "test_every_trick_is_refused_in_a_network_namespace_of_its_own",  # a probe process in a namespace
    # 2,000 bodies per webhook: heavy
    "test_the_telegram_webhook_answers_no_malformed_body_with_a_500",
    "test_the_twilio_webhook_answers_no_malformed_body_with_a_500",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        if (name in _E2E_FILES or "_e2e" in name or getattr(item, "originalname", item.name) in _E2E_TESTS
                or _E2E_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.e2e)
