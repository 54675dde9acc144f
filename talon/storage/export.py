"""``talon export``: conversations as Markdown (to read) and JSON (complete), with their media.

For each chat (or the one named) and each of its threads, ``<out>/<channel>_<chat>/`` gets
``<thread>.md``: every message with who said it and when, images and files linked to their copies
in ``media/`` beside it, tool calls named in a line; and ``<thread>.json``: every message whole
(content blocks, tool calls and results, when; Talon's private bookkeeping ``meta`` included).
Media files are named by the first 12 hex digits of their sha256 and their own (made safe) name, so
the same file is written once. Reads go through the configured stores (embedded or PostgreSQL);
file work runs off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talon.content import AttachmentRef, AudioBlock, FileBlock, ImageBlock, Message, TextBlock
from talon.permissions import open_private, private_dir
from talon.storage.attachments import AttachmentStore
from talon.storage.sessions import ChatKey, SessionStore, safe_path_part


@dataclass
class ExportReport:
    out: Path
    threads: int = 0
    messages: int = 0
    media: int = 0
    missing_media: int = 0


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "time not recorded"


def _who(message: Message) -> str:
    if message.role == "assistant":
        return "Talon (assistant)"
    if message.role == "tool":
        return f"tool result ({message.tool_name or 'tool'})"
    sender = message.meta.get("sender")
    return f"user {sender}" if sender else "user"


def media_name(ref: AttachmentRef) -> str:
    base = safe_path_part(ref.name or "file")[:80]
    return f"{ref.id[:12]}-{base}"


def _markdown_block(block: Any) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ImageBlock):
        return f"![{block.ref.name or 'image'}](media/{media_name(block.ref)})"
    if isinstance(block, AudioBlock):
        said = f" — transcript: {block.transcript}" if block.transcript else ""
        return f"[voice note: {block.ref.name or 'audio'}](media/{media_name(block.ref)}){said}"
    if isinstance(block, FileBlock):
        return f"[{block.ref.name or 'file'}](media/{media_name(block.ref)})"
    return ""


def to_markdown(chat: ChatKey, thread: str, messages: list[Message]) -> str:
    lines = [f"# {chat} — conversation {thread}", ""]
    for message in messages:
        if message.meta.get("checkpoint"):
            lines += [f"_{_when(message.at)}: earlier messages summarized for the model_", ""]
            continue
        lines += [f"**{_who(message)}** · {_when(message.at)}", ""]
        body = "\n\n".join(p for p in (_markdown_block(b) for b in message.content) if p.strip())
        if body:
            lines += [body, ""]
        for call in message.tool_calls:
            lines += [f"_called `{call.name}` with `{call.arguments[:500]}`_", ""]
    return "\n".join(lines)


def _write(path: Path, data: bytes) -> None:
    private_dir(path.parent)
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as fh:
        fh.write(data)


async def export(sessions: SessionStore, attachments: AttachmentStore, out: Path,
                 chat: ChatKey | None = None) -> ExportReport:
    report = ExportReport(out)
    for key, thread in await sessions.threads(chat):
        messages = await sessions.load(key, thread)
        folder = out / f"{safe_path_part(key.channel)}_{safe_path_part(key.chat_id)}"
        name = safe_path_part(thread)
        document = {"chat": str(key), "channel": key.channel, "chat_id": key.chat_id, "thread": name,
                    "messages": [json.loads(m.to_json()) for m in messages]}
        await asyncio.to_thread(_write, folder / f"{name}.md", to_markdown(key, thread, messages).encode("utf-8"))
        await asyncio.to_thread(_write, folder / f"{name}.json",
                                json.dumps(document, ensure_ascii=False, indent=1).encode("utf-8"))
        report.threads += 1
        report.messages += len(messages)
        for message in messages:
            for block in message.content:
                if not isinstance(block, (ImageBlock, AudioBlock, FileBlock)):
                    continue
                target = folder / "media" / media_name(block.ref)
                if await asyncio.to_thread(target.exists):
                    continue
                try:
                    data = await attachments.read_bytes(block.ref)
                except Exception:  # gone from the store: the Markdown link says which it was
                    report.missing_media += 1
                    continue
                await asyncio.to_thread(_write, target, data)
                report.media += 1
    return report
