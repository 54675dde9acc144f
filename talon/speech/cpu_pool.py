"""A bounded pool for CPU-heavy work off the event loop (transcription, speech synthesis).

``run`` hands a function to the pool's threads; ``slot`` is the semaphore that keeps at most
``concurrency`` jobs of the pool's kind going at once (one per event loop: an asyncio.Semaphore
binds to the loop it first waits on, and the tests run several loops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

_T = TypeVar("_T")


class CpuPool:
    def __init__(self, concurrency: int, name: str) -> None:
        self.concurrency = max(1, concurrency)
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix=name)
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def run(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            self._semaphores = {lp: s for lp, s in self._semaphores.items() if not lp.is_closed()}
            sem = self._semaphores[loop] = asyncio.Semaphore(self.concurrency)
        return sem

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
