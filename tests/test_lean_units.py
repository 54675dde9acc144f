"""Issue 28: speech models let go when unused, never while a note is being heard (no real model)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from talon.speech.cpu_pool import CpuPool
from talon.speech.transcribe import DecodedAudio, _LocalBackend, _Recognized


class Slow(_LocalBackend):
    """A backend whose 'model' is a counter, and whose run waits until told to finish."""

    name = "slow"

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.running = threading.Event()
        self.finish = threading.Event()

    def _load(self) -> Any:
        self.loads += 1
        return object()

    def _run(self, model: Any, samples: Any) -> _Recognized:
        self.running.set()
        self.finish.wait(10)
        return _Recognized("words", "en")


async def test_a_model_in_use_is_kept_an_idle_one_is_let_go_and_loads_again() -> None:
    backend = Slow()
    pool = CpuPool(1, "test-lean")
    audio = DecodedAudio(samples=None, duration_s=1.0)  # type: ignore[arg-type]
    try:
        assert not backend.unload_if_idle(0)  # nothing loaded yet
        hearing = asyncio.ensure_future(backend.recognize(audio, pool.run))
        await asyncio.to_thread(backend.running.wait, 10)
        assert not backend.unload_if_idle(0)  # in use: kept
        backend.finish.set()
        assert (await hearing).text == "words"
        assert not backend.unload_if_idle(3600)  # used just now
        assert backend.unload_if_idle(0)  # idle: let go
        assert (await backend.recognize(audio, pool.run)).text == "words"
        assert backend.loads == 2  # loaded again for the next note
    finally:
        pool.close()
