"""Pacing sends into one chat: at most N messages in any sliding window (Telegram: about 20 a
minute into a group).

A long reply in a group would otherwise run into 429s halfway; paced, it waits before the send
that would break the limit. The pacer only delays, it never drops: a 429 Telegram still sends
(other bots' traffic is not ours to see) is honoured by the channel's retry as anywhere else.

One ``SendPacer`` per channel, keyed by chat, so two topics of one group share the group's
allowance. Clock and sleep are injectable, so the arithmetic is tested without waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable


class SendPacer:
    def __init__(self, limit: int, window_s: float = 60.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if limit < 1:
            raise ValueError("a send pace needs a limit of at least 1 message per window")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._sleep = sleep
        self._sent: dict[str, deque[float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.waited_s = 0.0  # total time spent waiting, for logs and tests

    async def acquire(self, chat: str, messages: int = 1) -> float:
        """Wait until ``messages`` more may go to ``chat`` within the window, then count them.
        Returns the seconds waited."""
        messages = max(1, min(messages, self.limit))
        lock = self._locks.setdefault(chat, asyncio.Lock())
        waited = 0.0
        async with lock:  # one waiter per chat at a time, so the order of sends is kept
            sent = self._sent.setdefault(chat, deque())
            while True:
                now = self._clock()
                while sent and sent[0] <= now - self.window_s:
                    sent.popleft()
                if len(sent) + messages <= self.limit:
                    break
                # The send that frees room is the one that leaves the window soonest.
                delay = sent[len(sent) + messages - self.limit - 1] + self.window_s - now
                waited += delay
                await self._sleep(delay)
            now = self._clock()
            sent.extend([now] * messages)
        self.waited_s += waited
        return waited
