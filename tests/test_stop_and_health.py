"""Stop means stop, health tells the truth, errors say what is wrong (issue 17).

`talon run` as a real process: SIGTERM and SIGINT end it within its stop grace in every phase of
start-up (a Bot API it cannot reach, a database that is down or hangs), with the inbox intact.
/healthz answers 503 naming the channel and why until the channel is really up, and again when it
goes down. `talon doctor` proves the credentials with the platforms' own calls and says where the
settings came from. A set but unusable value is named with its problem, never called missing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from channels.base import ChannelHealth
from channels.telegram import TelegramChannel
from talon.bridge import Bridge
from talon.config import Settings
from talon.envelope import InboundMessage
from talon.errors import ConfigError
from talon.storage.embedded.inbox import SqliteInbox
from talon.runtime import build_runtime, configured_channels, shared_http_server
from talon.settings_source import find_env_file, unset
from tests.support.zygote import TalonProcess, start_talon_process
from tests.conftest import ALICE, TOKEN, make_settings, running_telegram, settings_env
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.process import closed_port
from tests.support.waiting import until_sync

STOP_GRACE_S = Bridge.stop_grace_s


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_",
                                                                    "ANTHROPIC_"))}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # never the real user's .env
    env.update(extra)
    return env


def talon(tmp_path: Path, env: dict[str, str], *args: str, log_name: str = "talon.log",
          cwd: Path | None = None) -> tuple[TalonProcess, Path]:
    log = tmp_path / log_name
    return start_talon_process(list(args), cwd=cwd or tmp_path, env=env, out=log), log


def stopped_within_grace(proc: TalonProcess, sig: int, log: Path) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"talon did not stop within {STOP_GRACE_S:g}s of {signal.Signals(sig).name}:\n"
                             + log.read_text()) from None


# --- stop means stop ---------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_stops_on_a_signal_while_the_bot_api_cannot_be_reached(tmp_path: Path, sig: int) -> None:
    with FakeOpenAI() as llm:
        env = clean_env(tmp_path, **settings_env(tmp_path, f"http://127.0.0.1:{closed_port()}", llm.base_url))
        # A message left pending by an earlier run: a stop during start-up must not lose it.
        (tmp_path / "data").mkdir(mode=0o700)
        asyncio.run(_add_pending(tmp_path / "data" / "inbox.sqlite3",
                                 InboundMessage(channel="telegram", chat_id=str(ALICE), sender_id=str(ALICE),
                                                message_id="7", text="still there?")))
        proc, log = talon(tmp_path, env, "run")
        try:
            # Retrying getMe with backoff: before the fix, the signal went unnoticed for ever.
            until_sync(lambda: log.read_text().count("getMe failed at the Bot API") >= 2, 60,
                       "two failed getMe attempts")
        finally:
            code = stopped_within_grace(proc, sig, log)
    text = log.read_text()
    assert code == 0, text
    assert "stop requested during start-up" in text and "Traceback" not in text
    assert asyncio.run(_pending_texts(tmp_path / "data" / "inbox.sqlite3")) == ["still there?"]


async def _add_pending(path: Path, message: InboundMessage) -> None:
    inbox = SqliteInbox(path)
    try:
        assert await inbox.add(message) is not None
    finally:
        await inbox.close()


async def _pending_texts(path: Path) -> list[str]:
    inbox = SqliteInbox(path)
    try:
        return [item.message.text for item in await inbox.pending()]
    finally:
        await inbox.close()


async def test_until_stopped_gives_the_result_or_returns_at_the_stop() -> None:
    from talon.runtime import until_stopped

    stop = asyncio.Event()
    assert await until_stopped(stop, asyncio.sleep(0, result="done")) == "done"

    async def bad() -> None:
        raise ConfigError("bad")

    with pytest.raises(ConfigError, match="bad"):
        await until_stopped(stop, bad())

    cleaned: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("coroutine")

    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await until_stopped(stop, forever()) is None
    assert cleaned == ["coroutine"]  # cancelled, its cleanup ran


class HungServer:
    """A loopback TCP server that accepts connections and never says a word (a hung database)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def hung_server() -> Iterator[HungServer]:
    server = HungServer()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["hung", "refusing"])
def test_run_stops_on_sigterm_while_waiting_for_the_database(tmp_path: Path, kind: str,
                                                             hung_server: HungServer) -> None:
    port = hung_server.port if kind == "hung" else closed_port()
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        env = clean_env(tmp_path, **settings_env(tmp_path, tg.base_url, llm.base_url),
                        TALON_DATABASE_URL=f"postgresql://talon@127.0.0.1:{port}/talon")
        proc, log = talon(tmp_path, env, "run")
        try:
            until_sync(lambda: "settings: " in log.read_text(), 60, "start-up to reach the stores")
            if kind == "hung":
                until_sync(lambda: hung_server.accepted, 60, "a connection to the hung database")
        finally:
            code = stopped_within_grace(proc, signal.SIGTERM, log)
    text = log.read_text()
    # Before the fix the signal killed it outright (-15), or it waited out the pool's 10 s.
    assert code == 0, text
    assert "stopped while opening the stores" in text and "Traceback" not in text
    assert not tg.calls  # it never got as far as Telegram


async def test_a_missing_database_fails_at_once_in_the_servers_own_words(tmp_path: Path, pg_server: str) -> None:
    from psycopg.conninfo import make_conninfo

    from talon.storage.postgres.db import AsyncDatabase

    url = make_conninfo(pg_server, dbname="talon_no_such_db")
    with pytest.raises(ConfigError) as err:
        await AsyncDatabase(url, timeout_s=30.0).open()
    message = str(err.value)
    assert 'the database server refused the connection: database "talon_no_such_db" does not exist' in message
    assert "pool initialization incomplete" not in message and "within 30s" not in message
    assert err.value.missing == ["TALON_DATABASE_URL"]


def test_run_with_a_missing_database_names_it_and_calls_nothing_missing(tmp_path: Path, pg_server: str) -> None:
    from psycopg.conninfo import make_conninfo

    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        env = clean_env(tmp_path, **settings_env(tmp_path, tg.base_url, llm.base_url),
                        TALON_DATABASE_URL=make_conninfo(pg_server, dbname="talon_absent"))
        result = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert 'database "talon_absent" does not exist' in result.stderr
    assert "missing settings" not in result.stderr and "Traceback" not in result.stderr


# --- errors that say what is wrong ----------------------------------------------------------------


def test_a_busy_port_is_named_with_its_problem_not_called_missing(tmp_path: Path) -> None:
    with socket.socket() as busy, FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        env = clean_env(tmp_path, **settings_env(tmp_path, tg.base_url, llm.base_url),
                        TALON_TELEGRAM_WEBHOOK_URL="https://talon.example.com/telegram/webhook",
                        TALON_TELEGRAM_WEBHOOK_SECRET="a_secret-token", TALON_HTTP_HOST="127.0.0.1",
                        TALON_HTTP_PORT=str(port))
        result = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"TALON_HTTP_PORT={port}: address already in use on 127.0.0.1" in result.stderr
    assert "missing settings" not in result.stderr and "Traceback" not in result.stderr


async def test_a_host_that_is_not_ours_is_named_with_its_problem() -> None:
    from channels.http import HttpServer

    with pytest.raises(ConfigError) as err:  # TEST-NET-1: never an address of this machine
        await HttpServer("192.0.2.1", 0).start()
    assert str(err.value).startswith("TALON_HTTP_HOST=192.0.2.1: cannot assign requested address")
    assert err.value.missing == ["TALON_HTTP_HOST"]


def test_an_unparsable_value_is_shown_with_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from talon.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TALON_HTTP_PORT", "80a")
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert "invalid settings: TALON_HTTP_PORT='80a': Input should be a valid integer" in err
    assert "missing settings" not in err


def test_missing_is_said_only_of_settings_without_a_value(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, TALON_MODEL="", TELEGRAM_BOT_TOKEN="123:x",  # type: ignore[call-arg]
                        TALON_HTTP_PORT=8081)
    assert unset(settings, ["TALON_MODEL", "TELEGRAM_BOT_TOKEN", "TALON_HTTP_PORT", "TALON_HTTP_HOST"]) == \
        ["TALON_MODEL"]  # the port and host have values (the host its default)
    assert unset(settings, ["OPENAI_API_KEY or OPENAI_BASE_URL"]) == ["OPENAI_API_KEY or OPENAI_BASE_URL"]
    with_url = settings.model_copy(update={"openai_base_url": "http://127.0.0.1:1/v1"})
    assert unset(with_url, ["OPENAI_API_KEY or OPENAI_BASE_URL"]) == ["OPENAI_API_KEY or OPENAI_BASE_URL"]
    assert unset(settings, ["TALON_MODEL_CONTEXT_WINDOW", "TALON_MEDIA_ROOT"]) == ["TALON_MODEL_CONTEXT_WINDOW"]


# --- where the settings come from -----------------------------------------------------------------


def test_the_env_file_rule(tmp_path: Path) -> None:
    here, config = tmp_path / "here", tmp_path / "config"
    here.mkdir()
    environ = {"XDG_CONFIG_HOME": str(config)}
    none = find_env_file(environ, cwd=here)
    assert none.path is None
    assert none.describe() == (f"the environment only: no .env file found (looked for {here}/.env and "
                               f"{config}/talon/.env; TALON_ENV_FILE names another)")
    (config / "talon").mkdir(parents=True)
    (config / "talon" / ".env").write_text("TALON_MODEL=openai:from-config\n")
    assert find_env_file(environ, cwd=here).path == config / "talon" / ".env"
    (here / ".env").write_text("TALON_MODEL=openai:from-here\n")
    found = find_env_file(environ, cwd=here)
    assert found.path == here / ".env" and found.reason == "the current directory"
    (tmp_path / "elsewhere.env").write_text("TALON_MODEL=openai:named\n")
    named = find_env_file({**environ, "TALON_ENV_FILE": "../elsewhere.env"}, cwd=here)
    assert named.path == tmp_path / "elsewhere.env" and named.reason == "TALON_ENV_FILE"
    with pytest.raises(ConfigError, match=r"TALON_ENV_FILE=nope\.env: no such file"):
        find_env_file({**environ, "TALON_ENV_FILE": "nope.env"}, cwd=here)


def doctor_rows(stdout: str) -> dict[str, str]:
    return {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in stdout.splitlines() if "  " in line}


def run_doctor(tmp_path: Path, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(tmp_path, TALON_TRANSCRIBER="off", **extra)
    return subprocess.run([sys.executable, "-m", "talon.cli", "doctor"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_doctor_reads_the_env_file_of_the_config_directory_and_says_so(tmp_path: Path) -> None:
    with FakeOpenAI() as llm:
        config = tmp_path / "config" / "talon"
        config.mkdir(parents=True)
        (config / ".env").write_text(f"TALON_MODEL=openai:from-config\nOPENAI_BASE_URL={llm.base_url}\n")
        work = tmp_path / "work"
        work.mkdir()
        result = run_doctor(tmp_path, work)
        rows = doctor_rows(result.stdout)
        assert rows["settings"] == f"{config / '.env'} (the config directory); environment variables override it"
        assert rows["model"] == "ok: openai:from-config"
        assert rows["model server url"] == f"{llm.base_url} (OPENAI_BASE_URL)"
        assert result.returncode == 0, result.stdout + result.stderr

        result = run_doctor(tmp_path, work, TALON_ENV_FILE=str(tmp_path / "gone.env"))
        assert result.returncode == 1
        assert f"INVALID: TALON_ENV_FILE={tmp_path / 'gone.env'}: no such file" in result.stdout
        assert "problems with settings" in result.stderr

        result = run_doctor(tmp_path, work, XDG_CONFIG_HOME=str(tmp_path / "empty"))
        assert doctor_rows(result.stdout)["settings"].startswith("the environment only: no .env file found")
        assert result.returncode == 1  # and so no model is configured
        assert "MISSING" in doctor_rows(result.stdout)["model"]


def test_doctor_checks_the_bot_token_with_getme(tmp_path: Path) -> None:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        common = dict(TALON_MODEL="openai:fake", OPENAI_BASE_URL=llm.base_url, TELEGRAM_API_BASE_URL=tg.base_url)
        good = run_doctor(tmp_path, tmp_path, TELEGRAM_BOT_TOKEN=TOKEN, **common)
        assert good.returncode == 0, good.stdout + good.stderr
        assert doctor_rows(good.stdout)["telegram bot"] == "ok: @talon_test_bot (id 123456), getMe answered"
        bad = run_doctor(tmp_path, tmp_path, TELEGRAM_BOT_TOKEN="123456:revoked-token", **common)
        base = tg.base_url
    assert bad.returncode == 1, bad.stdout
    row = doctor_rows(bad.stdout)["telegram bot"]
    assert row == (f"FAILED: Telegram refused TELEGRAM_BOT_TOKEN (Unauthorized) at {base}: copy the token "
                   "again from @BotFather (/mybots, your bot, API Token)")
    assert "problems with telegram bot" in bad.stderr
    assert "revoked-token" not in bad.stdout + bad.stderr


def test_doctor_checks_the_twilio_credentials_with_the_account_fetch(tmp_path: Path) -> None:
    with FakeTwilio() as twilio, FakeOpenAI() as llm:
        common = dict(TALON_MODEL="openai:fake", OPENAI_BASE_URL=llm.base_url, TWILIO_ACCOUNT_SID=twilio.account_sid,
                      TWILIO_WHATSAPP_FROM=twilio.whatsapp_from, TWILIO_API_BASE_URL=twilio.base_url,
                      TALON_PUBLIC_BASE_URL="https://talon.example.test")
        good = run_doctor(tmp_path, tmp_path, TWILIO_AUTH_TOKEN=twilio.auth_token, **common)
        bad = run_doctor(tmp_path, tmp_path, TWILIO_AUTH_TOKEN="not-the-token", **common)
    assert good.returncode == 0, good.stdout + good.stderr
    assert doctor_rows(good.stdout)["twilio account"] == "ok: Talon test account (active)"
    assert bad.returncode == 1, bad.stdout
    assert doctor_rows(bad.stdout)["twilio account"] == ("FAILED: Twilio refused TWILIO_ACCOUNT_SID / "
                                                         "TWILIO_AUTH_TOKEN (401, error 20003): copy both from "
                                                         "the Twilio console")
    assert "not-the-token" not in bad.stdout + bad.stderr


# --- health that tells the truth ------------------------------------------------------------------


async def healthz(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/healthz") as resp:
            return resp.status, await resp.text()


async def wait_for_health(url: str, status: int, needle: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        code, seen = await healthz(url)
        if code == status and needle in seen:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"/healthz never answered {status} with {needle!r}; last: {seen}")


@pytest.mark.parametrize("method", ["getMe", "setWebhook"])
async def test_healthz_is_503_until_telegram_is_really_up(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI,
                                                          method: str) -> None:
    refusing = True
    tg.fail_when(method, lambda params: refusing, 500, times=None)
    settings = make_settings(tmp_path, tg.base_url, llm.base_url,
                             TALON_TELEGRAM_WEBHOOK_URL="https://talon.example.com/telegram/webhook",
                             TALON_TELEGRAM_WEBHOOK_SECRET="a_secret-token", TALON_HTTP_HOST="127.0.0.1",
                             TALON_HTTP_PORT=0)
    http = shared_http_server(settings)
    assert http is not None
    runtime = build_runtime(settings, configured_channels(settings, http), http=http)
    starting = asyncio.create_task(runtime.start())
    try:
        while not http.running:
            assert not starting.done(), starting
            await asyncio.sleep(0.02)
        body = await wait_for_health(http.local_url, 503, f"{method} failed")
        assert (f"FAIL channel telegram: {method} failed at the Bot API {tg.base_url} "
                "(NetworkError: Internal Server Error); retrying in") in body
        refusing = False
        await starting
        body = await wait_for_health(http.local_url, 200, "webhook set")
        assert body.startswith("ok   channel telegram: webhook set: Telegram posts to "
                               "https://talon.example.com/telegram/webhook"), body
    finally:
        refusing = False
        await asyncio.gather(starting, return_exceptions=True)
        await runtime.stop()


async def test_polling_that_keeps_failing_is_reported_down_and_up_again(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    async with running_telegram(settings) as runtime:
        [channel] = runtime.channels
        assert isinstance(channel, TelegramChannel)
        assert channel.health().ok, channel.health()
        failing = True
        tg.fail_when("getUpdates", lambda params: failing, 500, times=None)
        deadline = time.monotonic() + 30
        while channel.health().ok:
            assert time.monotonic() < deadline, channel.health()
            await asyncio.sleep(0.05)
        health = channel.health()
        assert health == ChannelHealth(False, f"getUpdates failed 3 times in a row at {tg.base_url} (last: "
                                              "NetworkError: Internal Server Error); python-telegram-bot retries")
        failing = False
        while not channel.health().ok:
            assert time.monotonic() < deadline + 30, channel.health()
            await asyncio.sleep(0.05)
        assert channel.health().detail.startswith("polling: last getUpdates answered")
    assert channel.health() == ChannelHealth(False, "stopped")
