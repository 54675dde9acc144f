"""A very long reply becomes its head plus reply.md, and an upload that timed out is tried once
more, never again and again."""

from __future__ import annotations

import logging

import pytest

import channels.telegram as telegram_module
import channels.telegram.api as telegram_api
from channels.whatsapp import ReplyDocumentPart
from channels.whatsapp import plan_parts as whatsapp_parts
from talon.config import Limits, Settings
from talon.envelope import OutboundReply
from tests.conftest import ALICE
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.conftest import running_telegram as running
from tests.support.images import png_file as png
from tests.support.telegram import root
from tests.support.whatsapp import ALICE as WA_ALICE
from tests.support.whatsapp import fetch, post, settings as wa_settings_fixture, twilio  # noqa: F401
from tests.support.whatsapp import running as wa_running
def huge_reply() -> str:
    paragraph = "Lorem ipsum dolor sit amet, **consectetur** adipiscing elit. " * 12 + "\n\n"
    return ("# Report\n\n" + paragraph * (1_000_000 // len(paragraph)))[:1_000_000]


def to_alice(call: object) -> bool:
    return str(getattr(call, "params").get("chat_id")) == str(ALICE)


async def test_a_1_mb_reply_is_a_few_messages_and_reply_md_on_telegram(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    text = huge_reply()
    llm.queue(text)
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "write a lot", user_id=ALICE))
        # A deadline, not a wait: streaming and rendering 1 MB takes seconds alone, far more when
        # the machine's two cores are shared with other runs.
        [doc] = await tg.wait_for("sendDocument", to_alice, timeout=180)
    messages = tg.sent("sendMessage", chat_id=ALICE)
    assert len(messages) <= Limits().telegram_reply_max_messages  # not 245
    assert len(messages) == 1 and messages[0].params["text"].startswith("<b>Report</b>")
    [upload] = doc.files.values()
    assert upload.filename == "reply.md" and upload.data.decode("utf-8") == text  # the whole reply
    assert f"{len(text):,} characters" in doc.params["caption"] and len(text) > 999_000


def test_short_replies_are_untouched_and_the_threshold_is_a_setting() -> None:
    eight = "\n\n".join(f"part {i} " + "x" * 3000 for i in range(8))
    limits = Limits(whatsapp_reply_max_messages=5)
    parts = whatsapp_parts(OutboundReply(text=eight), limits)
    assert any(isinstance(p, ReplyDocumentPart) for p in parts) and len(parts) == 3
    assert not any(isinstance(p, ReplyDocumentPart) for p in whatsapp_parts(OutboundReply(text=eight),
                                                                           Limits(whatsapp_reply_max_messages=50)))
    # Without a public URL no file can go: then every message is sent, nothing is lost.
    assert not any(isinstance(p, ReplyDocumentPart)
                   for p in whatsapp_parts(OutboundReply(text=eight), limits, can_attach=False))
    short = telegram_module.plan_parts(OutboundReply(text="short answer"), Limits())
    assert short == [telegram_module.TextPart("short answer")]


async def test_a_1_mb_reply_is_a_few_messages_and_reply_md_on_whatsapp(
    twilio: FakeTwilio, llm: FakeOpenAI, wa_settings_fixture: Settings  # noqa: F811
) -> None:
    text = huge_reply()
    llm.queue(text)
    async with wa_running(wa_settings_fixture) as (runtime, channel):
        await post(channel, twilio.inbound_params(WA_ALICE, "write a lot"), sign_with=twilio)
        await twilio.wait_for_messages(3, to=WA_ALICE, timeout=180)
        await runtime.bridge.idle()
        sent = twilio.sent(WA_ALICE)
        [with_file] = [m for m in sent if m.media_urls]
        status, headers, body = await fetch(channel, with_file.media_urls[0])
    assert len(sent) == 3  # head, a note, reply.md (not 600 messages of 1600 characters)
    assert status == 200 and body.decode("utf-8") == text
    assert "reply.md" in headers["Content-Disposition"]


async def test_a_photo_upload_that_timed_out_is_retried_once_then_reported(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(telegram_api, "UPLOAD_BASE_TIMEOUT_S", 0.5)
    png(root(settings) / "chart.png")
    tg.response_delay["sendPhoto"] = 2.0  # Telegram has the photo; its answer comes too late
    llm.queue("![chart](chart.png)\n\nAnd the text goes on.")
    with caplog.at_level(logging.WARNING):
        async with running(settings):
            tg.push_update(tg.text_message(ALICE, "chart please", user_id=ALICE))
            await tg.wait_for("sendMessage", lambda c: to_alice(c) and "Could not attach" in c.params["text"],
                              timeout=30)
    uploads = [c for c in tg.calls if c.method == "sendPhoto"]
    assert len(uploads) == 2  # the first try and one retry: never 4
    assert any("may have arrived; retrying once" in r.getMessage() for r in caplog.records)
    lines = [c.params["text"] for c in tg.sent("sendMessage", chat_id=ALICE)]
    assert any("the upload timed out twice" in line for line in lines)
    assert not [c for c in tg.calls if c.method == "sendDocument"]  # no fallback re-upload
