"""Sessions: the append-only log of each chat thread, plus the context files next to it.

The log is complete and append-only; context management never rewrites it. A summary checkpoint
is one more record saying "from here on, the model sees this summary instead of the first N
messages". Media blocks are stored as attachment references, never as bytes.

Next to the log, ``context/`` holds what context management writes for the agent to read back:
the markdown archive of summarized turns per thread and tool outputs too large to send whole.
These are files in every implementation (with many workers, on storage they all mount), at the
paths the agent is shown: ``SessionFiles`` computes them.

Every message is stamped with the time it is stored (``Message.at``) unless it carries one, and
indexed for full-text search (``talon.storage.search``); ``search`` finds a chat's own messages,
every thread of it, and never another chat's.

Implementations: ``MemorySessions`` (tests), ``talon.storage.embedded.sessions.JsonlSessions``
(one JSONL file per thread) and ``talon.storage.postgres.sessions.PgSessions``. Returned messages
may be shared with a cache: transform them with ``model_copy``, never in place.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from talon.content import Message

if TYPE_CHECKING:
    from talon.storage.search import SearchHit
from talon.permissions import private_dir

_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")


@dataclass(frozen=True)
class ChatKey:
    channel: str
    chat_id: str

    def __str__(self) -> str:
        return f"{self.channel}:{self.chat_id}"


def safe_path_part(part: str) -> str:
    """One path component made from an outside id (chat id, channel name): never a traversal."""
    cleaned = _SAFE.sub("_", part)
    return "_" if cleaned in ("", ".", "..") else cleaned


def stamped(messages: tuple[Message, ...], now: float | None = None) -> list[Message]:
    """The messages with ``at`` set to now where they have none (copies; the originals are kept)."""
    when = time.time() if now is None else now
    return [m if m.at is not None else m.model_copy(update={"at": when}) for m in messages]


def new_thread_name(taken: "set[str] | None" = None) -> str:
    """A fresh thread name from the clock (``t20250101-120000``), unlike any in ``taken``."""
    name = time.strftime("t%Y%m%d-%H%M%S", time.gmtime())
    candidate, suffix = name, 0
    while taken and candidate in taken:
        suffix += 1
        candidate = f"{name}-{suffix}"
    return candidate


class SessionFiles:
    """Where a chat's files live: ``<data_dir>/sessions/<channel>/<chat>/``."""

    def __init__(self, data_dir: Path) -> None:
        # Absolute: the archive and saved-output paths are shown to the agent, whose file tools
        # resolve a relative path inside the workspace, not the process's working directory.
        self.root = Path(data_dir).absolute() / "sessions"
        private_dir(self.root)

    def chat_dir(self, chat: ChatKey) -> Path:
        return self.root / safe_path_part(chat.channel) / safe_path_part(chat.chat_id)

    def context_dir(self, chat: ChatKey) -> Path:
        """What context management writes for the agent to read back (archives, large outputs).

        The agent's file tools may read this one directory of the chat being served, read-only.
        """
        return self.chat_dir(chat) / "context"

    def archive_path(self, chat: ChatKey, thread: str) -> Path:
        """The readable markdown archive of summarized turns for a thread."""
        return self.context_dir(chat) / f"{thread}.archive.md"

    def results_dir(self, chat: ChatKey) -> Path:
        """Tool outputs too large to send whole, named by content hash."""
        return self.context_dir(chat) / "results"

    @property
    def search_enabled(self) -> bool:
        """Whether a full-text index is kept (TALON_SEARCH_INDEX); ``search`` finds nothing without."""
        return True


class SessionStore(Protocol):
    root: Path

    def chat_dir(self, chat: ChatKey) -> Path: ...
    def context_dir(self, chat: ChatKey) -> Path: ...
    def archive_path(self, chat: ChatKey, thread: str) -> Path: ...
    def results_dir(self, chat: ChatKey) -> Path: ...

    @property
    def search_enabled(self) -> bool: ...

    async def current_thread(self, chat: ChatKey) -> str:
        """The thread new messages go to ("main" until ``/new``)."""

    async def new_thread(self, chat: ChatKey) -> str:
        """Start a fresh thread and make it current; the old one is kept untouched."""

    async def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        """The thread's messages (default: the current thread), oldest first."""

    async def load_current(self, chat: ChatKey) -> tuple[str, list[Message]]:
        """The current thread's name and its messages, in one read."""

    async def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        """Add messages at the end of the thread (default: the current one), durably."""

    async def size_bytes(self, chat: ChatKey) -> int:
        """The size of the current thread's log."""

    async def threads(self, chat: ChatKey | None = None) -> list[tuple[ChatKey, str]]:
        """Every (chat, thread) stored, or only ``chat``'s, sorted (``talon export``)."""

    async def search(self, chat: ChatKey, query: str, limit: int = 10) -> "list[SearchHit]":
        """The chat's stored messages (every thread) holding all the words of ``query``, newest
        first. The query is words, never syntax (``talon.storage.search.query_words``)."""

    async def search_all(self, query: str, limit: int = 10) -> "list[SearchHit]":
        """Every chat's stored messages holding all the words, newest first, each hit naming its
        chat: the operator's search in the web panel, never a chat's own tool or command."""

    async def close(self) -> None: ...


class MemorySessions(SessionFiles):
    """Logs in a dict, for tests; the context files still go under ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self._logs: dict[tuple[ChatKey, str], list[str]] = {}
        self._current: dict[ChatKey, str] = {}

    async def current_thread(self, chat: ChatKey) -> str:
        return self._current.get(chat, "main")

    async def new_thread(self, chat: ChatKey) -> str:
        name = new_thread_name({t for c, t in self._logs if c == chat})
        self._current[chat] = name
        return name

    async def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        lines = self._logs.get((chat, thread or await self.current_thread(chat)), [])
        return [Message.from_json(line) for line in lines]

    async def load_current(self, chat: ChatKey) -> tuple[str, list[Message]]:
        thread = await self.current_thread(chat)
        return thread, await self.load(chat, thread)

    async def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        key = (chat, thread or await self.current_thread(chat))
        self._logs.setdefault(key, []).extend(m.to_json() for m in stamped(messages))

    async def size_bytes(self, chat: ChatKey) -> int:
        lines = self._logs.get((chat, await self.current_thread(chat)), [])
        return sum(len(line.encode("utf-8")) + 1 for line in lines)

    async def threads(self, chat: ChatKey | None = None) -> list[tuple[ChatKey, str]]:
        return sorted((key for key in self._logs if chat is None or key[0] == chat),
                      key=lambda k: (str(k[0]), k[1]))

    async def search(self, chat: ChatKey, query: str, limit: int = 10) -> "list[SearchHit]":
        from talon.storage.search import clamp_limit, memory_search, query_words

        words = query_words(query)
        if not words:
            return []
        logs = {key: [Message.from_json(line) for line in lines] for key, lines in self._logs.items()
                if key[0] == chat}
        return memory_search(chat, logs, words, clamp_limit(limit))

    async def search_all(self, query: str, limit: int = 10) -> "list[SearchHit]":
        from talon.storage.search import clamp_limit, memory_search_all, query_words

        words = query_words(query)
        if not words:
            return []
        logs = {key: [Message.from_json(line) for line in lines] for key, lines in self._logs.items()}
        return memory_search_all(logs, words, clamp_limit(limit))

    async def close(self) -> None:
        pass
