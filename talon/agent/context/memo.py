"""Values derived from a message, remembered by the message's identity.

Every request of a turn is built from the whole conversation, so without memory each model call
copies and maps every earlier message again, and a turn costs more the longer the chat has gone
on. Messages are never changed in place (the session cache shares them; every transform makes a
new one), so what was derived from one object stays true of it: the agent keeps its copies of
the log for the context pipeline, and a provider its wire form of each message, here.

An entry holds its source weakly: once nothing else holds the message (the session store has
dropped its chat's parsed log), the entry can never be hit again, and it is dropped when it comes
to the front of the map. At most ``DEFAULT_ENTRIES`` entries, and an entry unused for an hour
(its chat idle) is dropped (``talon.bounded``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from talon.bounded import BoundedMap

S = TypeVar("S")
V = TypeVar("V")

DEFAULT_ENTRIES = 12_800
"""About 64 chats' worth of 200-message conversations, as many chats as the session stores keep
parsed (an entry of a chat they dropped holds messages nothing else reads); least recently used
go first."""


class DerivedCache:
    """``derive(source, tag, make)`` returns ``make(source)``, made once per source object and tag.

    Each entry holds a weak reference to its source (the source itself when it cannot be
    referenced weakly), and a hit is one whose reference still gives the very object asked about:
    an ``id`` reused by a later object is a miss.
    """

    def __init__(self, max_entries: int = DEFAULT_ENTRIES, *, name: str = "memo") -> None:
        self.max_entries = max_entries
        self._entries: BoundedMap[tuple[int, Hashable], tuple[Callable[[], Any], Any]] = BoundedMap(
            name, max_entries=max_entries, stale=_gone)

    def derive(self, source: S, tag: Hashable, make: Callable[[S], V]) -> V:
        key = (id(source), tag)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is source:
            value: V = entry[1]
            return value
        made = make(source)
        self._entries[key] = (_reference(source), made)
        return made

    def __len__(self) -> int:
        return len(self._entries)


def _reference(source: object) -> Callable[[], Any]:
    try:
        return weakref.ref(source)
    except TypeError:  # not weakly referable (a tuple, a str): held strongly
        return lambda: source


def _gone(entry: tuple[Callable[[], Any], Any]) -> bool:
    return entry[0]() is None
