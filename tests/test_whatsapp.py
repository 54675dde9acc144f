"""WhatsApp through Twilio, end to end: signed webhooks posted to Talon's own HTTP server, the real
twilio client sending replies to a loopback fake of the Messages API, media downloaded from the
fake's media host, outbound files fetched back from Talon's tokenized media URLs, and the real
openai client talking to the fake model."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import secrets
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from PIL import Image

from channels.whatsapp import MediaHosts, MediaPart, TextPart, WhatsAppChannel, parse_inbound, plan_parts
from tests.pdfs import pdf_bytes
from talon.config import Limits, Settings
from talon.envelope import OutboundReply
from talon.errors import ConfigError, MalformedWebhook
from talon.media import MarkdownMediaRef
from tests.fakes.openai_server import FakeOpenAI, decode_data_url, image_urls, last_user_text
from tests.fakes.twilio import FakeTwilio, SentMessage
from tests.support.images import jpeg, png, wav
from tests.support.whatsapp import ALICE, BOB, EVE, HOOK, PUBLIC, alice_workspace, fetch, post, running, wa_settings
from tests.support.whatsapp import settings, twilio  # noqa: F401  (fixtures)

FIXTURES = Path(__file__).parent / "fixtures"


def pdf() -> bytes:
    return pdf_bytes([None])


def media_messages(messages: list[SentMessage]) -> list[SentMessage]:
    return [m for m in messages if m.media_urls]


# --- text in, text out ------------------------------------------------------------------------


async def test_signed_text_message_gets_a_reply(twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings) -> None:
    llm.queue("Hello *Alice*, nice to meet you.")
    llm.delay = 3.0  # the webhook must be answered long before the model is
    async with running(settings) as (_, channel):
        params = twilio.inbound_params(ALICE, "hi, I am Alice", profile_name="Alice")
        status, ctype, body = await post(channel, params, sign_with=twilio)
        # Twilio already has its answer while the turn is still waiting for the model.
        answered_before_the_turn = not twilio.messages and all(r.end is None for r in llm.requests)
        [reply] = await twilio.wait_for_messages(1, to=ALICE)
    assert status == 200 and ctype.startswith("text/xml") and "<Response/>" in body
    assert answered_before_the_turn
    assert last_user_text(llm.requests[0]).endswith("hi, I am Alice")
    assert reply.to == f"whatsapp:{ALICE}" and reply.from_ == twilio.whatsapp_from
    assert reply.body == "Hello _Alice_, nice to meet you."  # markdown italic -> WhatsApp italic
    assert reply.media_urls == ()
    assert reply.status_callback == f"{PUBLIC}{HOOK}/status"


async def test_bad_signature_is_403_and_no_turn(twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with running(settings) as (runtime, channel):
        params = twilio.inbound_params(ALICE, "let me in")
        forged = twilio.sign(PUBLIC + HOOK, params, auth_token="not-the-token")
        wrong_url = twilio.sign("https://elsewhere.example" + HOOK, params)
        tampered = dict(params, Body="something else")
        results = [
            await post(channel, params, signature=forged),
            await post(channel, params, signature=wrong_url),
            await post(channel, params),  # no signature at all
            await post(channel, tampered, signature=twilio.sign(PUBLIC + HOOK, params)),
        ]
        await asyncio.sleep(0.3)
        await runtime.bridge.idle()
        assert [r[0] for r in results] == [403, 403, 403, 403]
        assert llm.requests == [] and twilio.messages == []
        assert runtime.bridge.turns_started == 0
        # the very same message, properly signed, is then accepted (nothing was recorded for it)
        assert (await post(channel, params, sign_with=twilio))[0] == 200
        await twilio.wait_for_messages(1, to=ALICE)
    assert any("X-Twilio-Signature" in r.getMessage() and "403" in r.getMessage() for r in caplog.records)


async def test_other_account_is_403(twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings) as (runtime, channel):
        params = twilio.inbound_params(ALICE, "hi", account_sid="AC" + "0" * 32)
        assert (await post(channel, params, sign_with=twilio))[0] == 403
        await runtime.bridge.idle()
    assert llm.requests == []


async def test_malformed_webhooks_are_400(twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    good = twilio.inbound_params(ALICE, "hi")
    no_from = {k: v for k, v in good.items() if k != "From"}
    no_sid = {k: v for k, v in good.items() if k not in ("MessageSid", "SmsMessageSid", "SmsSid")}
    bad_count = dict(good, NumMedia="two")
    missing_url = dict(good, NumMedia="1")
    async with running(settings) as (runtime, channel):
        statuses = [(await post(channel, p, sign_with=twilio))[0]
                    for p in (no_from, no_sid, bad_count, missing_url)]
        await runtime.bridge.idle()
    assert statuses == [400, 400, 400, 400]
    assert llm.requests == []
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for reason in ("no From", "no MessageSid", "NumMedia='two'", "MediaUrl0 is missing"):
        assert reason in logged


async def test_replayed_message_sid_is_answered_once_also_after_restart(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    params = twilio.inbound_params(ALICE, "only once please")
    async with running(settings) as (runtime, channel):
        assert (await post(channel, params, sign_with=twilio))[0] == 200
        assert (await post(channel, params, sign_with=twilio))[0] == 200  # Twilio's retry
        await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
    async with running(settings) as (runtime, channel):
        status, _, body = await post(channel, params, sign_with=twilio)
        assert status == 200 and "<Response/>" in body
        await asyncio.sleep(0.3)
        await runtime.bridge.idle()
        assert runtime.bridge.turns_started == 0
    assert len(llm.requests) == 1
    assert len(twilio.sent(ALICE)) == 1


async def test_unknown_sender_is_ignored_and_log_says_how_to_allow(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(settings) as (runtime, channel):
        status, _, _ = await post(channel, twilio.inbound_params(EVE, "let me in"), sign_with=twilio)
        await post(channel, twilio.inbound_params(BOB, "bob here"), sign_with=twilio)
        await twilio.wait_for_messages(1, to=BOB)
    assert status == 200
    assert len(llm.requests) == 1 and "let me in" not in str(llm.requests[0].json)
    assert twilio.sent(EVE) == []
    assert any("TALON_WHATSAPP_ALLOWED_NUMBERS" in r.getMessage() and EVE in r.getMessage()
               for r in caplog.records)


# --- media in ---------------------------------------------------------------------------------


async def test_photo_and_voice_note_reach_the_model(twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings) -> None:
    photo = jpeg(1200, 900)
    photo_url = twilio.add_media(photo, "image/jpeg", redirect=True)  # media URL -> CDN, like Twilio
    voice_url = twilio.add_media((FIXTURES / "speech_fox.ogg").read_bytes(), "audio/ogg")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "what colour is this?",
                                                  media=[(photo_url, "image/jpeg")]), sign_with=twilio)
        await twilio.wait_for_messages(1, to=ALICE)
        await post(channel, twilio.inbound_params(ALICE, media=[(voice_url, "audio/ogg")]), sign_with=twilio)
        await twilio.wait_for_messages(2, to=ALICE, timeout=120)

    first = llm.requests[0]
    assert "what colour is this?" in last_user_text(first)
    [url] = image_urls(first)
    mime, data = decode_data_url(url)
    assert mime == "image/jpeg" and data == photo

    heard = last_user_text(llm.requests[1]).lower()
    for word in ("quick", "brown", "fox"):
        assert word in heard, heard

    media_fetch, cdn_fetch, voice_fetch = twilio.media_fetches
    assert media_fetch.authorized and media_fetch.status == 307
    assert cdn_fetch.path.startswith("/cdn/") and cdn_fetch.status == 200
    assert not cdn_fetch.authorized  # credentials never follow a redirect
    assert voice_fetch.authorized and voice_fetch.status == 200


async def test_media_from_a_host_not_allowed_is_refused_with_a_notice(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    # Reachable, but not an allowed host: "localhost" is not the host of TWILIO_API_BASE_URL.
    registered = twilio.add_media(jpeg(50, 50), "image/jpeg")
    elsewhere = registered.replace("127.0.0.1", "localhost")
    redirected = twilio.add_media(jpeg(50, 50), "image/jpeg",
                                  redirect=f"http://localhost:{twilio.port}/cdn/x")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "look", media=[(elsewhere, "image/jpeg")]),
                   sign_with=twilio)
        await twilio.wait_for_messages(1, to=ALICE)
        await post(channel, twilio.inbound_params(ALICE, "and this", media=[(redirected, "image/jpeg")]),
                   sign_with=twilio)
        await twilio.wait_for_messages(2, to=ALICE)
    for req in llm.requests:
        text = last_user_text(req)
        assert "localhost" in text and "not an allowed media host" in text
        assert image_urls(req) == []
    # the first was never fetched at all; the second only up to its redirect
    assert [(f.path.startswith("/2010-04-01/"), f.status) for f in twilio.media_fetches] == [(True, 307)]


async def test_oversized_media_is_cut_during_download(twilio: FakeTwilio, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = wa_settings(tmp_path, twilio, llm, TALON_DOWNLOAD_MAX_BYTES=50_000)
    url = twilio.add_media(b"%PDF-1.4\n" + b"0" * 200_000, "application/pdf")
    async with running(settings) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "read this", media=[(url, "application/pdf")]),
                   sign_with=twilio)
        await twilio.wait_for_messages(1, to=ALICE)
        assert list((runtime.store.root / "tmp").iterdir()) == []
    assert "download limit" in last_user_text(llm.requests[0])


# --- media out --------------------------------------------------------------------------------


async def test_reply_with_pdf_and_png_sends_two_media_messages_with_exact_bytes(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    root = alice_workspace(settings)
    root.mkdir(parents=True, exist_ok=True)
    report, chart = pdf(), png()
    (root / "report.pdf").write_bytes(report)
    (root / "chart.png").write_bytes(chart)
    llm.queue("Here you go: ![r](report.pdf) ![c](chart.png)")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "send me the files"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        fetched = [await fetch(channel, m.media_urls[0]) for m in media_messages(sent)]
    assert sent[0].body == "Here you go:" and not sent[0].media_urls
    pdf_msg, png_msg = media_messages(sent)
    assert len(pdf_msg.media_urls) == len(png_msg.media_urls) == 1
    assert pdf_msg.body == "" and png_msg.body == ""
    (s1, h1, b1), (s2, h2, b2) = fetched
    assert (s1, b1, h1["Content-Type"]) == (200, report, "application/pdf")
    assert (s2, b2, h2["Content-Type"]) == (200, chart, "image/png")
    assert 'filename="report.pdf"' in h1["Content-Disposition"]
    assert 'filename="chart.png"' in h2["Content-Disposition"]
    # unguessable: 32 random bytes per link, one link per file
    tokens = [urlsplit(m.media_urls[0]).path.split("/")[2] for m in (pdf_msg, png_msg)]
    assert len(set(tokens)) == 2 and all(len(t) >= 43 for t in tokens)


async def test_single_image_takes_the_text_as_caption_but_a_document_does_not(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    root = alice_workspace(settings)
    root.mkdir(parents=True, exist_ok=True)
    (root / "chart.png").write_bytes(png())
    (root / "notes.pdf").write_bytes(pdf())
    # named like an image, but a PDF: goes as a document, so its caption goes first as text
    (root / "scan.jpg").write_bytes(pdf())
    llm.queue("The **chart** ![c](chart.png)", "Your scan ![s](scan.jpg)")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "chart?"), sign_with=twilio)
        [captioned] = await twilio.wait_for_messages(1, to=ALICE)
        await post(channel, twilio.inbound_params(ALICE, "scan?"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        _, headers, _ = await fetch(channel, sent[2].media_urls[0])
    assert captioned.body == "The *chart*" and len(captioned.media_urls) == 1
    assert sent[1].body == "Your scan" and not sent[1].media_urls
    assert sent[2].body == "" and headers["Content-Type"] == "application/pdf"


async def test_large_image_is_reencoded_and_voice_goes_as_ogg_opus(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    root = alice_workspace(settings)
    root.mkdir(parents=True, exist_ok=True)
    noise = Image.effect_noise((1800, 1400), 90).convert("RGB")
    big = io.BytesIO()
    noise.save(big, "PNG")
    assert big.tell() > Limits().whatsapp_image_max_bytes
    (root / "big.png").write_bytes(big.getvalue())
    (root / "answer.wav").write_bytes(wav())
    llm.queue("![photo](big.png) ![voice reply](answer.wav)")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "go"), sign_with=twilio)
        sent = await twilio.wait_for_messages(2, to=ALICE)
        (s1, h1, image), (s2, h2, voice) = [await fetch(channel, m.media_urls[0]) for m in sent]
    assert s1 == 200 and h1["Content-Type"] == "image/jpeg"
    assert len(image) <= Limits().whatsapp_image_max_bytes
    with Image.open(io.BytesIO(image)) as im:
        assert im.format == "JPEG"
    assert s2 == 200 and h2["Content-Type"] == "audio/ogg"
    assert voice.startswith(b"OggS") and b"OpusHead" in voice[:200]
    assert 'filename="answer.ogg"' in h2["Content-Disposition"]


async def test_refs_that_cannot_be_sent_become_could_not_attach_lines(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    alice_workspace(settings)
    (tmp_path / "secret.txt").write_text("top secret")
    llm.queue("Files: ![a](../secret.txt) ![b](missing.png)")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "files?"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
    bodies = [m.body for m in sent]
    assert bodies[0] == "Files:"
    assert bodies[1] == "Could not attach secret.txt: paths with '..' are not allowed"
    assert bodies[2] == "Could not attach missing.png: no such file in this chat's workspace"
    assert not any(m.media_urls for m in sent)
    assert str(tmp_path) not in "".join(bodies)


async def test_media_token_expires_and_made_up_tokens_are_404(
    twilio: FakeTwilio, llm: FakeOpenAI, tmp_path: Path
) -> None:
    settings = wa_settings(tmp_path, twilio, llm, TALON_MEDIA_URL_TTL=1)
    alice_workspace(settings)
    (alice_workspace(settings) / "chart.png").write_bytes(png())
    llm.queue("![c](chart.png)")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "chart"), sign_with=twilio)
        [msg] = await twilio.wait_for_messages(1, to=ALICE)
        url = msg.media_urls[0]
        assert (await fetch(channel, url))[0] == 200
        assert (await fetch(channel, url.rsplit("/", 1)[0] + "/other.png"))[0] == 404
        assert (await fetch(channel, f"{PUBLIC}/media/{secrets.token_urlsafe(32)}/chart.png"))[0] == 404
        await asyncio.sleep(1.2)
        assert (await fetch(channel, url))[0] == 404


async def test_file_sent_just_before_stop_is_still_served_to_twilio(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    # Twilio fetches a MediaUrl after the message was created; Talon stopping right then must not
    # leave it a refused connection (error 11200, a file that silently never arrives).
    alice_workspace(settings)
    chart = png()
    (alice_workspace(settings) / "chart.png").write_bytes(chart)
    llm.queue("![c](chart.png)")
    async with contextlib.AsyncExitStack() as stack:
        runtime, channel = await stack.enter_async_context(running(settings, media_drain_s=120.0))
        await post(channel, twilio.inbound_params(ALICE, "chart"), sign_with=twilio)
        [msg] = await twilio.wait_for_messages(1, to=ALICE)
        base = channel.http.local_url
        stopping = asyncio.create_task(runtime.stop())
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as session:
            async with session.get(base + urlsplit(msg.media_urls[0]).path) as resp:
                status, body = resp.status, await resp.read()
        started = time.monotonic()
        await stopping
        # fetched: no need to wait out the 120 s drain (not a speed test)
        assert time.monotonic() - started < 60
        stack.pop_all()  # stopped already
    assert (status, body) == (200, chart)


async def test_file_in_a_refused_message_is_not_waited_for_at_stop(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    alice_workspace(settings)
    (alice_workspace(settings) / "chart.png").write_bytes(png())
    twilio.fail_next(400, 63016, "Failed to send freeform message because you are outside the allowed window.")
    llm.queue("![c](chart.png)")
    async with contextlib.AsyncExitStack() as stack:
        runtime, channel = await stack.enter_async_context(running(settings, media_drain_s=120.0))
        await post(channel, twilio.inbound_params(ALICE, "chart"), sign_with=twilio)
        await asyncio.sleep(0.2)
        await runtime.bridge.idle()
        assert [m.status for m in twilio.messages] == [400]
        assert channel.links is not None and await channel.links.count() == 0  # the link was withdrawn
        started = time.monotonic()
        stack.pop_all()
        await runtime.stop()
        # Not a speed test: waiting for the withdrawn link would take the whole 120 s drain.
        assert time.monotonic() - started < 60


async def test_file_swapped_after_sending_is_not_served(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    alice_workspace(settings)
    chart = alice_workspace(settings) / "chart.png"
    chart.write_bytes(png())
    (tmp_path / "outside.png").write_bytes(png(10, 10))
    llm.queue("![c](chart.png)")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "chart"), sign_with=twilio)
        [msg] = await twilio.wait_for_messages(1, to=ALICE)
        chart.unlink()
        chart.symlink_to(tmp_path / "outside.png")  # now points outside the media root
        assert (await fetch(channel, msg.media_urls[0]))[0] == 404


async def test_delivery_resumes_after_the_parts_already_sent(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    alice_workspace(settings)
    (alice_workspace(settings) / "chart.png").write_bytes(png())
    reply = OutboundReply("first " * 200 + "\n\n" + "second " * 200,
                          [MarkdownMediaRef("c", "chart.png")], ["a notice"])
    progress: list[int] = []

    async def on_part(parts: int) -> None:
        progress.append(parts)

    async with running(settings) as (_, channel):
        assert len(channel.reply_parts(reply)) == 4
        await channel.deliver(ALICE, reply, skip_parts=2, on_part=on_part)
        sent = await twilio.wait_for_messages(2, to=ALICE)
    assert progress == [3, 4]
    assert len(sent[0].media_urls) == 1 and sent[1].body == "a notice"
    assert "first" not in "".join(m.body for m in sent)


# --- long replies and errors ------------------------------------------------------------------


async def test_4000_character_reply_arrives_as_three_messages_code_block_whole(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings
) -> None:
    p1 = "Intro. " + " ".join(f"alpha{i}" for i in range(120))
    code_lines = [f"value_{i} = compute({i}) * 2  # step" for i in range(28)]
    code = "```python\n" + "\n".join(code_lines) + "\n```"
    p2 = "**Bold middle** " + " ".join(f"beta{i}" for i in range(70))
    p3 = "Outro " + " ".join(f"gamma{i}" for i in range(400))
    reply = "\n\n".join([p1, code, p2, p3])[:4000]
    assert len(reply) == 4000
    llm.queue(reply)
    async with running(settings) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "write a lot"), sign_with=twilio)
        await twilio.wait_for_messages(3, to=ALICE)
        await runtime.bridge.idle()
    bodies = [m.body for m in twilio.sent(ALICE)]
    assert len(bodies) == 3
    assert all(len(b) <= 1600 for b in bodies)
    assert all(b.count("```") % 2 == 0 for b in bodies)  # no fence left open
    [with_code] = [b for b in bodies if "```" in b]
    assert "\n".join(code_lines) in with_code  # the whole block in one message
    assert "*Bold middle*" in "".join(bodies)
    assert bodies[0].startswith("Intro.") and "gamma" in bodies[-1]


async def test_429_and_500_are_retried(twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings) -> None:
    twilio.fail_next(429)
    twilio.fail_next(500)
    llm.queue("made it")
    async with running(settings) as (_, channel):
        await post(channel, twilio.inbound_params(ALICE, "hello"), sign_with=twilio)
        [reply] = await twilio.wait_for_messages(1, to=ALICE)
    assert reply.body == "made it"
    assert [m.status for m in twilio.messages] == [429, 500, 201]
    assert len(llm.requests) == 1


async def test_outside_24_hour_window_is_logged_clearly_and_kept_not_retried(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    twilio.fail_next(400, 63016, "Failed to send freeform message because you are outside the allowed "
                                 "window. If you want to send messages outside this window, use a Template.")
    llm.queue("a long answer\n\n" + "x" * 1700)  # two parts: the second is not even tried
    async with running(settings) as (runtime, channel):
        params = twilio.inbound_params(ALICE, "hi")
        await post(channel, params, sign_with=twilio)
        await runtime.bridge.idle()
        # the message is done for the inbox (not retried on every restart): its parts wait for the
        # window in the WhatsApp store instead of being lost (issue 33; test_whatsapp_window.py)
        assert await runtime.inbox.status(f"whatsapp:{ALICE}:{params['MessageSid']}") == "done"
        assert await channel.state.pending_count(ALICE) == 3  # the refused part and the rest
        # Twilio may also report it later, on the status callback; a bad signature is refused
        status = {"MessageSid": "SM" + "1" * 32, "MessageStatus": "undelivered", "ErrorCode": "63016",
                  "To": f"whatsapp:{ALICE}", "From": twilio.whatsapp_from, "AccountSid": twilio.account_sid,
                  "SmsStatus": "undelivered", "ApiVersion": "2010-04-01"}
        assert (await post(channel, status, path=f"{HOOK}/status", sign_with=twilio))[0] == 200
        assert (await post(channel, status, path=f"{HOOK}/status", signature="bogus"))[0] == 403
    assert [m.status for m in twilio.messages] == [400]
    window_logs = [r for r in caplog.records if "63016" in r.getMessage()]
    assert any("24-hour" in r.getMessage() and ALICE in r.getMessage() for r in window_logs)
    # without a template the owner is told, as an error, that the message waits
    assert any(r.levelno == logging.ERROR and "TALON_WHATSAPP_TEMPLATE_REOPEN" in r.getMessage()
               for r in caplog.records)


async def test_other_refusals_are_not_retried_and_logged(
    twilio: FakeTwilio, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    twilio.fail_next(400, 21617, "The concatenated message body exceeds the 1600 character limit.")
    llm.queue("first part\n\n" + "y" * 1590)
    async with running(settings) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "hi"), sign_with=twilio)
        await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
    # the refused part is skipped (logged), the next one still goes
    assert [m.status for m in twilio.messages] == [400, 201]
    assert any("21617" in r.getMessage() and ALICE in r.getMessage() for r in caplog.records)


# --- configuration ----------------------------------------------------------------------------


def test_refuses_to_start_without_auth_token_or_public_url(tmp_path: Path) -> None:
    base = dict(TWILIO_ACCOUNT_SID="AC" + "1" * 32, TWILIO_WHATSAPP_FROM="whatsapp:+14155238886",
                TALON_MEDIA_ROOT=str(tmp_path / "m"), TALON_DATA_DIR=str(tmp_path / "d"))
    with pytest.raises(ConfigError) as err:
        WhatsAppChannel(Settings(_env_file=None, **base))  # type: ignore[arg-type]
    assert set(err.value.missing) == {"TWILIO_AUTH_TOKEN", "TALON_PUBLIC_BASE_URL"}
    assert "X-Twilio-Signature" in str(err.value)
    with pytest.raises(ConfigError) as err:
        WhatsAppChannel(Settings(_env_file=None, **base, TWILIO_AUTH_TOKEN="t"))  # type: ignore[arg-type]
    assert err.value.missing == ["TALON_PUBLIC_BASE_URL"]
    with pytest.raises(ConfigError) as err:
        WhatsAppChannel(Settings(_env_file=None, **base, TALON_PUBLIC_BASE_URL=PUBLIC))  # type: ignore[arg-type]
    assert err.value.missing == ["TWILIO_AUTH_TOKEN"]
    with pytest.raises(ConfigError) as err:
        WhatsAppChannel(Settings(_env_file=None, TWILIO_ACCOUNT_SID="AC1"))  # type: ignore[arg-type]
    assert err.value.missing == ["TWILIO_WHATSAPP_FROM"]


async def test_insecure_flag_starts_with_a_warning_and_skips_the_signature(
    twilio: FakeTwilio, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    settings = wa_settings(tmp_path, twilio, llm, TALON_PUBLIC_BASE_URL="",
                           TALON_WHATSAPP_INSECURE_NO_SIGNATURE=True)
    alice_workspace(settings)
    (alice_workspace(settings) / "chart.png").write_bytes(png())
    llm.queue("unsigned but answered ![c](chart.png)")
    async with running(settings) as (_, channel):
        assert (await post(channel, twilio.inbound_params(ALICE, "no signature")))[0] == 200
        sent = await twilio.wait_for_messages(2, to=ALICE)
    assert sent[0].body == "unsigned but answered" and sent[0].status_callback is None
    assert sent[1].body == "Could not attach chart.png: this server cannot send files (it has no public URL)"
    assert any("INSECURE_NO_SIGNATURE" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


def test_configured_channels_includes_whatsapp(tmp_path: Path) -> None:
    from talon.runtime import configured_channels

    settings = Settings(_env_file=None, TWILIO_ACCOUNT_SID="AC" + "1" * 32,  # type: ignore[arg-type]
                        TWILIO_AUTH_TOKEN="t", TWILIO_WHATSAPP_FROM="+14155238886",
                        TALON_PUBLIC_BASE_URL=PUBLIC, TALON_HTTP_PORT=0)
    [channel] = configured_channels(settings)
    assert isinstance(channel, WhatsAppChannel) and channel.sender == "whatsapp:+14155238886"


# --- pure pieces ------------------------------------------------------------------------------


def test_parse_inbound_maps_media_kinds_and_location() -> None:
    form = {"From": "whatsapp:+1 555 000 1111", "MessageSid": "MM" + "a" * 32, "NumMedia": "4",
            "Body": "", "ProfileName": "Alice",
            "MediaUrl0": "https://api.twilio.com/a", "MediaContentType0": "image/jpeg",
            "MediaUrl1": "https://api.twilio.com/b", "MediaContentType1": "audio/ogg; codecs=opus",
            "MediaUrl2": "https://api.twilio.com/c", "MediaContentType2": "video/mp4",
            "MediaUrl3": "https://api.twilio.com/d", "MediaContentType3": "application/pdf",
            "Latitude": "52.52", "Longitude": "13.40", "Address": "Berlin"}
    message = parse_inbound(form)
    assert message.chat_id == ALICE and message.sender_name == "Alice"
    assert [f.kind for f in message.files] == ["photo", "voice", "video", "document"]
    assert message.files[1].mime == "audio/ogg" and message.files[1].name.endswith(".ogg")
    assert "52.52, 13.40" in message.text and "Berlin" in message.text
    with pytest.raises(MalformedWebhook):
        parse_inbound(dict(form, NumMedia="11"))
    with pytest.raises(MalformedWebhook):
        parse_inbound(dict(form, MediaUrl2="file:///etc/passwd"))


def test_media_hosts_and_where_credentials_go() -> None:
    hosts = MediaHosts("", "https://api.twilio.com")
    assert hosts.allows("https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1")
    assert hosts.allows("https://mms.twiliocdn.com/AC1/abc?Expires=1")
    assert not hosts.allows("http://mms.twiliocdn.com/AC1/abc")  # https only
    assert not hosts.allows("https://evil.example/x") and not hosts.allows("https://169.254.169.254/")
    assert hosts.takes_credentials("https://api.twilio.com/2010-04-01/x")
    assert not hosts.takes_credentials("https://mms.twiliocdn.com/x")
    custom = MediaHosts("*.media.example, cdn.example", "http://127.0.0.1:8000")
    assert custom.allows("https://a.media.example/x") and custom.allows("https://cdn.example/x")
    assert not custom.allows("https://mms.twiliocdn.com/x")  # the setting replaces the defaults
    assert custom.allows("http://127.0.0.1:8000/x") and custom.takes_credentials("http://127.0.0.1:8000/x")
    assert not custom.takes_credentials("https://cdn.example/x")


def test_plan_parts_is_a_function_of_the_reply() -> None:
    limits = Limits()
    chart = MarkdownMediaRef("c", "chart.png")
    doc = MarkdownMediaRef("d", "report.pdf")
    assert plan_parts(OutboundReply("Look", [chart]), limits) == [MediaPart(chart, "Look")]
    assert plan_parts(OutboundReply("Look", [doc]), limits) == [TextPart("Look"), MediaPart(doc)]
    assert plan_parts(OutboundReply("A", [chart, doc], ["note"]), limits)[1:] == [
        MediaPart(chart), MediaPart(doc), plan_parts(OutboundReply("", [], ["note"]), limits)[0]]
    long = "word " * 400
    assert [type(p) for p in plan_parts(OutboundReply(long, [chart]), limits)] == [TextPart, TextPart, MediaPart]
