"""Voice replies: how fast the bundled voice speaks, and what a voice reply adds, in one run.

Run: ``python benchmarks/bench_voice.py`` (about a minute on 2 cores). Figures:

1. **Synthesis real-time factor** — seconds spent making a voice note (Piper with the bundled
   en_US "joe" medium voice, then PyAV's OGG/Opus 48 kHz encoding) per second of speech, over
   answers of one to eight sentences, the voice loaded beforehand (as Talon's start-up warm-up
   does). Aim: <= 0.3 on 2 cores. The share of the encoding is shown too.
2. **Added latency of a voice reply** — the same answer through the real Telegram channel (fake
   Bot API, fake model), models warm: a text message answered with text only
   (``TALON_VOICE_REPLIES=off``) against the same answered with text and a voice note
   (``always``). The text arrives as soon as it did without voice (the voice note is made while
   the text is sent); the voice note follows after the added latency shown, as a ratio of the
   text-only reply time and in seconds.
3. **Voice in, voice out** — a voice note (the committed English clip) answered with a voice
   note: time to the text and to the voice note, and the transcription's real-time factor.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.telegram import TelegramChannel  # noqa: E402
from talon.config import Settings  # noqa: E402
from talon.runtime import build_runtime  # noqa: E402
from talon.speech.synthesize import Synthesizer, encode_voice_note  # noqa: E402
from tests.conftest import ALICE, TOKEN, make_settings  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402

RUNS = 5
FOX = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "speech_fox.ogg"
SENTENCES = [
    "Good morning, here is what I found about your question.",
    "The train to the coast leaves every hour, and the trip takes about forty minutes.",
    "If you go early, the beach is quiet and the cafes are just opening.",
    "Bring a jacket, because the wind picks up in the afternoon.",
    "Tickets are cheaper when you buy them at the station machine.",
    "The last train back leaves a little before eleven in the evening.",
    "On weekends there are more people, so the morning is the best time.",
    "Have a lovely day out, and tell me if you want a plan for lunch too.",
]
ANSWER = " ".join(SENTENCES[:3])


def ogg_seconds(data: bytes) -> float:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return float(container.duration / av.time_base)


async def synthesis_rtf() -> None:
    synth = Synthesizer.from_settings(Settings(_env_file=None))  # type: ignore[call-arg]
    await synth.warm_up()
    rows = []
    for count in (1, 2, 4, 8):
        text = " ".join(SENTENCES[:count])
        notes = [await synth.synthesize(text, language="en") for _ in range(RUNS)]
        rtf = statistics.median(n.real_time_factor for n in notes)
        speech = statistics.median(n.duration_s for n in notes)
        rows.append((count, speech, rtf))
    # The encoder's share: encode the last note's length of audio alone.
    import numpy as np

    seconds = rows[-1][1]
    samples = np.zeros(int(seconds * 22_050), dtype=np.float32)
    samples[::50] = 0.1
    start = time.perf_counter()
    encode_voice_note(samples, 22_050)
    encode_rtf = (time.perf_counter() - start) / seconds
    synth.close()
    print("1. synthesis real-time factor (bundled Piper voice + OGG/Opus encoding), median of", RUNS)
    for count, speech, rtf in rows:
        print(f"   {count} sentence(s): {speech:5.1f}s of speech, RTF {rtf:.3f}")
    overall = statistics.median(r[2] for r in rows)
    print(f"   median RTF {overall:.3f} (aim <= 0.3); of which OGG/Opus encoding {encode_rtf:.4f}")


async def channel_latency() -> None:
    async with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        with tempfile.TemporaryDirectory() as tmp:
            results: dict[str, tuple[list[float], list[float]]] = {}
            spoken = 0.0
            for mode in ("off", "always"):
                settings = make_settings(Path(tmp) / mode, tg.base_url, llm.base_url,
                                         TALON_VOICE_REPLIES=mode, TALON_SPEECH_WARMUP=True,
                                         TALON_TRANSCRIBER="off")
                text_times: list[float] = []
                voice_times: list[float] = []
                speech: list[float] = []
                runtime = build_runtime(settings, [TelegramChannel(settings)])
                await runtime.start()
                try:
                    if runtime.warmup is not None:
                        await runtime.warmup
                    for i in range(RUNS + 1):
                        llm.queue(ANSWER)
                        texts_before = len(tg.sent("sendMessage", ALICE))
                        voices_before = len(tg.sent("sendVoice", ALICE))
                        start = time.monotonic()
                        tg.push_update(tg.text_message(ALICE, f"question {mode} {i}", user_id=ALICE))
                        [*_, text] = await tg.wait_for("sendMessage", count=texts_before + 1, timeout=60)
                        if mode == "always":
                            [*_, voice] = await tg.wait_for("sendVoice", count=voices_before + 1, timeout=60)
                            if i:
                                voice_times.append(voice.time - start)
                                speech.append(ogg_seconds(voice.media[0].file.data))  # type: ignore[union-attr]
                        await runtime.bridge.idle()
                        if i:  # the first turn warms the connections
                            text_times.append(text.time - start)
                finally:
                    await runtime.stop()
                results[mode] = (text_times, voice_times)
                if speech:
                    spoken = statistics.median(speech)
    text_only = statistics.median(results["off"][0])
    with_voice_text = statistics.median(results["always"][0])
    voice_note = statistics.median(results["always"][1])
    print(f"2. added latency of a voice reply (Telegram channel, fake Bot API and model), median of {RUNS}")
    print(f"   text-only reply: text after {text_only:.3f}s")
    print(f"   voice reply:     text after {with_voice_text:.3f}s ({with_voice_text / text_only:.2f}x), "
          f"voice note after {voice_note:.3f}s")
    added = voice_note - text_only
    print(f"   added by the voice note: {added:.3f}s for {spoken:.1f}s of speech "
          f"({added / spoken:.3f}s per second of speech; the fake model answers at once, so the "
          "text-only time is the floor of the channel alone)")


async def voice_in_voice_out() -> None:
    async with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        with tempfile.TemporaryDirectory() as tmp:
            settings = make_settings(Path(tmp), tg.base_url, llm.base_url, TALON_SPEECH_WARMUP=True)
            runtime = build_runtime(settings, [TelegramChannel(settings)])
            await runtime.start()
            text_times, voice_times = [], []
            try:
                if runtime.warmup is not None:
                    await runtime.warmup
                for i in range(RUNS):
                    llm.queue(ANSWER)
                    start = time.monotonic()
                    tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5))
                    [*_, text] = await tg.wait_for("sendMessage", count=i + 1, timeout=120)
                    [*_, voice] = await tg.wait_for("sendVoice", count=i + 1, timeout=120)
                    await runtime.bridge.idle()
                    text_times.append(text.time - start)
                    voice_times.append(voice.time - start)
                assert runtime.transcriber is not None
                started = time.perf_counter()
                transcript = await runtime.transcriber.transcribe(FOX)
                stt_rtf = (time.perf_counter() - started) / transcript.duration_s
            finally:
                await runtime.stop()
    print(f"3. voice note in, voice note out (bundled Whisper base + Piper, warm), median of {RUNS}")
    print(f"   text after {statistics.median(text_times):.2f}s, voice note after "
          f"{statistics.median(voice_times):.2f}s; transcription RTF {stt_rtf:.2f}")


async def main() -> None:
    await synthesis_rtf()
    await channel_latency()
    await voice_in_voice_out()


if __name__ == "__main__":
    asyncio.run(main())
