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


def shown_messages(messages: list[Message], first: int = 0) -> list[Shown]:
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
