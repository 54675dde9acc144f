"""faster-whisper's options: the settings reach ``WhisperOptions``, and the options become the
keywords of ``WhisperModel`` and ``transcribe`` (what the benchmark chose, docs/voice.md)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import ValidationError

from talon.config import Settings
from talon.speech.transcribe import WhisperOptions, whisper_options


def settings(**env: str) -> Settings:
    return Settings(_env_file=None, **env)  # type: ignore[call-arg]


def test_the_settings_defaults_are_the_benchmarked_options() -> None:
    assert whisper_options(settings()) == WhisperOptions()


def test_each_setting_reaches_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALON_WHISPER_COMPUTE", "float32")
    monkeypatch.setenv("TALON_WHISPER_THREADS", "3")
    monkeypatch.setenv("TALON_WHISPER_BEAM", "2")
    options = whisper_options(settings())
    assert options.model_kwargs() == {"compute_type": "float32", "cpu_threads": 3}
    assert options.transcribe_kwargs()["beam_size"] == 2


@pytest.mark.parametrize(("name", "value"), [
    ("TALON_WHISPER_BEAM", "0"), ("TALON_WHISPER_BEAM", "11"), ("TALON_WHISPER_THREADS", "-1"),
    ("TALON_WHISPER_COMPUTE", "float64"), ("TALON_WHISPER_COMPUTE", "int8; rm -rf /"),
])
def test_a_bad_value_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name):
        settings()


def test_zero_threads_means_the_cores_talon_may_use() -> None:
    cores = len(os.sched_getaffinity(0))
    assert WhisperOptions(cpu_threads=0).model_kwargs()["cpu_threads"] == cores
    assert WhisperOptions(cpu_threads=1).model_kwargs()["cpu_threads"] == 1


def test_the_language_is_detected_in_the_transcribing_pass() -> None:
    kwargs: dict[str, Any] = WhisperOptions().transcribe_kwargs(multilingual_model=True)
    # A language skips faster-whisper's separate detection pass; multilingual replaces it with the
    # language each window's own encoder output shows.
    assert kwargs["multilingual"] is True and kwargs["language"] == "en"
    assert kwargs["vad_filter"] is True and kwargs["without_timestamps"] is True
    assert kwargs["condition_on_previous_text"] is False


def test_an_english_only_model_or_a_given_language_gets_no_detection() -> None:
    english_only = WhisperOptions().transcribe_kwargs(multilingual_model=False)
    assert "multilingual" not in english_only and english_only["language"] is None
    given = WhisperOptions(language="fr").transcribe_kwargs()
    assert "multilingual" not in given and given["language"] == "fr"
    separate = WhisperOptions(shared_language_detection=False).transcribe_kwargs()
    assert "multilingual" not in separate and separate["language"] is None
