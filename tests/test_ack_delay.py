"""TALON_ACK_DELAY: the signs that a turn is under way (the acknowledgement reaction, the typing
indicator, the first live draft) come only when the turn takes longer than the delay; an answer
ready sooner arrives alone. Through the real python-telegram-bot against the loopback Bot API."""

from __future__ import annotations

from pathlib import Path

from talon.config import Settings
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

EYES = "\N{EYES}"
ANSWER = ("Tides come from the pull of the moon and, less, the sun. The water bulges towards "
          "the moon and on the far side too, so most coasts see two highs a day.")


def to_alice(call) -> bool:  # type: ignore[no-untyped-def]
    return str(call.params.get("chat_id")) == str(ALICE)


def cleared(call) -> bool:  # type: ignore[no-untyped-def]
    return call.params.get("reaction") in ([], None, "[]")


def delayed(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, delay: float) -> Settings:
    return make_settings(tmp_path, tg.base_url, llm.base_url, TALON_ACK_DELAY=delay,
                         TALON_TELEGRAM_STREAM_INTERVAL=0.3, TALON_MODEL_DISCOVERY=False)


def test_the_default_delay_is_one_second() -> None:
    assert Settings(_env_file=None).ack_delay_s == 1.0  # type: ignore[call-arg]


async def test_an_answer_ready_before_the_delay_comes_alone(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    # A delay no turn of the instant fake model comes near, however loaded the machine.
    llm.chunk_delay = 0.01
    llm.queue(ANSWER)
    async with running(delayed(tmp_path, tg, llm, 30)):
        tg.push_update(tg.text_message(ALICE, "why are there tides?", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage", to_alice, timeout=20)
    assert reply.params["text"] == ANSWER
    # The one call the answer needs, and no reaction, typing ping or draft around it.
    assert not tg.sent("setMessageReaction") and not tg.sent("sendChatAction")
    assert not tg.sent("sendMessageDraft") and not tg.sent("editMessageText")


async def test_a_turn_longer_than_the_delay_shows_the_reaction_and_typing_then_clears_them(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.hang = True  # the model answers only once the test has seen the signs
    async with running(delayed(tmp_path, tg, llm, 0.2)):
        update = tg.text_message(ALICE, "a slow one", user_id=ALICE)
        tg.push_update(update)
        [react] = await tg.wait_for("setMessageReaction", timeout=20)
        await tg.wait_for("sendChatAction", to_alice, timeout=20)
        assert not tg.sent("sendMessage", ALICE)
        llm.release()
        await tg.wait_for("sendMessage", to_alice, timeout=20)
        await tg.wait_for("setMessageReaction", cleared, timeout=20)
    assert react.params["message_id"] == update["message"]["message_id"]
    assert [r["emoji"] for r in react.params["reaction"]] == [EYES]
    assert tg.sent("sendChatAction", ALICE)[0].params["action"] == "typing"


async def test_text_streamed_past_the_delay_appears_as_drafts(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    # About 2.4 s of streaming against a 0.2 s delay: what came before the delay is held, then
    # shown with the rest; the drafts are prefixes of the answer, which arrives once.
    llm.chunk_delay = 0.12
    llm.queue(ANSWER)
    async with running(delayed(tmp_path, tg, llm, 0.2)):
        tg.push_update(tg.text_message(ALICE, "why are there tides?", user_id=ALICE))
        [final] = await tg.wait_for("sendMessage", to_alice, timeout=20)
        await tg.wait_for("setMessageReaction", cleared, timeout=20)
    drafts = [str(c.params["text"]) for c in tg.sent("sendMessageDraft", ALICE)]
    assert drafts, "no draft was shown for an answer that streamed for seconds"
    assert all(ANSWER.startswith(d.rstrip(" .…")) or d.rstrip("…").strip() in ANSWER for d in drafts), drafts
    assert final.params["text"] == ANSWER
