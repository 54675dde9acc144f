"""`talon setup` as a person runs it, on a pty, against the fake Bot API and the fake model: a
wrong token is refused with the Bot API's words, the right one accepted with the bot's name, the
model checked with one request, .env written 0600 with the keys, the owner paired by sending the
code; then `talon run` answers the owner. Also: Ctrl-C writes nothing; a second run keeps the other
lines of .env, replaces only what changed and keeps the old file as .env.bak; flags and --yes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from talon.cli.setup import read_env_file, update_env_file
from tests.conftest import TOKEN
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.terminal import ChatTerminal, chat_env

OWNER = 424242


@pytest.fixture
def fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def env_for(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> dict[str, str]:
    # The base URLs are in the environment: setup checks against them and keeps them.
    return chat_env(tmp_path, TELEGRAM_API_BASE_URL=tg.base_url, OPENAI_BASE_URL=llm.base_url,
                    TALON_TELEGRAM_POLL_TIMEOUT="1")


def chat_requests(llm: FakeOpenAI) -> int:
    return len(llm.requests)


def test_setup_on_a_terminal_checks_saves_pairs_and_talon_run_answers_the_owner(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    llm.default_responder = lambda request: "OK"
    env = env_for(tmp_path, tg, llm)
    term = ChatTerminal(tmp_path, env, ("setup",))
    try:
        at = term.wait_for("Telegram bot token", 60)
        term.type("999:wrong-token")
        at = term.wait_for("telegram: REFUSED: Telegram refused the token: Unauthorized", 30, after=at)
        at = term.wait_for("Try another token? [Y/n]", 10, after=at)
        term.type("")
        at = term.wait_for("Telegram bot token", 10, after=at)
        term.type(TOKEN)
        at = term.wait_for("telegram: ok: the bot is @talon_test_bot", 30, after=at)
        at = term.wait_for("Set up WhatsApp", 10, after=at)
        term.type("n")
        at = term.wait_for("Model", 10, after=at)
        term.type("openai:fake-model")
        at = term.wait_for("model: ok: openai:fake-model answered 'OK'; context window", 60, after=at)
        assert chat_requests(llm) == 1  # one real request proved the model
        at = term.wait_for("Save? [Y/n]", 10, after=at)
        term.type("")
        at = term.wait_for("saved ", 10, after=at)
        at = term.wait_for("pairing: send ", 10, after=at)
        code = re.search(r"pairing: send ([A-Z0-9]{3}-[A-Z0-9]{3}) to @talon_test_bot", term.output).group(1)  # type: ignore[union-attr]
        tg.push_update(tg.text_message(OWNER, "hello?", user_id=OWNER))  # not the code: ignored
        tg.push_update(tg.text_message(OWNER, code.lower(), user_id=OWNER, username="owner"))
        term.wait_for(f"paired: @owner (id {OWNER}) is on TALON_TELEGRAM_ALLOWED_USERS", 30, after=at)
        assert term.wait(30) == 0
    finally:
        term.close()
    assert TOKEN not in term.output and "999:wrong-token" not in term.output  # secrets are not echoed
    dotenv = tmp_path / ".env"
    assert oct(dotenv.stat().st_mode & 0o777) == "0o600"
    values = read_env_file(dotenv)
    assert values["TELEGRAM_BOT_TOKEN"] == TOKEN and values["TALON_MODEL"] == "openai:fake-model"
    assert values["TALON_TELEGRAM_ALLOWED_USERS"] == str(OWNER)
    assert "TELEGRAM_API_BASE_URL" not in values  # from the environment: used and left there
    [paired] = tg.sent("sendMessage", OWNER)
    assert paired.params["text"].startswith("Paired")

    # `talon run` from that directory answers the owner (and only the message sent after).
    llm.default_responder = lambda request: "hello owner"
    run_env = {k: v for k, v in env.items() if k != "TALON_ENV_FILE"}
    proc = subprocess.Popen([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=run_env,
                            stdout=open(tmp_path / "run.log", "wb"), stderr=subprocess.STDOUT)
    try:
        tg.push_update(tg.text_message(OWNER, "hi Talon", user_id=OWNER))
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "hello owner", timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert "hi Talon" in str(llm.requests[-1].json["messages"])
    assert "hello?" not in str([r.json for r in llm.requests]) and code not in str([r.json for r in llm.requests])


def test_ctrl_c_writes_nothing_and_a_second_run_replaces_only_what_changed(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    llm.default_responder = lambda request: "OK"
    env = env_for(tmp_path, tg, llm)
    original = "# my settings\nTALON_MODEL=openai:old-model\nTALON_LOG_LEVEL=DEBUG  # keep me\n"
    dotenv = tmp_path / ".env"
    dotenv.write_text(original)
    term = ChatTerminal(tmp_path, env, ("setup",))
    try:
        at = term.wait_for("Telegram bot token", 60)
        term.type(TOKEN)
        at = term.wait_for("telegram: ok", 30, after=at)
        term.wait_for("Set up WhatsApp", 10, after=at)
        term.ctrl_c()
        assert term.wait(30) == 130
    finally:
        term.close()
    assert "nothing more was written" in term.output
    assert dotenv.read_text() == original and not (tmp_path / ".env.bak").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    # Flags for scripts: checked the same way, then saved without a question.
    run = subprocess.run([sys.executable, "-m", "talon.cli", "setup", "--telegram-token", TOKEN, "--model",
                          "openai:fake-model", "--yes", "--no-pair"], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "telegram: ok: the bot is @talon_test_bot" in run.stdout and "model: ok" in run.stdout
    assert (tmp_path / ".env.bak").read_text() == original
    assert oct((tmp_path / ".env.bak").stat().st_mode & 0o777) == "0o600"  # it may hold secrets too
    text = dotenv.read_text()
    assert text.startswith("# my settings\nTALON_MODEL=openai:fake-model\nTALON_LOG_LEVEL=DEBUG  # keep me\n")
    assert f"TELEGRAM_BOT_TOKEN={TOKEN}" in text and oct(dotenv.stat().st_mode & 0o777) == "0o600"
    # A wrong token with --yes is refused and nothing is saved (unless --save-anyway).
    bad = subprocess.run([sys.executable, "-m", "talon.cli", "setup", "--telegram-token", "1:bad", "--yes",
                          "--no-pair"], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
    assert bad.returncode == 1 and "Unauthorized" in bad.stdout and "not saved" in bad.stdout
    assert f"TELEGRAM_BOT_TOKEN={TOKEN}" in dotenv.read_text()
    # A second interactive run shows the current choices as defaults (secrets hidden).
    term = ChatTerminal(tmp_path, env, ("setup",))
    try:
        at = term.wait_for("Telegram bot token (from @BotFather; - for no Telegram) [set (hidden); Enter keeps it", 60)
        term.type("")
        at = term.wait_for("telegram: ok", 30, after=at)
        term.wait_for("Set up WhatsApp", 10, after=at)
        term.type("n")
        at = term.wait_for("Model [openai:fake-model; Enter keeps it", 10, after=at)
        term.type("")
        term.wait_for("nothing changed: .env is left as it is", 60, after=at)
        os.killpg(term.proc.pid, signal.SIGINT)  # stop at the pairing wait
        assert term.wait(30) == 130
    finally:
        term.close()


def test_update_env_file_replaces_in_place_and_quotes(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    assert update_env_file(path, {"A_KEY": "plain", "B_KEY": 'has "quotes" and spaces #'}) is None
    assert read_env_file(path) == {"A_KEY": "plain", "B_KEY": 'has "quotes" and spaces #'}
    path.write_text("export A_KEY=old\nA_KEY=dup\nOTHER=1\n")
    backup = update_env_file(path, {"A_KEY": "new"})
    assert backup is not None and backup.read_text() == "export A_KEY=old\nA_KEY=dup\nOTHER=1\n"
    assert path.read_text() == "A_KEY=new\nOTHER=1\n"
    with pytest.raises(ValueError):
        update_env_file(path, {"A_KEY": "two\nlines"})
    assert path.read_text() == "A_KEY=new\nOTHER=1\n"


def test_whatsapp_with_flags_is_checked_against_the_twilio_base_url(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    from tests.fakes.twilio import FakeTwilio

    tg, llm = fakes
    llm.default_responder = lambda request: "OK"
    with FakeTwilio() as twilio:
        env = env_for(tmp_path, tg, llm) | {"TWILIO_API_BASE_URL": twilio.base_url}
        args = [sys.executable, "-m", "talon.cli", "setup", "--telegram-token", "", "--model", "openai:fake-model",
                "--twilio-account-sid", twilio.account_sid, "--whatsapp-from", "+14155550100",
                "--whatsapp-owner", "+14155550123", "--yes"]
        wrong = subprocess.run([*args, "--twilio-auth-token", "not-the-token"], cwd=tmp_path, env=env, text=True,
                               capture_output=True, timeout=120)
        assert wrong.returncode == 1 and "twilio: REFUSED: Twilio refused" in wrong.stdout, wrong.stdout
        assert not (tmp_path / ".env").exists()
        right = subprocess.run([*args, "--twilio-auth-token", twilio.auth_token], cwd=tmp_path, env=env, text=True,
                               capture_output=True, timeout=120)
    assert right.returncode == 0, right.stdout + right.stderr
    assert "twilio: ok" in right.stdout and twilio.auth_token not in right.stdout
    values = read_env_file(tmp_path / ".env")
    assert values["TWILIO_ACCOUNT_SID"] == twilio.account_sid and values["TWILIO_AUTH_TOKEN"] == twilio.auth_token
    assert values["TALON_WHATSAPP_ALLOWED_NUMBERS"] == "+14155550123"
    assert "TWILIO_API_BASE_URL" not in values and "TELEGRAM_BOT_TOKEN" not in values
