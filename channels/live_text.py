"""Showing an answer while the model writes it: what to show, and when (platform neutral).

``LiveText`` takes the streamed deltas of a turn (``on_text``, ``on_step`` of a ``LiveReply``)
and calls a channel's ``show(markdown)`` with the growing answer:

- **When.** At most once per ``interval_s``, from a task of its own: the model's stream is never
  held up by a slow platform call, and deltas that arrive during a call are merged into the next
  update. ``show`` returns False when it let the update go (a send budget that is short): it is
  tried again at the next tick, with whatever the text has become by then.
- **What.** The text up to the last point where no code block, inline code, emphasis or link is
  left open (``safe_prefix``), so an update never shows half of a markup construct and always
  renders to well-formed formatting; of a long answer, only its head (``head_chars``: a view
  shows the first message's worth). A step that asked for tools wrote a preamble: the next
  step's text replaces it.
- **Stopping.** ``show`` raises ``StreamStopped`` (a 429, a refusal): nothing more is shown in
  this turn; the final reply is delivered as usual. ``close`` ends the updates before that
  final delivery, so no late update can land after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from talon.errors import StreamStopped

log = logging.getLogger(__name__)

Show = Callable[[str], Awaitable[bool]]


_FENCES = ("```", "~~~")
# How much of a long answer a live view is given: the platforms show its first message only (at
# most 16,000 characters, Matrix's), and cutting that out of a whole 1 MB answer at each update
# (media extracted, split into messages) cost about a second of CPU each time.
HEAD_CHARS = 64_000
_PAIRED = ("**", "__", "~~")


# Characters that can open, close or end markup; everything else is plain text, skipped in runs.
_PLAIN = re.compile(r"[^\n`\\\[\]()*_~]+")


class _Inline:
    """Where the scan of inline markup stands (see ``PrefixScanner``)."""

    __slots__ = ("i", "clean", "stack", "code", "link")

    def __init__(self, start: int) -> None:
        self.i = start
        self.clean = start  # the last index at which nothing was open
        self.stack: list[str] = []
        self.code = False
        self.link = 0  # 0: none; 1: inside [text]; 2: inside (url)

    def copy(self) -> "_Inline":
        other = _Inline(self.i)
        other.clean, other.stack, other.code, other.link = self.clean, list(self.stack), self.code, self.link
        return other

    def advance(self, text: str, n: int, until: int) -> None:
        """Scan ``text[:n]`` from ``self.i`` while the position is below ``until``. A step at ``i``
        reads at most ``text[i + 1]``, so steps taken below ``n - 1`` are the same whatever
        follows ``n``: that is what lets ``PrefixScanner`` keep them."""
        i, clean, stack, code, link = self.i, self.clean, self.stack, self.code, self.link
        while i < until:
            run = _PLAIN.match(text, i, n)
            if run is not None:
                i = min(run.end(), until + 1)  # plain text looks at nothing after it
                if not stack and not link and not code:
                    clean = i
                continue
            ch = text[i]
            if ch == "\n" and text.startswith("\n\n", i, n):
                stack.clear()
                code = False
                link = 0
                clean = i
                i += 2
                continue
            if code:
                if ch == "`":
                    code = False
                    i += 1
                    if not stack and not link:
                        clean = i
                    continue
                i += 1
                continue
            if ch == "\\" and i + 1 < n:
                i += 2
                if not stack and not link:
                    clean = i
                continue
            if ch == "`":
                if not stack and not link:
                    clean = i
                code = True
                i += 1
                continue
            if link == 1 and ch == "]":
                if text.startswith("(", i + 1, n):
                    link = 2
                    i += 2
                    continue
                link = 0  # brackets, not a link
            elif link == 2 and ch == ")":
                link = 0
                i += 1
                if not stack:
                    clean = i
                continue
            elif link == 0 and ch == "[":
                if not stack:
                    clean = i
                link = 1
                i += 1
                continue
            pair = next((p for p in _PAIRED if text.startswith(p, i, n)), None)
            if pair is not None:
                if stack and stack[-1] == pair:
                    stack.pop()
                else:
                    if not stack and not link:
                        clean = i
                    stack.append(pair)
                i += len(pair)
                if not stack and not link:
                    clean = i
                continue
            if ch in "*_":
                before = text[i - 1] if i > 0 else " "
                after = text[i + 1] if i + 1 < n else " "
                word_inside = ch == "_" and before.isalnum() and after.isalnum()
                bullet = ch == "*" and after == " " and (i == 0 or text[i - 1] == "\n" or before == " ")
                if not (word_inside or bullet):
                    if stack and stack[-1] == ch and not before.isspace():
                        stack.pop()
                    elif not after.isspace():
                        if not stack and not link:
                            clean = i
                        stack.append(ch)
                    i += 1
                    if not stack and not link:
                        clean = i
                    continue
            i += 1
            if not stack and not link and not code:
                clean = i
        self.i, self.clean, self.code, self.link = i, clean, code, link


class PrefixScanner:
    """``safe_prefix`` of a text that only grows (a streamed answer), in time linear in the whole
    stream: what is certain is scanned once and kept, and only the last line is looked at again
    on each call (recomputing from the start made a 1 MB answer cost about a second of CPU per
    update, on the event loop).

    Code fences are found line by line: a line is certain once the text goes past it. Inline
    markup is scanned from the end of the last closed code block up to the start of an open one
    (or of the last line); the steps taken before that point stay, the rest is scanned on a copy.
    A text that does not extend the previous one starts the scan again."""

    def __init__(self) -> None:
        self._seen = ""  # the text of the previous call (its length is what is checked)
        self._line = 0  # where the first line not yet certain starts
        self._open: int | None = None  # a code fence opened by a certain line, not closed
        self._after = 0  # where the last code block closed by a certain line ends
        self._inline = _Inline(0)  # the certain steps, from ``_from``
        self._from = 0

    def prefix(self, markdown: str) -> str:
        if not markdown.startswith(self._seen):
            self.__init__()  # type: ignore[misc]
        self._seen = markdown
        open_at, after = self._open, self._after
        offset = self._line
        lines = markdown[offset:].splitlines(keepends=True)
        for index, line in enumerate(lines):
            certain = index < len(lines) - 1 or line.endswith("\n")
            if line.lstrip().startswith(_FENCES):
                if open_at is None:
                    open_at = offset
                elif line.endswith("\n") or offset + len(line) == len(markdown):
                    open_at = None
                    after = offset + len(line)
            offset += len(line)
            if certain:
                self._line, self._open, self._after = offset, open_at, after
        if self._from != self._after:  # a code block closed: what came before it no longer counts
            self._inline, self._from = _Inline(self._after), self._after
        if open_at is not None:
            n, start = open_at, (after if after <= open_at else 0)
        else:
            n, start = len(markdown), after
        if start == self._after:
            self._inline.advance(markdown, n, min(n, self._line) - 1)
            scan = self._inline.copy()
        else:  # closed by the last line, which may still change: not kept
            scan = _Inline(start)
        scan.advance(markdown, n, n)
        return markdown[:scan.clean].rstrip()


def safe_prefix(markdown: str) -> str:
    """The longest prefix of a partial answer that leaves no markup open.

    Code fences, inline code, ``**``/``__``/``~~``, single ``*``/``_`` emphasis and ``[links](...)``
    are tracked; a blank line ends every inline construct (markdown does not carry them across
    paragraphs). A ``_`` inside a word (snake_case) and a ``*`` bullet are not emphasis.
    """
    return PrefixScanner().prefix(markdown)


class LiveText:
    """One turn's live view; see the module docstring."""

    def __init__(self, show: Show, *, interval_s: float = 1.0, head_chars: int = HEAD_CHARS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._show = show
        self.interval_s = interval_s
        self.head_chars = head_chars
        self._clock = clock
        self._text = ""  # the text so far, as of the last update
        self._pending: list[str] = []  # deltas since (joined once per update, not once per delta)
        self._scanner = PrefixScanner()
        self._shown: str | None = None
        self._last_show = float("-inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_show = False
        self.stopped = False  # a show raised StreamStopped
        self.closed = False
        self.updates = 0  # shows that went out
        self.first_text_at: float | None = None  # clock time of the first delta
        self.first_shown_at: float | None = None  # clock time the first update went out

    @property
    def shown(self) -> str | None:
        """What the last update showed (None: nothing yet)."""
        return self._shown

    async def on_text(self, delta: str) -> None:
        if self.closed or self.stopped or not delta:
            return
        if self.first_text_at is None:
            self.first_text_at = self._clock()
        self._pending.append(delta)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="live-text")

    async def on_step(self, asked_for_tools: bool) -> None:
        if asked_for_tools:
            # The step's text was a preamble to tool calls: the next step writes anew. What is
            # shown stays until there is new text to replace it.
            self._text = ""
            self._pending.clear()
            self._scanner = PrefixScanner()

    async def _run(self) -> None:
        while not self.closed and not self.stopped:
            await self._wake.wait()
            self._wake.clear()
            wait = self._last_show + self.interval_s - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._pending:
                self._text += "".join(self._pending)
                self._pending.clear()
            view = self._scanner.prefix(self._text)
            if len(view) > self.head_chars:  # the view shows the first message: no need for the rest
                view = safe_prefix(view[:self.head_chars])
            if not view.strip() or view == self._shown:
                continue
            self._in_show = True
            try:
                went = await self._show(view)
            except StreamStopped as exc:
                log.info("live view stopped for this turn: %s", exc)
                self.stopped = True
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("live view update failed; no more updates in this turn")
                self.stopped = True
                return
            finally:
                self._in_show = False
            self._last_show = self._clock()
            if went:
                self._shown = view
                self.updates += 1
                if self.first_shown_at is None:
                    self.first_shown_at = self._last_show
            else:
                self._wake.set()  # dropped for want of budget: try again at the next tick

    async def close(self) -> None:
        """No more updates: called when the turn ended, before the final reply goes."""
        self.closed = True
        task = self._task
        if task is None or task.done():
            return
        if self._in_show:
            # A call in flight finishes: cut off, a first message could exist on the platform
            # without its id being known, and the final reply would then be a second one.
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
