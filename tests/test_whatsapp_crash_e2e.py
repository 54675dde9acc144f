"""SIGKILL while WhatsApp messages wait for the 24-hour window, then a restart: `talon run` as a real
process against the fake Twilio (driven by the real twilio client) and the fake model. Nothing
that waited is lost: after the person writes, it all arrives, in order, before the new answer."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.process import start_talon as start
from tests.support.zygote import TalonProcess
from tests.support.ports import free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio

PUBLIC = "https://talon.example.test"
HOOK = "/twilio/whatsapp"
ALICE = "+15550001111"
REOPEN = "HX" + "a" * 32
LONG = "\n\n".join(f"Paragraph {i}: " + "words " * 60 for i in range(1, 13))  # several WhatsApp messages


@pytest.fixture
def fakes() -> Iterator[tuple[FakeTwilio, FakeOpenAI]]:
    with FakeTwilio() as twilio, FakeOpenAI() as llm:
        yield twilio, llm


def wait_ready(url: str, proc: TalonProcess, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("Talon did not become ready:\n" + log.read_text())


def say(twilio: FakeTwilio, local: str, text: str) -> str:
    """Post a message from Alice; its inbox key."""
    params = twilio.inbound_params(ALICE, text)
    resp = httpx.post(local + HOOK, data=params, timeout=10,
                      headers={"X-Twilio-Signature": twilio.sign(PUBLIC + HOOK, params)})
    assert resp.status_code == 200, resp.text
    return f"whatsapp:{ALICE}:{params['MessageSid']}"


def inbox_status(data: Path, key: str) -> str | None:
    """The message's status in the embedded inbox, read as another process would."""
    path = data / "inbox.sqlite3"
    if not path.is_file():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT status FROM inbox WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None
    finally:
        conn.close()


def test_sigkill_while_messages_wait_for_the_window_loses_none(
        tmp_path: Path, fakes: tuple[FakeTwilio, FakeOpenAI]) -> None:
    twilio, llm = fakes
    port = free_port()
    local = f"http://127.0.0.1:{port}"
    env = {
        "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key", "TALON_MODEL": "openai:fake-model",
        "TALON_MODEL_DISCOVERY": "false", "TALON_MODEL_MAX_RETRIES": "0", "TALON_ACK_DELAY": "0",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_LOG_LEVEL": "INFO", "TALON_SPEECH_WARMUP": "false",
        "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": twilio.auth_token,
        "TWILIO_WHATSAPP_FROM": twilio.whatsapp_from, "TWILIO_API_BASE_URL": twilio.base_url,
        "TALON_PUBLIC_BASE_URL": PUBLIC, "TALON_HTTP_HOST": "127.0.0.1", "TALON_HTTP_PORT": str(port),
        "TALON_WHATSAPP_ALLOWED_NUMBERS": ALICE, "TALON_WHATSAPP_TEMPLATE_REOPEN": REOPEN,
    }
    # The answer to the first question is refused for the window (63016): it waits, a template goes.
    twilio.fail_next(400, 63016, "Failed to send freeform message because you are outside the allowed window.",
                     when=lambda fields: "ContentSid" not in fields)
    llm.queue(LONG)
    proc, log = start(tmp_path, env, "first.log")
    try:
        wait_ready(local, proc, log)
        first = say(twilio, local, "tell me everything")
        [template] = twilio.wait_for_messages_sync(1, to=ALICE, timeout=60)
        assert template.content_sid == REOPEN
        from talon.storage.embedded.whatsapp import SqliteWhatsAppStore

        def waiting() -> int:
            store = SqliteWhatsAppStore(tmp_path / "data" / "whatsapp.sqlite3")
            try:
                return int(asyncio.run(store.pending_count(ALICE)))
            finally:
                store.runner.close()

        # The message is closed in the inbox once its parts are safe in the WhatsApp store: kill
        # then (a kill before that replays the turn, as for any reply part sent but not recorded).
        deadline = time.monotonic() + 30
        while inbox_status(tmp_path / "data", first) != "done":
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        held = waiting()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert held >= 2, log.read_text()
    llm.queue("Here is the short answer.")
    proc, log = start(tmp_path, env, "second.log")
    try:
        wait_ready(local, proc, log)
        say(twilio, local, "and now?")
        sent = twilio.wait_for_messages_sync(1 + held + 1, to=ALICE, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    bodies = [m.body for m in sent[1:]]
    assert bodies[-1] == "Here is the short answer.", bodies
    assert bodies[0].startswith("Paragraph 1:") and "Paragraph 12:" in bodies[-2], bodies
    assert len(twilio.sent(to=ALICE)) == 1 + held + 1  # nothing twice
