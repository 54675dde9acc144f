"""HTML to readable text in a worker process with CPU, memory and time limits.

trafilatura (with lxml) can take tens of seconds and close to a gigabyte on one large page (a
4.8 MB HTML table: 21.5 s, 916 MB), and a thread cannot be stopped. So web_fetch never converts
in Talon's own process: ``HtmlConverter`` keeps up to ``workers`` warm worker processes, each
``python -m talon.agent.tools.html_worker`` (spawned with exec, never a fork of the event loop's
process), and hands one page at a time to an idle one over its stdin/stdout pipes, read and
written by the event loop (no thread).

Limits, all three enforced from outside the conversion code:

- memory: the worker's address space (``RLIMIT_AS``, ``TALON_WEB_CONVERT_MEMORY``); a conversion
  that needs more gets ``MemoryError`` (answered as "too large") or the process dies;
- CPU: before each page the worker's ``RLIMIT_CPU`` is set to the CPU time it has used plus the
  allowance, so a runaway conversion is ended by the kernel (SIGXCPU) even if the parent is stuck;
- time: the parent waits ``TALON_WEB_CONVERT_SECONDS`` for the answer, then kills the worker
  (SIGKILL) and reaps it; the next page starts a fresh one. A cancelled call (turn stopped, fetch
  timeout) kills its worker the same way, since its state is unknown.

Workers also die with Talon (``PR_SET_PDEATHSIG``, and end of input on their stdin), are
recycled after ``RECYCLE_AFTER`` pages, and ``HtmlConverter.aclose`` stops them at shutdown.

When a page is cut, ``ConversionCut`` says why (time or memory, with the limit); web_fetch then
returns the start of the page's plain text, taken from a bounded prefix of the HTML by the
standard library's parser (``plain_text_prefix``), with a note saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import html.parser
import json
import logging
import os
import resource
import signal
import struct
import sys
from dataclasses import dataclass

from talon.errors import ConversionCut

__all__ = ["ConversionCut", "HtmlConverter", "html_to_text", "plain_text_prefix"]

log = logging.getLogger(__name__)

RECYCLE_AFTER = 50  # pages per worker before it is replaced (fragmented heaps grow)
_HEADER = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1
PLAIN_PREFIX_BYTES = 300_000  # how much of a cut page is turned into plain text in Talon itself


def html_to_text(html: str | bytes, url: str) -> str:
    """Readable markdown of a page (trafilatura); its plain text when no main content is found.
    Unbounded: run it only in a worker (``HtmlConverter``)."""
    import trafilatura

    text = trafilatura.extract(html, url=url, output_format="markdown", include_links=True,
                               include_tables=True, include_comments=False, favor_recall=True,
                               with_metadata=True)
    if not text:
        text = trafilatura.html2txt(html)
    return text or ""


class _PlainText(html.parser.HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "head", "svg"}
    _BREAK = {"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "section",
              "article", "pre", "blockquote", "dt", "dd"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skipping += 1
        elif tag in self._BREAK:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" | ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def plain_text_prefix(data: bytes, charset: str | None, limit: int = PLAIN_PREFIX_BYTES) -> str:
    """The plain text of the first ``limit`` bytes of a page: tags, scripts and styles dropped.
    Linear and bounded by ``limit``, so it may run in Talon's process (in a thread)."""
    try:
        head = data[:limit].decode(charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        head = data[:limit].decode("utf-8", "replace")
    parser = _PlainText()
    with contextlib.suppress(Exception):  # a broken prefix still gives what was read so far
        parser.feed(head)
        parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


@dataclass(frozen=True)
class ConvertLimits:
    seconds: float = 10.0  # wall clock per page (TALON_WEB_CONVERT_SECONDS); CPU gets the same
    memory: int = 512_000_000  # address space of the worker (TALON_WEB_CONVERT_MEMORY)


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pages = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        await self.proc.wait()


class HtmlConverter:
    """A small pool of warm, limited worker processes that turn HTML into text."""

    def __init__(self, limits: ConvertLimits | None = None, *, workers: int = 2) -> None:
        self.limits = limits or ConvertLimits()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._slots = asyncio.Semaphore(max(1, workers))
        self.last_pid: int | None = None  # the pid of the worker that took the last page (tests)

    def _size(self) -> str:
        return f"{self.limits.memory / 1_000_000:,.0f} MB"

    def _limits(self) -> str:
        return (f"the limits are {self.limits.seconds:g} s (TALON_WEB_CONVERT_SECONDS) and {self._size()} "
                "(TALON_WEB_CONVERT_MEMORY)")

    async def _spawn(self) -> _Worker:
        # None of Talon's environment (tokens, keys); only where to find this very Talon.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        path = [here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONPATH": os.pathsep.join(path)}
        cpu = max(1, int(self.limits.seconds + 0.999))
        proc = await asyncio.create_subprocess_exec(
            # -P: the working directory is not on sys.path.
            sys.executable, "-P", "-m", "talon.agent.tools.html_worker", str(self.limits.memory), str(cpu),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env=env, cwd="/", start_new_session=True,
        )
        return _Worker(proc)

    async def convert(self, data: bytes, charset: str | None, url: str) -> str:
        """The page's readable text; ``ConversionCut`` when a limit cut it."""
        async with self._slots:
            worker = self._idle.pop() if self._idle else await self._spawn()
            self.last_pid = worker.pid
            self._busy.add(worker)
            keep = False
            try:
                answer = await self._ask(worker, data, charset, url)
                keep = True
            finally:
                self._busy.discard(worker)
                worker.pages += 1
                if keep and worker.pages < RECYCLE_AFTER and worker.proc.returncode is None:
                    self._idle.append(worker)
                else:
                    # Cut, failed or cancelled: its state is unknown, so it goes (killed and reaped).
                    await asyncio.shield(worker.kill())
        if "text" in answer:
            return str(answer["text"])
        if answer.get("error") == "memory":
            raise ConversionCut(f"converting it needed more than {self._size()} of memory "
                                "(TALON_WEB_CONVERT_MEMORY)")
        # lxml reports some failed allocations as parse errors: the limits are named too.
        raise ConversionCut(f"the converter failed ({str(answer.get('error'))[:300]}); {self._limits()}")

    async def _ask(self, worker: _Worker, data: bytes, charset: str | None, url: str) -> dict[str, object]:
        proc = worker.proc
        assert proc.stdin is not None and proc.stdout is not None
        header = json.dumps({"url": url, "charset": charset, "size": len(data)}).encode()
        try:
            async with asyncio.timeout(self.limits.seconds):
                proc.stdin.write(_HEADER.pack(len(header)) + header + data)
                await proc.stdin.drain()
                size = _HEADER.unpack(await proc.stdout.readexactly(_HEADER.size))[0]
                answer = json.loads(await proc.stdout.readexactly(size))
        except TimeoutError:
            log.info("web_fetch: converting %s took longer than %gs; worker %s killed", url[:200],
                     self.limits.seconds, worker.pid)
            raise ConversionCut(f"converting it took longer than {self.limits.seconds:g} s "
                                "(TALON_WEB_CONVERT_SECONDS)") from None
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
            code = await proc.wait()
            why = ("CPU time" if code == -signal.SIGXCPU else
                   "memory" if code in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGABRT) else f"exit {code}")
            log.log(logging.INFO if why in ("CPU time", "memory") else logging.WARNING,
                    "web_fetch: the converter of %s ended (%s)", url[:200], why)
            if why == "CPU time":
                raise ConversionCut(f"converting it needed more than {self.limits.seconds:g} s of CPU time "
                                    "(TALON_WEB_CONVERT_SECONDS)") from None
            raise ConversionCut(f"the converter stopped ({why}); the page is probably too large "
                                f"({self._limits()})") from None
        if not isinstance(answer, dict):
            raise ConversionCut(f"the converter gave no readable answer ({self._limits()})")
        return answer

    async def aclose(self) -> None:
        """Stop every worker (at shutdown)."""
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        for worker in workers:
            await worker.kill()


# --- the worker process -------------------------------------------------------------------------


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _cpu_allowance(seconds: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _read(stream: object, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = stream.read(size)  # type: ignore[attr-defined]
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    memory, cpu = int(argv[0]), int(argv[1])
    _die_with_parent()
    if os.getppid() == 1:
        return 0
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    import trafilatura  # noqa: F401 - warm: loaded once, before the first page

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            header = json.loads(_read(stdin, _HEADER.unpack(_read(stdin, _HEADER.size))[0]))
            data = _read(stdin, int(header["size"]))
        except EOFError:
            return 0
        _cpu_allowance(cpu)
        answer: dict[str, object]
        try:
            html: str | bytes = data
            if header.get("charset"):
                with contextlib.suppress(LookupError):  # unknown: trafilatura reads the page's own
                    html = data.decode(header["charset"], "replace")
            answer = {"text": html_to_text(html, str(header.get("url", "")))}
        except MemoryError:
            answer = {"error": "memory"}
        except Exception as exc:  # noqa: BLE001 - told to the parent, which says it to the model
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        html = data = b""
        out = json.dumps(answer).encode()
        stdout.write(_HEADER.pack(len(out)) + out)
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
