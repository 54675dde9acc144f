"""Rooms and channels shared by several people, platform neutral: which are served, when a
message in one is a turn, and what was said there that was not for the bot.

- ``parse_allowed``: a comma-separated setting of room/channel ids (``TALON_MATRIX_ALLOWED_ROOMS``
  and the like), empty for none: deny by default.
- ``ChatterLog``: per conversation, the last ``size`` messages that did not address the bot,
  handed to its next addressed turn (then forgotten); memory only, bounded and forgotten when idle.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from talon.bounded import BoundedMap
from talon.envelope import Chatter


def parse_allowed(value: str) -> frozenset[str]:
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def describe_unaddressed(text: str, files: int) -> str:
    """A chatter line's text: what was said, and that something was attached."""
    if files:
        noun = "a file" if files == 1 else f"{files} files"
        return f"{text} [sent {noun}]" if text else f"[sent {noun}]"
    return text


@dataclass
class ChatterLog:
    """The recent unaddressed messages of each room conversation (see the module docstring)."""

    size: int
    name: str = "chatter"
    _lines: BoundedMap[str, deque[Chatter]] = field(init=False)

    def __post_init__(self) -> None:
        self._lines = BoundedMap(self.name)

    def add(self, conversation: str, speaker: str, text: str) -> None:
        if self.size <= 0 or not text.strip():
            return
        lines = self._lines.setdefault(conversation, deque(maxlen=self.size))
        lines.append(Chatter(speaker=speaker, text=text))

    def take(self, conversation: str) -> list[Chatter]:
        """What was said since the last turn of this conversation; forgotten once taken."""
        return list(self._lines.pop(conversation, ()))
