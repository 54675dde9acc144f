"""Bounded, idle-expiring maps: every per-chat structure Talon keeps in memory is one of these.

A process that runs for weeks sees every chat it ever served; a plain dict keyed by chat, person
or turn grows with them until the process is killed. ``BoundedMap`` is a dict (least recently used
first, on an ``OrderedDict``) with two bounds:

- at most ``max_entries`` entries: inserting one more drops the least recently used;
- an entry not read or written for ``idle_s`` seconds is dropped (on the next write to the map,
  or ``sweep()``; nothing runs in the background).

An entry still in use (``in_use(value)`` true: a lock held, a task running) is never dropped; it
counts as just used. So a map holds at most ``max_entries`` entries plus those in use at once. An
entry ``stale(value)`` says is no longer needed is dropped as an idle one is.

The bounds are the constants below (``CHAT_STATE_MAX``, ``CHAT_IDLE_S``, docs/limits.md), read
from ``DEFAULTS`` when a map is given none of its own; tests replace ``DEFAULTS`` (smaller bounds,
a clock of their own) instead of sleeping. Every map registers under its ``name`` so ``/metrics``
can report each one's size (``talon_cache_entries{cache=...}``) without holding it alive.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

CHAT_STATE_MAX = 10_000
"""Chats (people, messages) whose per-chat state each structure keeps at once."""
CHAT_IDLE_S = 3600.0
"""A chat's state is dropped after it has been idle this long (longer than any turn, 900 s)."""


@dataclass(frozen=True)
class Bounds:
    max_entries: int = CHAT_STATE_MAX
    idle_s: float = CHAT_IDLE_S
    clock: Callable[[], float] = time.monotonic


DEFAULTS = Bounds()

_live: "weakref.WeakValueDictionary[int, BoundedMap[object, object]]" = weakref.WeakValueDictionary()
_ids = itertools.count()


class BoundedMap(MutableMapping[K, V], Generic[K, V]):
    """A dict with a size bound and an idle bound (see the module docstring)."""

    def __init__(self, name: str, *, max_entries: int | None = None, idle_s: float | None = None,
                 clock: Callable[[], float] | None = None, in_use: Callable[[V], bool] | None = None,
                 stale: Callable[[V], bool] | None = None) -> None:
        self.name = name
        self._max = max_entries
        self._idle = idle_s
        self._clock = clock
        self._in_use = in_use
        self._stale = stale  # an entry that is stale (its subject gone) is dropped like an idle one
        self._data: OrderedDict[K, tuple[V, float]] = OrderedDict()
        _live[next(_ids)] = self  # type: ignore[assignment]

    # --- the bounds, as of now ----------------------------------------------------------------
    @property
    def max_entries(self) -> int:
        return self._max if self._max is not None else DEFAULTS.max_entries

    @property
    def idle_s(self) -> float:
        return self._idle if self._idle is not None else DEFAULTS.idle_s

    def _now(self) -> float:
        return (self._clock or DEFAULTS.clock)()

    # --- the mapping ----------------------------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        value, _ = self._data[key]
        self._data[key] = (value, self._now())
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = (value, self._now())
        self._data.move_to_end(key)
        self.sweep()

    def __delitem__(self, key: K) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def peek(self, key: K) -> V | None:
        """The value without counting it as used."""
        entry = self._data.get(key)
        return None if entry is None else entry[0]

    def clear(self) -> None:
        self._data.clear()

    def sweep(self) -> int:
        """Drop idle entries, then the least recently used past the size bound; returns how many."""
        now = self._now()
        dropped = 0
        # Entries in use are moved to the end (counted as used now), at most once each.
        for _ in range(len(self._data)):
            if not self._data:
                break
            key, (value, used) = next(iter(self._data.items()))
            idle = now - used >= self.idle_s or (self._stale is not None and self._stale(value))
            if not idle and len(self._data) <= self.max_entries:
                break
            if self._in_use is not None and self._in_use(value):
                self._data[key] = (value, now)
                self._data.move_to_end(key)
                continue
            del self._data[key]
            dropped += 1
        return dropped


def sizes() -> dict[str, int]:
    """Every live map's size, summed by name (the process's, for ``/metrics``)."""
    totals: dict[str, int] = {}
    for bounded in list(_live.values()):
        totals[bounded.name] = totals.get(bounded.name, 0) + len(bounded)
    return totals
