"""Start-up and shutdown: what was pending is answered once its channel is up, and nothing in
flight or buffered is lost or doubled when Talon stops."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from channels.telegram import TelegramChannel
from talon.config import Settings
from talon.envelope import InboundMessage, RemoteFile
from talon.storage.embedded.inbox import SqliteInbox
from talon.runtime import build_runtime, configured_channels, shared_http_server
from tests.conftest import ALICE, TOKEN
from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.conftest import running_telegram as running
from tests.support.images import jpeg
from tests.support.whatsapp import ALICE as WA_ALICE
from tests.support.whatsapp import twilio, wa_settings  # noqa: F401 - fixture


def to_alice(call) -> bool:  # type: ignore[no-untyped-def]
    return str(call.params.get("chat_id")) == str(ALICE)


async def test_pending_message_waits_until_its_channel_has_started(
    twilio: FakeTwilio, tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Both channels configured: Telegram starts first and talks to its API, and a WhatsApp message
    # left pending by the last run must not be handled by a WhatsApp channel that has not started.
    caplog.set_level(logging.WARNING)
    settings = wa_settings(tmp_path, twilio, llm, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_BASE_URL=tg.base_url,
                           TALON_TELEGRAM_POLL_TIMEOUT=1)
    settings.ensure_dirs()
    photo = twilio.add_media(jpeg(40, 40), "image/jpeg")
    inbox = SqliteInbox(settings.data_dir / "inbox.sqlite3")
    await inbox.add(InboundMessage(channel="whatsapp", chat_id=WA_ALICE, sender_id=WA_ALICE, message_id="SM1",
                             text="what is this?",
                             files=[RemoteFile(kind="photo", source=photo, mime="image/jpeg", name="p.jpg")]))
    await inbox.close()
    http = shared_http_server(settings)
    runtime = build_runtime(settings, configured_channels(settings, http), http=http)
    await runtime.start()
    try:
        await twilio.wait_for_messages(1, to=WA_ALICE, timeout=15)
        await runtime.bridge.idle()
        assert await runtime.inbox.status("whatsapp:%s:SM1" % WA_ALICE) == "done"
    finally:
        await runtime.stop()
    assert len(image_urls(llm.requests[0])) == 1  # the photo was downloaded, not lost to a notice
    assert not [r for r in caplog.records if "not started" in r.getMessage() or r.exc_info]


async def test_album_buffered_when_talon_stops_is_answered_after_restart(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    # Polling confirms every update it fetched when it stops, so Telegram will not send these again.
    async with running(settings) as runtime:
        channel = runtime.channels[0]
        assert isinstance(channel, TelegramChannel)
        for i, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
            tg.push_update(tg.photo_message(ALICE, data=jpeg(64, 48, colour), media_group_id="album-9",
                                            caption="two colours" if i == 0 else None))
        for _ in range(100):
            album = next(iter(channel.intake.albums_gathering()), None)
            if album is not None and len(album.files) == 2:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the album never reached the channel")
        # stop while the album is still being gathered
    assert not tg.pending_updates
    assert not llm.requests
    async with running(settings) as runtime:
        await tg.wait_for("sendMessage", to_alice, timeout=20)
        await runtime.bridge.idle()
    assert len(llm.requests) == 1
    assert "two colours" in last_user_text(llm.requests[0])
    assert len(image_urls(llm.requests[0])) == 2


async def test_stop_mid_turn_leaves_the_message_pending_and_it_is_answered_once(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    llm.hang = True
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "first", user_id=ALICE))
        tg.push_update(tg.text_message(ALICE, "second", user_id=ALICE))
        await llm.wait_for_requests(1, timeout=20)
        pending = [item.message.text for item in await runtime.inbox.pending()]
        assert pending == ["first", "second"]
    llm.release()
    # Stopping cancelled the turn cleanly: no traceback, no delivery through a stopped channel.
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert not tg.sent("sendMessage", chat_id=ALICE)
    async with running(settings) as runtime:
        await tg.wait_for("sendMessage", to_alice, count=2, timeout=20)
        await runtime.bridge.idle()
        assert not await runtime.inbox.pending()
    assert [c.params["text"] for c in tg.sent("sendMessage", chat_id=ALICE)] == ["echo: first", "echo: second"]


async def test_a_message_stopped_mid_turn_many_times_is_still_answered_not_given_up(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    # A turn cut short by a stop (or, with many workers, a lost lease) is not the message's fault:
    # it gives its attempt back, so four stops in a row do not use up the three attempts.
    llm.hang = True
    tg.push_update(tg.text_message(ALICE, "patience", user_id=ALICE))
    for run in range(1, 5):
        async with running(settings) as runtime:
            await llm.wait_for_requests(run, timeout=20)
            item = (await runtime.inbox.pending())[0]
            assert item.message.text == "patience"
            assert item.attempts <= 2, item  # counted, and given back at every stop
    llm.release()
    async with running(settings) as runtime:
        await tg.wait_for("sendMessage", to_alice, timeout=20)
        await runtime.bridge.idle()
        assert not await runtime.inbox.pending()
    assert [c.params["text"] for c in tg.sent("sendMessage", chat_id=ALICE)] == ["echo: patience"]


async def test_stop_while_a_reply_is_being_sent_lets_it_finish_and_never_sends_it_twice(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    tg.response_delay["sendMessage"] = 1.0  # Telegram has the message; its answer is on the way
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice, timeout=20)
        # stop now, before the answer arrived and the part was recorded
    tg.response_delay.clear()
    async with running(settings) as runtime:
        await asyncio.sleep(0.5)
        await runtime.bridge.idle()
        assert not await runtime.inbox.pending()
    assert [c.params["text"] for c in tg.sent("sendMessage", chat_id=ALICE)] == ["echo: hello"]
