"""Sessions as files: one JSONL file per chat thread under ``<data_dir>/sessions``.

Every append is one write of complete lines, fsynced, so the log survives a crash: a torn last
line (power loss mid-write) is skipped on load and the next append starts a fresh line. The file
work runs on a thread of its own, in submission order (an fsync takes milliseconds, far more on a
busy disk, and must not stall the event loop).

Loading is incremental: the parsed messages of recently used threads are kept, and a later load
parses only the lines appended since, so a long chat is not re-parsed on every turn.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from talon.content import Message
from talon.permissions import open_private, private_dir
from talon.storage.sessions import ChatKey, SessionFiles, new_thread_name

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
    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
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

    @staticmethod
    def _append(path: Path, payload: bytes) -> None:
        private_dir(path.parent)
        with os.fdopen(open_private(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "ab+") as fh:
            # A torn last line from a crash must not swallow the next record.
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    payload = b"\n" + payload
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())

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
        payload = "".join(m.to_json() + "\n" for m in messages).encode("utf-8")
        await self._run(lambda: self._append(self.thread_path(chat, thread), payload))

    async def size_bytes(self, chat: ChatKey) -> int:
        def go() -> int:
            try:
                return self.thread_path(chat).stat().st_size
            except FileNotFoundError:
                return 0

        return await self._run(go)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, True)
