"""Console channel: chat with the agent in a terminal, with the same core and sessions.

``/attach PATH [caption]`` sends a file as if it came from a chat app. Files the agent attaches
are shown as their kind and resolved path inside the media root (``[image] /.../chart.png``),
checked exactly as a chat channel checks them; a reference that cannot be sent is shown as the
same "Could not attach NAME: reason" line a chat would get.

Input is read while an answer streams, so ``/stop`` (or a first Ctrl-C, see ``interrupt``)
stops it. On a terminal, typing is not echoed during an answer: the terminal would write it into
the middle of the streamed text. A line sent then is shown on a line of its own instead (off a
terminal nothing was echoed, and nothing is shown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import AttachmentRef, InboundFile, InboundKind
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import MediaPathError
from talon.media import MarkdownMediaRef, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason
from talon.media.inbound import human_size

from channels.base import BridgeHandle, Channel, PartCallback, deliver_parts

if TYPE_CHECKING:
    from talon.media.received import ReceivedNote
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

BANNER = (
    "Talon console. Type a message and press Enter; Ctrl-D quits.\n"
    "  /attach PATH [caption]  send a file      /stop (or Ctrl-C)  stop the answer; Ctrl-C again quits\n"
    "  /new  a fresh conversation   /status  the model and context use   /help  what the bot says it does\n"
)

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


class _Echo:
    """Turns the terminal's echo off while an answer streams, and back on; nothing off a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self._fd: int | None = None
        self._saved: list[Any] | None = None
        try:
            import termios

            fd = stream.fileno()
            if stream.isatty():
                self._saved = termios.tcgetattr(fd)
                self._fd = fd
        except (ImportError, OSError, ValueError, AttributeError):
            pass  # not a terminal (a pipe, a test's StringIO): nothing is echoed anyway

    @property
    def active(self) -> bool:
        """On a terminal: typing during an answer is not echoed, so the console shows it."""
        return self._fd is not None

    def off(self) -> None:
        if self._fd is None or self._saved is None:
            return
        import termios

        attrs = termios.tcgetattr(self._fd)
        attrs[3] &= ~termios.ECHO
        with contextlib.suppress(termios.error):
            termios.tcsetattr(self._fd, termios.TCSANOW, attrs)

    def restore(self) -> None:
        if self._fd is None or self._saved is None:
            return
        import termios

        with contextlib.suppress(termios.error):
            termios.tcsetattr(self._fd, termios.TCSANOW, self._saved)


class ConsoleChannel(Channel):
    name = "console"
    gated = False

    def serves(self, conversation: InboundMessage) -> str | None:
        """The console serves its one conversation, the machine's user at the terminal."""
        if conversation.is_group:
            return "the console has no groups"
        return None

    def __init__(self, *, chat_id: str = "local", stdin: TextIO | None = None,
                 stdout: TextIO | None = None, media_root: Path | None = None) -> None:
        self.chat_id = chat_id
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.media_root = media_root
        self._bridge: BridgeHandle | None = None
        self._reader: asyncio.Task[None] | None = None
        self.finished = asyncio.Event()
        self._counter = 0
        # The live view: the text of the current model step as printed so far, and the last
        # step's text once the turn closed (the final reply does not print it a second time).
        self._live = ""
        self._streamed: str | None = None
        self._line_start = True  # the cursor is at the start of a line
        self._talon_line = False  # the current line is the answer's ("talon> " was printed)
        # The ids of the messages typed in this run: any other one the bridge answers was left
        # pending by an earlier run (the console quit mid-answer) and is said to be so.
        self._typed: set[str] = set()
        self._answering: asyncio.Task[None] | None = None
        self._stop_asked = False
        self._submits: set[asyncio.Task[bool]] = set()
        self._echo = _Echo(self.stdin)
        self.exit_code = 0  # 130 when ended by Ctrl-C, 143 by SIGTERM

    async def start(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge
        self._reader = asyncio.create_task(self._read_loop(), name="console-reader")

    @property
    def bridge(self) -> BridgeHandle:
        """The bridge this console hands its lines to (set by ``start``)."""
        if self._bridge is None:
            raise RuntimeError("the console has not been started")
        return self._bridge

    async def stop(self) -> None:
        for task in (self._reader, self._answering):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._echo.restore()

    @property
    def answering(self) -> bool:
        """A message typed here (or resumed from an earlier run) is being answered."""
        return self._answering is not None and not self._answering.done()

    def interrupt(self) -> None:
        """Ctrl-C: during an answer the first one stops it (as /stop does); else, or a second
        time, the console quits (exit code 130). What was not answered stays pending."""
        if self.answering and not self._stop_asked and self._bridge is not None:
            self._stop_asked = True
            self._newline()
            self._print("(stopping the answer; Ctrl-C again quits)\n")
            # Called from the signal handler, which cannot await: the stop goes in as a task.
            task = asyncio.get_running_loop().create_task(self._bridge.submit(self._message("/stop")))
            self._submits.add(task)
            task.add_done_callback(self._submits.discard)
            return
        self.quit(130)

    def quit(self, exit_code: int = 0) -> None:
        """End the console now (Ctrl-C, SIGTERM); an answer in progress stays pending."""
        self._newline()
        self.exit_code = exit_code
        self._echo.restore()
        self.finished.set()

    def _print(self, text: str) -> None:
        if not text:
            return
        self.stdout.write(text)
        self.stdout.flush()
        self._line_start = text.endswith("\n")
        if self._line_start:
            self._talon_line = False

    def _newline(self) -> None:
        if not self._line_start:
            self._print("\n")

    def _prompt(self) -> None:
        if not self.finished.is_set():
            self._newline()
            self._print("you> ")

    def _watch(self) -> None:
        """Until every message sent is answered: echo off, and no prompt; then the prompt."""
        if self.answering:
            return
        self._echo.off()
        self._answering = asyncio.create_task(self._until_answered(), name="console-answering")

    async def _until_answered(self) -> None:
        try:
            await self.bridge.idle()
        finally:
            self._stop_asked = False
            self._echo.restore()
        self._prompt()

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
        self._print(BANNER)
        # A message left pending by an earlier run may be answered first: no prompt till then.
        self._watch()
        while True:
            try:
                line = await self._readline()
            except UnicodeDecodeError:
                self._newline()
                self._print("! that line is not valid UTF-8 text; not sent\n")
                if not self.answering:
                    self._prompt()
                continue
            if not line:
                await self.bridge.idle()
                self._newline()
                return
            line = _valid_text(line.rstrip("\n"))
            answering = self.answering
            if self._echo.active and not answering:
                self._line_start = True  # the terminal echoed the Enter
            if answering and line.strip() and self._echo.active:
                # Typed during the answer, not echoed: shown on its own line, never inside the answer.
                self._newline()
                self._print(f"you> {line}\n")
            if not line.strip():
                if not answering:
                    self._prompt()
                continue
            message = self._parse(line)
            if message is None:
                if not answering:
                    self._prompt()
                continue
            if line.strip().split()[0].lower() == "/stop":
                self._stop_asked = True
            await self.bridge.submit(message)
            self._watch()

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        prompt_id = await super().ask_approval(approval, text)
        # The turn waits for a yes or no typed now (input is read during answers): show the typing.
        self._echo.restore()
        self._prompt()
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

    def _message(self, text: str, files: list[RemoteFile] | None = None) -> InboundMessage:
        self._counter += 1
        message_id = f"{int(time.time() * 1000)}-{self._counter}"
        self._typed.add(message_id)
        return InboundMessage(channel=self.name, chat_id=self.chat_id, sender_id="console",
                              message_id=message_id, text=text, files=files or [])

    def _parse(self, line: str) -> InboundMessage | None:
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
        return self._message(text, files)

    async def acknowledge(self, message: InboundMessage) -> None:
        """A turn starts. One for a message from an earlier run says which message it answers."""
        if message.message_id in self._typed:
            return
        text = " ".join(message.text.split())
        if len(text) > 80:
            text = text[:77] + "..."
        what = f'"{text}"' if text else f"{len(message.files)} file(s)"
        when = time.strftime("%H:%M", time.localtime(message.received_at)) if message.received_at else ""
        self._newline()
        self._print(f"(answering your earlier message{f' of {when}' if when else ''}, left unanswered when "
                    f"the console last quit: {what})\n")

    def show_received(self, message: InboundMessage, notes: "list[ReceivedNote]") -> None:
        self._newline()
        for note in notes:
            self._print(f"{'!' if note.problem else '~'} {note.text}\n")

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
        path = Path(remote.source)
        def copy() -> AttachmentRef:
            with open(path, "rb") as fh:
                return store.blocking.put_chunks(iter(lambda: fh.read(1 << 16), b""),
                                                 mime=remote.mime or "application/octet-stream",
                                                 name=remote.name, limit=limits.download_max_bytes)

        try:
            ref = await asyncio.to_thread(copy)
        except OSError as exc:
            return base.model_copy(update={"notice": f"could not read {remote.name}: {exc.strerror}"})
        except Exception as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        """The answer printed as the model writes it; the final reply then adds only what the
        stream did not show (files, notices, a cut-off line)."""
        self._live, self._streamed = "", None

        async def on_text(delta: str) -> None:
            if not self._talon_line:
                # The answer's first text, or its continuation after a line typed meanwhile.
                self._newline()
                self._print("talon> ")
                self._talon_line = True
            self._live += delta
            self._print(delta)
            self._talon_line = True

        async def on_step(asked_for_tools: bool) -> None:
            if asked_for_tools and self._live:
                self._newline()  # a preamble to tool calls; the next step starts a new line
                self._live = ""

        async def close() -> None:
            self._newline()
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
                    self._newline()
                    self._print(f"{final[len(streamed.strip()):].strip()}\n")  # e.g. the cut-off line
                    return
            self._newline()
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
