"""Sessions: one JSONL file per chat thread under ``<data_dir>/sessions``.

Every message is appended as one complete line and fsynced, so the log survives a crash: a torn
last line (power loss mid-write) is skipped on load and the next append starts a fresh line.
Media blocks are stored as attachment references, never as bytes.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from talon.content import Message

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")


@dataclass(frozen=True)
class ChatKey:
    channel: str
    chat_id: str

    def __str__(self) -> str:
        return f"{self.channel}:{self.chat_id}"


def _safe(part: str) -> str:
    cleaned = _SAFE.sub("_", part)
    return cleaned or "_"


class SessionStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)

    def chat_dir(self, chat: ChatKey) -> Path:
        return self.root / _safe(chat.channel) / _safe(chat.chat_id)

    def current_thread(self, chat: ChatKey) -> str:
        pointer = self.chat_dir(chat) / "CURRENT"
        try:
            name = pointer.read_text("utf-8").strip()
        except FileNotFoundError:
            return "main"
        return name or "main"

    def thread_path(self, chat: ChatKey, thread: str | None = None) -> Path:
        return self.chat_dir(chat) / f"{thread or self.current_thread(chat)}.jsonl"

    def archive_path(self, chat: ChatKey, thread: str | None = None) -> Path:
        """The readable markdown archive of summarized turns for a thread."""
        return self.chat_dir(chat) / f"{thread or self.current_thread(chat)}.archive.md"

    def new_thread(self, chat: ChatKey) -> str:
        """Start a fresh thread; the old one stays on disk untouched."""
        directory = self.chat_dir(chat)
        directory.mkdir(parents=True, exist_ok=True)
        name = time.strftime("t%Y%m%d-%H%M%S", time.gmtime())
        suffix = 0
        candidate = name
        while (directory / f"{candidate}.jsonl").exists():
            suffix += 1
            candidate = f"{name}-{suffix}"
        tmp = directory / "CURRENT.tmp"
        tmp.write_text(candidate, "utf-8")
        os.replace(tmp, directory / "CURRENT")
        return candidate

    def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        path = self.thread_path(chat, thread)
        messages: list[Message] = []
        try:
            lines = path.read_text("utf-8").splitlines()
        except FileNotFoundError:
            return messages
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                messages.append(Message.from_json(line))
            except ValueError:
                log.warning("session %s line %d is unreadable (torn write?); skipped", path, number)
        return messages

    def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        path = self.thread_path(chat, thread)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = "".join(m.to_json() + "\n" for m in messages).encode("utf-8")
        with open(path, "ab+") as fh:
            # A torn last line from a crash must not swallow the next record.
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    payload = b"\n" + payload
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())

    def size_bytes(self, chat: ChatKey) -> int:
        try:
            return self.thread_path(chat).stat().st_size
        except FileNotFoundError:
            return 0
