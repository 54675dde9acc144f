"""One send budget per chat, shared by every call a channel makes into it.

A platform limits how much a bot may put into one chat (Telegram: about 20 messages a minute into
a group, about one a second into a private chat), and it counts drafts, edits, typing pings and
real messages alike. A streamed answer adds many cosmetic calls to the real ones, so they share
one budget, with two kinds of calls:

- **Essential** calls (the messages and files of a reply, the final edit) ``acquire``: they wait
  for room in the chat's sliding window, never dropped.
- **Cosmetic** calls (drafts, interim edits, typing, reactions) ``try_spend``: they go only while
  the window keeps a reserve for essential calls, and are dropped otherwise, so a busy chat loses
  its animation first, never its answer.

After a 429 the platform names how long to wait: ``penalize`` blocks the chat for that long.
Cosmetic calls are refused until then, and essential calls wait it out before they go.

Which window applies to a chat is the caller's choice (``window_for``), so the same budget serves
Telegram (groups tighter than private chats) and a later channel. Clock and sleep are injectable,
so the arithmetic is tested without waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """At most ``limit`` calls in any ``seconds``; cosmetic calls leave ``reserve`` of them free."""

    limit: int
    seconds: float
    reserve: int = 0

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("a send window needs a limit of at least 1 call")
        if not 0 <= self.reserve < self.limit:
            raise ValueError("the reserve of a send window must be below its limit")


class SendBudget:
    def __init__(self, window_for: Callable[[str], Window | None], *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._window_for = window_for
        self._clock = clock
        self._sleep = sleep
        self._spent: dict[str, deque[float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._blocked_until: dict[str, float] = {}
        self.waited_s = 0.0  # total time essential calls waited, for logs and tests
        self.dropped = 0  # cosmetic calls refused
        self.spent = 0  # calls counted, of both kinds

    def _trim(self, chat: str, window: Window, now: float) -> deque[float]:
        spent = self._spent.setdefault(chat, deque())
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

    def try_spend(self, chat: str) -> bool:
        """Count one cosmetic call if the chat has room to spare; False: drop the call."""
        if self.blocked_for(chat) > 0 or self._locks.get(chat, asyncio.Lock()).locked():
            self.dropped += 1  # blocked by a 429, or an essential call is waiting for room
            return False
        window = self._window_for(chat)
        now = self._clock()
        if window is not None:
            spent = self._trim(chat, window, now)
            if len(spent) + 1 > window.limit - window.reserve:
                self.dropped += 1
                return False
            spent.append(now)
        self.spent += 1
        return True

    async def acquire(self, chat: str, calls: int = 1) -> float:
        """Wait until ``calls`` essential calls may go to ``chat``, then count them; returns the
        seconds waited (a 429's wait included)."""
        window = self._window_for(chat)
        lock = self._locks.setdefault(chat, asyncio.Lock())
        waited = 0.0
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
                    waited += delay
                    await self._sleep(delay)
                spent.extend([self._clock()] * calls)
            self.spent += calls
        self.waited_s += waited
        return waited
