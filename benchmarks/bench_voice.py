"""Voice: how fast and how well the bundled Whisper hears, how fast the bundled voice speaks, and
what a voice reply adds, in one run.

Run: ``python benchmarks/bench_voice.py`` (the transcription table takes 5-10 minutes on 2
cores, more when they are busy; the rest about a minute); ``--only stt`` for the transcription
table alone, ``--rounds N`` for more or fewer rounds of it (default 3). Figures:

0. **Transcription settings** — the bundled multilingual Whisper base through Talon's own
   faster-whisper backend (``FasterWhisperBackend``, ``WhisperOptions``) on the project's voice
   notes in five languages (tests/fixtures/voice_samples.json): for each configuration, the
   real-time factor (seconds of decoding and transcribing per second of audio, the best of the
   rounds for each note, all notes together and the worst language) and the word error rate per
   language (jiwer, lowercase, no punctuation). The configurations run interleaved, round after
   round, all models loaded, so a machine busy with other work slows them alike. Aim: RTF <= 0.15
   on 2 cores at a word error rate no worse than the settings before issue 28 ("before").

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
import dataclasses
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
from talon.speech.transcribe import (  # noqa: E402
    FasterWhisperBackend,
    WhisperOptions,
    bundled_base_dir,
    decode_audio,
    prepare_bundled_base,
)
from talon.config import Limits  # noqa: E402
from tests.support.voice_samples import VoiceSample, voice_samples, wer_by_language  # noqa: E402
from tests.conftest import ALICE, TOKEN, make_settings  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402

RUNS = 5
STT_ROUNDS = 3
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


# (name, options): "before" is what Talon ran before issue 28 (CTranslate2's default of 4 threads,
# a beam of 5, timestamps, the language detected in a pass of its own: "sep"); the row marked *
# is WhisperOptions() as it ships (its cpu_threads=0 is the cores: 2 here); "ts": with
# timestamps; "lang-given": the note's language passed in (no detection at all).
_SEPARATE = {"shared_language_detection": False}
STT_CONFIGS: list[tuple[str, WhisperOptions]] = [
    ("before: int8 4thr beam5 ts sep", WhisperOptions(cpu_threads=4, beam_size=5, without_timestamps=False,
                                                      **_SEPARATE)),
    ("int8 2thr beam5 ts sep", WhisperOptions(cpu_threads=2, beam_size=5, without_timestamps=False, **_SEPARATE)),
    ("int8 2thr beam5 sep", WhisperOptions(cpu_threads=2, beam_size=5, **_SEPARATE)),
    ("int8 2thr beam5", WhisperOptions(cpu_threads=2, beam_size=5)),
    ("int8 2thr beam3", WhisperOptions(cpu_threads=2, beam_size=3)),
    ("int8 2thr beam2", WhisperOptions(cpu_threads=2, beam_size=2)),
    ("int8 2thr beam1", WhisperOptions(cpu_threads=2, beam_size=1)),
    ("int8 2thr beam1 ts", WhisperOptions(cpu_threads=2, beam_size=1, without_timestamps=False)),
    ("int8 1thr beam5", WhisperOptions(cpu_threads=1, beam_size=5)),
    ("float32 2thr beam5", WhisperOptions(compute_type="float32", cpu_threads=2, beam_size=5)),
    ("int8 2thr beam5 no-vad", WhisperOptions(cpu_threads=2, beam_size=5, vad_filter=False)),
    ("int8 2thr beam5 lang-given", WhisperOptions(cpu_threads=2, beam_size=5, language="given")),
]


def _stt_model_dir() -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        return prepare_bundled_base(bundled_base_dir(), Path(tmp))


def transcription_table(rounds: int, only: tuple[str, ...] = ()) -> None:
    samples = voice_samples()
    limits = Limits()
    model_dir = _stt_model_dir()
    backends: list[tuple[str, WhisperOptions, FasterWhisperBackend, object]] = []
    for name, options in STT_CONFIGS:
        if only and name not in only:
            continue
        backend = FasterWhisperBackend(model_dir, options=options)
        model = backend._loaded()
        backends.append((name, options, backend, model))
    durations = {s: decode_audio(s.path, limits=limits).duration_s for s in samples}
    best: dict[tuple[str, VoiceSample], float] = {}
    heard: dict[tuple[str, VoiceSample], str] = {}

    def run(options: WhisperOptions, backend: FasterWhisperBackend, model: object,
            sample: VoiceSample) -> tuple[str, float]:
        # "given": the note's language is passed, to show what detecting it costs.
        language = sample.language if options.language == "given" else options.language
        backend.options = dataclasses.replace(options, language=language)
        start = time.perf_counter()
        audio = decode_audio(sample.path, limits=limits)
        text = backend._run(model, audio.samples).text
        return text, time.perf_counter() - start

    for _, options, backend, model in backends:  # warm: a model's first run allocates its buffers
        run(options, backend, model, samples[0])
    for _ in range(rounds):
        for name, options, backend, model in backends:
            for sample in samples:
                text, elapsed = run(options, backend, model, sample)
                key = (name, sample)
                best[key] = min(best.get(key, elapsed), elapsed)
                heard[key] = text
    languages = sorted({s.language for s in samples}, key=lambda code: (code != "en", code))
    audio_total = sum(durations.values())
    print(f"0. transcription: bundled Whisper base (faster-whisper), {len(samples)} voice notes, "
          f"{audio_total:.0f}s of audio in {len(languages)} languages; best of {rounds} rounds per note")
    header = (f"   {'configuration':30} {'RTF':>5} {'worst':>5} | "
              + " ".join(f"{'WER ' + code:>6}" for code in languages) + f" {'WER all':>7}")
    print(header)
    shipped = dataclasses.replace(WhisperOptions(), cpu_threads=WhisperOptions().threads())
    for name, options, _, _ in backends:
        mark = "*" if options == shipped else " "
        rtf = sum(best[(name, s)] for s in samples) / audio_total
        by_language = {
            code: sum(best[(name, s)] for s in samples if s.language == code)
            / sum(durations[s] for s in samples if s.language == code)
            for code in languages
        }
        wer = wer_by_language({s: heard[(name, s)] for s in samples})
        print(f"  {mark}{name:30} {rtf:5.3f} {max(by_language.values()):5.3f} | "
              + " ".join(f"{wer[code]:6.3f}" for code in languages) + f" {wer['all']:7.3f}")
    print("   RTF: all notes together; worst: the slowest language; * the default. Its transcripts:")
    default = next((name for name, options, _, _ in backends if options == shipped), backends[0][0])
    for sample in samples:
        print(f"   [{sample.language}] {heard[(default, sample)]}")


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
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["stt"], help="the transcription table alone")
    parser.add_argument("--rounds", type=int, default=STT_ROUNDS, help="rounds of the transcription table")
    parser.add_argument("--quick", action="store_true",
                        help="the transcription table for two rows only: before issue 28, and as shipped")
    args = parser.parse_args()
    transcription_table(args.rounds, (STT_CONFIGS[0][0], "int8 2thr beam5") if args.quick else ())
    if args.only:
        return
    await synthesis_rtf()
    await channel_latency()
    await voice_in_voice_out()


if __name__ == "__main__":
    asyncio.run(main())
