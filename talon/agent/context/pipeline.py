"""The context pipeline: transforms of what the model will see, applied per request.

The session log stays complete; every step here works on a copy of the conversation as it will
be sent, in order of cost:

1. ``repair_tool_pairs``       every tool call has exactly one result (a crash can leave a gap);
2. ``truncate_tool_arguments`` long arguments of old write/edit calls are cut to a head + marker;
3. ``evict_tool_results``      a tool result over the limit is saved to a file and replaced by a
                               numbered head/tail preview naming that file;
4. ``tombstone_images``        images older than the last few turns become a note naming the
                               file, its size and hash, and how to look again;
5. ``summarize_step``          at the trigger (85% of the window by default) older turns are
                               summarized by the model, appended to the thread's markdown archive,
                               and a checkpoint record is added to the log so later requests
                               start from the summary; the recent tail (10%) is kept verbatim and
                               a tool call is never separated from its result;
6. ``fit_to_budget``           last line of defence: if the request is still too long, images go,
                               then the largest texts are clipped, then the oldest turns are left
                               out of this request. A request over the window is never sent.

``clip_trailing_tool_results`` is the recovery used when a provider refuses a request as too long
anyway (our estimate was low): the newest tool results shrink to previews and the call is retried.

The view itself (``conversation_view``) already differs from the log in one way besides the
summary: an assistant message holding a notice Talon wrote (``TALON_NOTICE``: a stopped answer's
note, the step limit, an empty reply) becomes the model's own words only, and the notice a
user-side note from Talon after it, so a model never reads Talon's words as its own.

Private bookkeeping travels in ``Message.meta`` under keys starting with ``_`` (log position,
summary marker); the agent strips ``meta`` before a request is built, so none of it reaches a
model. Steps never edit a message in place: messages are shared with the session cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from talon.agent.context.memo import DerivedCache
from talon.agent.providers.profiles import ModelProfile
from talon.agent.providers.base import image_placeholder
from talon.agent.context.session import CHECKPOINT_KEY, SUMMARY_CHECKPOINT, failed_turns, is_checkpoint
from talon.agent.context.summary import append_archive
from talon.agent.context.tokens import CHARS_PER_TOKEN, estimate_message, estimate_messages
from talon.content import AttachmentRef, ContentBlock, ImageBlock, Message, TextBlock, ToolCall
from talon.permissions import private_dir
from talon.safe_files import atomic_write_beneath

log = logging.getLogger(__name__)

IDX = "_idx"  # position of the message in the session log
SUMMARY = "_summary"  # marks the synthetic summary message at the head of a view
NOTE = "_talon_note"  # marks a note from Talon made in the view out of a Talon notice
# In an assistant message of the log: the text in it that Talon wrote for the person (a notice
# such as STOPPED_NOTE, appended to the model's words or the whole message), not the model.
TALON_NOTICE = "talon_notice"
STOPPED_NOTE = "[stopped by the person before the answer was finished]"

WRITE_TOOLS = frozenset({"write_file", "edit_file"})


# --- policy and budget ----------------------------------------------------------------------
@dataclass(frozen=True)
class ContextPolicy:
    """The knobs of context management, with the defaults the design names."""

    trigger_ratio: float = 0.85
    keep_tail_ratio: float = 0.10
    tool_args_max_chars: int = 2000
    long_argument_tools: frozenset[str] = WRITE_TOOLS
    tool_result_ratio: float = 0.06
    tool_result_min_tokens: int = 1000
    tool_result_max_tokens: int = 10_000
    image_keep_turns: int = 3
    max_images: int = 20
    summary_ratio: float = 0.05
    summary_min_tokens: int = 300
    summary_max_tokens: int = 2000
    # Kept free besides the reply reservation: estimates are estimates.
    safety_ratio: float = 0.02


@dataclass(frozen=True)
class ContextBudget:
    window: int
    max_output: int
    limit: int  # most input tokens a request may carry
    trigger: int  # summarize from this many input tokens
    keep_tail: int
    tool_result_tokens: int
    summary_tokens: int

    @classmethod
    def for_profile(cls, profile: ModelProfile, policy: ContextPolicy | None = None) -> "ContextBudget":
        policy = policy or ContextPolicy()
        window = profile.context_window
        # An explicit TALON_MODEL_MAX_OUTPUT is reserved exactly (it was checked to fit).
        max_output = profile.max_output if profile.explicit_output else min(profile.max_output, window // 2)
        limit = window - max_output - max(64, int(window * policy.safety_ratio))
        trigger = min(int(window * policy.trigger_ratio), limit)
        tool_tokens = int(window * policy.tool_result_ratio)
        tool_tokens = max(policy.tool_result_min_tokens, min(policy.tool_result_max_tokens, tool_tokens))
        summary = int(window * policy.summary_ratio)
        summary = max(policy.summary_min_tokens, min(policy.summary_max_tokens, summary))
        return cls(
            window=window,
            max_output=max_output,
            limit=limit,
            trigger=trigger,
            keep_tail=int(window * policy.keep_tail_ratio),
            tool_result_tokens=min(tool_tokens, max(200, limit // 4)),
            summary_tokens=min(summary, max(100, limit // 6)),
        )


# --- large tool results ---------------------------------------------------------------------
class ResultFiles:
    """Where evicted tool output is kept, one file per distinct output (named by its hash)."""

    def __init__(self, directory: Path, *, write: bool = True) -> None:
        self.directory = Path(directory)
        self.write = write

    def save(self, text: str) -> Path:
        data = text.encode("utf-8")
        path = self.directory / f"{hashlib.sha256(data).hexdigest()[:16]}.txt"
        if self.write and not path.exists():
            private_dir(self.directory)
            atomic_write_beneath(self.directory, [path.name], data, mode=0o600)
        return path


# --- the per-request context ----------------------------------------------------------------
Summarize = Callable[[str | None, list[Message]], Awaitable[str]]


@dataclass
class RequestContext:
    """What the steps need for one request: budget, fixed overhead, and the side channels."""

    budget: ContextBudget
    policy: ContextPolicy = field(default_factory=ContextPolicy)
    overhead: int = 0  # system prompt + tool definitions
    scale: float = 1.0  # provider-reported tokens per estimated token (>= 1)
    results: ResultFiles | None = None
    archive: Path | None = None
    archive_title: str = "conversation"
    summarize: Summarize | None = None
    persist: Callable[[Message], Awaitable[None]] | None = None
    force_summary: bool = False

    def estimate(self, messages: Sequence[Message]) -> int:
        return math.ceil((self.overhead + estimate_messages(messages)) * self.scale)

    def message_budget(self, tokens: int) -> int:
        """Message tokens (unscaled) that fit when the whole request may have ``tokens``."""
        return max(0, int(tokens / self.scale) - self.overhead)


ContextStep = Callable[[list[Message], RequestContext], Awaitable[list[Message]]]


@dataclass
class ContextPipeline:
    steps: Sequence[ContextStep] = field(default_factory=list)

    async def apply(self, messages: list[Message], ctx: RequestContext) -> list[Message]:
        for step in self.steps:
            messages = await step(messages, ctx)
        return messages


# --- the view: log -> conversation ----------------------------------------------------------
def conversation_view(history: Sequence[Message], copies: DerivedCache | None = None) -> list[Message]:
    """What the model would see of a log: the last summary, then everything it does not cover.

    Each message carries its log position in ``meta['_idx']``; checkpoint records themselves are
    not conversation. With ``copies`` the copy of a log message made for an earlier request is
    used again (the same object, so what later steps derive from it can be remembered too).
    """
    start = 0
    view: list[Message] = []
    failed = failed_turns(history)

    def copy(message: Message, tag: tuple[str, int], meta: dict[str, object]) -> Message:
        if copies is None:
            return message.model_copy(update={"meta": meta})
        return copies.derive(message, tag, lambda m: m.model_copy(update={"meta": meta}))

    for i in range(len(history) - 1, -1, -1):
        if is_checkpoint(history[i]):
            checkpoint = history[i]
            start = int(checkpoint.meta.get("covers", 0))
            view.append(copy(checkpoint, (SUMMARY, i), {SUMMARY: True, IDX: i}))
            break
    for i in range(start, len(history)):
        message = history[i]
        if failed and message.meta.get("turn_id") in failed:
            continue  # a turn the server refused for good (see Agent.run_turn)
        if is_checkpoint(message):
            continue
        notice = talon_notice(message)
        if notice is None:
            view.append(copy(message, (IDX, i), {**message.meta, IDX: i}))
            continue
        # Talon's words never go to the model as the assistant's (a model echoes them): what the
        # model wrote stays an assistant message; the notice follows as a note from Talon.
        own = _without_notice(message.text, notice)
        if own.strip():
            view.append(_derived(copies, message, ("_own", i), _own_words(own, {**message.meta, IDX: i})))
        view.append(_derived(copies, message, (NOTE, i), _note_of(notice, i)))
    return view


def _own_words(own: str, meta: dict[str, object]) -> Callable[[Message], Message]:
    return lambda m: m.model_copy(update={"content": [TextBlock(text=own)], "meta": meta})


def _note_of(notice: str, idx: int) -> Callable[[Message], Message]:
    return lambda m: talon_note(notice, idx)


def talon_notice(message: Message) -> str | None:
    """The text Talon wrote into an assistant message of the log (``TALON_NOTICE``); for logs
    written before it was marked, the stop note of an interrupted answer."""
    if message.role != "assistant":
        return None
    notice = message.meta.get(TALON_NOTICE)
    if isinstance(notice, str) and notice.strip():
        return notice
    if message.meta.get("interrupted") and message.text.rstrip().endswith(STOPPED_NOTE):
        return STOPPED_NOTE
    return None


def _without_notice(text: str, notice: str) -> str:
    stripped = text.rstrip()
    if stripped.endswith(notice.strip()):
        return stripped[:len(stripped) - len(notice.strip())].rstrip()
    return text


def talon_note(notice: str, idx: int) -> Message:
    """A notice of Talon's as the model reads it: a user-side note that says who wrote it."""
    words = notice.strip()
    if words.startswith("[") and words.endswith("]"):
        words = words[1:-1]
    text = (f"[Note from Talon, not written by you and not a message from the person: after your "
            f"previous answer Talon told the person: {words}]")
    return Message(role="user", content=[TextBlock(text=text)], meta={IDX: idx, NOTE: True})


def _derived(copies: DerivedCache | None, source: Message, tag: tuple[str, int],
             make: Callable[[Message], Message]) -> Message:
    return make(source) if copies is None else copies.derive(source, tag, make)


def checkpoint_record(summary: str, *, covers: int, archive: Path | None) -> Message:
    """The log record that makes later requests start from ``summary`` (of log messages < covers)."""
    where = f" The full text is in the archive {archive}; read_file or grep it when details matter." if archive else ""
    text = (
        f"[Summary of the earlier conversation (its first {covers} messages), written to save "
        f"space.{where}]\n\n{summary.strip()}"
    )
    meta = {CHECKPOINT_KEY: SUMMARY_CHECKPOINT, "covers": covers}
    if archive is not None:
        meta["archive"] = str(archive)
    return Message(role="user", content=[TextBlock(text=text)], meta=meta)


def _is_turn_start(message: Message) -> bool:
    return message.role == "user" and not message.meta.get(SUMMARY) and not message.meta.get(NOTE)


def _with_content(message: Message, content: list[ContentBlock]) -> Message:
    return message.model_copy(update={"content": content})


# --- 1. tool pairs --------------------------------------------------------------------------
INTERRUPTED = "[no result: this tool call was interrupted before it finished]"


def repair_tool_pairs(messages: Sequence[Message]) -> list[Message]:
    """Give every tool call one result and drop results that answer no call."""
    out: list[Message] = []
    open_calls: dict[str, ToolCall] = {}

    def close_open() -> None:
        for call in open_calls.values():
            out.append(Message(role="tool", content=[TextBlock(text=INTERRUPTED)], tool_call_id=call.id,
                               tool_name=call.name, meta={"error": True}))
        open_calls.clear()

    for message in messages:
        if message.role == "tool":
            if message.tool_call_id in open_calls:
                del open_calls[message.tool_call_id]
                out.append(message)
            continue
        close_open()
        out.append(message)
        if message.role == "assistant":
            open_calls = {c.id: c for c in message.tool_calls}
    close_open()
    return out


# --- 2. old long arguments ------------------------------------------------------------------
def _cut_arguments(arguments: str, max_chars: int) -> str:
    marker = "[... {n:,} more characters cut from this earlier call]"
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        head = arguments[: max_chars // 2]
        return json.dumps({"_truncated_arguments": head + marker.format(n=len(arguments) - len(head))})
    field_max = max(100, max_chars // 4)
    cut: dict[str, object] = {}
    for key, value in parsed.items():
        if isinstance(value, str) and len(value) > field_max:
            cut[key] = value[:field_max] + marker.format(n=len(value) - field_max)
        else:
            cut[key] = value
    text = json.dumps(cut, ensure_ascii=False)
    if len(text) > max_chars * 2:  # many fields, or long non-string values
        return json.dumps({"_truncated_arguments": text[: max_chars // 2] + marker.format(n=len(text) - max_chars // 2)})
    return text


def truncate_tool_arguments(
    messages: Sequence[Message], *, max_chars: int = 2000, tools: frozenset[str] = WRITE_TOOLS
) -> list[Message]:
    """Cut long arguments of write/edit calls made before the current turn."""
    starts = [i for i, m in enumerate(messages) if _is_turn_start(m)]
    current = starts[-1] if starts else len(messages)
    out = list(messages)
    for i in range(current):
        message = out[i]
        if message.role != "assistant" or not message.tool_calls:
            continue
        if not any(c.name in tools and len(c.arguments) > max_chars for c in message.tool_calls):
            continue
        calls = [
            c.model_copy(update={"arguments": _cut_arguments(c.arguments, max_chars)})
            if c.name in tools and len(c.arguments) > max_chars else c
            for c in message.tool_calls
        ]
        out[i] = message.model_copy(update={"tool_calls": calls})
    return out


# --- 3. large tool results ------------------------------------------------------------------
PREVIEW_HEAD_LINES = 20
PREVIEW_TAIL_LINES = 10
PREVIEW_LINE_CHARS = 200


def preview(text: str, path: Path, *, max_chars: int) -> str:
    """First and last lines, numbered, and where the whole text is."""
    lines = text.splitlines()
    n = len(lines)

    def fmt(i: int) -> str:
        line = lines[i]
        if len(line) > PREVIEW_LINE_CHARS:
            line = line[:PREVIEW_LINE_CHARS] + " [...]"
        return f"{i + 1:>6}\t{line}"

    head_n = min(n, PREVIEW_HEAD_LINES)
    tail_start = max(head_n, n - PREVIEW_TAIL_LINES)
    intro = (
        f"[This output was too long to keep in the conversation: {n:,} lines, {len(text):,} "
        f"characters. The whole output is saved in {path} (read_file it with offset/limit, or "
        f"grep it). First and last lines:]"
    )
    head = [fmt(i) for i in range(head_n)]
    tail = [fmt(i) for i in range(tail_start, n)]
    gap = [f"   ... lines {head_n + 1}-{tail_start} not shown ..."] if tail_start > head_n else []
    body = "\n".join(head + gap + tail)
    room = max(200, max_chars - len(intro) - 1)
    if len(body) > room:
        body = body[: room // 2] + "\n   ...\n" + body[-room // 2:]
    return f"{intro}\n{body}"


def evict_tool_results(messages: Sequence[Message], *, max_tokens: int, results: ResultFiles) -> list[Message]:
    """Replace the text of each tool result over ``max_tokens`` with a preview of a saved file."""
    out = list(messages)
    for i, message in enumerate(out):
        if message.role != "tool":
            continue
        text = message.text
        if len(text) <= max_tokens * CHARS_PER_TOKEN:
            continue
        path = results.save(text)
        note = TextBlock(text=preview(text, path, max_chars=max_tokens * CHARS_PER_TOKEN // 2))
        out[i] = _with_content(message, [note] + [b for b in message.content if not isinstance(b, TextBlock)])
    return out


def clip_trailing_tool_results(
    messages: Sequence[Message], *, max_tokens: int, results: ResultFiles
) -> tuple[list[Message], bool]:
    """Shrink the tool results after the last assistant message (overflow recovery).

    Their text goes down to a preview of ``max_tokens`` and their images become tombstones.
    Returns the messages and whether anything changed.
    """
    out = list(messages)
    changed = False
    i = len(out) - 1
    while i >= 0 and out[i].role == "tool":
        message = out[i]
        text = message.text
        images = message.images()
        if len(text) > max_tokens * CHARS_PER_TOKEN:
            text = preview(text, results.save(text), max_chars=max_tokens * CHARS_PER_TOKEN)
        if text != message.text or images:
            content: list[ContentBlock] = [TextBlock(text=text)] if text else []
            content += [TextBlock(text=tombstone(b.ref)) for b in images]
            out[i] = _with_content(message, content)
            changed = True
        i -= 1
    return out, changed


# --- 4. old images --------------------------------------------------------------------------
def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.0f} KB" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f} MB"


def tombstone(ref: AttachmentRef) -> str:
    name = ref.path or ref.name or "image"
    dims = f"{ref.width}x{ref.height}, " if ref.width and ref.height else ""
    again = (
        f'to look at it again, call read_file with path "{ref.path}"' if ref.path
        else "it is not saved in the workspace, so ask the user to send it again if you need to see it"
    )
    return (
        f"[image {name} ({dims}{_size(ref.bytes)}, sha256 {ref.id[:12]}) was shown earlier and is no "
        f"longer attached; {again}]"
    )


def withhold_images(messages: Sequence[Message], ids: set[str], reason: str) -> list[Message]:
    """Replace the images whose attachment id is in ``ids`` by a line saying why they are not shown."""
    out = list(messages)
    for i, message in enumerate(out):
        if any(isinstance(b, ImageBlock) and b.ref.id in ids for b in message.content):
            out[i] = _with_content(message, [
                TextBlock(text=image_placeholder(b, reason)) if isinstance(b, ImageBlock) and b.ref.id in ids else b
                for b in message.content
            ])
    return out


def tombstone_images(messages: Sequence[Message], *, keep_turns: int = 3, max_images: int = 20) -> list[Message]:
    """Keep the images of the last ``keep_turns`` turns (at most ``max_images``, newest first)."""
    starts = [i for i, m in enumerate(messages) if _is_turn_start(m)]
    if keep_turns <= 0:
        cutoff = len(messages)
    elif len(starts) >= keep_turns:
        cutoff = starts[-keep_turns]
    else:
        cutoff = 0
    out = list(messages)
    kept = 0
    for i in range(len(out) - 1, -1, -1):
        message = out[i]
        if not any(isinstance(b, ImageBlock) for b in message.content):
            continue
        blocks: list[ContentBlock] = []
        changed = False
        for block in reversed(message.content):
            if isinstance(block, ImageBlock):
                if i >= cutoff and kept < max_images:
                    kept += 1
                    blocks.append(block)
                else:
                    blocks.append(TextBlock(text=tombstone(block.ref)))
                    changed = True
            else:
                blocks.append(block)
        if changed:
            out[i] = _with_content(message, list(reversed(blocks)))
    return out


# --- 5. summaries ---------------------------------------------------------------------------
def choose_cut(messages: Sequence[Message], keep_tokens: int) -> int | None:
    """Where the kept tail starts: the earliest turn boundary whose tail fits ``keep_tokens``.

    A boundary is a message that is not a tool result, so a call and its results stay together.
    When even the last group is larger, the tail is just that group. None: nothing to summarize.
    """
    first = 1 if messages and messages[0].meta.get(SUMMARY) else 0
    suffix = 0
    best: int | None = None
    last_boundary: int | None = None
    for i in range(len(messages) - 1, first, -1):
        suffix += estimate_message(messages[i])
        message = messages[i]
        if message.role == "tool" or message.meta.get(SUMMARY) or IDX not in message.meta:
            continue
        if last_boundary is None:
            last_boundary = i
        if suffix <= keep_tokens:
            best = i
    cut = best if best is not None else last_boundary
    if cut is None or cut <= first:
        return None
    return cut


async def summarize_step(messages: list[Message], ctx: RequestContext) -> list[Message]:
    """At the trigger, fold old turns into a summary and record it in the log."""
    if ctx.summarize is None or ctx.persist is None or not messages:
        return messages
    if not ctx.force_summary and ctx.estimate(messages) < ctx.budget.trigger:
        return messages
    keep = ctx.budget.keep_tail // 2 if ctx.force_summary else ctx.budget.keep_tail
    cut = choose_cut(messages, keep)
    if cut is None:
        return messages
    previous = messages[0] if messages[0].meta.get(SUMMARY) else None
    fresh = messages[1 if previous is not None else 0: cut]
    if not fresh:
        return messages
    first = int(fresh[0].meta.get(IDX, 0))
    covers = int(messages[cut].meta[IDX])
    previous_text = previous.text if previous is not None else None
    summary = await ctx.summarize(_strip_header(previous_text), list(fresh))
    request = _folded_request(fresh, messages[cut:])
    if request is not None:
        summary = f"{summary.rstrip()}\n\n{request}"
    if ctx.archive is not None:
        append_archive(ctx.archive, fresh, first=first, last=covers - 1, title=ctx.archive_title)
    record = checkpoint_record(summary, covers=covers, archive=ctx.archive)
    await ctx.persist(record)
    log.info("summarized log messages %d-%d (%d in this request) into a checkpoint", first, covers - 1, len(fresh))
    head = record.model_copy(update={"meta": {SUMMARY: True}})
    return [head] + list(messages[cut:])


REQUEST_CLIP_CHARS = 2000


def _folded_request(fresh: Sequence[Message], kept: Sequence[Message]) -> str | None:
    """The user's latest message, verbatim, when the cut fell inside its turn (long tool chains).

    The summary model is asked to quote it, but whether the request being worked on survives must
    not depend on that.
    """
    if any(_is_turn_start(m) for m in kept):
        return None
    latest = next((m for m in reversed(fresh) if _is_turn_start(m)), None)
    if latest is None or not latest.text.strip():
        return None
    text = latest.text.strip()
    if len(text) > REQUEST_CLIP_CHARS:
        text = _clip_text(text, REQUEST_CLIP_CHARS)
    return f"The request being worked on (the user's latest message, verbatim):\n{text}"


_HEADER = re.compile(r"^\[Summary of the earlier conversation[^\]]*\]\s*", re.DOTALL)


def _strip_header(text: str | None) -> str | None:
    return _HEADER.sub("", text, count=1) if text else text


# --- 6. the last line of defence ------------------------------------------------------------
MIN_CLIP_CHARS = 1500
# The floor of the last pass, which may clip the summary and the newest message too.
LAST_CLIP_CHARS = 400


def _clip_text(text: str, keep: int) -> str:
    half = max(keep // 2, 1)
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters cut to fit the context window ...]\n{text[-half:]}"


def fit_to_budget(messages: Sequence[Message], *, max_tokens: int) -> list[Message]:
    """Make the messages fit ``max_tokens`` (estimated) whatever it takes, least loss first."""
    out = list(messages)
    total = estimate_messages(out)
    if total <= max_tokens:
        return out
    # Images, oldest first.
    for i, message in enumerate(out):
        if total <= max_tokens:
            return out
        if message.images():
            before = estimate_message(message)
            out[i] = _with_content(message, [
                TextBlock(text=tombstone(b.ref)) if isinstance(b, ImageBlock) else b for b in message.content
            ])
            total += estimate_message(out[i]) - before
    # The largest texts and call arguments, to their head and tail (no shorter than MIN_CLIP_CHARS).
    out, total = _clip_largest(out, total, max_tokens, floor=MIN_CLIP_CHARS)
    # Whole groups, oldest first (never the summary at the head, never the newest group).
    dropped = 0
    head = 1 if out and out[0].meta.get(SUMMARY) else 0
    while total > max_tokens:
        end = head + 1
        while end < len(out) and out[end].role == "tool":
            end += 1
        if end >= len(out):
            break
        total -= estimate_messages(out[head:end])
        dropped += end - head
        del out[head:end]
    if dropped:
        note = Message.user(
            f"[{dropped} earlier message(s) are left out of this request to fit the model's context "
            "window; the session log keeps them.]"
        )
        out.insert(head, note)
        total += estimate_message(note)
    # What is left (the summary at the head, the newest group) below that floor: these two alone
    # can be over a small window, e.g. a summary written for a larger one before the server stated
    # its real window. A request over the budget is never sent while clipping can still help.
    out, total = _clip_largest(out, total, max_tokens, floor=LAST_CLIP_CHARS)
    if total > max_tokens:
        log.warning("the request is still ~%d tokens over its budget after clipping every text", total - max_tokens)
    return out


def _clip_largest(out: list[Message], total: int, max_tokens: int, *, floor: int) -> tuple[list[Message], int]:
    """Clip the largest text or call arguments, one at a time, until ``total`` fits or nothing
    longer than ``floor`` characters is left; the new list and its estimate."""
    while total > max_tokens:
        best: tuple[int, int, int] | None = None  # (size, message index, block index or -1-call)
        for i, message in enumerate(out):
            for j, block in enumerate(message.content):
                if isinstance(block, TextBlock) and len(block.text) > floor and (best is None or len(block.text) > best[0]):
                    best = (len(block.text), i, j)
            for j, call in enumerate(message.tool_calls):
                if len(call.arguments) > floor and (best is None or len(call.arguments) > best[0]):
                    best = (len(call.arguments), i, -1 - j)
        if best is None:
            break
        size, i, j = best
        # The marker _clip_text adds is counted too: 200 characters cover it with room to spare.
        excess = (total - max_tokens) * CHARS_PER_TOKEN + 200
        keep = max(floor - 200, size - excess)
        message = out[i]
        before = estimate_message(message)
        if j >= 0:
            content = list(message.content)
            content[j] = TextBlock(text=_clip_text(message.content[j].text, keep))  # type: ignore[union-attr]
            out[i] = _with_content(message, content)
        else:
            calls = list(message.tool_calls)
            calls[-1 - j] = calls[-1 - j].model_copy(update={"arguments": _cut_arguments(calls[-1 - j].arguments, keep)})
            out[i] = message.model_copy(update={"tool_calls": calls})
        after = estimate_message(out[i])
        if after >= before:
            break
        total += after - before
    return out, total


# --- the steps, as the pipeline runs them ---------------------------------------------------
async def repair_step(messages: list[Message], ctx: RequestContext) -> list[Message]:
    return repair_tool_pairs(messages)


async def truncate_step(messages: list[Message], ctx: RequestContext) -> list[Message]:
    return truncate_tool_arguments(messages, max_chars=ctx.policy.tool_args_max_chars,
                                   tools=ctx.policy.long_argument_tools)


async def evict_step(messages: list[Message], ctx: RequestContext) -> list[Message]:
    if ctx.results is None:
        return messages
    return evict_tool_results(messages, max_tokens=ctx.budget.tool_result_tokens, results=ctx.results)


async def tombstone_step(messages: list[Message], ctx: RequestContext) -> list[Message]:
    return tombstone_images(messages, keep_turns=ctx.policy.image_keep_turns, max_images=ctx.policy.max_images)


async def fit_step(messages: list[Message], ctx: RequestContext) -> list[Message]:
    return fit_to_budget(messages, max_tokens=ctx.message_budget(ctx.budget.limit))


def default_steps() -> list[ContextStep]:
    return [repair_step, truncate_step, evict_step, tombstone_step, summarize_step, fit_step]


def default_pipeline() -> ContextPipeline:
    return ContextPipeline(default_steps())


def shrink_budget(budget: ContextBudget, profile: ModelProfile, factor: float,
                  policy: ContextPolicy | None = None) -> ContextBudget:
    """The budget of a window ``factor`` times as large (after the provider refused a request).

    A large window shrinks to no less than 1,024 tokens; one of 1,024 or less shrinks all the
    same (a floor above the window itself would give the refused request's budget again)."""
    window = profile.context_window
    target = int(window * factor)
    if window > _SHRINK_FLOOR:
        target = max(_SHRINK_FLOOR, target)
    return ContextBudget.for_profile(replace(profile, context_window=target), policy)


_SHRINK_FLOOR = 1024


