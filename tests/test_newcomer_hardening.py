"""The newcomer's defects (issue 27, part 8), as the trial met them.

- With the default ``TALON_MEDIA_ROOT=./media_root`` a file the agent made never arrived on
  WhatsApp: Twilio's fetch of the media link got 404 "no such file in the media root" (the
  relative root was joined twice). The root is now made absolute once, when the settings are
  read; a file the agent writes is sent on WhatsApp (fetched as Twilio would) and on Telegram.
- ``talon doctor`` passed a ``$1/day`` cap that ``talon run`` refuses.
- Talon's own notices (``[stopped by the person ...]``) were sent back to the model as the
  assistant's words, and the demo model echoed them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
import pytest_asyncio

from channels.media_links import MediaLinks
from channels.whatsapp import WhatsAppChannel
from talon.agent.context.pipeline import STOPPED_NOTE, TALON_NOTICE, conversation_view
from talon.config import Settings
from talon.content import Message
from talon.runtime import build_runtime
from talon.storage.media_links import MemoryMediaLinks
from talon.storage.sessions import ChatKey
from tests.conftest import ALICE, TOKEN, make_settings
from tests.conftest import running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio

PUBLIC = "https://talon.example.test"
WA_ALICE = "+15550001111"
REPORT = "city,rain_mm\nBerlin,42\nLisbon,7\n"


def write_then_send(llm: FakeOpenAI) -> None:
    """The model writes report.csv with its tool, then sends it with a markdown link."""
    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Here is the report: ![report](report.csv)"
        return FakeOpenAI.tool_call("write_file", {"path": "report.csv", "content": REPORT})
    llm.default_responder = respond


def relative_root_settings(**values: object) -> Settings:
    """Settings as a newcomer has them: TALON_MEDIA_ROOT not set, so ./media_root (the cwd is the
    test's own directory)."""
    settings = Settings(_env_file=None, **values)  # type: ignore[arg-type]
    assert Settings.model_fields["media_root"].default == Path("./media_root")
    return settings


@pytest_asyncio.fixture
async def twilio() -> AsyncIterator[FakeTwilio]:
    async with FakeTwilio() as fake:
        yield fake


async def test_a_file_the_agent_makes_is_sent_on_whatsapp_with_the_default_relative_media_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    monkeypatch.chdir(tmp_path)
    write_then_send(llm)
    settings = relative_root_settings(
        OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="test-key", TALON_MODEL="openai:fake-model",
        TALON_MODEL_MAX_RETRIES=0, TALON_DATA_DIR=str(tmp_path / "data"), TWILIO_ACCOUNT_SID=twilio.account_sid,
        TWILIO_AUTH_TOKEN=twilio.auth_token, TWILIO_WHATSAPP_FROM=twilio.whatsapp_from,
        TWILIO_API_BASE_URL=twilio.base_url, TALON_PUBLIC_BASE_URL=PUBLIC, TALON_HTTP_HOST="127.0.0.1",
        TALON_HTTP_PORT=0, TALON_WHATSAPP_ALLOWED_NUMBERS=f"whatsapp:{WA_ALICE}")
    channel = WhatsAppChannel(settings, retry_base_s=0.01, media_drain_s=0.0)
    runtime = build_runtime(settings, [channel])
    await runtime.start()
    try:
        params = twilio.inbound_params(WA_ALICE, "make me the rain report")
        async with aiohttp.ClientSession() as session:
            hook = settings.whatsapp_webhook_path
            headers = {"X-Twilio-Signature": twilio.sign(PUBLIC + hook, params)}
            async with session.post(channel.http.local_url + hook, data=params, headers=headers) as resp:
                assert resp.status == 200
            sent = await twilio.wait_for_messages(2, to=WA_ALICE)
            [media] = [m for m in sent if m.media_urls]
            # Twilio fetches the link from Talon's server (the public host maps to it).
            async with session.get(channel.http.local_url + urlsplit(media.media_urls[0]).path) as resp:
                status, body = resp.status, await resp.read()
    finally:
        await runtime.stop()
    assert (status, body) == (200, REPORT.encode())
    assert settings.media_root == tmp_path / "media_root"  # made absolute once, when read
    assert (tmp_path / "media_root").is_dir() and not (tmp_path / "media_root" / "media_root").exists()


async def test_a_file_the_agent_makes_is_sent_on_telegram_with_the_default_relative_media_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    monkeypatch.chdir(tmp_path)
    write_then_send(llm)
    settings = relative_root_settings(
        TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_BASE_URL=tg.base_url, OPENAI_BASE_URL=llm.base_url,
        OPENAI_API_KEY="test-key", TALON_MODEL="openai:fake-model", TALON_DATA_DIR=str(tmp_path / "data"),
        TALON_TELEGRAM_ALLOWED_USERS=str(ALICE), TALON_TELEGRAM_POLL_TIMEOUT=1, TALON_MODEL_MAX_RETRIES=0,
        TALON_ACK_DELAY=0)
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "make me the rain report", user_id=ALICE))
        [call] = await tg.wait_for("sendDocument", lambda c: True, timeout=20)
    [upload] = call.files.values()
    assert upload.data == REPORT.encode() and upload.filename == "report.csv"


async def test_media_links_made_with_a_relative_root_are_served(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The link table is given the root as configured: relative, it still finds the file."""
    monkeypatch.chdir(tmp_path)
    workspace = tmp_path / "media_root" / "whatsapp" / "x"
    workspace.mkdir(parents=True)
    (workspace / "a.txt").write_text("hello")
    links = MediaLinks(MemoryMediaLinks(), Path("media_root"), PUBLIC, 60.0)
    with open(workspace / "a.txt", "rb") as fh:
        url = await links.add_file(Path("media_root/whatsapp/x/a.txt"), fh, "a.txt", "text/plain",
                                   root=Path("media_root/whatsapp/x"))
    app = web.Application()
    app.router.add_get(MediaLinks.route, links.handle)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        async with client.get(urlsplit(url).path) as resp:
            assert (resp.status, await resp.read()) == (200, b"hello")


# --- talon doctor runs the checks talon run makes ------------------------------------------------

def doctor_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI,
               **extra: str) -> dict[str, str]:
    env = {"TALON_MODEL": "openai:gpt-fake", "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key",
           "TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_BASE_URL": tg.base_url,
           "TALON_TELEGRAM_ALLOWED_USERS": "42", "TALON_TRANSCRIBER": "off", "TALON_MODEL_MAX_RETRIES": "0",
           "TALON_DATA_DIR": str(tmp_path / "data"), "TALON_MEDIA_ROOT": str(tmp_path / "media_root"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "TALON_SPEECH_WARMUP": "false",
           "TALON_MODEL_DISCOVERY": "false", **extra}
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {**{k: v for k, v in os.environ.items()}, **env}


def doctor_rows(out: str) -> dict[str, str]:
    return {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines() if "  " in line}


MONEY_CAP = ("TALON_LIMIT_PER_PERSON sets an amount of money, but the model 'gpt-fake' has no known price: set it "
             "in TALON_PRICES")


@pytest.fixture
def sync_fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def test_doctor_refuses_the_money_cap_that_run_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        sync_fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    from talon.cli import main

    tg, llm = sync_fakes
    doctor_env(monkeypatch, tmp_path, tg, llm)
    assert main(["doctor"]) == 0, capsys.readouterr()  # everything else is fine
    capsys.readouterr()
    monkeypatch.setenv("TALON_LIMIT_PER_PERSON", "$1/day")
    assert main(["doctor"]) == 1
    out = capsys.readouterr()
    rows = doctor_rows(out.out)
    # The caps row shows it (control_rows builds the caps as run does); the preflight row with the
    # same words is not repeated.
    areas = [area for area, value in rows.items() if value.startswith(f"INVALID: {MONEY_CAP}")]
    assert areas, out.out
    assert f"problems with {areas[0]}" in out.err


@pytest.mark.e2e
def test_run_refuses_the_same_money_cap_before_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = sync_fakes
    env = doctor_env(monkeypatch, tmp_path, tg, llm, TALON_LIMIT_PER_PERSON="$1/day")
    result = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"talon: cannot start: {MONEY_CAP}" in result.stderr
    assert [c.method for c in tg.calls] == []  # refused before any channel started


# --- Talon's notices are never the assistant's words in the model's request -----------------------

ANSWER = ("Tides come from the pull of the moon and, less, the sun. The water bulges towards the moon and on "
          "the far side too, so most coasts see two highs a day. Spring tides are the big ones. ") * 2


def assistant_texts(request: dict[str, Any]) -> list[str]:
    out = []
    for message in request["messages"]:
        if message["role"] == "assistant":
            content = message.get("content") or ""
            out.append(content if isinstance(content, str) else json.dumps(content))
    return out


async def test_the_stop_notice_reaches_the_model_as_talons_note_not_as_its_own_words(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.chunk_delay = 0.5  # a long answer, streamed: the person stops it half way
    llm.queue(ANSWER, "Fresh answer.")
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAM_INTERVAL=0.3,
                             TALON_MODEL_DISCOVERY=False)
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "tell me about tides", user_id=ALICE))
        await tg.wait_for("sendMessageDraft", lambda c: True, timeout=15)
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Stopped.", timeout=10)
        llm.chunk_delay = 0.0
        tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Fresh answer.", timeout=10)
        session = await runtime.sessions.load(ChatKey("telegram", str(ALICE)))
    [cut] = [m for m in session if m.meta.get("interrupted")]
    assert cut.text.endswith(STOPPED_NOTE)  # the person's transcript keeps it
    partial = cut.text[:-len(STOPPED_NOTE)].strip()
    assert partial and partial in ANSWER
    request = llm.requests[-1].json
    said = assistant_texts(request)
    assert said == [partial], said  # the model's own words, and nothing of Talon's
    assert all("stopped by the person" not in text for text in said)
    asked = json.dumps(request["messages"])
    assert "Note from Talon, not written by you" in asked and "stopped by the person" in asked


def test_every_notice_of_talons_leaves_the_assistants_words_in_the_view() -> None:
    """The three notices Talon writes into assistant messages (a stop, the step limit, an empty
    reply), and a log written before notices were marked: none is the assistant's in the view."""
    step_limit = "I stopped after 30 steps without finishing (the step limit is 30). Tell me how to continue."
    empty = "The model returned an empty reply. Please ask again or rephrase."
    log = [
        Message.user("one"), Message.assistant(f"Half an answer\n\n{STOPPED_NOTE}", interrupted=True,
                                               **{TALON_NOTICE: STOPPED_NOTE}),
        Message.user("two"), Message.assistant(step_limit, **{TALON_NOTICE: step_limit}),
        Message.user("three"), Message.assistant(empty, **{TALON_NOTICE: empty}),
        Message.user("four"), Message.assistant(STOPPED_NOTE, interrupted=True),  # an older log
        Message.user("five"),
    ]
    view = conversation_view(log)
    assistant = [m.text for m in view if m.role == "assistant"]
    assert assistant == ["Half an answer"]
    notes = [m.text for m in view if m.role == "user" and m.text.startswith("[Note from Talon")]
    assert len(notes) == 4 and "step limit" in notes[1] and "empty reply" in notes[2]
    assert [m.text for m in view if m.role == "user" and not m.text.startswith("[Note")] == [
        "one", "two", "three", "four", "five"]
