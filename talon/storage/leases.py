"""Leases: a named right (serve this chat, poll Telegram) held by one worker until it expires.

Taking one succeeds when it is free, expired, or already the taker's (which renews it). The holder
renews the leases it uses; one it fails to renew in time is free for others. Leases exist only
where workers share stores (PostgreSQL: ``talon.storage.postgres.leases.PgLeases``, whose clock is
the database's, so workers' clocks do not matter); ``MemoryLeases`` is the same contract for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


def chat_lease(channel: str, chat_id: str) -> str:
    return f"chat:{channel}:{chat_id}"


@dataclass(frozen=True)
class LeaseSummary:
    live: int
    expired: int  # not yet taken over: a worker died or is stuck
    holders: int  # distinct live holders


class Leases(Protocol):
    holder: str
    ttl_s: float

    async def acquire(self, name: str) -> bool:
        """Take (or renew) the lease ``name`` for ``ttl_s``; False when another holds it."""

    async def renew(self, names: list[str]) -> set[str]:
        """Extend the named leases, where still ours and live; the names renewed."""

    async def release(self, name: str) -> None: ...

    async def release_all(self) -> None: ...

    async def holder_of(self, name: str) -> str | None: ...

    async def summary(self) -> LeaseSummary: ...


class MemoryLeases:
    """Leases in a dict shared by the ``MemoryLeases`` of one test (pass the same ``table``)."""

    def __init__(self, holder: str, ttl_s: float, table: dict[str, tuple[str, float]] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.holder = holder
        self.ttl_s = ttl_s
        self.table: dict[str, tuple[str, float]] = {} if table is None else table
        self.clock = clock

    async def acquire(self, name: str) -> bool:
        now = self.clock()
        held = self.table.get(name)
        if held is not None and held[1] > now and held[0] != self.holder:
            return False
        self.table[name] = (self.holder, now + self.ttl_s)
        return True

    async def renew(self, names: list[str]) -> set[str]:
        now = self.clock()
        renewed = set()
        for name in names:
            held = self.table.get(name)
            if held is not None and held[0] == self.holder and held[1] > now:
                self.table[name] = (self.holder, now + self.ttl_s)
                renewed.add(name)
        return renewed

    async def release(self, name: str) -> None:
        if self.table.get(name, ("", 0.0))[0] == self.holder:
            del self.table[name]

    async def release_all(self) -> None:
        for name in [n for n, (h, _) in self.table.items() if h == self.holder]:
            del self.table[name]

    async def holder_of(self, name: str) -> str | None:
        held = self.table.get(name)
        return held[0] if held is not None and held[1] > self.clock() else None

    async def summary(self) -> LeaseSummary:
        now = self.clock()
        live = [h for h, expires in self.table.values() if expires > now]
        return LeaseSummary(len(live), len(self.table) - len(live), len(set(live)))
