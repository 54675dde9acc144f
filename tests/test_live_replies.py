"""Live replies end to end: the real python-telegram-bot and openai clients against the loopback
fakes, with a model that streams slowly (chunks spread over seconds)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from talon.storage.sessions import ChatKey
from talon.config import Settings
from talon.envelope import InboundMessage
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.processes import running_with
from tests.support.waiting import until

if TYPE_CHECKING:
    from talon.runtime import Runtime

GROUP = -1001234567890
BOT = "@talon_test_bot"
EYES = "\N{EYES}"

# About 12 characters a chunk: ~20 chunks, spread over ~2.4 s at 0.12 s a chunk.
ANSWER = ("Tides come from the pull of the moon and, less, the sun. The water bulges towards "
          "the moon and on the far side too, so most coasts see two highs a day. **Spring tides** "
          "are the big ones.")




async def drained(runtime: Runtime) -> bool:
    return await runtime.inbox.pending() == []


def to(chat: int):  # noqa: ANN201 - a predicate for wait_for
    return lambda c: str(c.params.get("chat_id")) == str(chat)


def live_settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, **extra: object) -> Settings:
    values: dict[str, object] = dict(TALON_TELEGRAM_STREAM_INTERVAL=0.3, TALON_MODEL_DISCOVERY=False,
                                     TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP))
    values.update(extra)
    return make_settings(tmp_path, tg.base_url, llm.base_url, **values)


async def test_private_chat_streams_drafts_then_exactly_one_message(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.chunk_delay = 0.12
    llm.queue(ANSWER)
    async with running(live_settings(tmp_path, tg, llm)):
        tg.push_update(tg.text_message(ALICE, "why are there tides?", user_id=ALICE))
        [final] = await tg.wait_for("sendMessage", to(ALICE), timeout=20)
        await tg.wait_for("setMessageReaction", lambda c: c.params.get("reaction") in ([], None, "[]"),
                          timeout=5)
    drafts = tg.sent("sendMessageDraft", ALICE)
    # several drafts arrived while the model streamed, each a longer prefix of the answer
    assert len(drafts) >= 3, tg.summary()
    assert all(d.time < final.time for d in drafts)
    shown = [d.params["text"] for d in drafts]
    assert all(len(a) < len(b) for a, b in zip(shown, shown[1:], strict=False)), shown
    assert len({d.params["draft_id"] for d in drafts}) == 1
    # then exactly one message with the whole answer, formatted
    assert [c.params["text"] for c in tg.sent("sendMessage", ALICE)] == [final.params["text"]]
    assert "<b>Spring tides</b>" in final.params["text"] and final.params["text"].endswith("big ones.")
    assert not tg.sent("editMessageText")
    # the drafts came at most about once per interval (0.3 s; loopback jitter allowed)
    gaps = [b.time - a.time for a, b in zip(drafts, drafts[1:], strict=False)]
    assert min(gaps) >= 0.25, gaps
    # never half of a markup construct: every draft is HTML that parses (the fake checks) and no
    # draft shows an unopened "**"
    assert all("**" not in text for text in shown)


async def test_acknowledgement_reaction_is_set_then_cleared(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.chunk_delay = 0.05
    llm.queue("Noted.")
    async with running(live_settings(tmp_path, tg, llm)):
        update = tg.text_message(ALICE, "remember milk", user_id=ALICE)
        message_id = update["message"]["message_id"]
        tg.push_update(update)
        await tg.wait_for("sendMessage", to(ALICE), timeout=10)
        await tg.wait_for("setMessageReaction", count=2, timeout=5)
    [react, clear] = tg.sent("setMessageReaction")
    reply = tg.sent("sendMessage", ALICE)[0]
    assert react.params["message_id"] == message_id
    assert [r["emoji"] for r in react.params["reaction"]] == [EYES]
    assert react.time < reply.time < clear.time  # shown when taken up, cleared once answered
    assert tg.reaction_log == [(ALICE, message_id, [EYES]), (ALICE, message_id, [])]
    assert tg.reactions[(ALICE, message_id)] == []


async def test_group_answer_is_one_message_edited_until_it_is_whole(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.chunk_delay = 0.12
    llm.queue(ANSWER)
    async with running(live_settings(tmp_path, tg, llm)):
        tg.push_update(tg.text_message(GROUP, f"{BOT} why are there tides?", user_id=ALICE,
                                       chat_type="supergroup"))
        await tg.wait_for("editMessageText", lambda c: str(c.params.get("text", "")).endswith("big ones."),
                          timeout=20)
    [message] = tg.sent("sendMessage", GROUP)
    edits = tg.sent("editMessageText", GROUP)
    mid = message.result["message_id"]
    assert len(edits) >= 3, tg.summary()
    assert all(e.params["message_id"] == mid for e in edits)
    # it replied to the question, and its last version is the whole answer, formatted
    assert message.params["reply_parameters"]["message_id"]
    assert "<b>Spring tides</b>" in edits[-1].params["text"]
    assert tg.messages[(GROUP, mid)]["text"].endswith("are the big ones.")
    assert not tg.sent("sendMessageDraft")


async def test_a_429_stops_the_drafts_and_the_final_message_arrives_once(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.chunk_delay = 0.12
    llm.queue(ANSWER)
    drafts_seen = 0

    def second_draft(params: dict[str, object]) -> bool:
        nonlocal drafts_seen
        drafts_seen += 1
        return drafts_seen == 2

    tg.fail_when("sendMessageDraft", second_draft, 429, retry_after=2)
    async with running(live_settings(tmp_path, tg, llm)):
        tg.push_update(tg.text_message(ALICE, "why are there tides?", user_id=ALICE))
        [final] = await tg.wait_for("sendMessage", to(ALICE), timeout=20)
        # the turn is over once its reaction is cleared: no draft can come after that
        await tg.wait_for("setMessageReaction", lambda c: c.params.get("reaction") in ([], None, "[]"),
                          timeout=5)
    attempts = tg.sent("sendMessageDraft", include_failed=True)
    refused = [c for c in attempts if c.status == 429]
    assert [c.status for c in attempts] == [200, 429], tg.summary()  # no draft after the 429
    assert final.time >= refused[0].time + 2.0 - 0.05  # the final message waited out retry_after
    assert len(tg.sent("sendMessage", ALICE)) == 1
    assert final.params["text"].endswith("big ones.")


async def test_stop_during_a_slow_turn_answers_at_once_and_keeps_what_was_said(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.chunk_delay = 0.5  # a long answer: ~20 s if let run
    llm.queue(ANSWER * 2, "Fresh answer.")
    settings = live_settings(tmp_path, tg, llm)
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "tell me about tides", user_id=ALICE))
        await tg.wait_for("sendMessageDraft", to(ALICE), timeout=15)
        asked = time.monotonic()
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        [stopped] = await tg.wait_for("sendMessage", to(ALICE), timeout=10)
        answered = time.monotonic()
        llm.chunk_delay = 0.0
        tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=10)
        session = await runtime.sessions.load(ChatKey("telegram", str(ALICE)))
    assert stopped.params["text"] == "Stopped."
    assert answered - asked < 1.0  # normally a few tens of milliseconds
    assert replies[1].params["text"] == "Fresh answer."
    assert [c.params["text"] for c in tg.sent("sendMessage", ALICE)] == ["Stopped.", "Fresh answer."]
    # the partial answer is in the session, marked as interrupted, and the next request saw it
    [cut] = [m for m in session if m.meta.get("interrupted")]
    assert cut.text.startswith("Tides come") and "stopped by the person" in cut.text
    assert cut.text.split("\n\n[stopped")[0] in ANSWER
    assert "stopped by the person" in json.dumps(llm.requests[-1].json)
    assert last_user_text(llm.requests[-1]).endswith("and now?")


async def test_steer_hands_a_message_sent_during_a_tool_step_to_the_next_request(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    async def slow_tool_call(body: dict[str, object]) -> object:
        await asyncio.sleep(1.0)  # the tool step: the model takes its time to ask for ls
        return FakeOpenAI.tool_call("ls", {"path": "."})

    llm.queue(slow_tool_call, "There is nothing in the workspace, and yes, in French too.")
    async with running(live_settings(tmp_path, tg, llm)) as runtime:
        tg.push_update(tg.text_message(ALICE, "what files do I have?", user_id=ALICE))
        await llm.wait_for_requests(1)
        tg.push_update(tg.text_message(ALICE, "answer in French please", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), timeout=15)
        await until(lambda: drained(runtime), 10, "both messages closed by the one reply")
    assert len(llm.requests) == 2  # no third turn for the steered message
    second = llm.requests[1].json["messages"]
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
    assert "answer in French please" in json.dumps(second[-1])
    assert len(tg.sent("sendMessage", ALICE)) == 1
    # both messages were acknowledged, and both reactions cleared
    assert {e[1] for e in tg.reaction_log if e[2]} == {1, 2}
    assert all(v == [] for v in tg.reactions.values())


async def test_edits_before_during_and_after_a_turn(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.hang = True
    async with running(live_settings(tmp_path, tg, llm, TALON_BUSY_MODE="queue")):
        first = tg.text_message(ALICE, "first question", user_id=ALICE)
        tg.push_update(first)
        await llm.wait_for_requests(1)
        second = tg.text_message(ALICE, "what is 2+2", user_id=ALICE)
        tg.push_update(second)
        await asyncio.sleep(0.5)
        # edited while it waits behind the running turn: the edited text is what gets answered
        tg.push_update(tg.edited_text_message(ALICE, second["message"]["message_id"], "what is 3+3"))
        await asyncio.sleep(0.5)
        llm.release()
        await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=10)
        # edited after its answer: a fresh turn that says it is about an edited message
        tg.push_update(tg.edited_text_message(ALICE, first["message"]["message_id"], "first question, fixed"))
        await tg.wait_for("sendMessage", to(ALICE), count=3, timeout=10)
    texts = [last_user_text(r).split("\n")[-1] for r in llm.requests]
    assert texts == ["first question", "what is 3+3", "first question, fixed"]
    assert "what is 2+2" not in json.dumps(llm.requests[1].json)
    assert "edited a message of theirs that you already answered" in last_user_text(llm.requests[2])


async def test_interrupt_mode_stops_the_running_turn_and_answers_the_new_message(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.chunk_delay = 0.5
    llm.queue(ANSWER * 2, "Here is the short version.")
    async with running(live_settings(tmp_path, tg, llm, TALON_BUSY_MODE="interrupt")) as runtime:
        tg.push_update(tg.text_message(ALICE, "tell me about tides", user_id=ALICE))
        await tg.wait_for("sendMessageDraft", to(ALICE), timeout=15)
        llm.chunk_delay = 0.0
        tg.push_update(tg.text_message(ALICE, "actually, just the short version", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", to(ALICE), timeout=10)
        await until(lambda: drained(runtime), 10, "the inbox to be empty")
        session = await runtime.sessions.load(ChatKey("telegram", str(ALICE)))
    assert reply.params["text"] == "Here is the short version."
    assert len(tg.sent("sendMessage", ALICE)) == 1  # the stopped turn sent nothing of its own
    assert [m.meta.get("interrupted", False) for m in session if m.role == "assistant"] == [True, False]
    assert last_user_text(llm.requests[1]).endswith("just the short version")


async def test_whatsapp_has_no_streaming_but_stop_works_the_same(
        llm: FakeOpenAI, tmp_path: Path) -> None:
    from tests.fakes.twilio import FakeTwilio
    from tests.support.whatsapp import ALICE as WA_ALICE
    from tests.support.whatsapp import post
    from tests.support.whatsapp import running as wa_running
    from tests.support.whatsapp import wa_settings
    llm.chunk_delay = 0.5
    llm.queue(ANSWER * 2, "Fresh answer.")
    async with FakeTwilio() as twilio:
        async with wa_running(wa_settings(tmp_path, twilio, llm)) as (runtime, channel):
            assert channel.live_reply(_wa_message(WA_ALICE)) is None  # no edits there: no live view
            await post(channel, twilio.inbound_params(WA_ALICE, "tell me about tides"), sign_with=twilio)
            await llm.wait_for_requests(1)
            await asyncio.sleep(1.0)  # it is streaming now
            asked = time.monotonic()
            await post(channel, twilio.inbound_params(WA_ALICE, "/stop"), sign_with=twilio)
            [stopped] = await twilio.wait_for_messages(1, to=WA_ALICE)
            answered = time.monotonic()
            llm.chunk_delay = 0.0
            await post(channel, twilio.inbound_params(WA_ALICE, "and now?"), sign_with=twilio)
            replies = await twilio.wait_for_messages(2, to=WA_ALICE)
    assert stopped.body == "Stopped." and answered - asked < 1.0
    assert replies[1].body == "Fresh answer."
    assert len(llm.requests) == 2


def _wa_message(number: str) -> InboundMessage:
    return InboundMessage(channel="whatsapp", chat_id=number, sender_id=number, message_id="SM1", text="hi")


async def test_stop_during_a_tool_kills_the_command_and_the_next_message_works(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    marker = tmp_path / "media_root" / "finished.txt"
    # A name of its own, so that the command's processes can be found wherever they run.
    command = f"sleep 2 && touch finished.txt # {uuid.uuid4().hex}"
    llm.queue(FakeOpenAI.tool_call("shell", {"command": command, "timeout": 30}), "Next answer.")
    async with running(live_settings(tmp_path, tg, llm, TALON_SHELL_TOOL=True, TALON_APPROVAL="off")):
        tg.push_update(tg.text_message(ALICE, "run the long job", user_id=ALICE))
        await llm.wait_for_requests(1)
        await until(lambda: running_with(command), 20, "the command to be running")
        asked = time.monotonic()
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        [stopped] = await tg.wait_for("sendMessage", to(ALICE), timeout=10)
        answered = time.monotonic()
        tg.push_update(tg.text_message(ALICE, "something else", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=10)
        # Gone, sandbox and all (found anywhere on the machine, so an escaped process counts too):
        # nothing is left that could still touch the marker.
        await until(lambda: not running_with(command), 10, "the command's processes to be gone")
    assert stopped.params["text"] == "Stopped." and answered - asked < 1.0
    assert not marker.exists()  # the command was killed with the turn
    assert [c.params["text"] for c in tg.sent("sendMessage", ALICE)] == ["Stopped.", "Next answer."]
    # the unanswered tool call reached the model with an "interrupted" result, not a broken history;
    # Talon's stop notice is a note from Talon with the next message, never the assistant's words
    messages = llm.requests[1].json["messages"]
    assert [m["role"] for m in messages][-3:] == ["assistant", "tool", "user"]
    assert "Note from Talon" in json.dumps(messages[-1]) and "stopped by the person" in json.dumps(messages[-1])


async def test_an_edit_while_its_turn_runs_reaches_the_next_model_step(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    async def slow_tool_call(body: dict[str, object]) -> object:
        await asyncio.sleep(1.0)
        return FakeOpenAI.tool_call("ls", {"path": "."})

    llm.queue(slow_tool_call, "Paris it is.")
    async with running(live_settings(tmp_path, tg, llm, TALON_BUSY_MODE="queue")) as runtime:
        update = tg.text_message(ALICE, "plan a trip to Rome", user_id=ALICE)
        tg.push_update(update)
        await llm.wait_for_requests(1)
        tg.push_update(tg.edited_text_message(ALICE, update["message"]["message_id"], "plan a trip to Paris"))
        await tg.wait_for("sendMessage", to(ALICE), timeout=15)
        await until(lambda: drained(runtime), 10, "the inbox to be empty")
    assert len(llm.requests) == 2  # the edit joined the turn (even in queue mode): no turn of its own
    last = llm.requests[1].json["messages"][-1]
    assert last["role"] == "user"
    assert "just edited the message you are answering" in json.dumps(last)
    assert "plan a trip to Paris" in json.dumps(last)
    assert len(tg.sent("sendMessage", ALICE)) == 1
