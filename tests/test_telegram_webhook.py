"""Telegram webhook mode, end to end: the real python-telegram-bot client against the Bot API fake,
Telegram's webhook requests posted by hand to Talon's own HTTP server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from channels.telegram import SECRET_HEADER, TelegramChannel
from talon.errors import ConfigError
from talon.runtime import build_runtime, configured_channels, shared_http_server
from tests.conftest import ALICE, MALLORY, make_settings
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.support.images import jpeg
from tests.support.telegram_webhook import SECRET, URL, wh_settings, running, post, update, to_alice


async def test_start_sets_the_webhook_with_the_secret_and_never_polls(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    llm.queue("Hello over the webhook.")
    async with running(wh_settings(tmp_path, tg, llm)) as (runtime, channel):
        assert tg.webhook_url == URL and tg.webhook_secret == SECRET
        assert tg.webhook_allowed_updates == ["message", "edited_message", "callback_query"]
        [call] = tg.sent("setWebhook")
        assert call.params.get("drop_pending_updates") is False
        assert channel.app.updater is not None and not channel.app.updater.running
        body = update(tg, 1, tg.text_message(ALICE, "hi via webhook", user_id=ALICE))
        status, _ = await post(channel, body)
        assert status == 200
        # 200 means the message is in the durable inbox
        assert await runtime.inbox.seen(f"telegram:{ALICE}:{body['message']['message_id']}")
        [sent] = await tg.wait_for("sendMessage", to_alice)
        await asyncio.sleep(0.3)
    assert sent.params["text"] == "Hello over the webhook."
    assert last_user_text(llm.requests[0]).endswith("hi via webhook")
    assert not tg.sent("getUpdates", include_failed=True)
    assert not tg.sent("deleteWebhook")
    assert tg.webhook_url == URL  # left set on stop: Telegram keeps updates until we are back


async def test_wrong_or_missing_secret_is_refused_without_processing(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(wh_settings(tmp_path, tg, llm)) as (runtime, channel):
        forged = update(tg, 1, tg.text_message(ALICE, "forged", user_id=ALICE))
        assert (await post(channel, forged, secret=None))[0] == 403
        assert (await post(channel, forged, secret="wrong"))[0] == 403
        assert (await post(channel, forged, secret=SECRET + "x"))[0] == 403
        assert (await post(channel, forged, secret=""))[0] == 403
        await asyncio.sleep(0.3)
        assert not llm.requests and not tg.sent("sendMessage")
        assert not await runtime.inbox.pending()
        # the same update with the right secret is then taken normally
        assert (await post(channel, forged))[0] == 200
        await tg.wait_for("sendMessage", to_alice)
    assert len(llm.requests) == 1
    assert any(SECRET_HEADER in r.getMessage() and "403" in r.getMessage() for r in caplog.records)
    assert not any(SECRET in r.getMessage() for r in caplog.records)


async def test_malformed_bodies_get_400_and_a_log_line(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(wh_settings(tmp_path, tg, llm)) as (_, channel):
        assert (await post(channel, b"{not json"))[0] == 400
        assert (await post(channel, b"\xff\xfe\x00"))[0] == 400
        assert (await post(channel, b"[1, 2]"))[0] == 400
        assert (await post(channel, {"message": {"text": "no update_id"}}))[0] == 400
        assert (await post(channel, {"update_id": 5, "message": {"text": "no chat or date"}}))[0] == 400
        # the wrong secret is refused before the body is looked at
        assert (await post(channel, b"{not json", secret="nope"))[0] == 403
        await asyncio.sleep(0.2)
    assert not llm.requests
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("channels.telegram")]
    assert any("not JSON" in m and "400" in m for m in messages)
    assert any("not an update" in m for m in messages)
    assert any("message has no message_id, date, chat" in m for m in messages)


async def test_a_retried_update_is_answered_once(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.queue("Only once.")
    async with running(wh_settings(tmp_path, tg, llm)) as (_, channel):
        body = update(tg, 7, tg.text_message(ALICE, "say it once", user_id=ALICE))
        assert (await post(channel, body))[0] == 200
        assert (await post(channel, body))[0] == 200  # Telegram's retry
        await tg.wait_for("sendMessage", to_alice)
        assert (await post(channel, body))[0] == 200  # and one after the turn finished
        await asyncio.sleep(0.5)
    assert len(llm.requests) == 1
    assert tg.texts(ALICE) == ["Only once."]


async def test_no_200_until_the_inbox_has_the_message(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    """A failure to store the message answers 500, so Telegram's retry delivers it later."""
    async with running(wh_settings(tmp_path, tg, llm)) as (runtime, channel):
        real_submit = runtime.bridge.submit
        failures = iter([OSError("disk full")])

        def flaky_submit(message: Any) -> bool:
            exc = next(failures, None)
            if exc is not None:
                raise exc
            return real_submit(message)

        runtime.bridge.submit = flaky_submit  # type: ignore[method-assign]
        body = update(tg, 3, tg.text_message(ALICE, "store me", user_id=ALICE))
        assert (await post(channel, body))[0] == 500
        assert not await runtime.inbox.pending() and not llm.requests
        assert (await post(channel, body))[0] == 200  # the retry
        await tg.wait_for("sendMessage", to_alice)
    assert len(llm.requests) == 1


async def test_album_items_are_answered_after_the_album_is_submitted(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    async with running(wh_settings(tmp_path, tg, llm)) as (runtime, channel):
        bodies = [update(tg, 10 + i, tg.photo_message(ALICE, data=jpeg(64, 48, colour), media_group_id="g1",
                                                      caption="two" if i == 0 else None))
                  for i, colour in enumerate([(255, 0, 0), (0, 0, 255)])]
        results = await asyncio.gather(*(post(channel, body) for body in bodies))
        assert [status for status, _ in results] == [200, 200]
        # both answers came after the album reached the inbox
        assert await runtime.inbox.seen(f"telegram:{ALICE}:{bodies[0]['message']['message_id']}")
        await tg.wait_for("sendMessage", to_alice, timeout=20)
    assert len(llm.requests) == 1 and "two" in last_user_text(llm.requests[0])


async def test_denied_user_over_the_webhook_gets_no_turn(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    async with running(wh_settings(tmp_path, tg, llm)) as (_, channel):
        status, _ = await post(channel, update(tg, 1, tg.text_message(MALLORY, "let me in", user_id=MALLORY)))
        assert status == 200  # handled: Telegram must not retry it
        await asyncio.sleep(0.3)
    assert not llm.requests


async def test_missing_or_invalid_webhook_settings_fail_closed(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    cases = [
        ({"TALON_TELEGRAM_WEBHOOK_SECRET": ""}, "TALON_TELEGRAM_WEBHOOK_SECRET"),
        ({"TALON_TELEGRAM_WEBHOOK_SECRET": "has spaces"}, "TALON_TELEGRAM_WEBHOOK_SECRET"),
        ({"TALON_TELEGRAM_WEBHOOK_SECRET": "é" * 8}, "TALON_TELEGRAM_WEBHOOK_SECRET"),
        ({"TALON_TELEGRAM_WEBHOOK_SECRET": "a" * 257}, "TALON_TELEGRAM_WEBHOOK_SECRET"),
        ({"TALON_TELEGRAM_WEBHOOK_SECRET": "ok\n"}, "TALON_TELEGRAM_WEBHOOK_SECRET"),
        ({"TALON_TELEGRAM_WEBHOOK_URL": "http://talon.example.com/hook"}, "TALON_TELEGRAM_WEBHOOK_URL"),
        ({"TALON_TELEGRAM_WEBHOOK_URL": "talon.example.com/hook"}, "TALON_TELEGRAM_WEBHOOK_URL"),
        ({"TALON_TELEGRAM_WEBHOOK_PATH": "telegram"}, "TALON_TELEGRAM_WEBHOOK_PATH"),
    ]
    for extra, setting in cases:
        settings = wh_settings(tmp_path, tg, llm, **extra)
        with pytest.raises(ConfigError) as info:
            TelegramChannel(settings)
        assert info.value.missing == [setting], extra
        assert setting in str(info.value)
        with pytest.raises(ConfigError):
            configured_channels(settings)
    # the longest allowed secret and every allowed character are fine
    TelegramChannel(wh_settings(tmp_path, tg, llm, TALON_TELEGRAM_WEBHOOK_SECRET="aZ09_-" * 42 + "abcd"))
    # no webhook URL: long polling, and the secret is not needed
    polling = make_settings(tmp_path, tg.base_url, llm.base_url)
    assert not polling.telegram_webhook_mode and TelegramChannel(polling).http is None


async def test_back_to_polling_deletes_the_webhook_and_polls(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    llm.queue("webhook answer", "polling answer")
    async with running(wh_settings(tmp_path, tg, llm)) as (_, channel):
        assert (await post(channel, update(tg, 1, tg.text_message(ALICE, "first", user_id=ALICE))))[0] == 200
        await tg.wait_for("sendMessage", to_alice)
    assert tg.webhook_url == URL
    # a message sent while Talon was switching over waits at Telegram and must not be dropped
    tg.push_update(tg.text_message(ALICE, "second", user_id=ALICE))
    async with running(make_settings(tmp_path, tg.base_url, llm.base_url)) as (_, channel):
        assert channel.http is None
        await tg.wait_for("sendMessage", to_alice, count=2)
        [delete] = tg.sent("deleteWebhook")
        assert not delete.params.get("drop_pending_updates")
    assert tg.webhook_url == ""
    assert tg.texts(ALICE) == ["webhook answer", "polling answer"]
    assert all(call.status == 200 for call in tg.sent("getUpdates", include_failed=True))


async def test_shared_http_server_is_started_for_telegram_webhooks_alone(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    settings = wh_settings(tmp_path, tg, llm)
    assert not settings.whatsapp_configured()
    http = shared_http_server(settings)
    assert http is not None
    [channel] = configured_channels(settings, http)
    assert isinstance(channel, TelegramChannel) and channel.http is http
    runtime = build_runtime(settings, [channel], http=http)
    llm.queue("shared server works")
    await runtime.start()
    try:
        assert http.running
        assert (await post(channel, update(tg, 1, tg.text_message(ALICE, "hello", user_id=ALICE))))[0] == 200
        await tg.wait_for("sendMessage", to_alice)
    finally:
        await runtime.stop()
    assert not http.running
    # polling only: nothing needs to listen
    assert shared_http_server(make_settings(tmp_path, tg.base_url, llm.base_url)) is None


async def test_webhook_check_logs_telegram_delivery_errors(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(wh_settings(tmp_path, tg, llm), webhook_check_s=0.05):
        tg.webhook_last_error = "Connection timed out"
        await tg.wait_for("getWebhookInfo")
        await asyncio.sleep(0.2)
    assert any("Connection timed out" in r.getMessage() for r in caplog.records)
