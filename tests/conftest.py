"""Shared fixtures: loopback fakes of the Telegram Bot API and an OpenAI-compatible server,
and Talon settings pointed at them. Nothing here touches the internet."""

from __future__ import annotations

from tests.support.parallel import keep_bytecode

keep_bytecode()  # first: before anything below is imported (tests/support/parallel.py)

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
from tests.support.synapse import synapse  # noqa: F401  (a real Matrix homeserver, once per session)
from tests.support.parallel import check_groups, compile_ahead, group_heavy_modules, groups_lost, heavy_first, run_dir
from tests.support.parallel import pytest_xdist_auto_num_workers  # noqa: F401  (two workers per core)
from tests.support.parallel import pytest_runtest_protocol  # noqa: F401  (tests marked alone run alone)
from tests.support.tiers import freeze_after_collection, pytest_runtest_call, pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401

if TYPE_CHECKING:
    from talon.runtime import Runtime

# Talon warms Whisper and the voice at every start; most tests start a runtime and never speak,
# so the suite turns that off (Settings reads the environment). Tests of the warm-up turn it on.
os.environ.setdefault("TALON_SPEECH_WARMUP", "false")

# The bundled Whisper model is joined once per installation into $XDG_CACHE_HOME/talon/models.
# The suite (and every Talon process it starts) uses a cache of its own, made for this run and
# removed after it, so no run depends on what an earlier one left in the user's home; all the
# pytest-xdist workers of a run share it (tests/support/parallel.py).
os.environ["XDG_CACHE_HOME"] = str(run_dir() / "cache")

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


# Three tiers, each test in exactly one (docs/development.md):
# - `e2e`: files named *_e2e.py, files that start Talon or another program as a process, a real
#   server (llama.cpp, PostgreSQL) or load real speech models, tests that ask for PostgreSQL
#   (the fixture, or a store parametrized "postgres") or a real transcriber, and a few heavy tests
#   named here;
# - `slow`: in-process, but Talon's runtime against the loopback fakes (the fake model server,
#   Bot API, Twilio or web site fixtures), or a test named in _SLOW_TESTS (real timeouts, big media,
#   scans of the whole source tree);
# - `unit`: everything else; `pytest -m unit` runs in seconds. A unit test that costs more than
#   0.3 s of CPU (or waits 3 s) fails the tier check (tests/support/tiers.py): give it its tier here.
# A name that no longer exists marks nothing.
_E2E_FILES = frozenset({
    "test_cli_process.py", "test_console.py", "test_pg_stores.py", "test_migrate.py",
    "test_scaleout_ops.py", "test_scaleout_whatsapp.py", "test_speech.py", "test_tts.py",
    "test_voice_replies.py", "test_typecheck.py", "test_startup.py", "test_live_crash.py",
    "test_tool_races.py", "test_agent_long_conversation.py", "test_mcp.py", "test_control_process.py",
    "test_scheduler_restart.py", "test_shell_sandbox.py", "test_console_stop.py", "test_local_model.py",
    "test_jobs_restart.py",  # `talon run` as a process, killed and started again
})
_E2E_FIXTURES = frozenset({"pg_url", "pg_server", "transcriber", "synapse"})
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


# Fixtures that run Talon's channels and agent in-process against loopback fakes.
_SLOW_FIXTURES = frozenset({"llm", "tg", "twilio", "settings", "site", "slack", "discord_fake"})
# In-process tests that take a measurable time of their own (about 0.3 s or more alone): real
# timeouts and retry waits, big images and video frames, whole-tree scans, fuzzers.
_SLOW_TESTS = frozenset({
    "test_every_embedded_store_file_and_table_is_archived_or_named_as_left_out",  # every store, a backup
    "test_a_slow_stream_longer_than_the_timeout_completes",
    "test_silence_past_the_timeout_fails_once_and_is_not_repeated",
    "test_anthropic_overloaded_is_retried_and_logged",
    "test_rate_limit_waits_out_retry_after_and_says_so",
    "test_a_call_past_its_total_cap_stops_and_is_not_repeated",
    "test_big_photo_is_downscaled_not_dropped",
    "test_large_alpha_image_falls_back_to_jpeg_within_bytes",
    "test_byte_limit_steps_quality_then_size",
    "test_exif_rotated_photo_comes_out_upright",
    "test_big_frames_are_downscaled_and_share_the_byte_budget",
    "test_a_large_screenshot_reaches_claude",
    "test_image_under_the_byte_limit_still_fits_it_once_base64_encoded",
    "test_every_tool_call_has_a_wall_clock_limit_enforced_from_outside",
    "test_live_text_paces_updates_and_a_tool_preamble_is_replaced",
    "test_live_text_retries_a_dropped_update_and_stops_for_good_after_stream_stopped",
    "test_clients_that_hang_up_mid_body_get_one_short_warning_no_traceback",
    "test_a_conversation_sends_the_same_bodies_with_and_without_the_caches",
    "test_discovery_of_a_server_that_hangs_is_bounded",
    "test_no_private_attribute_is_read_from_outside",
    "test_no_exception_class_statement_outside_talon_errors",
    "test_shell_runs_in_the_workspace_without_secrets_times_out_and_caps",
    "test_never_unbalanced_on_random_markup",
    "test_broken_and_encrypted_pdfs_give_notices",
    "test_delay_lets_requests_overlap",
    "test_read_file_of_one_huge_line_stays_in_bounded_memory",
    "test_build_provider_picks_adapter_and_profile",
    "test_doctor_refuses_the_money_cap_that_run_refuses",  # doctor in-process against the fakes
    "test_a_web_page_full_of_lookalikes_reaches_the_model_with_only_its_own_markers",
    # real archives written, verified and restored (tests/test_backup.py, tests/test_export.py)
    "test_round_trip_keeps_everything_and_the_archive_verifies",
    "test_tampered_truncated_and_hostile_archives_are_refused",
    "test_a_restore_never_writes_over_anything",
    "test_links_planted_in_a_workspace_are_not_followed_and_link_members_are_refused",
    "test_a_backup_while_messages_arrive_holds_whole_messages",
    "test_export_names_every_message_and_keeps_everything",
    # a whole runtime built (and, for WhatsApp, run against the Twilio fake): 0.35 to 1.2 s each
    "test_on_whatsapp_too_a_chat_cannot_send_another_chats_file",
    "test_runtime_builds_the_agent_with_workspace_tools",
    "test_context_settings_reach_the_agent",
    # 0.2 s of CPU or more: too near the unit tier's 0.3 s bound (tests/support/tiers.py)
    "test_hostile_results",
    "test_a_call_stopped_midway_keeps_what_the_server_said_and_counts_what_came",
    # collects garbage: its CPU grows with the heap a worker has built up (0.16-0.33 s)
    "test_the_memo_lets_go_of_messages_nothing_else_holds",
    "test_money_caps_need_a_price_and_a_bad_zone_is_named",  # 0.32 s of CPU in a parallel run
})


def _is_e2e(item: pytest.Item) -> bool:
    if (item.path.name in _E2E_FILES or "_e2e" in item.path.name
            or getattr(item, "originalname", item.name) in _E2E_TESTS
            or _E2E_FIXTURES & set(getattr(item, "fixturenames", ()))):
        return True
    callspec = getattr(item, "callspec", None)  # a store fixture parametrized over the backends
    return callspec is not None and "postgres" in callspec.params.values()


def pytest_configure(config: pytest.Config) -> None:
    compile_ahead(config)


def pytest_collection_finish(session: pytest.Session) -> None:
    check_groups(session)
    freeze_after_collection()


def pytest_sessionfinish(session: pytest.Session) -> None:
    groups_lost(session)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") is not None or _is_e2e(item):
            item.add_marker(pytest.mark.e2e)
        elif (item.get_closest_marker("slow") is not None
              or getattr(item, "originalname", item.name) in _SLOW_TESTS
              or _SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
        else:
            item.add_marker(pytest.mark.unit)
    group_heavy_modules(items)
    heavy_first(items)
