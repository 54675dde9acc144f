"""Console channel: chat with the agent in a terminal, with the same core and sessions.

``/attach PATH [caption]`` sends a file as if it came from a chat app. Files the agent attaches
are shown as their kind and resolved path inside the media root (``[image] /.../chart.png``),
checked exactly as a chat channel checks them; a reference that cannot be sent is shown as the
same "Could not attach NAME: reason" line a chat would get.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from talon.attachments import AttachmentStore
from talon.config import Limits
from talon.content import InboundFile, InboundKind
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import MediaPathError
from talon.media import MarkdownMediaRef, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason
from talon.media.inbound import human_size

from channels.base import Channel, PartCallback, deliver_parts

log = logging.getLogger(__name__)

_KIND_BY_EXT: dict[str, InboundKind] = {
    ".jpg": "photo", ".jpeg": "photo", ".png": "photo", ".webp": "photo", ".gif": "animation",
    ".ogg": "voice", ".oga": "voice", ".opus": "voice", ".mp3": "audio", ".m4a": "audio",
    ".wav": "audio", ".amr": "audio", ".mp4": "video", ".mov": "video", ".webm": "video",
}


def _valid_text(line: str) -> str:
    """Undecodable input bytes (surrogate escapes in a C/POSIX locale) as U+FFFD: such text could
    not be stored in the inbox or the session (JSON is UTF-8)."""
    try:
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        return line.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


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
        # The live view: the text of the current model step as printed so far, and the last
        # step's text once the turn closed (the final reply does not print it a second time).
        self._live = ""
        self._streamed: str | None = None
        self._asking = asyncio.Event()  # an approval prompt is shown: the next line may answer it

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
        try:
            await self._read_lines()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Never leave `talon chat` waiting for a reader that is gone.
            log.exception("console: reading input failed")
            self._print(f"! the console stopped reading input: {exc}\n")
        finally:
            self.finished.set()

    async def _read_lines(self) -> None:
        self._print("Talon console. Type a message; /attach PATH [caption] sends a file; Ctrl-D quits.\n")
        while True:
            self._print("you> ")
            try:
                line = await self._readline()
            except UnicodeDecodeError:
                self._print("! that line is not valid UTF-8 text; not sent\n")
                continue
            if not line:
                await self._bridge.idle()
                return
            line = _valid_text(line.rstrip("\n"))
            if not line.strip():
                continue
            message = self._parse(line)
            if message is None:
                continue
            self._asking.clear()
            self._bridge.submit(message)
            # One exchange at a time keeps the prompt readable; but a turn waiting for an approval
            # waits for the next line (yes or no), so that line is read now.
            answered = asyncio.ensure_future(self._bridge.idle())
            asking = asyncio.ensure_future(self._asking.wait())
            await asyncio.wait({answered, asking}, return_when=asyncio.FIRST_COMPLETED)
            asking.cancel()  # never ``answered``: cancelling idle() would cancel the turns it waits for

    async def ask_approval(self, approval: Any, text: str) -> str | None:
        prompt_id = await super().ask_approval(approval, text)
        self._asking.set()
        return prompt_id

    def _readline(self) -> "asyncio.Future[str]":
        """The next line of input, read in a daemon thread: a thread blocked on the terminal
        must not keep the process alive after Ctrl-C (the default executor would be joined)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def settle(line: str | None, exc: BaseException | None) -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(line or "")

        def read() -> None:
            try:
                line, exc = self.stdin.readline(), None
            except Exception as error:
                line, exc = None, error
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, line, exc)

        threading.Thread(target=read, name="console-stdin", daemon=True).start()
        return future

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

    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], None] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        """The answer printed as the model writes it; the final reply then adds only what the
        stream did not show (files, notices, a cut-off line)."""
        self._live, self._streamed = "", None

        async def on_text(delta: str) -> None:
            if not self._live:
                self._print("talon> ")
            self._live += delta
            self._print(delta)
            self.stdout.flush()

        async def on_step(asked_for_tools: bool) -> None:
            if asked_for_tools and self._live:
                self._print("\n")  # a preamble to tool calls; the next step starts a new line
                self._live = ""

        async def close() -> None:
            if self._live:
                self._print("\n")
            self._streamed, self._live = self._live, ""

        return LiveReply(on_text=on_text, on_step=on_step, close=close)

    def reply_parts(self, reply: OutboundReply) -> list[str | MarkdownMediaRef]:
        # One part per line shown, derived from the reply alone so skip_parts stays meaningful.
        parts: list[str | MarkdownMediaRef] = [f"talon> {reply.text}\n"] if reply.text.strip() else []
        parts += reply.media
        parts += [f"! {n}\n" for n in reply.notices]
        return parts

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        parts = self.reply_parts(reply)
        streamed, self._streamed = self._streamed, None

        async def show(index: int, part: str | MarkdownMediaRef) -> None:
            if index == 0 and isinstance(part, str) and streamed and reply.text.strip():
                final = reply.text.strip()
                if final == streamed.strip():
                    return  # already on screen, as it was written
                if final.startswith(streamed.strip()):
                    self._print(f"{final[len(streamed.strip()):].strip()}\n")  # e.g. the cut-off line
                    return
            self._print(part if isinstance(part, str) else self._media_line(part))

        await deliver_parts(parts, show, skip_parts=skip_parts, on_part=on_part)

    def _media_line(self, ref: MarkdownMediaRef) -> str:
        """The kind and resolved path of an attached file, after the same checks a chat applies."""
        name = display_name(ref.path)
        if self.media_root is None:
            return f"! {attach_failure_line(name, 'no media root is configured')}\n"
        try:
            media = outbound_channel_media(ref, ref.alt, self.media_root)
        except MediaPathError as exc:
            log.warning("console: not attaching %r: %s", ref.path, exc)
            return f"! {attach_failure_line(name, path_refusal_reason(exc))}\n"
        except OSError as exc:
            log.warning("console: cannot read %r: %s", ref.path, exc)
            return f"! {attach_failure_line(name, 'it cannot be read')}\n"
        with media:
            caption = f" — {media.caption}" if media.caption else ""
            return f"[{media.kind}] {media.path} ({media.mime}, {human_size(media.size)}){caption}\n"
