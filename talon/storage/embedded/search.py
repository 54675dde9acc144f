"""The embedded full-text index: SQLite FTS5 in ``<data_dir>/search.sqlite3``.

The session logs (JSONL) stay the record; this index is derived from them and can be rebuilt at
any time (``talon migrate`` indexes what is not indexed yet, ``rebuild`` starts over). Each
indexed line is keyed by (chat, thread, byte offset of the line in its file), so indexing a line
twice changes nothing. Writes are ``synchronous=NORMAL`` in WAL mode: a power cut may lose the
last entries of the index, never the log, and ``talon migrate`` puts them back.

All methods block: ``JsonlSessions`` calls them on its file thread, right after the append they
index, in the same order.
"""

from __future__ import annotations

import logging
import sqlite3
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
    chat_tag, body, tokenize = 'unicode61 remove_diacritics 2'
);
"""


def fts_match(chat: ChatKey, words: list[str]) -> str:
    """The FTS5 expression for plain words in one chat: every word a quoted phrase in ``body``,
    and the chat's own token; nothing of the query is ever FTS5 syntax."""
    terms = [f'chat_tag : "{chat_token(chat)}"']
    terms += ['body : "' + w.replace('"', '""') + '"' for w in words]
    return " AND ".join(terms)


class SearchIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)
        create_private_file(path)
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    def add(self, chat: ChatKey, thread: str, entries: Iterable[tuple[int, Message]]) -> int:
        """Index messages at their byte offsets; the number newly indexed."""
        rows = []
        for pos, message in entries:
            text = searchable_text(message)
            if text is not None:
                rows.append((pos, message, text))
        if not rows:
            return 0
        key, tag, added = str(chat), chat_token(chat), 0
        conn = self._conn
        conn.execute("BEGIN")
        try:
            for pos, message, text in rows:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO lines (chat, thread, pos, at, role, sender) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, thread, pos, message.at, message.role, str(message.meta.get("sender") or "")))
                if cur.rowcount:
                    conn.execute("INSERT INTO fts (rowid, chat_tag, body) VALUES (?, ?, ?)",
                                 (cur.lastrowid, tag, text))
                    added += 1
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return added

    def search(self, chat: ChatKey, words: list[str], limit: int) -> list[SearchHit]:
        if not words:
            return []
        rows = self._conn.execute(
            "SELECT l.thread, l.at, l.role, l.sender, f.body FROM fts f JOIN lines l ON l.id = f.rowid "
            "WHERE fts MATCH ? AND l.chat = ? ORDER BY l.at DESC, l.id DESC LIMIT ?",
            (fts_match(chat, words), str(chat), limit)).fetchall()
        return [SearchHit(str(t), at, str(role), str(sender), str(body)) for t, at, role, sender, body in rows]

    def count(self) -> int:
        row = self._conn.execute("SELECT count(*) FROM lines").fetchone()
        return int(row[0]) if row else 0

    def rebuild(self) -> None:
        """Forget everything indexed (the next ``index_files`` indexes every line again)."""
        self._conn.execute("BEGIN")
        self._conn.execute("DELETE FROM lines")
        self._conn.execute("DELETE FROM fts")
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()


def read_lines(path: Path) -> Iterable[tuple[int, Message]]:
    """(byte offset, message) of every complete, readable line of a JSONL log, streamed."""
    pos = 0
    with open(path, "rb") as fh:
        for raw in fh:
            start, pos = pos, pos + len(raw)
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            try:
                yield start, Message.from_json(raw.decode("utf-8", "replace"))
            except ValueError:
                continue


def index_files(index: SearchIndex, sessions_root: Path) -> tuple[int, int]:
    """Index every log under ``<data_dir>/sessions``: (lines read, lines newly indexed)."""
    read = added = 0
    if not sessions_root.is_dir():
        return 0, 0
    for channel_dir in sorted(p for p in sessions_root.iterdir() if p.is_dir()):
        for chat_dir in sorted(p for p in channel_dir.iterdir() if p.is_dir()):
            key = chat_of(chat_dir)
            for log_file in sorted(chat_dir.glob("*.jsonl")):
                batch: list[tuple[int, Message]] = []
                for entry in read_lines(log_file):
                    read += 1
                    batch.append(entry)
                    if len(batch) >= 500:
                        added += index.add(key, log_file.stem, batch)
                        batch = []
                added += index.add(key, log_file.stem, batch)
    return read, added


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
