"""The agent's file tools: ls, read_file, write_file, edit_file, glob, grep, and an optional shell.

Every path goes through ``Workspace.resolve`` (see ``talon.agent.tools.workspace`` for the rules); the
tools never trust the prompt to keep the agent inside. The work itself is done on the resolved
path opened one directory at a time without following links (``talon.agent.tools.beneath``), so a
file flipped into a symlink after the check is refused, not followed. Output is bounded by the
call's ``ToolContext.max_output_chars``; anything cut says how to see the rest. Blocking file
work runs in a worker thread so one slow disk or large PDF does not stall other chats; grep
matches with RE2 (linear time, and it releases the GIL). ``write_file`` and ``edit_file`` never
write into a protected path (``.git`` by default) nor past the workspace's size limit (both in
``talon.agent.tools.workspace``).

The shell is off unless ``TALON_SHELL_TOOL`` is set. Each command runs in a fresh bubblewrap
sandbox (``talon.agent.tools.sandbox``) that sees only the chat's workspace (writable) and the system's
programs, with a timeout that kills the whole sandbox and capped output. The workspace's size
limit (``TALON_WORKSPACE_MAX``) holds for the shell this way: what is left of it is the command's
file-size limit, the usage is measured while it runs (a command that takes the workspace past
the limit is killed and told so) and after it; a full workspace's commands can make no file grow
(deleting works). A command the kernel stopped at its memory cgroup's limit says so. Without a
working bwrap the shell is refused at start unless ``TALON_SHELL_UNSANDBOXED=true``, which runs it
bare with a minimal environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import io
import logging
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import re2

from talon.agent.tools import file_readers
from talon.agent.tools.beneath import dir_beneath
from talon.agent.tools.sandbox import SANDBOX_PATH, CommandCgroup, Sandbox, SandboxLimits, find_sandbox, remove_cgroup
from talon.agent.tools.registry import Tool, ToolContext, ToolRegistry, ToolResult
from talon.agent.tools.workspace import Resolved, Workspace, human_bytes
from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import ContentBlock, ImageBlock, TextBlock
from talon.errors import ConfigError, SandboxUnavailable, ToolError, UnsafePath

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_WRITE_BYTES = 10_000_000
MAX_EDIT_BYTES = 10_000_000
MAX_LIST_ENTRIES = 500
MAX_GLOB_RESULTS = 300
GLOB_SCAN_LIMIT = 50_000
GREP_MAX_MATCHES = 200
GREP_MAX_FILE_BYTES = 10_000_000
GREP_TIME_BUDGET_S = 20.0
GREP_LINE_CHARS = 300
SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv"}
SHELL_DEFAULT_TIMEOUT_S = 60.0
SHELL_MAX_TIMEOUT_S = 600.0
WORKSPACE_WATCH_S = 1.0  # how often a running command's workspace usage is measured (at least)


async def _off_loop(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


async def _off_loop_stoppable(fn: Callable[[threading.Event], T]) -> T:
    """Like ``_off_loop`` for long scans: when the call is cancelled (turn timeout, tool limit,
    shutdown) the event is set and the scan stops at its next check, so no thread outlives its
    call by more than a moment (SIGTERM then stops Talon within its grace)."""
    stop = threading.Event()
    try:
        return await asyncio.to_thread(fn, stop)
    except asyncio.CancelledError:
        stop.set()
        raise


def _str_arg(args: dict[str, Any], name: str, *, required: bool = True, default: str = "") -> str:
    value = args.get(name, None)
    if value is None:
        if required:
            raise ToolError(f"missing required argument {name!r}")
        return default
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} must be a string")
    return value


def _int_arg(args: dict[str, Any], name: str, default: int | None, *, minimum: int = 0) -> int | None:
    value = args.get(name, None)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ToolError(f"argument {name!r} must be a whole number")
    if value < minimum:
        raise ToolError(f"argument {name!r} must be at least {minimum}")
    return int(value)


def _num_arg(args: dict[str, Any], name: str, default: float | None, *, minimum: float = 0.0) -> float | None:
    value = args.get(name, None)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"argument {name!r} must be a number")
    if value < minimum:
        raise ToolError(f"argument {name!r} must be at least {minimum:g}")
    return float(value)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / (1024 * 1024):.1f} MB"


def _clip(text: str, limit: int, hint: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... output cut at {limit:,} characters; {hint}]"


def _proc_path(fh: BinaryIO, fallback: Path) -> Path:
    """A name for an open file that libraries can open again: the same file, not a path lookup.

    ``/proc/self/fd/N`` reopens exactly the open file, so a PDF, image or video reader that wants
    a path cannot be sent somewhere else by a name flipped since the check.
    """
    proc = Path(f"/proc/self/fd/{fh.fileno()}")
    return proc if proc.exists() else fallback


@contextmanager
def _open_dir(where: Resolved) -> Iterator[int]:
    try:
        with dir_beneath(where.base, where.parts, shown=where.shown) as fd:
            yield fd
    except UnsafePath as exc:
        raise ToolError(exc.strerror or str(exc)) from exc


def _walk_files(where: Resolved, include: str | None = None,
                pattern: re.Pattern[str] | None = None) -> Iterator[tuple[str, str, int]]:
    """(relative path, name, directory descriptor) of each regular entry below ``where``.

    ``os.fwalk`` walks by descriptor and never follows a link, so a directory replaced by a link
    mid-walk is not entered; the caller opens each file with ``O_NOFOLLOW`` from its directory's
    descriptor. Sorted, and skipping tool caches (``.git``, ``node_modules``...).
    """
    with _open_dir(where) as top:
        for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            rel_dir = "" if dirpath == "." else dirpath[2:] + "/"
            for name in sorted(filenames):
                rel = rel_dir + name
                if include is not None and not fnmatch.fnmatch(name, include):
                    continue
                if pattern is not None and not pattern.fullmatch(rel):
                    continue
                yield rel, name, dirfd


def _open_entry(name: str, dirfd: int) -> tuple[BinaryIO, os.stat_result] | None:
    """Open one walked entry link-free; None unless it is a regular file with one link."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over relative paths: ``*`` and ``?`` stay in one component, ``**/`` spans any."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            negate = body.startswith("!")
            body = re.escape(body[1:] if negate else body).replace(r"\-", "-")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def compile_pattern(source: str, *, ignore_case: bool = False) -> Any:
    """The grep pattern as RE2: matching time grows linearly with the text, whatever the pattern
    (Python's ``re`` can backtrack for ever on ``(a+)+$`` and holds the GIL meanwhile)."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(source, options)
    except re2.error as exc:
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ToolError(
            f"invalid regular expression: {detail} (grep uses RE2 syntax: no backreferences or "
            "lookaround)"
        ) from exc


class WorkspaceTool(Tool):
    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def run(self, args: dict[str, Any]) -> ToolResult:
        return await self.invoke(args, ToolContext())

    def ws(self, ctx: ToolContext) -> Workspace:
        """The workspace of the chat being served (per call), else the one given at creation."""
        chosen = ctx.workspace
        return chosen if isinstance(chosen, Workspace) else self.workspace

    def resolve(self, args: dict[str, Any], ctx: ToolContext, name: str = "path", **kw: Any) -> Resolved:
        return self.ws(ctx).resolve(args.get(name), read_only_roots=ctx.read_only_roots, **kw)

    @staticmethod
    def shown_below(where: Resolved, rel: str) -> str:
        if where.shown in (".", ""):
            return rel
        return f"{where.shown.rstrip('/')}/{rel}"


class ListTool(WorkspaceTool):
    name = "ls"
    description = (
        "List a directory of the workspace: names (directories end with /), sizes and dates. "
        "path is relative to the workspace; default is the workspace itself."
    )
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "directory, relative to the workspace"}},
    }

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if args.get("path") in (None, ""):
            args = {**args, "path": "."}
        where = self.resolve(args, ctx, want="dir")

        def listing() -> str:
            with _open_dir(where) as fd:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                lines = []
                for entry in entries[:MAX_LIST_ENTRIES]:
                    try:
                        st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        lines.append(f"{entry.name} (unreadable)")
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        lines.append(f"{entry.name} (symbolic link)")
                    elif stat.S_ISDIR(st.st_mode):
                        lines.append(f"{entry.name}/")
                    else:
                        stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(st.st_mtime))
                        lines.append(f"{entry.name}  {_size(st.st_size)}  {stamp}")
            more = f"\n[... {len(entries) - MAX_LIST_ENTRIES} more entries not shown]" if len(entries) > MAX_LIST_ENTRIES else ""
            if not entries:
                return f"{where.shown}/ is empty."
            return f"{where.shown}/ ({len(entries)} entries)\n" + "\n".join(lines) + more

        return ToolResult.text(_clip(await _off_loop(listing), ctx.max_output_chars, "list a subdirectory"))


class ReadFileTool(WorkspaceTool):
    name = "read_file"
    description = (
        "Read a file. Text: numbered lines; offset = first line (1-based), limit = number of lines "
        f"(default {file_readers.DEFAULT_LINES}). PDF: text; offset = first page, limit = pages "
        f"(default {file_readers.DEFAULT_PDF_PAGES}). Image: shows the image. Video: a few frames "
        "over a window of seconds; offset = start second, limit = window length in seconds "
        f"(default {file_readers.VIDEO_DEFAULT_WINDOW_S:g}). Paths are relative to the workspace; "
        "the conversation archive is read by the absolute path given in the summary."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "offset": {"type": "number", "description": "first line / page / second"},
            "limit": {"type": "number", "description": "how many lines / pages / seconds"},
        },
        "required": ["path"],
    }

    def __init__(self, workspace: Workspace, store: AttachmentStore | None, limits: Limits) -> None:
        super().__init__(workspace)
        self.store = store
        self.limits = limits

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        where = self.resolve(args, ctx, want="file")
        # Opened once, link-free; every reader below works on this open file, never the name.
        fh = await _off_loop(where.open_read)
        try:
            return await self._read(fh, where, args, ctx)
        finally:
            fh.close()

    async def _read(self, fh: BinaryIO, where: Resolved, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        head = await _off_loop(lambda: os.pread(fh.fileno(), file_readers.SNIFF_BYTES, 0))
        kind = file_readers.sniff_kind(where.real, head)
        opened = _proc_path(fh, where.real)
        if kind == "text":
            offset = _int_arg(args, "offset", 1, minimum=1) or 1
            limit = _int_arg(args, "limit", file_readers.DEFAULT_LINES, minimum=1) or 1
            text = await _off_loop(lambda: file_readers.read_text(
                fh, shown=where.shown, offset=offset, limit=limit, max_chars=ctx.max_output_chars))
            return ToolResult.text(text)
        if kind == "pdf":
            offset = _int_arg(args, "offset", 1, minimum=1) or 1
            limit = _int_arg(args, "limit", file_readers.DEFAULT_PDF_PAGES, minimum=1) or 1
            text = await _off_loop(lambda: file_readers.read_pdf(
                opened, shown=where.shown, offset=offset, limit=limit, max_chars=ctx.max_output_chars))
            return ToolResult.text(text)
        if kind == "image":
            return await self._image(opened, where.real.name, where.shown, where.in_workspace)
        if kind == "video":
            return await self._video(opened, where.real.stem, where.shown, args, in_workspace=where.in_workspace)
        size = os.fstat(fh.fileno()).st_size
        if kind == "audio":
            raise ToolError(f"{where.shown} is an audio file ({_size(size)}); read_file cannot play or transcribe audio")
        raise ToolError(f"{where.shown} is a binary file ({_size(size)}) and cannot be shown as text")

    def _need_store(self) -> AttachmentStore:
        if self.store is None:
            raise ToolError("images cannot be shown in this setup (no attachment store)")
        return self.store

    async def _image(self, real: Path, name: str, shown: str, in_workspace: bool) -> ToolResult:
        from talon.errors import MediaError
        from talon.media.images import prepare_image

        store = self._need_store()
        try:
            prepared = await _off_loop(lambda: prepare_image(real, store=store.blocking, limits=self.limits, name=name))
        except MediaError as exc:
            raise ToolError(f"{shown}: {exc}") from exc
        ref = prepared.ref.model_copy(update={"path": shown if in_workspace else None})
        note = f"{shown}: image {prepared.original_width}x{prepared.original_height}, {_size(real.stat().st_size)}"
        if prepared.resized:
            note += f" (shown downscaled to {ref.width}x{ref.height})"
        return ToolResult(content=[TextBlock(text=note), ImageBlock(ref=ref)])

    async def _video(self, real: Path, stem: str, shown: str, args: dict[str, Any], *,
                     in_workspace: bool = True) -> ToolResult:
        store = self._need_store()
        start = _num_arg(args, "offset", 0.0) or 0.0
        length = _num_arg(args, "limit", None, minimum=0.001)
        frames_max = max(1, min(self.limits.video_max_frames, file_readers.VIDEO_FRAMES_PER_CALL))
        window = await _off_loop(lambda: file_readers.sample_video_window(
            real, start_s=start, length_s=length, max_frames=frames_max))
        content: list[ContentBlock] = []
        dims = f"{window.width}x{window.height}, " if window.width else ""
        total = f"{window.duration_s:.1f}s long" if window.duration_s is not None else "length unknown"
        lines = [
            f"{shown}: video, {dims}{total}. Frames from {window.start_s:.1f}s to {window.end_s:.1f}s "
            f"({len(window.frames)} shown; narrow offset/limit to see more detail):"
        ]
        lines += [f"[{n}] at {f.timestamp_s:.1f}s" for n, f in enumerate(window.frames, 1)]
        lines += [f"note: {n}" for n in window.notes]
        if window.duration_s is not None and window.end_s < window.duration_s - 0.05:
            lines.append(f"[more video after {window.end_s:.1f}s; continue with offset={window.end_s:g}]")
        content.append(TextBlock(text="\n".join(lines)))
        for frame in window.frames:
            ref = await store.put_bytes(frame.jpeg, mime="image/jpeg", name=f"{stem}@{frame.timestamp_s:.1f}s.jpg",
                                  width=frame.width, height=frame.height)
            # The frame's path is the video's, as for inbound videos: an old frame's tombstone then
            # says how to look again (read_file the video) instead of "ask the user to resend".
            content.append(ImageBlock(ref=ref.model_copy(update={"path": shown if in_workspace else None})))
        return ToolResult(content=content)


class WriteFileTool(WorkspaceTool):
    name = "write_file"
    description = (
        "Create or overwrite a text file in the workspace (parent folders are created). "
        "To send the file to the user, put ![description](path) in your reply."
    )
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    }

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        content = _str_arg(args, "content")
        where = self.resolve(args, ctx, want="new", write=True)
        data = content.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content is {_size(len(data))}, over the {_size(MAX_WRITE_BYTES)} write limit")

        existed = await _off_loop(lambda: where.write_atomic(data))
        verb = "Overwrote" if existed else "Created"
        return ToolResult.text(
            f"{verb} {where.shown} ({_size(len(data))}, {content.count(chr(10)) + (1 if content and not content.endswith(chr(10)) else 0)} lines). "
            f"To send it to the user: ![description]({where.shown})"
        )


class EditFileTool(WorkspaceTool):
    name = "edit_file"
    description = (
        "Replace exact text in a workspace text file. old_string must match the file exactly "
        "(including whitespace) and only once, unless replace_all is true."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean"},
        },
        "required": ["path", "old_string", "new_string"],
    }

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        old = _str_arg(args, "old_string")
        new = _str_arg(args, "new_string")
        replace_all = bool(args.get("replace_all", False))
        if not old:
            raise ToolError("old_string is empty; use write_file to create or overwrite a file")
        if old == new:
            raise ToolError("old_string and new_string are the same; nothing to change")
        where = self.resolve(args, ctx, want="file", write=True)

        def edit() -> str:
            with where.open_read() as fh:
                raw = fh.read(MAX_EDIT_BYTES + 1)
            if len(raw) > MAX_EDIT_BYTES:
                raise ToolError(f"{where.shown} is {_size(len(raw))}, too large to edit")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ToolError(f"{where.shown} is not UTF-8 text; edit_file only edits text files") from exc
            count = text.count(old)
            if count == 0:
                raise ToolError(
                    f"old_string was not found in {where.shown}; read the file again and copy the "
                    "exact text, including spaces and line breaks"
                )
            if count > 1 and not replace_all:
                raise ToolError(
                    f"old_string occurs {count} times in {where.shown}; include more surrounding "
                    "text to make it unique, or set replace_all to true"
                )
            first = text.index(old)
            updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
            where.write_atomic(updated.encode("utf-8"))
            start_line = text.count("\n", 0, first) + 1
            lines = updated.splitlines()
            lo = max(1, start_line - 2)
            hi = min(len(lines), start_line + new.count("\n") + 2)
            excerpt = "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in range(lo, hi + 1))
            done = f"Replaced {count if replace_all else 1} occurrence(s) in {where.shown}."
            return f"{done} Lines {lo}-{hi} now read:\n{excerpt}" if excerpt else done

        return ToolResult.text(_clip(await _off_loop(edit), ctx.max_output_chars, "read_file to see more"))


class GlobTool(WorkspaceTool):
    name = "glob"
    description = (
        "Find files by name pattern, e.g. **/*.pdf or reports/*.csv, under path (default: the "
        "workspace). Newest first."
    )
    parameters = {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
        "required": ["pattern"],
    }

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        pattern = _str_arg(args, "pattern").strip()
        if not pattern:
            raise ToolError("pattern is empty")
        if pattern.startswith(("/", "~")) or ".." in Path(pattern).parts or "\x00" in pattern:
            raise ToolError("pattern must be relative to path and may not contain '..' or '~'")
        if args.get("path") in (None, ""):
            args = {**args, "path": "."}
        base = self.resolve(args, ctx, want="dir")

        regex = glob_regex(pattern)

        def search() -> str:
            found: list[tuple[float, str]] = []
            scanned = 0
            for rel, name, dirfd in _walk_files(base):
                scanned += 1
                if scanned > GLOB_SCAN_LIMIT:
                    break
                if not regex.fullmatch(rel):
                    continue
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except OSError:
                    continue
                # Links are not results: what they name may be anywhere.
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    found.append((st.st_mtime, self.shown_below(base, rel)))
            found.sort(key=lambda f: (-f[0], f[1]))
            if not found:
                return f"No files match {pattern!r} under {base.shown}."
            lines = [f[1] for f in found[:MAX_GLOB_RESULTS]]
            more = f"\n[... {len(found) - MAX_GLOB_RESULTS} more; use a narrower pattern]" if len(found) > MAX_GLOB_RESULTS else ""
            return f"{len(found)} file(s) match {pattern!r}:\n" + "\n".join(lines) + more

        return ToolResult.text(_clip(await _off_loop(search), ctx.max_output_chars, "use a narrower pattern"))


class GrepTool(WorkspaceTool):
    name = "grep"
    description = (
        "Search file contents with a regular expression (RE2 syntax) under path (a file or "
        "directory, default: the workspace); include filters file names (e.g. *.md). Prints "
        "path:line: text."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string"},
            "path": {"type": "string"},
            "include": {"type": "string", "description": "file name pattern, e.g. *.py"},
            "ignore_case": {"type": "boolean"},
        },
        "required": ["pattern"],
    }

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        source = _str_arg(args, "pattern")
        include = _str_arg(args, "include", required=False) or None
        regex = compile_pattern(source, ignore_case=bool(args.get("ignore_case")))
        if args.get("path") in (None, ""):
            args = {**args, "path": "."}
        base = self.resolve(args, ctx, want="any")
        if not base.real.exists():
            raise ToolError(f"{base.shown!r} does not exist")
        budget = min(GREP_TIME_BUDGET_S, ctx.time_budget_s)

        def one_file(fh: BinaryIO, shown: str, hits: list[str], used: list[int], deadline: float,
                     stop: threading.Event) -> str:
            """Search one open file; returns why the search stopped, or ""."""
            head = fh.read(file_readers.SNIFF_BYTES)
            if b"\x00" in head:
                return ""
            fh.seek(0)
            text_fh = io.TextIOWrapper(fh, encoding="utf-8", errors="replace")
            for number, line in enumerate(text_fh, 1):
                if number % 1024 == 0 and (time.monotonic() > deadline or stop.is_set()):
                    return "the search took too long; narrow path or include"
                line = line.rstrip("\n")
                if regex.search(line[:file_readers.MAX_LINE_CHARS]):
                    text = line if len(line) <= GREP_LINE_CHARS else line[:GREP_LINE_CHARS] + " [...]"
                    hit = f"{shown}:{number}: {text}"
                    hits.append(hit)
                    used[0] += len(hit) + 1
                    if len(hits) >= GREP_MAX_MATCHES or used[0] > ctx.max_output_chars:
                        return "too many matches; narrow the pattern, path or include"
            text_fh.detach()
            return ""

        def search(stop: threading.Event) -> str:
            deadline = time.monotonic() + budget
            hits: list[str] = []
            used = [0]
            stopped = ""
            if base.real.is_file():
                with base.open_read() as fh:
                    if os.fstat(fh.fileno()).st_size <= GREP_MAX_FILE_BYTES:
                        stopped = one_file(fh, base.shown, hits, used, deadline, stop)
            else:
                for rel, name, dirfd in _walk_files(base, include):
                    if time.monotonic() > deadline or stop.is_set():
                        stopped = "the search took too long; narrow path or include"
                        break
                    opened = _open_entry(name, dirfd)
                    if opened is None:
                        continue  # a link, a device, a hard-linked file: not searched
                    fh, st = opened
                    with fh:
                        if st.st_size > GREP_MAX_FILE_BYTES:
                            continue
                        try:
                            stopped = one_file(fh, self.shown_below(base, rel), hits, used, deadline, stop)
                        except OSError:
                            continue
                    if stopped:
                        break
            if not hits:
                return f"No matches for {source!r} under {base.shown}." + (f" ({stopped})" if stopped else "")
            tail = f"\n[... stopped: {stopped}]" if stopped else ""
            return "\n".join(hits) + tail

        return ToolResult.text(_clip(await _off_loop_stoppable(search), ctx.max_output_chars, "narrow the search"))


class ShellTool(WorkspaceTool):
    name = "shell"
    description = (
        "Run a shell command (/bin/sh) in the workspace folder and return its exit code and output "
        "(stdout and stderr together, cut when long). timeout is in seconds."
    )
    parameters = {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
    }

    def __init__(self, workspace: Workspace, *, default_timeout_s: float = SHELL_DEFAULT_TIMEOUT_S,
                 max_output_chars: int = 20_000, sandbox: Sandbox | None) -> None:
        super().__init__(workspace)
        self.default_timeout_s = default_timeout_s
        self.max_output_chars = max_output_chars
        # Every command runs in this bubblewrap sandbox (``talon.agent.tools.sandbox``); None only
        # under TALON_SHELL_UNSANDBOXED=true.
        self.sandbox = sandbox
        # Host directories commands see read-only, and where (the shared skills at /skills).
        self.read_only_binds: tuple[tuple[str, str], ...] = ()

    @property
    def sandboxed(self) -> bool:
        return self.sandbox is not None

    def environment(self, workspace: Workspace | None = None) -> dict[str, str]:
        # Talon's environment holds API keys and bot tokens; a command gets none of it.
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str((workspace or self.workspace).real_root),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
        }

    def _timeout(self, args: dict[str, Any]) -> float:
        return min(_num_arg(args, "timeout", self.default_timeout_s, minimum=0.1) or self.default_timeout_s,
                   SHELL_MAX_TIMEOUT_S)

    def time_limit(self, args: dict[str, Any], default: float) -> float:
        try:
            return self._timeout(args) + 15.0  # its own timeout, then the kill and the last output
        except ToolError:
            return default

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        command = _str_arg(args, "command")
        if not command.strip():
            raise ToolError("command is empty")
        timeout = self._timeout(args)
        cap = max(1000, min(self.max_output_chars, ctx.max_output_chars))
        workspace = self.ws(ctx)
        cgroup = await asyncio.to_thread(self.sandbox.new_cgroup) if self.sandbox is not None else None
        try:
            return await self._run(command, workspace, cgroup, timeout, cap)
        finally:
            if cgroup is not None:
                await asyncio.to_thread(remove_cgroup, cgroup)

    async def _run(self, command: str, workspace: Workspace, cgroup: CommandCgroup | None, timeout: float,
                   cap: int) -> ToolResult:
        # The workspace's size limit (TALON_WORKSPACE_MAX): what is left of it becomes this
        # command's file-size limit, the usage is watched while it runs (a command that takes
        # the workspace past the limit is killed) and measured again after it.
        limit = workspace.policy.max_bytes
        used_before = await asyncio.to_thread(workspace.usage) if limit else 0
        allowance = max(0, limit - used_before) if limit else None
        notes: list[str] = []
        if allowance == 0:
            notes.append(f"[{workspace.full_notice(used_before)}; in this command no file can grow]")
        if self.sandbox is not None:
            argv = self.sandbox.argv(workspace.real_root, command, cgroup=cgroup, max_file_size=allowance,
                                     read_only_binds=self.read_only_binds)
            env = {"PATH": SANDBOX_PATH}
        else:
            argv = ["/bin/sh", "-c", command]
            env = self.environment(workspace)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workspace.real_root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout kills children too
        )
        head = bytearray()
        tail = bytearray()
        total = 0
        half = cap // 2
        filled: list[int] = []  # the usage that made the watcher kill the command

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        async def pump() -> None:
            nonlocal total, tail
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                total += len(chunk)
                room = half - len(head)
                if room > 0:
                    head.extend(chunk[:room])
                    chunk = chunk[room:]
                tail.extend(chunk)
                if len(tail) > half:
                    tail = tail[-half:]

        async def watch() -> None:
            pause = WORKSPACE_WATCH_S
            while True:
                await asyncio.sleep(pause)
                started = time.monotonic()
                used = await asyncio.to_thread(workspace.usage)
                # A large workspace takes longer to measure: measure less often, not all the time.
                pause = max(WORKSPACE_WATCH_S, 5 * (time.monotonic() - started))
                if used > limit and used > used_before:  # cleaning up a full workspace is fine
                    filled.append(used)
                    kill()
                    return

        timed_out = False
        reader = asyncio.create_task(pump())
        watcher = asyncio.create_task(watch()) if limit else None
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            kill()
            await proc.wait()
        except asyncio.CancelledError:
            # The turn was stopped (/stop, turn timeout, tool limit, SIGTERM): the command goes with it.
            kill()
            reader.cancel()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        try:
            await asyncio.wait_for(reader, 5.0)
        except TimeoutError:
            # A background child still holds the output open; it does not outlive the call.
            kill()
        shown = head.decode("utf-8", "replace")
        omitted = total - len(head) - len(tail)
        if omitted > 0:
            shown += f"\n[... {omitted:,} bytes of output omitted ...]\n"
        if tail:
            shown += tail.decode("utf-8", "replace")
        is_error = timed_out or proc.returncode != 0
        if filled:
            status = (f"killed: it took the workspace to {human_bytes(filled[0])}, over its limit of "
                      f"{human_bytes(limit)} (TALON_WORKSPACE_MAX)")
        elif timed_out:
            status = f"timed out after {timeout:g}s; the command and its children were killed"
        else:
            status = f"exit code {proc.returncode}"
        oom = await asyncio.to_thread(cgroup.oom_kills) if cgroup is not None else 0
        if oom and self.sandbox is not None:
            is_error = True
            notes.append(f"[out of memory: the command's processes together reached its memory limit of "
                         f"{human_bytes(self.sandbox.limits.max_memory)} (TALON_SHELL_MAX_MEMORY); the kernel "
                         f"killed {oom} of them]")
        if limit:
            used_after = await asyncio.to_thread(workspace.usage)
            if used_after > limit:
                is_error = True
                notes.append(f"[{workspace.full_notice(used_after)}]")
        lead = "\n".join([f"[{status}]", *notes])
        return ToolResult.text(f"{lead}\n{shown}" if shown else f"{lead} (no output)", is_error=is_error)


def workspace_tools(
    workspace: Workspace,
    *,
    store: AttachmentStore | None,
    limits: Limits | None = None,
    shell: bool = False,
    shell_unsandboxed: bool = False,
    sandbox_limits: SandboxLimits | None = None,
) -> ToolRegistry:
    """The standard tool set over one workspace; the shell only when asked for.

    The shell runs in a bubblewrap sandbox. Where none can start, asking for the shell is a
    ``ConfigError`` unless ``shell_unsandboxed`` (TALON_SHELL_UNSANDBOXED) says to run it bare.
    """
    registry = ToolRegistry()
    for tool in (
        ListTool(workspace),
        ReadFileTool(workspace, store, limits or Limits()),
        WriteFileTool(workspace),
        EditFileTool(workspace),
        GlobTool(workspace),
        GrepTool(workspace),
    ):
        registry.add(tool)
    if shell:
        sandbox: Sandbox | None = None
        problem: str | None = None
        try:
            sandbox = find_sandbox(sandbox_limits)
        except SandboxUnavailable as exc:
            problem = str(exc)
        if problem is not None and not shell_unsandboxed:
            raise ConfigError(
                f"TALON_SHELL_TOOL=true needs a sandbox, but {problem}. Install bubblewrap, or set "
                "TALON_SHELL_UNSANDBOXED=true to run the shell without one (it can then read "
                "everything the user running Talon can, including its data dir and .env)",
                ["TALON_SHELL_UNSANDBOXED"],
            )
        if problem is not None:
            log.warning("the shell tool runs WITHOUT a sandbox (TALON_SHELL_UNSANDBOXED=true): %s", problem)
        registry.add(ShellTool(workspace, sandbox=sandbox))
    return registry
