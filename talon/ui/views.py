"""What the templates show, made from Talon's data: a conversation's messages as the model saw
them, numbers and times in words, the day chart as SVG geometry. Plain functions of values."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from talon.agent.context.pipeline import SUMMARY as SUMMARY_KEY  # the summary that stands for older turns
from talon.content import AudioBlock, FileBlock, ImageBlock, Message, TextBlock
from talon.storage.sessions import ChatKey

TOOL_TEXT_MAX = 4000  # characters of a tool call or result shown (folded) on a page
TEXT_MAX = 20000


def when(at: float | None) -> str:
    if not at:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def ago(at: float | None) -> str:
    if not at:
        return "-"
    seconds = time.time() - at
    future = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            words = f"{int(seconds // size)} {unit}"
            break
    else:
        words = f"{int(seconds)} s"
    return f"in {words}" if future else f"{words} ago"


def number(value: float | int | None) -> str:
    return f"{int(value or 0):,}"


def money(value: float | None) -> str:
    return f"${value or 0.0:,.4f}"


def chat_url(key: ChatKey | tuple[str, str]) -> str:
    channel, chat_id = (key.channel, key.chat_id) if isinstance(key, ChatKey) else key
    return f"/ui/chats/{quote(channel, safe='')}:{quote(chat_id, safe=':')}"


@dataclass
class Shown:
    """One message on a chat's page."""

    index: int
    role: str  # user, assistant, tool, system
    text: str = ""
    images: list[dict[str, object]] = field(default_factory=list)  # {sha, mime, width, height, name}
    audio: list[dict[str, object]] = field(default_factory=list)  # {sha, transcript, duration}
    files: list[dict[str, object]] = field(default_factory=list)  # {sha, name, mime, bytes}
    # Files the agent's reply referenced (``![alt](path)``): {sha, name, mime} when the web chat
    # stored them, else {path, name} to fetch from the chat's workspace.
    sent: list[dict[str, object]] = field(default_factory=list)
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # {name, arguments}
    tool_name: str = ""
    summary: bool = False
    error: bool = False


# How the inbound normalizer writes a voice note's (or audio file's) transcript into the text the
# model sees (talon.media.inbound._transcript_line): "[voice note, 0:03, machine transcription]: ...".
_TRANSCRIPT = re.compile(r"^\[(?P<what>[^\]\n]*?), (?P<length>[0-9:]+), machine transcription[^\]\n]*\]: (?P<text>.*)$",
                         re.MULTILINE)


def _transcripts(text: str) -> tuple[str, list[dict[str, object]]]:
    """The text without its transcript lines, and those lines as voice notes."""
    found = [{"sha": "", "transcript": m["text"], "duration": None, "length": m["length"], "name": m["what"]}
             for m in _TRANSCRIPT.finditer(text)]
    return (_TRANSCRIPT.sub("", text).strip() if found else text), found


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit:,} more characters)"


def _sent_refs(text: str, item: Shown, stored: dict[str, tuple[str, str]]) -> str:
    """The reply's text without its file references, and those files on ``item.sent``."""
    from talon.media.outbound import extract_markdown_media

    if "![" not in text:
        return text
    rest, refs = extract_markdown_media(text)
    for ref in refs:
        name = ref.path.replace("\\", "/").rsplit("/", 1)[-1] or ref.path
        known = stored.get(ref.path)
        if known is not None:
            item.sent.append({"sha": known[0], "mime": known[1], "name": name, "path": ref.path})
        else:
            item.sent.append({"sha": "", "mime": "", "name": name, "path": ref.path})
    return rest


def sent_paths(messages: list[Message]) -> set[str]:
    """Every file reference (``![alt](path)``, as written) in the assistant's replies: what a
    chat's page may fetch from its workspace."""
    from talon.media.outbound import extract_markdown_media

    paths: set[str] = set()
    for message in messages:
        if message.role != "assistant":
            continue
        for block in message.content:
            if isinstance(block, TextBlock) and "![" in block.text:
                paths.update(ref.path for ref in extract_markdown_media(block.text)[1])
    return paths


def shown_messages(messages: list[Message], first: int = 0,
                   stored: dict[str, tuple[str, str]] | None = None) -> list[Shown]:
    """``stored``: reference path -> (sha256, mime) of files the web chat put in the attachment store."""
    out = []
    for n, message in enumerate(messages[first:], first):
        item = Shown(index=n, role=message.role, tool_name=message.tool_name or "",
                     summary=bool(message.meta.get(SUMMARY_KEY)),
                     error=bool(message.meta.get("error")))
        texts = []
        for block in message.content:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ImageBlock):
                item.images.append({"sha": block.ref.id, "mime": block.ref.mime, "width": block.ref.width,
                                    "height": block.ref.height, "name": block.ref.name or ""})
            elif isinstance(block, AudioBlock):
                item.audio.append({"sha": block.ref.id, "transcript": block.transcript or "",
                                   "duration": block.duration_s, "name": block.ref.name or ""})
            elif isinstance(block, FileBlock):
                item.files.append({"sha": block.ref.id, "name": block.ref.name or block.ref.id[:12],
                                   "mime": block.ref.mime, "bytes": block.ref.bytes})
        limit = TOOL_TEXT_MAX if message.role == "tool" else TEXT_MAX
        text = "\n".join(texts)
        if message.role == "user":
            text, heard = _transcripts(text)
            item.audio.extend(heard)
        elif message.role == "assistant":
            text = _sent_refs(text, item, stored or {})
        item.text = _clip(text, limit)
        for call in message.tool_calls:
            try:
                args = json.dumps(json.loads(call.arguments), indent=1, ensure_ascii=False)
            except ValueError:
                args = call.arguments
            item.tool_calls.append({"name": call.name, "arguments": _clip(args, TOOL_TEXT_MAX)})
        out.append(item)
    return out


def referenced(messages: list[Message]) -> dict[str, str]:
    """sha256 -> mime of every attachment the messages refer to (what a chat may serve)."""
    refs: dict[str, str] = {}
    for message in messages:
        for block in message.content:
            if isinstance(block, (ImageBlock, AudioBlock, FileBlock)):
                refs[block.ref.id] = block.ref.mime
    return refs


@dataclass(frozen=True)
class Bar:
    x: int
    y: int
    height: int
    label: str
    value: int


def day_bars(per_day: dict[str, int], days: int = 14, now: float | None = None, height: int = 100,
             width: int = 24) -> list[Bar]:
    """The last ``days`` UTC days as bars of an SVG chart, oldest first (days without messages: 0)."""
    now = time.time() if now is None else now
    labels = [time.strftime("%Y-%m-%d", time.gmtime(now - 86400 * k)) for k in range(days - 1, -1, -1)]
    top = max([per_day.get(d, 0) for d in labels] + [1])
    bars = []
    for i, label in enumerate(labels):
        value = per_day.get(label, 0)
        h = round(height * value / top)
        bars.append(Bar(x=i * (width + 4), y=height - h, height=h, label=label[5:], value=value))
    return bars
