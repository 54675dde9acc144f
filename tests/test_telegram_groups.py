"""Telegram groups and forum topics, end to end through the fake Bot API and the real
python-telegram-bot and openai clients (issue 12)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from channels.telegram import TelegramChannel
from talon.storage.sessions import ChatKey
from talon.config import Settings
from talon.runtime import build_runtime
from tests.conftest import ALICE, BOB, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import Call, FakeTelegram

GROUP = -1001234567890  # a listed supergroup
FORUM = -1009876543210  # a listed forum supergroup
UNLISTED = -1005550001111
CAROL = 333  # a member of the groups, in no allowlist
BOT = "@talon_test_bot"


@pytest.fixture
def settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> Settings:
    return make_settings(tmp_path, tg.base_url, llm.base_url,
                         TALON_TELEGRAM_ALLOWED_CHATS=f"{GROUP}, {FORUM}")




def in_group(tg: FakeTelegram, text: str, *, chat: int = GROUP, user: int = CAROL,
             first_name: str = "Carol", username: str | None = "carol", **extra: Any) -> dict[str, Any]:
    return tg.text_message(chat, text, user_id=user, username=username, first_name=first_name,
                           chat_type="supergroup", chat_title="Trip planning", **extra)


def to(chat: int) -> Any:
    return lambda c: str(c.params.get("chat_id")) == str(chat)


def png(color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


def system_text(request: Any) -> str:
    return next(m["content"] for m in request.json["messages"] if m["role"] == "system")


async def test_unlisted_group_gets_no_turn_and_the_log_names_it(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with running(settings):
        tg.push_update(tg.text_message(UNLISTED, f"{BOT} hello?", user_id=ALICE, chat_type="supergroup",
                                       chat_title="Strangers"))
        tg.push_update(tg.text_message(ALICE, "and in private", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
    assert [last_user_text(r) for r in llm.requests] == ["and in private"]
    assert not tg.sent(chat_id=UNLISTED)  # no pairing code, no answer, nothing
    logged = [r.getMessage() for r in caplog.records if str(UNLISTED) in r.getMessage()]
    assert logged and "TALON_TELEGRAM_ALLOWED_CHATS" in logged[0] and "Strangers" in logged[0]


async def test_only_addressed_messages_are_turns_and_they_name_the_speaker(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    llm.queue("The Louvre opens at 9.", "On Sunday too.")
    async with running(settings):
        tg.push_update(in_group(tg, "anyone up for lunch?"))
        tg.push_update(in_group(tg, "/new@some_other_bot"))
        tg.push_update(in_group(tg, f"{BOT} which museum opens first?", user=ALICE, first_name="Alice",
                                username="alice"))
        [answer] = await tg.wait_for("sendMessage", to(GROUP))
        tg.push_update(in_group(tg, "thanks! and on Sunday?", user=BOB, first_name="Bob", username="bob",
                                reply_to=answer.result["message_id"]))
        await tg.wait_for("sendMessage", to(GROUP), count=2)
    assert len(llm.requests) == 2
    first, second = (last_user_text(r) for r in llm.requests)
    assert first.endswith(f"[Alice (@alice)]: {BOT} which museum opens first?")
    # a reply to the bot is a turn too, and says who is speaking now
    assert second.startswith("[Bob (@bob)]: (In reply to you:\n> The Louvre opens at 9.\n)")
    assert second.endswith("thanks! and on Sunday?")
    # what was said to no one came along once, as untrusted chatter, never as a turn of its own
    assert "UNTRUSTED GROUP CHATTER" in first and "[Carol (@carol)]: anyone up for lunch?" in first
    assert "/new@some_other_bot" in first and "anyone up for lunch" not in second
    # the system prompt says where the agent is and how to read the labels
    prompt = system_text(llm.requests[0])
    assert 'Telegram group "Trip planning"' in prompt and "Several people" in prompt


async def test_text_mention_and_commands_address_the_bot(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    bot_id = tg.bot_user["id"]
    async with running(settings):
        tg.push_update(in_group(tg, "who is cooking tonight?", user=BOB, first_name="Bob", username=None))
        tg.push_update(in_group(tg, f"/status@{BOT[1:]}"))
        [status] = await tg.wait_for("sendMessage", to(GROUP))
        # a text_mention (a name linked to the bot's user, no @username in the text)
        tg.push_update(in_group(tg, "Talon, what time is it in Lima?", entities=[
            {"type": "text_mention", "offset": 0, "length": 5,
             "user": {"id": bot_id, "is_bot": True, "first_name": "Talon Test"}}]))
        await tg.wait_for("sendMessage", to(GROUP), count=2)
    assert len(llm.requests) == 1
    text = last_user_text(llm.requests[0])
    assert text.endswith("[Carol (@carol)]: Talon, what time is it in Lima?")
    assert status.params["text"].startswith("Model:")
    assert "[Bob]: who is cooking tonight?" in text  # the command left the chatter for this turn


async def test_answer_replies_in_place_in_the_right_topic(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    # The topic's own workspace: its files are what its answers may send.
    root = settings.workspace_dir("telegram", f"{FORUM}:7")
    root.mkdir(parents=True, exist_ok=True)
    (root / "map.png").write_bytes(png("blue"))
    (root / "route.png").write_bytes(png("green"))
    (root / "plan.txt").write_text("day 1: museum\n")
    (root / "note.ogg").write_bytes((Path(__file__).parent / "fixtures" / "speech_fox.ogg").read_bytes())
    llm.queue("Here is the plan.\n\n![map](map.png) ![route](route.png)\n\n![plan](plan.txt)\n\n![note](note.ogg)")
    async with running(settings):
        update = in_group(tg, f"{BOT} send the plan", chat=FORUM, is_forum=True, message_thread_id=7)
        asked = update["message"]["message_id"]
        tg.push_update(update)
        await tg.wait_for("sendVoice", to(FORUM))
    sends = [c for c in tg.sent(chat_id=FORUM) if c.method.startswith("send") and c.method != "sendChatAction"]
    assert [c.method for c in sends] == ["sendMessage", "sendMediaGroup", "sendDocument", "sendVoice"]
    # every part lands in the topic; the first answers the message that asked
    assert all(c.params.get("message_thread_id") == 7 for c in sends)
    assert all(m["message_thread_id"] == 7 for m in sends[1].result)
    assert sends[0].params["reply_parameters"]["message_id"] == asked
    assert sends[0].result["reply_to_message"]["message_id"] == asked
    assert all("reply_parameters" not in c.params for c in sends[1:])
    # the typing indicator shows in the topic too
    assert all(c.params.get("message_thread_id") == 7 for c in tg.sent("sendChatAction", chat_id=FORUM))
    assert 'in its topic "Topic 7"' in system_text(llm.requests[0])


async def test_album_whose_caption_mentions_the_bot_is_one_turn_in_its_topic(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings):
        common: dict[str, Any] = dict(chat_type="supergroup", chat_title="Trip planning", is_forum=True,
                                      message_thread_id=9, user_id=CAROL, first_name="Carol",
                                      media_group_id="album-1")
        tg.push_update(tg.photo_message(FORUM, data=png("red"), caption=f"{BOT} which is nicer?", **common))
        tg.push_update(tg.photo_message(FORUM, data=png("green"), **common))
        # the same in another album that does not address the bot: chatter, not a turn
        quiet = {**common, "media_group_id": "album-2"}
        tg.push_update(tg.photo_message(FORUM, data=png("blue"), caption="our hotel", **quiet))
        tg.push_update(tg.photo_message(FORUM, data=png("white"), **quiet))
        [answer] = await tg.wait_for("sendMessage", to(FORUM))
        tg.push_update(in_group(tg, f"{BOT} and the hotel?", chat=FORUM, is_forum=True, message_thread_id=9,
                                username=None))
        await tg.wait_for("sendMessage", to(FORUM), count=2)
    assert len(llm.requests) == 2
    assert len(llm.requests[0].image_urls()) == 2
    assert last_user_text(llm.requests[0]).startswith("[Carol]: " + BOT + " which is nicer?\n")
    assert answer.params["message_thread_id"] == 9
    # the album that spoke to no one came along with the next turn, as chatter
    assert "[Carol]: our hotel [sent 2 files]" in last_user_text(llm.requests[1])


async def test_two_topics_keep_separate_sessions(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings) as runtime:
        tg.push_update(in_group(tg, f"{BOT} topic one: the codeword is kiwi", chat=FORUM, is_forum=True,
                                message_thread_id=3))
        await tg.wait_for("sendMessage", to(FORUM))
        tg.push_update(in_group(tg, f"{BOT} topic two: what is the codeword?", chat=FORUM, is_forum=True,
                                message_thread_id=4))
        await tg.wait_for("sendMessage", to(FORUM), count=2)
        # the General topic has no thread id: it is the group's own conversation
        tg.push_update(in_group(tg, f"{BOT} in General", chat=FORUM, is_forum=True))
        replies = await tg.wait_for("sendMessage", to(FORUM), count=3)
        one = await runtime.sessions.load(ChatKey("telegram", f"{FORUM}:3"))
        two = await runtime.sessions.load(ChatKey("telegram", f"{FORUM}:4"))
        general = await runtime.sessions.load(ChatKey("telegram", str(FORUM)))
    assert "kiwi" not in json.dumps(llm.requests[1].json)
    assert [m.role for m in general] == ["user", "assistant"] and "kiwi" not in json.dumps(llm.requests[2].json)
    assert [m.role for m in one] == ["user", "assistant"] and [m.role for m in two] == ["user", "assistant"]
    assert "kiwi" in one[0].text and "kiwi" not in json.dumps([m.model_dump() for m in two])
    assert [c.params.get("message_thread_id") for c in replies] == [3, 4, None]


async def test_other_bots_get_nothing(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings):
        tg.push_update(in_group(tg, f"{BOT} ping from a bot", user=777, first_name="Echo Bot",
                                username="echo_bot", is_bot=True))
        tg.push_update(tg.text_message(777, "private ping from a bot", user_id=777, is_bot=True))
        tg.push_update(in_group(tg, f"{BOT} and from a person", first_name="Carol"))
        [answer] = await tg.wait_for("sendMessage", to(GROUP))
    assert len(llm.requests) == 1
    text = last_user_text(llm.requests[0])
    assert text.endswith("and from a person") and "ping from a bot" not in text  # not even as chatter
    assert not tg.sent(chat_id=777)
    assert answer.params["text"].startswith("echo:")


async def test_new_in_a_group_only_from_an_admin_or_an_allowed_user(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    admin = 444
    tg.set_member_status(GROUP, admin, "administrator")
    async with running(settings) as runtime:
        chat = ChatKey("telegram", str(GROUP))
        tg.push_update(in_group(tg, f"{BOT} remember: we fly on Friday"))
        await tg.wait_for("sendMessage", to(GROUP))
        before = await runtime.sessions.current_thread(chat)
        refused = in_group(tg, "/new")
        tg.push_update(refused)
        [refusal] = await tg.wait_for("sendMessage", lambda c: to(GROUP)(c) and "administrator" in c.params["text"])
        assert await runtime.sessions.current_thread(chat) == before
        tg.push_update(in_group(tg, "/new", user=admin, first_name="Dana", username="dana"))
        await tg.wait_for("sendMessage", lambda c: to(GROUP)(c) and "Started a new conversation" in c.params["text"])
        after_admin = await runtime.sessions.current_thread(chat)
        tg.push_update(in_group(tg, f"/new@{BOT[1:]}", user=ALICE, first_name="Alice"))  # in the allowlist
        await tg.wait_for("sendMessage", lambda c: to(GROUP)(c) and "Started a new conversation" in c.params["text"],
                          count=2)
    assert refusal.params["text"] == "Only an administrator of this group can start a new conversation here."
    assert refusal.params["reply_parameters"]["message_id"] == refused["message"]["message_id"]
    assert after_admin != before
    # Alice is in TALON_TELEGRAM_ALLOWED_USERS: no lookup needed for her
    assert [c.params["user_id"] for c in tg.sent("getChatMember", chat_id=GROUP)] == [CAROL, admin]


async def test_private_chat_never_reaches_the_group_or_back(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "my passport number is X1234567", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
        tg.push_update(in_group(tg, f"{BOT} what do you know about me?", user=ALICE, first_name="Alice",
                                username="alice"))
        await tg.wait_for("sendMessage", to(GROUP))
        tg.push_update(in_group(tg, f"{BOT} the group secret is teal", user=BOB, first_name="Bob"))
        await tg.wait_for("sendMessage", to(GROUP), count=2)
        tg.push_update(tg.text_message(ALICE, "what was said in the group?", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), count=2)
    private1, group1, group2, private2 = llm.requests
    assert "X1234567" not in json.dumps(group1.json) and "X1234567" not in json.dumps(group2.json)
    assert "teal" not in json.dumps(private2.json) and "what do you know" not in json.dumps(private2.json)
    assert "X1234567" in json.dumps(private2.json)  # the private session itself goes on
    assert "Several people" not in system_text(private2)


async def test_a_long_reply_in_a_group_is_paced_and_a_429_honoured(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    from channels.send_budget import SendBudget, Window

    paragraphs = [f"Part {i}: " + ("word " * 700) for i in range(4)]  # about 3.5k characters each
    llm.queue("\n\n".join(paragraphs))
    channel = TelegramChannel(settings)
    # Telegram's 20 a minute, scaled down; typing pings (cosmetic) may not touch it
    channel.budget = SendBudget(lambda chat: Window(2, 0.6, reserve=1) if chat.startswith("-") else None)
    runtime = build_runtime(settings, [channel])
    tg.fail_next("sendMessage", 429, retry_after=1)
    await runtime.start()
    try:
        tg.push_update(in_group(tg, f"{BOT} tell me everything"))
        sent = await tg.wait_for("sendMessage", to(GROUP), count=4, timeout=20)
    finally:
        await runtime.stop()
    attempts: list[Call] = [c for c in tg.sent("sendMessage", GROUP, include_failed=True)]
    assert [c.status for c in attempts] == [429, 200, 200, 200, 200]
    assert [c.params["text"].split(":")[0] for c in sent] == ["Part 0", "Part 1", "Part 2", "Part 3"]
    # no more than 2 sends in any 0.6 s window, the refused try included (measured on arrival at
    # the fake, so a few milliseconds of loopback latency are allowed for)
    times = [c.time for c in attempts]
    assert all(later - earlier >= 0.55 for earlier, later in zip(times, times[2:], strict=False))
    assert channel.budget.waited_s > 0
    assert sent[0].params["reply_parameters"]["message_id"] and "reply_parameters" not in sent[1].params


async def test_trigger_all_makes_every_group_message_a_turn(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                             TALON_TELEGRAM_GROUP_TRIGGER="all")
    async with running(settings) as runtime:
        before = await runtime.sessions.current_thread(ChatKey("telegram", str(GROUP)))
        tg.push_update(in_group(tg, "/new@some_other_bot", user=ALICE))  # not ours, even in "all"
        tg.push_update(in_group(tg, "no mention here"))
        [answer] = await tg.wait_for("sendMessage", to(GROUP))
        after = await runtime.sessions.current_thread(ChatKey("telegram", str(GROUP)))
    assert len(llm.requests) == 1 and before == after
    assert last_user_text(llm.requests[0]).endswith("[Carol (@carol)]: no mention here")
    assert answer.params["text"].startswith("echo:")


async def test_an_anonymous_admin_is_a_person(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    # Telegram shows an anonymous administrator as @GroupAnonymousBot speaking for the group.
    anon: dict[str, Any] = dict(user=1087968824, first_name="Group", username="GroupAnonymousBot", is_bot=True,
                                sender_chat={"id": GROUP, "type": "supergroup", "title": "Trip planning"})
    async with running(settings):
        tg.push_update(in_group(tg, f"{BOT} post the schedule", **anon))
        await tg.wait_for("sendMessage", to(GROUP))
        tg.push_update(in_group(tg, "/new", **anon))
        await tg.wait_for("sendMessage", lambda c: to(GROUP)(c) and "Started a new conversation" in c.params["text"])
    assert last_user_text(llm.requests[0]).endswith(
        f"[an administrator of Trip planning]: {BOT} post the schedule")
    assert not tg.sent("getChatMember")


async def test_fake_refuses_a_topic_in_a_chat_that_is_no_forum(tg: FakeTelegram) -> None:
    import telegram

    tg.push_update(in_group(tg, "hello"))  # makes the group known to the fake (not a forum)
    async with telegram.Bot(tg.token, base_url=tg.bot_base_url) as bot:
        with pytest.raises(telegram.error.BadRequest, match="thread not found"):
            await bot.send_message(GROUP, "into a topic", message_thread_id=5)
        with pytest.raises(telegram.error.BadRequest, match="replied not found"):
            await bot.send_message(GROUP, "a reply", reply_parameters=telegram.ReplyParameters(424242))
        sent = await bot.send_message(GROUP, "a reply", reply_parameters=telegram.ReplyParameters(
            424242, allow_sending_without_reply=True))
        assert sent.reply_to_message is None


async def test_files_count_when_they_reply_to_the_bot_or_their_caption_mentions_it(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    group: dict[str, Any] = dict(chat_type="supergroup", chat_title="Trip planning", user_id=CAROL,
                                 first_name="Carol")
    async with running(settings):
        tg.push_update(in_group(tg, f"{BOT} I will send the booking"))
        [answer] = await tg.wait_for("sendMessage", to(GROUP))
        tg.push_update(tg.photo_message(GROUP, data=png("red"), caption="look at this view", **group))
        tg.push_update(tg.document_message(GROUP, data=b"Hotel Lux, 2 nights\n", file_name="booking.txt",
                                           reply_to=answer.result["message_id"], **group))
        tg.push_update(tg.photo_message(GROUP, data=png("blue"), caption=f"and {BOT} is this the hotel?", **group))
        await tg.wait_for("sendMessage", to(GROUP), count=3)
    assert len(llm.requests) == 3
    booking, photo = last_user_text(llm.requests[1]), last_user_text(llm.requests[2])
    assert "[Carol]: look at this view [sent a file]" in booking and "Hotel Lux, 2 nights" in booking
    assert photo.startswith(f"[Carol]: and {BOT} is this the hotel?") and len(llm.requests[2].image_urls()) == 1
    assert "look at this view" not in photo  # chatter travels once


async def test_a_reply_to_another_member_names_whom_it_quotes(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    async with running(settings):
        said = in_group(tg, "the hotel is Lux", user=ALICE, first_name="Alice", username="alice")
        tg.push_update(said)
        tg.push_update(in_group(tg, f"{BOT} is that a good one?", reply_to=said["message"]["message_id"]))
        await tg.wait_for("sendMessage", to(GROUP))
    assert last_user_text(llm.requests[0]).endswith(
        f"[Carol (@carol)]: (In reply to Alice (@alice):\n> the hotel is Lux\n)\n{BOT} is that a good one?")


async def test_a_group_turn_left_pending_by_a_crash_is_answered_in_its_topic(
        tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    from talon.envelope import Chatter, InboundMessage

    asked = in_group(tg, f"{BOT} still there?", chat=FORUM, is_forum=True, message_thread_id=5)["message"]
    runtime = build_runtime(settings, [TelegramChannel(settings)])
    # What the inbox held when the last run died: stored, never answered.
    await runtime.inbox.add(InboundMessage(
        channel="telegram", chat_id=str(FORUM), sender_id=str(CAROL), message_id=str(asked["message_id"]),
        text=f"{BOT} still there?", sender_name="Carol", sender_username="carol", chat_type="supergroup",
        chat_title="Trip planning", thread_id="5", chatter=[Chatter(speaker="Bob", text="is it down?")]))
    await runtime.start()
    try:
        [answer] = await tg.wait_for("sendMessage", to(FORUM))
        await runtime.bridge.idle()
        session = await runtime.sessions.load(ChatKey("telegram", f"{FORUM}:5"))
    finally:
        await runtime.stop()
    assert answer.params["message_thread_id"] == 5
    assert answer.params["reply_parameters"]["message_id"] == asked["message_id"]
    text = last_user_text(llm.requests[0])
    assert "[Bob]: is it down?" in text and text.endswith(f"[Carol (@carol)]: {BOT} still there?")
    assert session
