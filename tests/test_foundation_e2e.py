"""End to end through the real python-telegram-bot and openai clients against loopback fakes."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from channels.telegram import TelegramChannel
from talon.config import Settings
from talon.content import Message
from tests.conftest import ALICE, BOB, MALLORY
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.support.telegram import texts_to


async def test_text_message_round_trip(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    llm.queue("Hello Alice, nice to meet you.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "hi, I am Alice", user_id=ALICE))
        [sent] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    assert last_user_text(llm.requests[0]) .endswith("hi, I am Alice")
    assert llm.requests[0].json["model"] == "fake-model"
    assert sent.params["text"] == "Hello Alice, nice to meet you."
    # the typing indicator was shown while the agent worked
    assert tg.sent("sendChatAction", chat_id=ALICE)


async def test_denied_user_gets_no_turn_and_log_says_how_to_allow(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(settings):
        tg.push_update(tg.text_message(MALLORY, "let me in", user_id=MALLORY, username="mallory"))
        tg.push_update(tg.text_message(ALICE, "after mallory", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    assert len(llm.requests) == 1
    assert "let me in" not in json.dumps(llm.requests[0].json)
    assert not tg.sent("sendMessage", chat_id=MALLORY)
    assert any("TALON_TELEGRAM_ALLOWED_USERS" in r.getMessage() and str(MALLORY) in r.getMessage()
               for r in caplog.records)


async def test_username_allowlist_and_group_chats_ignored(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings):
        tg.push_update(tg.text_message(-100, "group hello", user_id=ALICE, chat_type="group"))
        tg.push_update(tg.text_message(BOB, "bob here", user_id=BOB, username="Bob"))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(BOB))
    assert len(llm.requests) == 1
    assert last_user_text(llm.requests[0]).endswith("bob here")


async def test_chats_run_concurrently_and_one_chat_in_order(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    llm.delay = 0.6
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "alice one", user_id=ALICE))
        tg.push_update(tg.text_message(ALICE, "alice two", user_id=ALICE))
        tg.push_update(tg.text_message(BOB, "bob one", user_id=BOB, username="bob"))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2, timeout=15)
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(BOB), timeout=15)

    by_text = {last_user_text(r).split("\n")[-1]: r for r in llm.requests}
    a1, a2, b1 = by_text["alice one"], by_text["alice two"], by_text["bob one"]
    # one chat: strictly one turn at a time, in order
    assert a1.end <= a2.start
    # different chats: overlapping in time
    assert b1.start < a1.end and a1.start < b1.end
    replies = texts_to(tg, ALICE)
    assert replies == ["echo: alice one", "echo: alice two"]


async def test_model_outage_apologises_and_next_message_works(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    llm.queue(FakeOpenAI.error(500, "upstream exploded"))
    llm.queue("I am back.")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "first", user_id=ALICE))
        [apology] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
        assert "sorry" in apology.params["text"].lower()
        tg.push_update(tg.text_message(ALICE, "second", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2)
        assert replies[1].params["text"] == "I am back."
        session = runtime.sessions.thread_path(_chat(ALICE))
    lines = session.read_text().splitlines()
    messages = [Message.from_json(line) for line in lines]  # every line still parses
    assert [m.role for m in messages] == ["user", "user", "assistant"]
    # the history sent to the model on the second try holds both user messages
    assert "first" in json.dumps(llm.requests[-1].json)


async def test_refused_connection_and_timeout_apologise(tg: FakeTelegram, tmp_path: Path) -> None:
    from tests.conftest import make_settings

    # Nothing listens on this port: connection refused.
    settings = make_settings(tmp_path, tg.base_url, "http://127.0.0.1:9/v1")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "anyone there?", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    assert "couldn't reach" in reply.params["text"]


async def test_model_timeout_apologises(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MODEL_TIMEOUT=0.5)
    llm.delay = 3
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "slow?", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=15)
    assert "sorry" in reply.params["text"].lower()


async def test_long_reply_split_within_telegram_limit(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    paragraphs = [f"Paragraph {i}: " + ("word " * 150).strip() + " 😀" for i in range(14)]
    long_reply = "\n\n".join(paragraphs)
    assert len(long_reply) > 10_000
    llm.queue(long_reply)
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "write a lot", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=3)
        await asyncio.sleep(0.5)
    chunks = texts_to(tg, ALICE)
    assert all(len(c.encode("utf-16-le")) // 2 <= 4096 for c in chunks)
    # nothing lost: every paragraph arrives, whole, in order
    joined = "\n\n".join(chunks)
    assert [p for p in paragraphs if p in joined] == paragraphs


async def test_session_survives_restart(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "remember the word pineapple", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "what was the word?", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2)
    assert "pineapple" in json.dumps(llm.requests[-1].json)


async def test_tool_loop_runs_tools_and_respects_step_limit(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path
) -> None:
    from talon.agent.tools.registry import Tool, ToolResult
    from tests.conftest import make_settings

    class Add(Tool):
        name = "add"
        description = "add two numbers"
        parameters = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}

        async def run(self, args: dict) -> ToolResult:
            return ToolResult.text(str(args["a"] + args["b"]))

    # Strict order: in the default steer mode the second message would join the first turn.
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MAX_STEPS=3, TALON_BUSY_MODE="queue")
    llm.queue(FakeOpenAI.tool_call("add", {"a": 2, "b": 40}))
    llm.queue("The answer is 42.")
    for _ in range(5):
        llm.queue(FakeOpenAI.tool_call("add", {"a": 1, "b": 1}))
    async with running(settings) as runtime:
        runtime.agent.tools.add(Add())
        tg.push_update(tg.text_message(ALICE, "what is 2+40?", user_id=ALICE))
        tg.push_update(tg.text_message(ALICE, "loop forever", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2)
    assert replies[0].params["text"] == "The answer is 42."
    tool_msgs = [m for m in llm.requests[1].json["messages"] if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[0]["content"] == "42"
    assert "step limit" in replies[1].params["text"]
    assert len(llm.requests) == 2 + 3


async def test_polling_watchdog_restarts_stopped_polling(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings, watchdog_interval_s=0.2) as runtime:
        channel = runtime.channels[0]
        assert isinstance(channel, TelegramChannel)
        assert channel.app.updater is not None
        await channel.app.updater.stop()  # polling dies behind our back
        for _ in range(50):
            if channel.polling_restarts:
                break
            await asyncio.sleep(0.1)
        assert channel.polling_restarts >= 1
        tg.push_update(tg.text_message(ALICE, "still there?", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    assert reply.params["text"] == "echo: still there?"


async def test_redelivered_update_is_answered_once(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    update = tg.text_message(ALICE, "only once", user_id=ALICE)
    async with running(settings) as runtime:
        tg.push_update(update)
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
        duplicate = dict(update)
        duplicate.pop("update_id", None)
        tg.push_update(duplicate)  # same message, delivered again under a new update id
        tg.push_update(tg.text_message(ALICE, "next", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2)
        await runtime.bridge.idle()
    assert texts_to(tg, ALICE) == ["echo: only once", "echo: next"]


def _chat(chat_id: int):
    from talon.storage.sessions import ChatKey

    return ChatKey("telegram", str(chat_id))


async def test_transient_delivery_failure_is_retried_in_run(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings) as runtime:
        runtime.bridge.delivery_backoff_s = (0.2,)
        # more drops than the channel's own 3 tries: the bridge has to try the delivery again
        tg.drop_connection_next("sendMessage", times=4)
        tg.push_update(tg.text_message(ALICE, "through the storm", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=30)
        await runtime.bridge.idle()
        assert await runtime.inbox.pending() == []
    assert reply.params["text"] == "echo: through the storm"
    assert len(llm.requests) == 1  # the model was asked once; only the delivery was repeated


async def test_permanent_refusal_closes_the_message_and_chat_goes_on(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    async with running(settings) as runtime:
        tg.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
        tg.push_update(tg.text_message(ALICE, "first", user_id=ALICE))
        await llm.wait_for_requests(1)
        await runtime.bridge.idle()
        assert await runtime.inbox.pending() == []  # not retried forever
        tg.push_update(tg.text_message(ALICE, "second", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    assert reply.params["text"] == "echo: second"


async def test_new_and_status_commands(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    def to_alice(c) -> bool:
        return str(c.params.get("chat_id")) == str(ALICE)

    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "/status", user_id=ALICE))
        [status] = await tg.wait_for("sendMessage", to_alice)
        assert "openai:fake-model" in status.params["text"] and "approximate" in status.params["text"]
        tg.push_update(tg.text_message(ALICE, "remember: the cat is called Tom", user_id=ALICE))
        tg.push_update(tg.text_message(ALICE, "/status", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to_alice, count=3)
        assert "reported by the provider" in replies[2].params["text"]
        old = runtime.sessions.thread_path(_chat(ALICE))
        tg.push_update(tg.text_message(ALICE, "/new", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to_alice, count=4)
        assert "new conversation" in replies[3].params["text"].lower()
        tg.push_update(tg.text_message(ALICE, "what is the cat called?", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice, count=5)
        assert runtime.sessions.thread_path(_chat(ALICE)) != old
    assert len(llm.requests) == 2  # commands never reach the model
    assert "Tom" not in json.dumps(llm.requests[1].json)  # the fresh thread starts empty
    assert "Tom" in old.read_text()  # and the old one is kept on disk


async def test_bot_api_unreachable_at_start_is_waited_out(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    tg.drop_connection_next("getMe", times=2)  # the network is not up yet when Talon boots
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "morning", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE))
    assert reply.params["text"] == "echo: morning"
    assert len([c for c in tg.calls if c.method == "getMe"]) >= 3


async def test_a_turn_that_never_ends_gets_an_apology(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TURN_TIMEOUT=1.5, TALON_MODEL_TIMEOUT=600)
    llm.hang = True  # the model server accepts the request and never answers
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "are you stuck?", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=30)
        assert "took too long" in reply.params["text"]
        llm.hang = False
        llm.release()
        tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2)
        # (the unanswered message travels with it: consecutive user messages are merged)
        assert replies[1].params["text"].endswith("and now?")
        await runtime.bridge.idle()
        assert await runtime.inbox.pending() == []
