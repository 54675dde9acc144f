"""Full-text search over a chat's stored messages: what is indexed, how a query is read, a hit.

Both session stores keep an index as messages are stored: the embedded one a SQLite FTS5 table
(``talon.storage.embedded.search``), the PostgreSQL one a ``tsvector`` column with a GIN index
(``talon.storage.postgres.sessions``). Neither stems: FTS5's ``unicode61`` tokenizer and
PostgreSQL's ``simple`` configuration split words and fold case in any language, so a query in
Greek, Russian or Portuguese finds what was written, not an English stem of it.

A query is never handed to either engine as syntax. ``query_words`` keeps the words (letters and
digits) of what a person or the model typed, and every store matches all of them as plain terms
(quoted in FTS5, ``plainto_tsquery`` in PostgreSQL): quotes, ``*``, ``OR``, ``NEAR``, column
names, ``chat_id = ...`` are words or nothing. The chat is not part of the query either: each
store restricts the search to the chat by equality on its own columns, and also indexes a token
derived from the chat (``chat_token``) that every query requires, so the engine never even
collects another chat's matches.

Indexed: the text of user and assistant messages (captions and the text of documents are text
blocks), voice transcripts and the names of files. Not indexed: tool calls and results, summary
checkpoints and other bookkeeping.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass

from talon.content import AudioBlock, FileBlock, ImageBlock, Message, TextBlock
from talon.storage.sessions import ChatKey

# Words: runs of letters and digits in any script (``_`` separates, as in both tokenizers).
_WORD = re.compile(r"[^\W_]+")
MAX_QUERY_WORDS = 16
MAX_LIMIT = 50
DEFAULT_LIMIT = 10
_SNIPPET = 240


def query_words(query: str) -> list[str]:
    """The plain words of a query, lower-cased, at most ``MAX_QUERY_WORDS``; [] when none."""
    words: list[str] = []
    for word in _WORD.findall(query.lower()):
        if word not in words:
            words.append(word[:64])
        if len(words) >= MAX_QUERY_WORDS:
            break
    return words


def index_words(text: str) -> list[str]:
    """Every word of a text, as ``query_words`` reads them (for the PostgreSQL index)."""
    return _WORD.findall(text.lower())


def chat_token(chat: ChatKey) -> str:
    """One index token for a chat: letters and digits only, so both tokenizers keep it whole."""
    return "zc" + hashlib.sha256(f"{chat.channel}\x00{chat.chat_id}".encode()).hexdigest()[:30]


def searchable_text(message: Message) -> str | None:
    """What of a stored message is indexed; None for messages not indexed at all."""
    if message.role not in ("user", "assistant") or message.meta.get("checkpoint"):
        return None
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, AudioBlock):
            if block.transcript:
                parts.append(block.transcript)
        elif isinstance(block, (FileBlock, ImageBlock)) and block.ref.name:
            parts.append(block.ref.name)
    text = "\n".join(p for p in parts if p.strip())
    return text or None


def clamp_limit(limit: int | None) -> int:
    try:
        value = int(limit) if limit is not None else DEFAULT_LIMIT
    except (TypeError, ValueError):
        value = DEFAULT_LIMIT
    return max(1, min(MAX_LIMIT, value))


@dataclass(frozen=True)
class SearchHit:
    """One stored message that matched: where it is, when, who, and its text."""

    thread: str
    at: float | None
    role: str
    sender: str
    text: str
    chat: ChatKey | None = None  # set by the all-chats search (the panel's), never by a chat's own

    def describe(self, words: list[str] | None = None) -> str:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.at)) if self.at else "undated"
        who = "you (the assistant)" if self.role == "assistant" else (
            f"user {self.sender}" if self.sender else "user")
        return f"[{when}, {who}, conversation {self.thread}] {snippet(self.text, words or [])}"


def snippet(text: str, words: list[str]) -> str:
    """The text around the first matched word, on one line, at most about 240 characters."""
    flat = " ".join(text.split())
    if len(flat) <= _SNIPPET:
        return flat
    lowered = flat.lower()
    first = min((i for i in (lowered.find(w) for w in words) if i >= 0), default=0)
    start = max(0, first - _SNIPPET // 3)
    piece = flat[start:start + _SNIPPET]
    return ("…" if start else "") + piece + ("…" if start + _SNIPPET < len(flat) else "")


SEARCH_OFF = "Search is off here (TALON_SEARCH_INDEX=false): no index of past messages is kept."


def format_hits(query: str, hits: list[SearchHit]) -> str:
    """Hits as the agent tool and ``/search`` show them, newest first."""
    words = query_words(query)
    if not words:
        return "Nothing to search for: the query has no words."
    if not hits:
        return f"No earlier message in this chat matches {' '.join(words)!r}."
    lines = [f"{len(hits)} message(s) in this chat match {' '.join(words)!r} (newest first):"]
    lines += [f"{i}. {hit.describe(words)}" for i, hit in enumerate(hits, 1)]
    return "\n".join(lines)


def memory_search(chat: ChatKey, logs: dict[tuple[ChatKey, str], list[Message]], words: list[str],
                  limit: int) -> list[SearchHit]:
    """The same match over messages in memory (``MemorySessions``): every word, case-folded."""
    hits: list[SearchHit] = []
    for (key, thread), messages in logs.items():
        if key != chat:
            continue
        for message in messages:
            text = searchable_text(message)
            if text is None:
                continue
            found = set(_WORD.findall(text.lower()))
            if all(w in found for w in words):
                hits.append(SearchHit(thread, message.at, message.role, str(message.meta.get("sender") or ""),
                                      text))
    hits.sort(key=lambda h: h.at or 0.0, reverse=True)
    return hits[:limit]


def memory_search_all(logs: dict[tuple[ChatKey, str], list[Message]], words: list[str],
                      limit: int) -> list[SearchHit]:
    """Every chat's messages holding all the words (the operator's search in the panel)."""
    hits: list[SearchHit] = []
    for chat in {key for key, _ in logs}:
        hits += [SearchHit(h.thread, h.at, h.role, h.sender, h.text, chat)
                 for h in memory_search(chat, logs, words, limit)]
    hits.sort(key=lambda h: h.at or 0.0, reverse=True)
    return hits[:limit]
