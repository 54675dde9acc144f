"""Answers first under load: how long an answer waits when one chat sends a burst of messages.

Run: ``python benchmarks/bench_burst.py`` (about five minutes; ``--seconds 20`` for a shorter
burst at the same rates). The real Telegram channel (python-telegram-bot against the fake Bot API)
with its defaults (drafts in private chats, the 👀 reaction, typing; all of them at once for every
message, ``TALON_ACK_DELAY=0``, the harshest case) and a fast fake model that
answers at once, so what is measured is Talon's pacing, not the model. ``TALON_BUSY_MODE=queue``:
every message gets an answer of its own.

For each scenario (30 and 100 messages a minute, into one private chat and into one group, where
each message addresses the bot), messages arrive evenly spread over the burst; each answer's wait
is from its message reaching Talon's poll to the answer arriving at the fake Bot API. Reported:
the longest and the median wait, how many answers had to wait for room in the chat's send
budget (``SendBudget.waits``: Telegram's own pace, about one a second in a private chat and 20
a minute in a group), and how many cosmetic calls were dropped. The ratio of the longest wait to
the gap between two messages says whether answers keep up (below 1: each is out before the next
message comes).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.telegram import TelegramChannel  # noqa: E402
from talon.runtime import build_runtime  # noqa: E402
from tests.conftest import ALICE, TOKEN, make_settings  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import Call, FakeTelegram  # noqa: E402

GROUP = -1001234567890
BOT = "@talon_test_bot"


async def burst(chat: int, per_minute: int, seconds: float) -> dict[str, float]:
    count = max(1, round(per_minute * seconds / 60))
    gap = 60.0 / per_minute
    async with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        with tempfile.TemporaryDirectory() as tmp:
            settings = make_settings(Path(tmp), tg.base_url, llm.base_url, TALON_BUSY_MODE="queue",
                                     TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP), TALON_MODEL_DISCOVERY=False,
                                     TALON_TELEGRAM_POLL_TIMEOUT=1,
                                     # The signs of work at once for every message (the harshest
                                     # case): with the default 1 s, these instant answers have none.
                                     TALON_ACK_DELAY=0)
            channel = TelegramChannel(settings)
            runtime = build_runtime(settings, [channel])
            await runtime.start()
            group = chat < 0
            sent_at: dict[str, float] = {}
            try:
                start = time.monotonic()
                for n in range(count):
                    await asyncio.sleep(max(0.0, start + n * gap - time.monotonic()))
                    text = (f"{BOT} " if group else "") + f"message {n}"
                    tg.push_update(tg.text_message(chat, text, user_id=ALICE,
                                                   chat_type="supergroup" if group else "private"))
                    sent_at[f"message {n}"] = time.monotonic()

                def answer(c: Call) -> bool:
                    return str(c.params.get("chat_id")) == str(chat) and "echo:" in str(c.params.get("text", ""))

                answers = await tg.wait_for("sendMessage", answer, count=count, timeout=count * 4 + 120)
                await runtime.bridge.idle()
            finally:
                await runtime.stop()
    waits = []
    for call in answers:
        asked = str(call.params["text"]).rsplit("message ", 1)[-1]
        waits.append(call.time - sent_at[f"message {asked}"])
    return {
        "messages": count, "gap": gap, "longest": max(waits), "median": statistics.median(waits),
        "budget_waits": channel.budget.waits, "budget_waited": channel.budget.waited_s,
        "dropped": channel.budget.dropped,
    }


async def main(seconds: float) -> None:
    print(f"burst of {seconds:.0f} s per scenario; waits from message to answer (fake Bot API, fast model)\n")
    print(f"{'chat':8} {'rate':>9} {'msgs':>5} {'longest':>8} {'median':>7} {'longest/gap':>11} "
          f"{'answers waited':>14} {'cosmetic dropped':>16}")
    for chat, name in ((ALICE, "private"), (GROUP, "group")):
        for per_minute in (30, 100):
            r = await burst(chat, per_minute, seconds)
            print(f"{name:8} {per_minute:>5}/min {r['messages']:>5.0f} {r['longest']:>7.2f}s {r['median']:>6.2f}s "
                  f"{r['longest'] / r['gap']:>11.2f} {r['budget_waits']:>5.0f} ({r['budget_waited']:>5.1f}s) "
                  f"{r['dropped']:>16.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each burst (default 60)")
    asyncio.run(main(parser.parse_args().seconds))
