"""Console channel: chat with the agent in a terminal, with the same core and sessions.

``/attach PATH [caption]`` sends a file as if it came from a chat app.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from talon.attachments import AttachmentStore
from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import InboundMessage, OutboundReply, RemoteFile

from channels.base import Channel, PartCallback

log = logging.getLogger(__name__)

_KIND_BY_EXT = {
    ".jpg": "photo", ".jpeg": "photo", ".png": "photo", ".webp": "photo", ".gif": "animation",
    ".ogg": "voice", ".oga": "voice", ".opus": "voice", ".mp3": "audio", ".m4a": "audio",
    ".wav": "audio", ".amr": "audio", ".mp4": "video", ".mov": "video", ".webm": "video",
}


class ConsoleChannel(Channel):
    name = "console"

    def __init__(self, *, chat_id: str = "local", stdin: TextIO | None = None,
                 stdout: TextIO | None = None, media_root: Path | None = None) -> None:
        self.chat_id = chat_id
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.media_root = media_root
        self._bridge: Any = None
        self._reader: asyncio.Task[None] | None = None
        self.finished = asyncio.Event()
        self._counter = 0

    async def start(self, bridge: Any) -> None:
        self._bridge = bridge
        self._reader = asyncio.create_task(self._read_loop(), name="console-reader")

    async def stop(self) -> None:
        if self._reader:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    def _print(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._print("Talon console. Type a message; /attach PATH [caption] sends a file; Ctrl-D quits.\n")
        while True:
            self._print("you> ")
            line = await loop.run_in_executor(None, self.stdin.readline)
            if not line:
                await self._bridge.idle()
                self.finished.set()
                return
            line = line.rstrip("\n")
            if not line.strip():
                continue
            message = self._parse(line)
            if message is None:
                continue
            self._bridge.submit(message)
            # One exchange at a time keeps the prompt readable.
            await self._bridge.idle()

    def _parse(self, line: str) -> InboundMessage | None:
        self._counter += 1
        message_id = f"{int(time.time() * 1000)}-{self._counter}"
        files: list[RemoteFile] = []
        text = line
        if line.startswith("/attach"):
            try:
                words = shlex.split(line)
            except ValueError as exc:
                self._print(f"! cannot read that /attach line: {exc}\n")
                return None
            if len(words) < 2:
                self._print("! usage: /attach PATH [caption]\n")
                return None
            path = Path(words[1]).expanduser()
            if not path.is_file():
                self._print(f"! no such file: {path}\n")
                return None
            kind = _KIND_BY_EXT.get(path.suffix.lower(), "document")
            files.append(RemoteFile(kind=kind, source=str(path.resolve()), name=path.name,
                                    size=path.stat().st_size))
            text = " ".join(words[2:])
        return InboundMessage(channel=self.name, chat_id=self.chat_id, sender_id="console",
                              message_id=message_id, text=text, files=files)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
        path = Path(remote.source)
        try:
            with open(path, "rb") as fh:
                ref = store.put_chunks(iter(lambda: fh.read(1 << 16), b""),
                                       mime=remote.mime or "application/octet-stream",
                                       name=remote.name, limit=limits.download_max_bytes)
        except OSError as exc:
            return base.model_copy(update={"notice": f"could not read {remote.name}: {exc.strerror}"})
        except Exception as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        parts = [f"talon> {reply.text}\n"] if reply.text.strip() else []
        parts += [f"[attachment {m}]\n" for m in reply.media]
        parts += [f"! {n}\n" for n in reply.notices]
        for index, part in enumerate(parts):
            if index < skip_parts:
                continue
            self._print(part)
            if on_part:
                await on_part(index + 1)
