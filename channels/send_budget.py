"""One send budget per chat, in two shares: the answers', and the cosmetic calls'.

A platform limits how much a bot may put into one chat (Telegram: about 20 messages a minute into
a group, about one a second into a private chat). A streamed answer adds cosmetic calls (drafts,
interim edits, typing pings, reactions) to the real ones, and under load those must never be
what an answer waits for. So each chat has two sliding windows:

- **Answers** (the messages and files of a reply, the final edit) ``acquire`` room in the
  answers' window, which is the platform's own limit: they wait only when the platform itself
  would refuse them (or after a 429), never dropped.
- **Cosmetic** calls ``try_spend`` their own, separate share, and are dropped when it is spent
  (or while an answer of the chat waits for room), so a busy chat loses its animation first and
  its answers never wait on it.

After a 429 the platform names how long to wait: ``penalize`` blocks the chat for that long.
Cosmetic calls are refused until then, and answers wait it out before they go.

Which windows apply to a chat is the caller's choice (``window_for``, ``cosmetic_for``), so the
same budget serves Telegram (groups tighter than private chats) and a later channel. Clock and
sleep are injectable, so the arithmetic is tested without waiting. ``waits`` counts the answers
that had to wait for their window (a 429's wait is not counted there), for logs, benchmarks and
tests. What it keeps per chat is bounded and dropped for chats idle an hour (``talon.bounded``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from talon.bounded import BoundedMap


@dataclass(frozen=True)
class Window:
    """At most ``limit`` calls in any ``seconds``."""

    limit: int
    seconds: float

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("a send window needs a limit of at least 1 call")


def _unlimited(chat: str) -> Window | None:
    return None


def _held(lock: asyncio.Lock) -> bool:
    return lock.locked()


class SendBudget:
    def __init__(self, window_for: Callable[[str], Window | None], *,
                 cosmetic_for: Callable[[str], Window | None] = _unlimited,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._window_for = window_for
        self._cosmetic_for = cosmetic_for
        self._clock = clock
        self._sleep = sleep
        # Per chat, bounded and dropped when the chat is idle (``talon.bounded``): a window is a
        # minute or so long, so an hour idle has nothing left to remember.
        self._spent: BoundedMap[str, deque[float]] = BoundedMap("send_budget", clock=clock)  # answers
        self._cosmetic: BoundedMap[str, deque[float]] = BoundedMap("send_budget_cosmetic", clock=clock)
        self._locks: BoundedMap[str, asyncio.Lock] = BoundedMap("send_budget_locks", clock=clock, in_use=_held)
        self._blocked_until: BoundedMap[str, float] = BoundedMap("send_budget_blocked", clock=clock)
        self.waited_s = 0.0  # total time answers waited (a 429's wait included)
        self.waits = 0  # answers that waited for room in their window
        self.dropped = 0  # cosmetic calls refused
        self.spent = 0  # calls counted, of both kinds

    def _trim(self, chat: str, window: Window, now: float,
              book: BoundedMap[str, deque[float]] | None = None) -> deque[float]:
        spent = (self._spent if book is None else book).setdefault(chat, deque())
        while spent and spent[0] <= now - window.seconds:
            spent.popleft()
        return spent

    def blocked_for(self, chat: str) -> float:
        """Seconds until a 429's wait is over for ``chat`` (0 when it is not blocked)."""
        return max(0.0, self._blocked_until.get(chat, 0.0) - self._clock())

    def penalize(self, chat: str, seconds: float) -> None:
        """The platform said "too many requests, retry after ``seconds``" for this chat."""
        until = self._clock() + max(0.0, seconds)
        self._blocked_until[chat] = max(self._blocked_until.get(chat, 0.0), until)

    def try_spend(self, chat: str, calls: int = 1) -> bool:
        """Count ``calls`` cosmetic calls if the chat's cosmetic share has room; False: drop them."""
        if self.blocked_for(chat) > 0 or self._locks.get(chat, asyncio.Lock()).locked():
            self.dropped += 1  # blocked by a 429, or an answer is waiting for room
            return False
        window = self._cosmetic_for(chat)
        now = self._clock()
        if window is not None:
            spent = self._trim(chat, window, now, self._cosmetic)
            if len(spent) + calls > window.limit:
                self.dropped += 1
                return False
            spent.extend([now] * calls)
        self.spent += calls
        return True

    async def acquire(self, chat: str, calls: int = 1) -> float:
        """Wait until ``calls`` answer calls may go to ``chat``, then count them; returns the
        seconds waited (a 429's wait included)."""
        window = self._window_for(chat)
        lock = self._locks.setdefault(chat, asyncio.Lock())
        waited = 0.0
        windowed = False
        async with lock:  # one waiter per chat at a time, so the order of sends is kept
            while (blocked := self.blocked_for(chat)) > 0:
                waited += blocked
                await self._sleep(blocked)
            if window is not None:
                calls = max(1, min(calls, window.limit))
                while True:
                    now = self._clock()
                    spent = self._trim(chat, window, now)
                    if len(spent) + calls <= window.limit:
                        break
                    # The call that frees room is the one that leaves the window soonest.
                    delay = spent[len(spent) + calls - window.limit - 1] + window.seconds - now
                    if not windowed:
                        windowed = True
                        self.waits += 1
                    waited += delay
                    await self._sleep(delay)
                spent.extend([self._clock()] * calls)
            self.spent += calls
        self.waited_s += waited
        return waited
