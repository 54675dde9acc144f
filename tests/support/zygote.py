"""`talon run` processes for the tests, forked from a process that has imported Talon already.

Most end-to-end tests start `talon run` as a real process (to kill it, restart it, run several on
one database), about a hundred per run of the suite. Each spent 1.2-1.4 s of CPU importing Talon,
the OpenAI SDK, python-telegram-bot and aiohttp before doing anything, a fifth of the suite's
CPU on two cores. Here each pytest worker starts one helper process (``python -m
tests.support.zygote``) that imports those modules once and then forks a child per request. The
child is a real process of its own (its own pid, signals, exit status, log file, working
directory and environment) running ``python -m talon.cli ARGS`` exactly as the interpreter would
(``runpy``, then the interpreter's own exit steps: non-daemon threads joined, ``atexit``
handlers run). Only the interpreter's start and those imports are shared.

What a fork cannot show stays with a real ``exec``: the tests of what Talon imports at start, of
its memory at rest and of its start itself start ``python -m talon.cli`` as before
(``subprocess.Popen``). ``TALON_TESTS_NO_FORK=1`` makes every start a real one.

Protocol: the helper listens on a Unix socket; a start is one connection carrying one JSON line
(module, arguments, environment, working directory, log file); the helper answers ``pid N`` and, when the child
ends, ``exit CODE`` (``subprocess``'s convention: minus the signal's number for a signal). The
helper exits, killing its children, when the worker that started it goes away (its stdin closes).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

NO_FORK_ENV = "TALON_TESTS_NO_FORK"
# What `talon run` imports for Telegram and an OpenAI-compatible model, the usual test setup.
PRELOAD = ("talon.cli", "talon.runtime", "talon.agent.providers.openai", "channels.telegram", "channels.http",
           "talon.scheduler.service", "talon.control", "talon.storage.embedded.panel")


# --- the helper process ----------------------------------------------------------------------
def _child(request: dict[str, Any], keep: list[int]) -> None:
    """In the forked child: become ``python -m talon.cli ARGS`` and never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
        atexit._clear()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # made by start_talon_process
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        sys.argv = ["talon.cli", *request["args"]]
        sys.path[0] = os.getcwd()  # as `python -m` started in that directory would have it
        import runpy

        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            if exit_.code is None:
                code = 0
            elif isinstance(exit_.code, int):
                code = exit_.code
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001  (printed as the interpreter would)
            import traceback

            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own exit steps
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        if code < 0:  # ended by a signal, as the interpreter does on an uncaught Ctrl-C
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)


def serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    pending: dict[socket.socket, bytes] = {}
    print("ready", flush=True)
    try:
        while True:
            for key, _ in selector.select(timeout=5.0):
                if key.data == "accept":
                    conn, _addr = listener.accept()
                    pending[conn] = b""
                    selector.register(conn, selectors.EVENT_READ, "request")
                elif key.data == "request":
                    conn = key.fileobj  # type: ignore[assignment]
                    chunk = conn.recv(1 << 20)
                    pending[conn] += chunk
                    if not chunk or b"\n" not in pending[conn]:
                        if not chunk:
                            selector.unregister(conn)
                            conn.close()
                            pending.pop(conn, None)
                        continue
                    selector.unregister(conn)
                    request = json.loads(pending.pop(conn))
                    keep = [listener.fileno(), wake_r, wake_w, conn.fileno(), selector.fileno(),  # type: ignore[attr-defined]
                            *(c.fileno() for c in pending), *(c.fileno() for c in children.values())]
                    pid = os.fork()
                    if pid == 0:
                        _child(request, keep)
                    children[pid] = conn
                    conn.sendall(f"pid {pid}\n".encode())
                elif key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                    conn.close()
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# --- the tests' side -------------------------------------------------------------------------
class Forked:
    """A forked `talon` process, used like ``subprocess.Popen``: pid, poll, wait, send_signal,
    terminate, kill, returncode."""

    def __init__(self, conn: socket.socket, args: list[str]) -> None:
        self.args = args
        self._conn = conn
        self._buffer = b""
        self.returncode: int | None = None
        self.pid = int(self._line(timeout=60).removeprefix("pid "))

    def _line(self, timeout: float | None) -> str:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("the test helper that forks talon processes went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _exit(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        try:
            line = self._line(timeout)
        except (TimeoutError, BlockingIOError):
            return False
        self.returncode = int(line.removeprefix("exit "))
        self._conn.close()
        return True

    def poll(self) -> int | None:
        self._exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exit(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.returncode is None:
            self.wait()


class _Helper:
    def __init__(self) -> None:
        from tests.support.parallel import run_dir

        self.path = str(run_dir() / f"zygote-{os.getpid()}.sock")
        root = Path(__file__).resolve().parent.parent.parent
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.zygote", self.path], cwd=root,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the test helper that forks talon processes did not start ({ready!r})")
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def start(self, module: str, args: list[str], cwd: Path, env: dict[str, str], out: Path) -> Forked:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.sendall(json.dumps({"module": module, "args": args, "cwd": str(cwd), "env": env,
                                 "out": str(out)}).encode() + b"\n")
        return Forked(conn, [sys.executable, "-m", module, *args])


_helper: _Helper | None = None
TalonProcess = Forked | subprocess.Popen  # what start_talon_process gives


def start_talon_process(args: list[str], *, cwd: Path, env: dict[str, str], out: Path) -> TalonProcess:
    """``python -m talon.cli ARGS`` in ``cwd`` with exactly ``env``, stdout and stderr to ``out``
    (stdin empty): forked from the helper, or a real start with ``TALON_TESTS_NO_FORK=1``. The
    log is made (or emptied) before this returns, as with Popen; the child appends to it."""
    global _helper
    with open(out, "wb") as log:
        if os.environ.get(NO_FORK_ENV) == "1":
            return subprocess.Popen([sys.executable, "-m", "talon.cli", *args], cwd=cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    if _helper is None or _helper.proc.poll() is not None:
        _helper = _Helper()
    return _helper.start("talon.cli", args, cwd, env, out)


if __name__ == "__main__":
    serve(sys.argv[1])
