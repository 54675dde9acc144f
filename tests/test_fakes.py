"""The loopback fakes behave like the real APIs as seen through the real client libraries."""

from __future__ import annotations

import asyncio
import base64
import datetime as dtm
import io
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
import telegram
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from PIL import Image
from telegram.ext import Application, CommandHandler, ContextTypes, MessageHandler, filters

from tests.fakes import FakeOpenAI, FakeTelegram
from tests.fakes.openai_server import decode_data_url, image_urls, last_user_text

TOKEN = "123:abc"


def png(width: int = 64, height: int = 48, color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "blue").save(out, "JPEG")
    return out.getvalue()


@pytest_asyncio.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def bot(tg: FakeTelegram) -> AsyncIterator[telegram.Bot]:
    client = telegram.Bot(TOKEN, base_url=f"{tg.base_url}/bot",
                          base_file_url=f"{tg.base_url}/file/bot")
    async with client:
        yield client


@pytest_asyncio.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest_asyncio.fixture
async def client(llm: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=0) as c:
        yield c


def chat(text: str = "hi") -> Any:  # Any: the SDK's TypedDict unions are noise in tests
    return [{"role": "user", "content": text}]


# -- Telegram ------------------------------------------------------------------------------------


async def test_get_me_and_send_message(tg: FakeTelegram, bot: telegram.Bot) -> None:
    me = await bot.get_me()
    assert me.is_bot and me.username == "talon_test_bot"

    first = await bot.send_message(42, "hello")
    second = await bot.send_message(42, "123")
    assert (first.message_id, second.message_id) == (1, 2)
    assert first.text == "hello" and first.chat.id == 42 and first.date is not None

    calls = tg.sent("sendMessage", chat_id=42)
    # PTB urlencodes fields, JSON-encoding non-strings; free text stays text even when numeric.
    assert calls[0].content_type == "application/x-www-form-urlencoded"
    assert calls[0].params == {"chat_id": 42, "text": "hello"}
    assert calls[1].params["text"] == "123"
    assert tg.texts(42) == ["hello", "123"]


async def test_get_updates_long_polls_and_confirms_with_offset(
    tg: FakeTelegram, bot: telegram.Bot
) -> None:
    update = tg.text_message(7, "/start now", username="alice")

    async def push_later() -> None:
        await asyncio.sleep(0.3)
        tg.push_update(update)

    started = time.monotonic()
    pusher = asyncio.create_task(push_later())
    updates = await bot.get_updates(timeout=60, read_timeout=90)
    await pusher
    # answered when the update arrived, not when the 60 s long poll ran out
    assert 0.25 < time.monotonic() - started < 30

    [got] = updates
    assert isinstance(got.message, telegram.Message)
    assert got.message.text == "/start now" and got.message.chat.id == 7
    assert got.message.from_user is not None and got.message.from_user.username == "alice"
    assert got.message.entities[0].type == telegram.constants.MessageEntityType.BOT_COMMAND

    # Until confirmed the update is delivered again; an offset past it drops it.
    assert [u.update_id for u in await bot.get_updates(timeout=0)] == [got.update_id]
    assert await bot.get_updates(offset=got.update_id + 1, timeout=0) == ()
    assert tg.pending_updates == []


async def test_get_updates_times_out_empty_and_honours_allowed_updates(
    tg: FakeTelegram, bot: telegram.Bot
) -> None:
    started = time.monotonic()
    assert await bot.get_updates(timeout=1) == ()
    assert time.monotonic() - started >= 0.9

    tg.push_update({"callback_query": {"id": "1", "from": {"id": 1, "is_bot": False,
                                                            "first_name": "A"},
                                       "chat_instance": "x", "data": "d"}})
    tg.push_update(tg.text_message(1, "hi"))
    updates = await bot.get_updates(timeout=0, allowed_updates=["message"])
    assert [u.message.text for u in updates if u.message] == ["hi"] and len(updates) == 1


async def test_send_photo_captures_exact_bytes(tg: FakeTelegram, bot: telegram.Bot) -> None:
    image = png(64, 48)
    message = await bot.send_photo(5, photo=image, caption="a <b>red</b> box", parse_mode="HTML",
                                   filename="box.png")
    assert message.caption == "a <b>red</b> box"
    assert (message.photo[-1].width, message.photo[-1].height) == (64, 48)

    [call] = tg.sent("sendPhoto", chat_id=5)
    assert call.content_type == "multipart/form-data"
    [media] = call.media
    assert media.kind == "photo" and media.file is not None
    assert media.file.data == image
    assert media.file.filename == "box.png" and media.file.content_type == "image/png"
    assert (media.caption, media.parse_mode) == ("a <b>red</b> box", "HTML")


async def test_send_document_and_voice_are_captured(tg: FakeTelegram, bot: telegram.Bot) -> None:
    await bot.send_document(5, document=b"%PDF-1.4 fake", filename="report.pdf")
    await bot.send_voice(5, voice=b"OggS fake", filename="note.ogg", duration=3)
    kinds = [(m.kind, m.file.filename if m.file else None) for m in tg.media_sent(5)]
    assert kinds == [("document", "report.pdf"), ("voice", "note.ogg")]
    assert tg.sent("sendDocument")[0].files["document"].content_type == "application/pdf"


async def test_send_media_group_with_three_photos(tg: FakeTelegram, bot: telegram.Bot) -> None:
    images = [png(10 + i, 10, color) for i, color in enumerate(("red", "green", "blue"))]
    media = [telegram.InputMediaPhoto(data, caption=f"#{i}" if i == 0 else None)
             for i, data in enumerate(images)]
    messages = await bot.send_media_group(9, media=media)

    assert len(messages) == 3 and len({m.media_group_id for m in messages}) == 1
    [call] = tg.sent("sendMediaGroup")
    assert all(item["media"].startswith("attach://") for item in call.params["media"])
    sent = call.media
    assert [m.file.data for m in sent if m.file] == images
    assert [m.caption for m in sent] == ["#0", None, None]


async def test_media_group_rules_are_enforced(tg: FakeTelegram, bot: telegram.Bot) -> None:
    with pytest.raises(telegram.error.BadRequest, match="can't be mixed"):
        await bot.send_media_group(9, media=[telegram.InputMediaPhoto(png()),
                                             telegram.InputMediaDocument(b"doc")])


async def test_get_file_and_download(tg: FakeTelegram, bot: telegram.Bot) -> None:
    data = bytes(range(256)) * 1000  # several download chunks
    file_id = tg.add_file(data, file_path="documents/blob.bin", delay=0.2)
    started = time.monotonic()
    remote = await bot.get_file(file_id)
    assert remote.file_size == len(data) and remote.file_path is not None
    assert bytes(await remote.download_as_bytearray()) == data
    assert time.monotonic() - started >= 0.2
    assert tg.downloads == ["documents/blob.bin"]

    with pytest.raises(telegram.error.BadRequest, match="Invalid file_id"):
        await bot.get_file("nope")
    big = tg.add_file(b"", too_big=True, file_size=30 * 1024 * 1024)
    with pytest.raises(telegram.error.BadRequest, match="File is too big"):
        await bot.get_file(big)


async def test_photo_update_has_size_ladder_and_downloads(
    tg: FakeTelegram, bot: telegram.Bot
) -> None:
    original = jpeg(1600, 1200)
    tg.push_update(tg.photo_message(3, data=original, caption="look", media_group_id="g1"))
    [update] = await bot.get_updates(timeout=0)
    message = update.message
    assert message is not None and message.caption == "look" and message.media_group_id == "g1"
    widths = [p.width for p in message.photo]
    assert widths == sorted(widths) and widths[-1] == 1600 and len(widths) == 4

    out = io.BytesIO()
    await (await message.photo[-1].get_file()).download_to_memory(out)
    assert out.getvalue() == original
    thumb = await (await message.photo[0].get_file()).download_as_bytearray()
    with Image.open(io.BytesIO(bytes(thumb))) as image:
        assert max(image.size) == 90


async def test_other_update_builders_parse_in_ptb(
    tg: FakeTelegram, bot: telegram.Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")
    tg.push_update(tg.document_message(1, data=b"text", file_name="notes.txt"))
    tg.push_update(tg.voice_message(1, data=b"OggS", duration=4))
    tg.push_update(tg.audio_message(1, data=b"ID3", title="Song"))
    tg.push_update(tg.video_message(1, data=b"mp4"))
    tg.push_update(tg.video_note_message(1, data=b"mp4"))
    tg.push_update(tg.animation_message(1, data=b"mp4"))
    tg.push_update(tg.sticker_message(1, "🔥", is_video=True))
    tg.push_update(tg.text_message(-100123, "in group", user_id=77, chat_type="supergroup",
                                   reply_to=1))
    messages: list[Any] = [u.message for u in await bot.get_updates(timeout=0)]
    assert messages[0].document.mime_type == "text/plain"
    assert messages[1].voice.duration == dtm.timedelta(seconds=4)
    assert messages[2].audio.title == "Song"
    assert messages[3].video.width == 640
    assert messages[4].video_note.length == 240
    assert messages[5].animation is not None and messages[5].document is not None
    assert messages[6].sticker.emoji == "🔥" and messages[6].sticker.is_video
    group = messages[7]
    assert group.chat.type == "supergroup" and group.from_user.id == 77
    assert group.reply_to_message is not None and group.reply_to_message.message_id == 1


async def test_errors_surface_as_ptb_exceptions(
    tg: FakeTelegram, bot: telegram.Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # PTB 22 warns unless opted in to timedeltas
    tg.fail_next("sendMessage", 429, retry_after=3)
    with pytest.raises(telegram.error.RetryAfter) as caught:
        await bot.send_message(1, "x")
    assert caught.value.retry_after == dtm.timedelta(seconds=3)

    tg.fail_when("sendMessage", lambda p: p.get("parse_mode") == "HTML",
                 description="Bad Request: can't parse entities: Unsupported start tag")
    with pytest.raises(telegram.error.BadRequest, match="parse entities"):
        await bot.send_message(1, "<b>x</b>", parse_mode="HTML")
    await bot.send_message(1, "<b>x</b>", parse_mode="HTML")  # the rule fired once

    tg.drop_connection_next("sendChatAction")
    with pytest.raises(telegram.error.NetworkError):
        await bot.send_chat_action(1, "typing")

    assert [c.status for c in tg.sent("sendMessage", include_failed=True)] == [429, 400, 200]
    assert len(tg.sent("sendMessage")) == 1


async def test_limits_and_html_are_validated(tg: FakeTelegram, bot: telegram.Bot) -> None:
    with pytest.raises(telegram.error.BadRequest, match=r'(?i)unsupported start tag "br"'):
        await bot.send_message(1, "a<br>b", parse_mode="HTML")
    with pytest.raises(telegram.error.BadRequest, match=r"(?i)can't find end tag"):
        await bot.send_message(1, "<b>open", parse_mode="HTML")
    with pytest.raises(telegram.error.BadRequest, match="Message is too long"):
        await bot.send_message(1, "x" * 4097)
    # Markup does not count towards the limit; 2048 emoji are 4096 UTF-16 units.
    await bot.send_message(1, "<b>" + "x" * 4096 + "</b>", parse_mode="HTML")
    await bot.send_message(1, "😀" * 2048)
    with pytest.raises(telegram.error.BadRequest, match="Message is too long"):
        await bot.send_message(1, "😀" * 2049)
    with pytest.raises(telegram.error.BadRequest, match="caption is too long"):
        await bot.send_photo(1, png(), caption="c" * 1025)


async def test_edit_message_text(tg: FakeTelegram, bot: telegram.Bot) -> None:
    sent = await bot.send_message(1, "draft")
    edited = await bot.edit_message_text("final", chat_id=1, message_id=sent.message_id)
    assert isinstance(edited, telegram.Message) and edited.text == "final"
    with pytest.raises(telegram.error.BadRequest, match="not modified"):
        await bot.edit_message_text("final", chat_id=1, message_id=sent.message_id)
    with pytest.raises(telegram.error.BadRequest, match="not found"):
        await bot.edit_message_text("x", chat_id=1, message_id=999)


async def test_wrong_token_and_unknown_method(tg: FakeTelegram) -> None:
    wrong = telegram.Bot("999:zzz", base_url=f"{tg.base_url}/bot")
    with pytest.raises(telegram.error.InvalidToken):
        async with wrong:  # initialize() calls getMe; on failure PTB shuts the client down
            pass
    async with httpx.AsyncClient() as http:
        denied = await http.post(f"{tg.base_url}/bot999:zzz/getMe")
        unknown = await http.get(f"{tg.base_url}/bot{TOKEN}/fooBar", params={"a": "1"})
        via_json = await http.post(f"{tg.base_url}/bot{TOKEN}/sendmessage",
                                   json={"chat_id": "8", "text": "json body"})
    assert denied.status_code == 401
    assert denied.json() == {"ok": False, "error_code": 401, "description": "Unauthorized"}
    assert unknown.status_code == 404 and unknown.json()["description"] == "Not Found"
    assert via_json.json()["result"]["text"] == "json body"
    assert tg.texts(8) == ["json body"]


async def test_ptb_application_polls_and_replies(tg: FakeTelegram) -> None:
    app = (Application.builder().token(TOKEN).base_url(f"{tg.base_url}/bot")
           .base_file_url(f"{tg.base_url}/file/bot").build())

    async def start(update: telegram.Update, _: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None
        await update.message.reply_text("welcome")

    async def echo(update: telegram.Update, _: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        await update.message.reply_text("you said " + update.message.text)

    app.add_handler(CommandHandler("start", start))
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))
    async with app:
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0, timeout=5)
        tg.push_update(tg.text_message(5, "/start"))
        tg.push_update(tg.text_message(5, "hello"))
        await tg.wait_for("sendMessage", count=2, timeout=5)
        await app.updater.stop()
        await app.stop()
    assert tg.texts(5) == ["welcome", "you said hello"]
    assert tg.pending_updates == []  # the updater confirmed them on shutdown


async def test_get_updates_conflicts_with_a_webhook(tg: FakeTelegram, bot: telegram.Bot) -> None:
    await bot.set_webhook("https://example.invalid/hook")
    with pytest.raises(telegram.error.Conflict):
        await bot.get_updates(timeout=0)
    await bot.delete_webhook()
    assert await bot.get_updates(timeout=0) == ()


async def test_wait_for_returns_matches_or_explains_timeout(
    tg: FakeTelegram, bot: telegram.Bot
) -> None:
    async def send_later() -> None:
        await asyncio.sleep(0.1)
        await bot.send_message(1, "one")
        await bot.send_message(1, "two")

    task = asyncio.create_task(send_later())
    calls = await tg.wait_for("sendMessage", count=2, timeout=5)
    await task
    assert [c.params["text"] for c in calls] == ["one", "two"]

    with pytest.raises(TimeoutError, match="sendMessage"):
        await tg.wait_for("sendPhoto", timeout=0.2)


def test_telegram_fake_in_a_thread_with_sync_clients() -> None:
    with FakeTelegram(token=TOKEN) as tg:
        tg.push_update(tg.text_message(4, "from another thread"))
        with httpx.Client() as http:
            body = http.post(f"{tg.base_url}/bot{TOKEN}/getUpdates",
                             data={"timeout": "1"}).json()
            assert body["result"][0]["message"]["text"] == "from another thread"
            http.post(f"{tg.base_url}/bot{TOKEN}/sendMessage", data={"chat_id": "4", "text": "ok"})
        [call] = tg.wait_for_sync("sendMessage", timeout=5)
        assert call.params == {"chat_id": 4, "text": "ok"}


async def test_thread_mode_can_be_awaited_from_another_loop() -> None:
    tg = FakeTelegram(token=TOKEN).start_in_thread()
    try:
        client = telegram.Bot(TOKEN, base_url=f"{tg.base_url}/bot")
        async with client:
            await client.send_message(3, "cross-loop")
        [call] = await tg.wait_for("sendMessage", timeout=5)
        assert call.params["text"] == "cross-loop"
    finally:
        tg.stop_thread()


# -- OpenAI --------------------------------------------------------------------------------------


async def test_queued_text_reply(llm: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    llm.queue("scripted answer")
    completion = await client.chat.completions.create(model="gpt-fake", messages=chat())
    assert completion.choices[0].message.content == "scripted answer"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    [req] = llm.requests
    assert req.json["model"] == "gpt-fake" and req.end is not None and req.end >= req.start
    assert req.headers["Authorization"] == "Bearer x"


async def test_default_responder_echoes_and_helpers_read_content(
    llm: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    image = png()
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    completion = await client.chat.completions.create(model="m", messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is"},
                                     {"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": "this?"}]},
    ])
    assert completion.choices[0].message.content == "echo: what is\nthis?"
    [req] = llm.requests
    assert last_user_text(req) == req.last_user_text() == "what is\nthis?"
    assert image_urls(req) == [url]
    assert decode_data_url(url) == ("image/png", image)


async def test_tool_call_reply_parses(llm: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    llm.queue(FakeOpenAI.tool_call("read_file", {"path": "notes.md"}, id="call_1"),
              [FakeOpenAI.tool_call("a", {}), FakeOpenAI.tool_call("b", {"x": 1})],
              FakeOpenAI.reply("with usage", usage={"prompt_tokens": 99000}))
    first = await client.chat.completions.create(model="m", messages=chat())
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    # SDK 3.x types tool calls as function | custom; narrowing is required to read .function.
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.id == "call_1" and call.type == "function"
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "notes.md"}

    second = await client.chat.completions.create(model="m", messages=chat())
    names = [c.function.name for c in second.choices[0].message.tool_calls or []
             if isinstance(c, ChatCompletionMessageFunctionToolCall)]
    assert names == ["a", "b"]

    third = await client.chat.completions.create(model="m", messages=chat())
    assert third.usage is not None and third.usage.prompt_tokens == 99000


async def test_callable_replies_sync_and_async(llm: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    async def slow_upper(request: dict) -> str:
        await asyncio.sleep(0.01)
        return last_user_text(request).upper()

    llm.queue(lambda request: f"{len(request['messages'])} messages", slow_upper)
    one = await client.chat.completions.create(model="m", messages=chat())
    two = await client.chat.completions.create(model="m", messages=chat("shout"))
    assert one.choices[0].message.content == "1 messages"
    assert two.choices[0].message.content == "SHOUT"


async def test_errors_map_to_openai_exceptions(llm: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    llm.queue(FakeOpenAI.error(500, "boom"), FakeOpenAI.context_length_exceeded())
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=chat())
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=chat())
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length" in caught.value.message

    llm.streaming = False
    with pytest.raises(openai.BadRequestError, match="stream"):
        await client.chat.completions.create(model="m", messages=chat(), stream=True)


async def test_streaming_sends_text_tool_calls_and_usage_in_chunks(llm: FakeOpenAI,
                                                                     client: openai.AsyncOpenAI) -> None:
    llm.queue(FakeOpenAI.reply("A fairly long streamed answer, in pieces.",
                               [FakeOpenAI.tool_call("ls", {"path": "."})]))
    stream = await client.chat.completions.create(model="m", messages=chat(), stream=True,
                                                  stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 2 and "".join(texts) == "A fairly long streamed answer, in pieces."
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices
                   for tc in c.choices[0].delta.tool_calls or [])
    assert json.loads(args) == {"path": "."}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_sdk_retries_server_errors_by_default(llm: FakeOpenAI) -> None:
    llm.queue(FakeOpenAI.error(500, "flaky"), "recovered")
    async with openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=1) as retrying:
        completion = await retrying.chat.completions.create(model="m", messages=chat())
    assert completion.choices[0].message.content == "recovered"
    assert len(llm.requests) == 2
    assert llm.requests[1].headers.get("x-stainless-retry-count") == "1"


async def test_strict_mode_rejects_broken_conversations(
    llm: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    dangling: list[Any] = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_9", "type": "function",
                     "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "user", "content": "next"}]
    with pytest.raises(openai.BadRequestError, match="call_9"):
        await client.chat.completions.create(model="m", messages=dangling)

    orphan: list[Any] = [{"role": "user", "content": "hi"},
              {"role": "tool", "tool_call_id": "call_x", "content": "result"}]
    with pytest.raises(openai.BadRequestError, match="role 'tool'"):
        await client.chat.completions.create(model="m", messages=orphan)

    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    image_part = {"type": "image_url", "image_url": {"url": url}}
    image_in_tool: list[Any] = [
        *dangling[:2], {"role": "tool", "tool_call_id": "call_9", "content": [image_part]}]
    with pytest.raises(openai.BadRequestError, match="only allowed for messages with role 'user'"):
        await client.chat.completions.create(model="m", messages=image_in_tool)

    not_an_image = "data:image/png;base64," + base64.b64encode(b"plain text").decode()
    bad_image: list[Any] = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": not_an_image}}]}]
    with pytest.raises(openai.BadRequestError, match="unsupported image"):
        await client.chat.completions.create(model="m", messages=bad_image)

    ok: list[Any] = [*dangling[:2], {"role": "tool", "tool_call_id": "call_9", "content": "done"}]
    assert (await client.chat.completions.create(model="m", messages=ok)).choices


async def test_delay_lets_requests_overlap() -> None:
    async with FakeOpenAI(delay=0.3) as slow:
        async with openai.AsyncOpenAI(base_url=slow.base_url, api_key="x", max_retries=0) as c:
            await asyncio.gather(
                c.chat.completions.create(model="m", messages=chat("a")),
                c.chat.completions.create(model="m", messages=chat("b")),
            )
        first, second = slow.requests
    assert first.end is not None and second.end is not None
    assert first.end - first.start >= 0.3 and second.end - second.start >= 0.3
    assert first.start < second.end and second.start < first.end  # served concurrently


async def test_hang_holds_requests_until_release(
    llm: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    llm.hang = True
    task = asyncio.create_task(client.chat.completions.create(model="m", messages=chat("wait")))
    [req] = await llm.wait_for_requests(1, timeout=5)
    await asyncio.sleep(0.1)
    assert not task.done() and req.end is None
    llm.release()
    completion = await asyncio.wait_for(task, 5)
    assert completion.choices[0].message.content == "echo: wait"

    with pytest.raises(TimeoutError, match="waited for 5"):
        await llm.wait_for_requests(5, timeout=0.1)


async def test_models_and_transcription(llm: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    assert [m.id async for m in client.models.list()] == ["gpt-fake"]
    llm.transcription_text = "bonjour"
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=("voice.ogg", b"OggS-audio", "audio/ogg"), language="fr")
    assert result.text == "bonjour"
    [record] = llm.transcriptions
    assert record.file is not None and record.file.data == b"OggS-audio"
    assert record.file.filename == "voice.ogg"
    assert record.fields["model"] == "whisper-1" and record.fields["language"] == "fr"


def test_openai_fake_in_a_thread_with_sync_client() -> None:
    with FakeOpenAI(api_key="secret") as llm:
        llm.queue("threaded")
        with openai.OpenAI(base_url=llm.base_url, api_key="secret", max_retries=0) as sync:
            reply = sync.chat.completions.create(model="m", messages=chat())
            assert reply.choices[0].message.content == "threaded"
        with (openai.OpenAI(base_url=llm.base_url, api_key="wrong", max_retries=0) as denied,
              pytest.raises(openai.AuthenticationError)):
            denied.chat.completions.create(model="m", messages=chat())
        assert len(llm.wait_for_requests_sync(2, timeout=5)) == 2
