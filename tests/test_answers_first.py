"""Answers first under load: cosmetic calls (typing, the 👀 reaction, drafts) spend their own share
of a chat's send budget and are dropped when it is spent, so an answer waits only for Telegram's
own pace. End to end through the fake Bot API with the default live view and reaction on; the
budget's own record says whether any answer waited for room (``SendBudget.waits``), not a clock.
benchmarks/bench_burst.py measures the waits under heavier bursts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from channels.telegram import TelegramChannel
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram


async def test_thirty_messages_in_a_minute_into_a_private_chat_are_all_answered_without_waiting(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path
) -> None:
    # queue: every message gets an answer of its own (steer would fold some into one reply)
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_BUSY_MODE="queue")
    async with running(settings) as runtime:
        channel = runtime.bridge.channels["telegram"]
        assert isinstance(channel, TelegramChannel)
        for n in range(30):
            tg.push_update(tg.text_message(ALICE, f"question {n}", user_id=ALICE))
            await asyncio.sleep(0.1)
        answers = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE),
                                    count=30, timeout=120)
        await runtime.bridge.idle()
        budget = channel.budget
        assert budget.waits == 0 and budget.waited_s == 0  # no answer waited on the chat's budget
    assert sorted(a.params["text"] for a in answers) == sorted(f"echo: question {n}" for n in range(30))
    # The cosmetic calls went while their share lasted, and only they were dropped.
    cosmetic = [c for c in tg.calls if c.method in ("setMessageReaction", "sendChatAction", "sendMessageDraft")]
    assert cosmetic and budget.dropped > 0
    assert len(tg.sent("setMessageReaction")) % 2 == 0  # every 👀 set was cleared again
