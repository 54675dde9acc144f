"""Live replies: what a streamed answer costs in Bot API calls, and how soon the person sees it.

Run: ``python benchmarks/bench_streaming.py`` (about half a minute). The real Telegram channel
(python-telegram-bot against the fake Bot API) and the fake model, which streams a 1,000-character
answer in ~12-character chunks 0.06 s apart (about 5 s of writing, a slow local model's pace),
with ``TALON_TELEGRAM_STREAM_INTERVAL`` at its default of 1 s. For each mode:

1. **Bot API calls per streamed answer** into the chat, by method: drafts or edits, the final
   message, typing pings and the acknowledgement reaction (set and cleared).
2. **First token to first visible text**: from the model's first text chunk leaving the fake
   server to the first call that shows text in the chat arriving at the fake Bot API (a draft,
   or the first message in edit mode; with streaming off, the final message).
3. **First token to the whole answer** on screen (the final message or last edit).

Figures vary with the machine's load (2 shared cores here); ``RUNS`` answers per mode, medians.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.telegram import TelegramChannel  # noqa: E402
from talon.runtime import build_runtime  # noqa: E402
from tests.conftest import ALICE, TOKEN, make_settings  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import Call, FakeTelegram  # noqa: E402

RUNS = 3
GROUP = -1001234567890
ANSWER = ("The tide rises and falls twice a day because the moon pulls the water towards it. " * 12
          + "That is all.")
SHOWING = {"sendMessageDraft", "sendMessage", "editMessageText"}


async def one_answer(mode: str, chat: int, run: int) -> tuple[Counter[str], float, float]:
    async with FakeTelegram(token=TOKEN) as tg, FakeOpenAI(chunk_delay=0.06) as llm:
        with tempfile.TemporaryDirectory() as tmp:
            settings = make_settings(Path(tmp), tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING=mode,
                                     TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP), TALON_MODEL_DISCOVERY=False)
            llm.queue(ANSWER)
            runtime = build_runtime(settings, [TelegramChannel(settings)])
            await runtime.start()
            try:
                group = chat < 0
                tg.push_update(tg.text_message(chat, ("@talon_test_bot " if group else "") + f"tides? ({run})",
                                               user_id=ALICE, chat_type="supergroup" if group else "private"))

                def whole(c: Call) -> bool:
                    return str(c.params.get("text", "")).endswith("That is all.")

                final = (await tg.wait_for("editMessageText" if mode == "edit" or (group and mode == "draft")
                                           else "sendMessage", whole, timeout=60))[0]
                await runtime.bridge.idle()
            finally:
                await runtime.stop()
            calls = [c for c in tg.sent(chat_id=chat) if c.method != "getUpdates"]
            first_token = llm.requests[0].first_text_at
            assert first_token is not None
            first_shown = min(c.time for c in calls if c.method in SHOWING)
            return Counter(c.method for c in calls), first_shown - first_token, final.time - first_token


async def main() -> None:
    print(f"answer: {len(ANSWER)} characters, streamed in ~12-character chunks 0.06 s apart; "
          f"update interval 1 s; {RUNS} runs per mode (medians)\n")
    for label, mode, chat in (("private, draft (default)", "draft", ALICE), ("private, edit", "edit", ALICE),
                              ("group, draft -> edit", "draft", GROUP), ("private, off", "off", ALICE)):
        results = [await one_answer(mode, chat, run) for run in range(RUNS)]
        counts = results[len(results) // 2][0]
        total = statistics.median(sum(r[0].values()) for r in results)
        first = statistics.median(r[1] for r in results)
        whole = statistics.median(r[2] for r in results)
        by_method = ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))
        print(f"{label:26s} Bot API calls per answer: {total:.0f} ({by_method})")
        print(f"{'':26s} first token -> first visible text: {first * 1000:.0f} ms; "
              f"-> whole answer: {whole:.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
