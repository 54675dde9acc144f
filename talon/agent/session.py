"""Sessions: one JSONL file per chat thread under ``<data_dir>/sessions``.

Every message is appended as one complete line and fsynced, so the log survives a crash: a torn
last line (power loss mid-write) is skipped on load and the next append starts a fresh line.
Media blocks are stored as attachment references, never as bytes.

The log is complete and append-only; context management never rewrites it. A summary checkpoint
is one more record (see ``is_checkpoint``) saying "from here on, the model sees this summary
instead of the first N messages". Next to the logs, ``context/`` holds what context management
writes for the agent to read back: the markdown archive of summarized turns per thread and tool
outputs too large to send whole.

Loading is incremental: the parsed messages of recently used threads are kept, and a later load
parses only the lines appended since, so a long chat is not re-parsed on every turn. Returned
messages are shared with that cache: transform them with ``model_copy``, never in place.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from talon.content import Message
from talon.permissions import open_private, private_dir

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")
_CACHED_THREADS = 64

CHECKPOINT_KEY = "checkpoint"
SUMMARY_CHECKPOINT = "summary"


# Meta key of the record that closes a turn the model server refused for good: the turn stays in
# the log, but later requests leave it out (``talon.agent.context.conversation_view``).
FAILED_TURN = "failed_turn"


def failed_turns(history: Sequence[Message]) -> set[str]:
    return {str(m.meta.get("turn_id")) for m in history if m.meta.get(FAILED_TURN)}


def is_checkpoint(message: Message) -> bool:
    """A summary checkpoint record (bookkeeping in the log, not a turn of the conversation)."""
    return message.meta.get(CHECKPOINT_KEY) == SUMMARY_CHECKPOINT


@dataclass
class _Parsed:
    inode: int
    offset: int  # bytes of complete lines parsed so far
    lines: int
    messages: list[Message] = field(default_factory=list)


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


class SessionStore:
    def __init__(self, data_dir: Path) -> None:
        # Absolute: the archive and saved-output paths are shown to the agent, whose file tools
        # resolve a relative path inside the workspace, not the process's working directory.
        self.root = Path(data_dir).absolute() / "sessions"
        private_dir(self.root)
        self._parsed: OrderedDict[Path, _Parsed] = OrderedDict()

    def chat_dir(self, chat: ChatKey) -> Path:
        return self.root / safe_path_part(chat.channel) / safe_path_part(chat.chat_id)

    def current_thread(self, chat: ChatKey) -> str:
        pointer = self.chat_dir(chat) / "CURRENT"
        try:
            name = pointer.read_text("utf-8").strip()
        except FileNotFoundError:
            return "main"
        return name or "main"

    def thread_path(self, chat: ChatKey, thread: str | None = None) -> Path:
        return self.chat_dir(chat) / f"{thread or self.current_thread(chat)}.jsonl"

    def context_dir(self, chat: ChatKey) -> Path:
        """What context management writes for the agent to read back (archives, large outputs).

        The agent's file tools may read this one directory of the chat being served, read-only.
        """
        return self.chat_dir(chat) / "context"

    def archive_path(self, chat: ChatKey, thread: str | None = None) -> Path:
        """The readable markdown archive of summarized turns for a thread."""
        return self.context_dir(chat) / f"{thread or self.current_thread(chat)}.archive.md"

    def results_dir(self, chat: ChatKey) -> Path:
        """Tool outputs too large to send whole, named by content hash."""
        return self.context_dir(chat) / "results"

    def new_thread(self, chat: ChatKey) -> str:
        """Start a fresh thread; the old one stays on disk untouched."""
        directory = self.chat_dir(chat)
        private_dir(directory)
        name = time.strftime("t%Y%m%d-%H%M%S", time.gmtime())
        suffix = 0
        candidate = name
        while (directory / f"{candidate}.jsonl").exists():
            suffix += 1
            candidate = f"{name}-{suffix}"
        tmp = directory / "CURRENT.tmp"
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as fh:
            fh.write(candidate)
        os.replace(tmp, directory / "CURRENT")
        return candidate

    def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        path = self.thread_path(chat, thread)
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

    def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        path = self.thread_path(chat, thread)
        private_dir(path.parent)
        payload = "".join(m.to_json() + "\n" for m in messages).encode("utf-8")
        with os.fdopen(open_private(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "ab+") as fh:
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
