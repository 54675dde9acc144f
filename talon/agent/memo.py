"""Values derived from a message, remembered by the message's identity.

Every request of a turn is built from the whole conversation, so without memory each model call
copies and maps every earlier message again, and a turn costs more the longer the chat has gone
on. Messages are never changed in place (the session cache shares them; every transform makes a
new one), so what was derived from one object stays true of it: the agent keeps its copies of
the log for the context pipeline, and a provider its wire form of each message, here. At most
``DEFAULT_ENTRIES`` entries, and an entry unused for an hour (its chat idle) is dropped
(``talon.bounded``).
"""

from __future__ import annotations

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

    Each entry holds its source, so the source's ``id`` cannot be reused by another object while
    the entry lives: a hit is always the very object the value was made from.
    """

    def __init__(self, max_entries: int = DEFAULT_ENTRIES, *, name: str = "memo") -> None:
        self.max_entries = max_entries
        self._entries: BoundedMap[tuple[int, Hashable], tuple[Any, Any]] = BoundedMap(name, max_entries=max_entries)

    def derive(self, source: S, tag: Hashable, make: Callable[[S], V]) -> V:
        key = (id(source), tag)
        entry = self._entries.get(key)
        if entry is not None:
            value: V = entry[1]
            return value
        made = make(source)
        self._entries[key] = (source, made)
        return made

    def __len__(self) -> int:
        return len(self._entries)
