"""`talon chat` as a real process on a pseudo-terminal, as a person runs it.

The console sees a real terminal (``isatty``, termios echo), so what it does about echo can be
checked. Output is collected by a thread; ``wait_for`` polls it with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path


def chat_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without any TALON_/platform settings of the caller, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_", "ANTHROPIC_"))}
    env.update({"TALON_MEDIA_ROOT": str(tmp_path / "media_root"), "TALON_DATA_DIR": str(tmp_path / "data"),
                "TALON_MODEL_MAX_RETRIES": "0", "TALON_SPEECH_WARMUP": "false", "PYTHONFAULTHANDLER": "1",
                "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                # A local model's llama.cpp server on one thread: its threads spin while they wait for
                # each other, and beside the other test worker two of them crawl (tests/llama_server.py).
                "TALON_LOCAL_THREADS": "1"})
    env.update(extra)
    return env



def _as_a_terminal_starts_it() -> None:
    """Ctrl-C and Ctrl-\\ as a shell in a terminal leaves them to the program it starts: a test
    run started in the background (``cmd &`` in a script, as CI may) ignores SIGINT, and Python
    then installs no KeyboardInterrupt handler in the program, so Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

class ChatTerminal:
    """``talon chat`` (or another command: ``args``) on a pty, in its own session (so a signal to
    its group is like Ctrl-C)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], args: tuple[str, ...] = ("chat",)) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "talon.cli", *args], stdin=slave, stdout=slave,
                                     stderr=slave, cwd=tmp_path, env=env, start_new_session=True,
                                     preexec_fn=_as_a_terminal_starts_it)
        os.close(slave)
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # the process closed its side
                return
            if not data:
                return
            with self._lock:
                self._out += data

    @property
    def output(self) -> str:
        with self._lock:
            return self._out.decode("utf-8", "replace").replace("\r\n", "\n")

    def wait_for(self, text: str, timeout: float, *, after: int = 0) -> int:
        """Wait until ``text`` appears at or after offset ``after``; its offset."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.output.find(text, after)
            if found >= 0:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} did not appear within {timeout} s; output:\n{self.output}")
            if self.proc.poll() is not None and self.output.find(text, after) < 0:
                raise AssertionError(f"talon chat exited ({self.proc.returncode}) before {text!r}:\n{self.output}")
            time.sleep(0.05)

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def echo_on(self) -> bool:
        """Whether the terminal echoes typing right now (the console turns it off during answers)."""
        return bool(termios.tcgetattr(self.master)[3] & termios.ECHO)

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C

    def ctrl_d(self) -> None:
        os.write(self.master, b"\x04")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Where it hangs: Python's fault handler (PYTHONFAULTHANDLER) prints every thread's
            # stack on SIGABRT, into the output shown here.
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self._reader.join(5)
            raise AssertionError(f"talon chat did not exit within {timeout} s; output:\n{self.output}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
