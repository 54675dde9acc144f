"""Webhooks under attack: a replayed Twilio request with a shifted MessageSid boundary, and
clients that send half a request and hang up."""

from __future__ import annotations

import asyncio
import logging

import pytest

from channels.http import HttpServer
from channels.whatsapp import checked_message_sid, parse_inbound
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.support.whatsapp import ALICE, HOOK, PUBLIC, post, running, settings, twilio  # noqa: F401
from talon.errors import MalformedWebhook

GOOD = "SM" + "0123456789abcdef" * 2


def test_message_sids_must_have_twilios_format_and_agree() -> None:
    base = {"From": f"whatsapp:{ALICE}", "NumMedia": "0"}
    assert checked_message_sid({**base, "MessageSid": GOOD, "SmsMessageSid": GOOD, "SmsSid": GOOD}) == GOOD
    assert parse_inbound({**base, "MessageSid": GOOD}).message_id == GOOD
    bad = {
        "shifted": {"MessageSid": GOOD + "NumMedia0"},
        "too short": {"MessageSid": GOOD[:-1]},
        "upper-case hex": {"MessageSid": GOOD.upper()},
        "other prefix": {"MessageSid": "XX" + GOOD[2:]},
        "copies disagree": {"MessageSid": GOOD, "SmsSid": "SM" + "f" * 32},
        "only a bad copy": {"SmsMessageSid": GOOD + "x"},
        "none": {},
    }
    for name, ids in bad.items():
        with pytest.raises(MalformedWebhook):
            parse_inbound({**base, **ids})
        assert name  # (the parametrisation, named for the failure message)


async def test_a_captured_webhook_with_a_shifted_sid_keeps_its_signature_but_gets_400(
    twilio: FakeTwilio, llm: FakeOpenAI, settings  # noqa: F811
) -> None:
    llm.queue("first answer")
    params = twilio.inbound_params(ALICE, "hello", message_sid=GOOD)
    async with running(settings) as (runtime, channel):
        assert (await post(channel, params, sign_with=twilio))[0] == 200
        await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
        signature = twilio.sign(PUBLIC + HOOK, params)
        statuses = []
        # Twilio signs URL + name1 + value1 + name2 + value2... with no separator, so moving the
        # boundary between MessageSid's value and the next name keeps the same signed string.
        names = sorted(params)
        for victim in ("MessageSid", "SmsSid", "SmsMessageSid"):
            nxt = names[names.index(victim) + 1]
            shifted = {k: v for k, v in params.items() if k != nxt}
            shifted[victim] = params[victim] + nxt + params[nxt]
            assert twilio.sign(PUBLIC + HOOK, shifted) == signature  # the forgery is "valid"
            statuses.append((await post(channel, shifted, signature=signature))[0])
        await asyncio.sleep(0.3)
        await runtime.bridge.idle()
        turns = runtime.bridge.turns_started
    assert statuses == [400, 400, 400]
    assert turns == 1 and len(llm.requests) == 1 and len(twilio.sent(ALICE)) == 1  # 0 extra turns


async def test_clients_that_hang_up_mid_body_get_one_short_warning_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(request):  # type: ignore[no-untyped-def]
        await request.post()
        raise AssertionError("never reached: the body never completes")

    server = HttpServer("127.0.0.1", 0)
    server.add_route("POST", "/hook", handler)
    await server.start()
    caplog.set_level(logging.DEBUG)
    try:
        for _ in range(200):
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                         b"Content-Length: 1000\r\n\r\nFrom=whatsapp%3A%2B1555&Body=half")
            await writer.drain()
            writer.close()
        await asyncio.sleep(1.0)
    finally:
        await server.stop()
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere
    warnings = [r.getMessage() for r in records if "closed the connection" in r.getMessage()]
    # Rate-limited: 200 aborted requests within a second are one line, not 200.
    assert 1 <= len(warnings) <= 2, warnings
    assert all(len(w) < 200 and "\n" not in w for w in warnings)
