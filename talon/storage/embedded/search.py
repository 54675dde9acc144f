"""The embedded full-text index: SQLite FTS5 in ``<data_dir>/search.sqlite3``.

The session logs (JSONL) stay the record; this index is derived from them and can be rebuilt at
any time (``rebuild`` starts over). Each indexed line is keyed by (chat, thread, byte offset of
the line in its file), so indexing a line twice changes nothing, and ``progress`` records how far
each log is covered. Entries are written in batches (after 256 messages or a second, before any
search, at close) in WAL mode with ``synchronous=NORMAL``: a crash or power cut may lose the last
entries of the index, never the log; a search first indexes what its chat's logs hold past what
is covered (``catch_up``), and ``talon migrate`` does that for every chat.

All methods block: ``JsonlSessions`` calls them on its file thread, right after the append they
index, in the same order.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from talon.content import Message
from talon.permissions import create_private_file, private_dir
from talon.storage.search import SearchHit, chat_token, searchable_text
from talon.storage.sessions import ChatKey

log = logging.getLogger(__name__)

INDEX_FILE = "search.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lines (
    id INTEGER PRIMARY KEY, chat TEXT NOT NULL, thread TEXT NOT NULL, pos INTEGER NOT NULL,
    at REAL, role TEXT NOT NULL, sender TEXT NOT NULL, UNIQUE (chat, thread, pos)
);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(
    chat_tag, body, tokenize = 'unicode61 remove_diacritics 2', detail = column
);
CREATE TABLE IF NOT EXISTS chats (num INTEGER PRIMARY KEY, chat TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS progress (
    chat TEXT NOT NULL, thread TEXT NOT NULL, covered INTEGER NOT NULL, PRIMARY KEY (chat, thread)
);
"""
# A line's id (the FTS5 rowid) is its chat's number times 2**32 plus its order of indexing in that
# chat: a chat's lines are one range of rowids, which FTS5 seeks to (``rowid BETWEEN``) instead of
# collecting a common word's matches in every chat, and walks newest first (``ORDER BY rowid DESC``).
_CHAT_SPAN = 1 << 32
# Pending entries are written after this many, or this many seconds after the first of them (or
# before a search, or at close).
FLUSH_AFTER = 256
BULK_FLUSH = 4096  # messages per transaction when indexing whole logs (index_files)
FLUSH_AFTER_S = 1.0


def fts_match(chat: ChatKey, words: list[str]) -> str:
    """The FTS5 expression for plain words in one chat: every word a quoted phrase in ``body``,
    and the chat's own token; nothing of the query is ever FTS5 syntax."""
    terms = [f'chat_tag : "{chat_token(chat)}"']
    terms += ['body : "' + w.replace('"', '""') + '"' for w in words]
    return " AND ".join(terms)


def fts_match_all(words: list[str]) -> str:
    """The FTS5 expression for plain words in any chat: every word a quoted phrase in ``body``."""
    return " AND ".join('body : "' + w.replace('"', '""') + '"' for w in words)


class SearchIndex:
    """The index, owned by one thread (the sessions' file thread, or a command-line tool)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)
        create_private_file(path)
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        # Entries not yet written: (chat, thread, pos, at, role, sender, text), and how far each
        # log is covered once they are. Written together, in one transaction (``flush``).
        self._pending: list[tuple[str, str, int, float | None, str, str, str, str]] = []
        self._covered: dict[tuple[str, str], int] = {}
        self._known: dict[tuple[str, str], int] = {}  # coverage as written (a cache of progress)
        self._nums: dict[str, int] = {}  # chat -> its number
        self._next: dict[int, int] = {}  # chat number -> the next id in its range
        self._since = 0.0
        self._hold = False  # set while ``catch_up`` adds: it flushes (and counts) itself

    def add(self, chat: ChatKey, thread: str, entries: Iterable[tuple[int, Message]], end: int | None = None, *,
            start: int | None = None) -> None:
        """Messages at their byte offsets, to be indexed; ``end``: the log is covered up to there
        (with ``start``: only when everything before ``start`` is covered already, so lines the
        index never saw are still found by ``catch_up``).
        Written at the next ``flush``, which comes by itself after ``FLUSH_AFTER`` entries or
        ``FLUSH_AFTER_S`` seconds (one transaction for many messages: an FTS5 commit per message
        would cost more CPU than storing the message)."""
        key, tag = str(chat), chat_token(chat)
        for pos, message in entries:
            text = searchable_text(message)
            if text is not None:
                self._pending.append((key, thread, pos, message.at, message.role,
                                      str(message.meta.get("sender") or ""), tag, text))
        if end is not None and (start is None or self._coverage(key, thread) >= start):
            self._covered[(key, thread)] = max(end, self._covered.get((key, thread), 0))
        now = time.monotonic()
        if not self._since:
            self._since = now
        if not self._hold and (len(self._pending) >= FLUSH_AFTER or now - self._since >= FLUSH_AFTER_S):
            self.flush()

    def _coverage(self, key: str, thread: str) -> int:
        if (key, thread) in self._covered:
            return self._covered[(key, thread)]
        if (key, thread) not in self._known:
            row = self._conn.execute("SELECT covered FROM progress WHERE chat = ? AND thread = ?",
                                     (key, thread)).fetchone()
            self._known[(key, thread)] = int(row[0]) if row else 0
        return self._known[(key, thread)]

    def flush(self) -> int:
        """Write what is pending; the number of messages newly indexed."""
        if not self._pending and not self._covered:
            return 0
        pending, covered = self._pending, self._covered
        self._pending, self._covered, self._since = [], {}, 0.0
        conn, added = self._conn, 0
        for key in {entry[0] for entry in pending}:
            self._chat_num(key)  # allocated outside the transaction: a rollback keeps them valid
        conn.execute("BEGIN")
        try:
            for key, thread, pos, at, role, sender, tag, text in pending:
                num = self._nums[key]
                cur = conn.execute(
                    "INSERT OR IGNORE INTO lines (id, chat, thread, pos, at, role, sender) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (self._next[num], key, thread, pos, at, role, sender))
                if cur.rowcount:
                    conn.execute("INSERT INTO fts (rowid, chat_tag, body) VALUES (?, ?, ?)", (self._next[num], tag, text))
                    self._next[num] += 1
                    added += 1
            conn.executemany(
                "INSERT INTO progress (chat, thread, covered) VALUES (?, ?, ?) ON CONFLICT (chat, thread) "
                "DO UPDATE SET covered = max(covered, excluded.covered)",
                [(k, t, end) for (k, t), end in covered.items()])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            self._known.clear()
            self._next.clear()
            raise
        for k, end in covered.items():
            self._known[k] = max(end, self._known.get(k, 0))
        return added

    def _chat_num(self, key: str) -> int:
        num = self._nums.get(key)
        if num is None:
            row = self._conn.execute("SELECT num FROM chats WHERE chat = ?", (key,)).fetchone()
            if row is None:
                cur = self._conn.execute("INSERT INTO chats (chat) VALUES (?)", (key,))
                row = (cur.lastrowid,)
            num = self._nums[key] = int(row[0])
        if num not in self._next:
            top = self._conn.execute("SELECT max(id) FROM lines WHERE id BETWEEN ? AND ?",
                                     (num * _CHAT_SPAN, (num + 1) * _CHAT_SPAN - 1)).fetchone()
            self._next[num] = int(top[0]) + 1 if top and top[0] is not None else num * _CHAT_SPAN
        return num

    def catch_up(self, chat: ChatKey, chat_dir: Path, *, bulk: bool = False) -> tuple[int, int]:
        """Index what the chat's logs hold past what is covered (lines a crash left out of the
        index, or logs from before it existed): (lines read, messages newly indexed). ``bulk``
        (``index_files``): written in transactions of ``BULK_FLUSH`` messages across chats, not one
        or more per chat (an FTS5 commit per chat is most of the time of indexing many small
        chats); the caller flushes at the end."""
        added = 0 if bulk else self.flush()
        read = 0
        key = str(chat)
        covered = {str(t): int(c) for t, c in self._conn.execute(
            "SELECT thread, covered FROM progress WHERE chat = ?", (key,)).fetchall()}
        for log_file in sorted(chat_dir.glob("*.jsonl")):
            start = covered.get(log_file.stem, 0)
            try:
                if log_file.stat().st_size <= start:
                    continue
            except FileNotFoundError:
                continue
            batch: list[tuple[int, Message]] = []
            end = start
            for pos, message, line_end in read_lines(log_file, start):
                read += 1
                batch.append((pos, message))
                end = line_end
                if len(batch) >= 500:
                    self._add_now(chat, log_file.stem, batch, end)
                    if not bulk or len(self._pending) >= BULK_FLUSH:
                        added += self.flush()
                    batch = []
            self._add_now(chat, log_file.stem, batch, end)
            if not bulk or len(self._pending) >= BULK_FLUSH:
                added += self.flush()
        return read, added

    def _add_now(self, chat: ChatKey, thread: str, batch: list[tuple[int, Message]], end: int) -> None:
        self._hold = True  # no flush from inside add: the caller flushes
        try:
            self.add(chat, thread, batch, end)
        finally:
            self._hold = False

    def search(self, chat: ChatKey, words: list[str], limit: int, chat_dir: Path | None = None) -> list[SearchHit]:
        """Every word, this chat only, newest first; what is pending is written first and, with
        ``chat_dir``, what the chat's logs hold past the index is indexed first."""
        if not words:
            return []
        if chat_dir is not None:
            self.catch_up(chat, chat_dir)
        else:
            self.flush()
        key = str(chat)
        row = self._conn.execute("SELECT num FROM chats WHERE chat = ?", (key,)).fetchone()
        if row is None:
            return []
        num = int(row[0])
        # The chat's range of rowids, newest indexed first; a few more than asked, then by time
        # (lines indexed late, by a catch-up, may be older than their rowid says).
        rows = self._conn.execute(
            "SELECT l.thread, l.at, l.role, l.sender, f.body FROM fts f JOIN lines l ON l.id = f.rowid "
            "WHERE fts MATCH ? AND f.rowid BETWEEN ? AND ? AND l.chat = ? ORDER BY f.rowid DESC LIMIT ?",
            (fts_match(chat, words), num * _CHAT_SPAN, (num + 1) * _CHAT_SPAN - 1, key, limit * 4)).fetchall()
        hits = [SearchHit(str(t), at, str(role), str(sender), str(body)) for t, at, role, sender, body in rows]
        hits.sort(key=lambda h: h.at or 0.0, reverse=True)
        return hits[:limit]

    def search_all(self, words: list[str], limit: int) -> list[SearchHit]:
        """Every word, in any chat, newest indexed first (what is pending is written first); each
        hit names its chat. The words are quoted phrases, never FTS5 syntax (``fts_match_all``)."""
        if not words:
            return []
        self.flush()
        rows = self._conn.execute(
            "SELECT l.chat, l.thread, l.at, l.role, l.sender, f.body FROM fts f JOIN lines l ON l.id = f.rowid "
            "WHERE fts MATCH ? ORDER BY l.at DESC LIMIT ?", (fts_match_all(words), limit)).fetchall()
        hits = []
        for chat, thread, at, role, sender, body in rows:
            channel, _, chat_id = str(chat).partition(":")
            hits.append(SearchHit(str(thread), at, str(role), str(sender), str(body), ChatKey(channel, chat_id)))
        return hits

    def count(self) -> int:
        self.flush()
        row = self._conn.execute("SELECT count(*) FROM lines").fetchone()
        return int(row[0]) if row else 0

    def rebuild(self) -> None:
        """Forget everything indexed (the next ``index_files`` indexes every line again)."""
        self._pending, self._covered, self._known, self._next = [], {}, {}, {}
        self._conn.execute("BEGIN")
        self._conn.execute("DELETE FROM lines")
        self._conn.execute("DELETE FROM fts")
        self._conn.execute("DELETE FROM progress")
        self._conn.execute("COMMIT")

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._conn.close()


def read_lines(path: Path, start: int = 0) -> Iterable[tuple[int, Message, int]]:
    """(byte offset, message, offset after the line) of every complete, readable line of a JSONL
    log from ``start``, streamed. A line still being written (no newline yet) is not read."""
    pos = start
    with open(path, "rb") as fh:
        fh.seek(start)
        for raw in fh:
            if not raw.endswith(b"\n"):
                return
            begin, pos = pos, pos + len(raw)
            if not raw.strip():
                continue
            try:
                yield begin, Message.from_json(raw.decode("utf-8", "replace")), pos
            except ValueError:
                continue


def index_files(index: SearchIndex, sessions_root: Path) -> tuple[int, int]:
    """Index every log under ``<data_dir>/sessions`` past what is covered: (lines read, lines
    newly indexed)."""
    read = added = 0
    if not sessions_root.is_dir():
        return 0, 0
    for channel_dir in sorted(p for p in sessions_root.iterdir() if p.is_dir()):
        for chat_dir in sorted(p for p in channel_dir.iterdir() if p.is_dir()):
            r, a = index.catch_up(chat_of(chat_dir), chat_dir, bulk=True)
            read, added = read + r, added + a
    return read, added + index.flush()


def chat_of(chat_dir: Path) -> ChatKey:
    """The chat a session directory belongs to: its ``CHAT`` file (written by ``JsonlSessions``),
    else its names (which equal the ids for every id made only of safe characters)."""
    try:
        channel, _, chat_id = (chat_dir / "CHAT").read_text("utf-8").partition(":")
        if channel and chat_id:
            return ChatKey(channel, chat_id.rstrip("\n"))
    except FileNotFoundError:
        pass
    return ChatKey(chat_dir.parent.name, chat_dir.name)
