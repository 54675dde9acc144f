"""Sessions as files: one JSONL file per chat thread under ``<data_dir>/sessions``.

Every append is one write of complete lines, fsynced, so the log survives a crash: a torn last
line (power loss mid-write) is skipped on load and the next append starts a fresh line. The file
work runs on a thread of its own, in submission order (an fsync takes milliseconds, far more on a
busy disk, and must not stall the event loop).

Each message is stamped with the time it is stored and indexed for full-text search
(``talon.storage.embedded.search``, FTS5 in ``search.sqlite3``) on the same file thread, right
after its line is written: the log is the record, the index is derived (``talon migrate`` indexes
what a crash between the two left out).

Loading is incremental: the parsed messages of recently used threads are kept, and a later load
parses only the lines appended since, so a long chat is not re-parsed on every turn.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from talon.content import Message
from talon.permissions import open_private, private_dir
from talon.storage.embedded.search import INDEX_FILE, SearchIndex, chat_of
from talon.storage.search import SearchHit, clamp_limit, query_words
from talon.storage.sessions import ChatKey, SessionFiles, new_thread_name, stamped

log = logging.getLogger(__name__)

_CACHED_THREADS = 64
T = TypeVar("T")


@dataclass
class _Parsed:
    inode: int
    offset: int  # bytes of complete lines parsed so far
    lines: int
    messages: list[Message] = field(default_factory=list)


class JsonlSessions(SessionFiles):
    def __init__(self, data_dir: Path, *, index: bool = True) -> None:
        super().__init__(data_dir)
        # The full-text index; None only where a benchmark measures the store without it.
        self.index = SearchIndex(Path(data_dir) / INDEX_FILE) if index else None
        self._named: set[Path] = set()  # chat directories whose CHAT file is known to exist
        self._parsed: OrderedDict[Path, _Parsed] = OrderedDict()  # touched on the file thread only
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessions")

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._executor.submit(fn))

    # --- blocking parts (the file thread; also usable by tools with no loop) ----------------
    def current_thread_now(self, chat: ChatKey) -> str:
        try:
            name = (self.chat_dir(chat) / "CURRENT").read_text("utf-8").strip()
        except FileNotFoundError:
            return "main"
        return name or "main"

    def thread_path(self, chat: ChatKey, thread: str | None = None) -> Path:
        """The JSONL file of a thread (default: the current one). Reads a file: not on the loop."""
        return self.chat_dir(chat) / f"{thread or self.current_thread_now(chat)}.jsonl"

    def _new_thread(self, chat: ChatKey) -> str:
        directory = self.chat_dir(chat)
        private_dir(directory)
        candidate = new_thread_name({p.stem for p in directory.glob("*.jsonl")})
        tmp = directory / "CURRENT.tmp"
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as fh:
            fh.write(candidate)
        os.replace(tmp, directory / "CURRENT")
        return candidate

    def _load(self, path: Path) -> list[Message]:
        try:
            st = path.stat()
        except FileNotFoundError:
            self._parsed.pop(path, None)
            return []
        parsed = self._parsed.get(path)
        if parsed is None or parsed.inode != st.st_ino or st.st_size < parsed.offset:
            parsed = _Parsed(inode=st.st_ino, offset=0, lines=0)
        tail: list[Message] = []
        if st.st_size > parsed.offset:
            with open(path, "rb") as fh:
                fh.seek(parsed.offset)
                data = fh.read()
            cut = data.rfind(b"\n") + 1
            parsed.messages.extend(self._parse(path, data[:cut], parsed.lines))
            parsed.offset += cut
            parsed.lines += data[:cut].count(b"\n")
            if data[cut:]:
                # No newline yet: a torn write, or a line still being written. Not consumed, so
                # it is looked at again once complete.
                tail = self._parse(path, data[cut:], parsed.lines)
        self._parsed[path] = parsed
        self._parsed.move_to_end(path)
        while len(self._parsed) > _CACHED_THREADS:
            self._parsed.popitem(last=False)
        return parsed.messages + tail

    @staticmethod
    def _parse(path: Path, data: bytes, first_line: int) -> list[Message]:
        messages: list[Message] = []
        for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), first_line + 1):
            if not line.strip():
                continue
            try:
                messages.append(Message.from_json(line))
            except ValueError:
                log.warning("session %s line %d is unreadable (torn write?); skipped", path, number)
        return messages

    def _append(self, chat: ChatKey, path: Path, messages: list[Message]) -> None:
        lines = [(m.to_json() + "\n").encode("utf-8") for m in messages]
        payload = b"".join(lines)
        private_dir(path.parent)
        self._name_chat(chat, path.parent)
        with os.fdopen(open_private(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "ab+") as fh:
            fh.seek(0, os.SEEK_END)
            start = fh.tell()
            # A torn last line from a crash must not swallow the next record.
            if start > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    payload = b"\n" + payload
                    start += 1
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
            end = start + sum(len(line) for line in lines)
        if self.index is not None:
            entries, pos = [], start
            for message, line in zip(messages, lines):
                entries.append((pos, message))
                pos += len(line)
            try:
                self.index.add(chat, path.stem, entries, end, start=start)
            except sqlite3.Error as exc:  # the log has the message; `talon migrate` indexes it
                log.error("search index %s: could not index %d message(s) of %s (%s)",
                          self.index.path, len(entries), chat, exc)

    def _name_chat(self, chat: ChatKey, directory: Path) -> None:
        """``CHAT`` in the chat's directory: its real ids (the directory name is made safe)."""
        if directory in self._named:
            return
        marker = directory / "CHAT"
        if not marker.exists():
            tmp = directory / "CHAT.tmp"
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as fh:
                fh.write(str(chat))
            os.replace(tmp, marker)
        self._named.add(directory)

    # --- the interface ----------------------------------------------------------------------
    async def current_thread(self, chat: ChatKey) -> str:
        return await self._run(lambda: self.current_thread_now(chat))

    async def new_thread(self, chat: ChatKey) -> str:
        return await self._run(lambda: self._new_thread(chat))

    async def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        return await self._run(lambda: self._load(self.thread_path(chat, thread)))

    async def load_current(self, chat: ChatKey) -> tuple[str, list[Message]]:
        def go() -> tuple[str, list[Message]]:
            thread = self.current_thread_now(chat)
            return thread, self._load(self.thread_path(chat, thread))

        return await self._run(go)

    async def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        if not messages:
            return
        ready = stamped(messages)
        await self._run(lambda: self._append(chat, self.thread_path(chat, thread), ready))

    async def size_bytes(self, chat: ChatKey) -> int:
        def go() -> int:
            try:
                return self.thread_path(chat).stat().st_size
            except FileNotFoundError:
                return 0

        return await self._run(go)

    @property
    def search_enabled(self) -> bool:
        return self.index is not None

    async def threads(self, chat: ChatKey | None = None) -> list[tuple[ChatKey, str]]:
        def go() -> list[tuple[ChatKey, str]]:
            found: list[tuple[ChatKey, str]] = []
            dirs = [self.chat_dir(chat)] if chat is not None else [
                c for ch in sorted(self.root.iterdir()) if ch.is_dir() for c in sorted(ch.iterdir()) if c.is_dir()]
            for directory in dirs:
                if directory.is_dir():
                    key = chat if chat is not None else chat_of(directory)
                    found += [(key, p.stem) for p in sorted(directory.glob("*.jsonl"))]
            return sorted(found, key=lambda k: (str(k[0]), k[1]))

        return await self._run(go)

    async def search(self, chat: ChatKey, query: str, limit: int = 10) -> list[SearchHit]:
        words, index = query_words(query), self.index
        if not words or index is None:
            return []
        return await self._run(lambda: index.search(chat, words, clamp_limit(limit), self.chat_dir(chat)))

    async def search_all(self, query: str, limit: int = 10) -> list[SearchHit]:
        words, index = query_words(query), self.index
        if not words or index is None:
            return []
        return await self._run(lambda: index.search_all(words, clamp_limit(limit)))

    async def close(self) -> None:
        index = self.index
        if index is not None:  # its last batch is written on the file thread, after the appends
            await self._run(index.close)
        await asyncio.to_thread(self._executor.shutdown, True)
