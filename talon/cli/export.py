"""``talon export [--chat CHANNEL:ID] [--out DIR]`` (talon.storage.export does the work)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def cmd_export(args: argparse.Namespace) -> int:
    import asyncio

    from talon.cli import _load_settings, _setup_logging
    from talon.storage.export import ExportReport, export
    from talon.storage.factory import open_stores
    from talon.storage.sessions import ChatKey

    settings = _load_settings()
    _setup_logging("WARNING")
    chat = None
    if args.chat:
        channel, _, chat_id = args.chat.partition(":")
        if not channel.strip() or not chat_id.strip():
            print(f"talon: --chat takes CHANNEL:ID, e.g. telegram:123456789 (got {args.chat!r})", file=sys.stderr)
            return 2
        chat = ChatKey(channel.strip().lower(), chat_id.strip())
    out = Path(args.out or time.strftime("talon-export-%Y%m%d-%H%M%S"))
    if out.exists() and any(out.iterdir()):
        print(f"talon: {out} is not empty: name a new directory with --out", file=sys.stderr)
        return 1

    async def go() -> ExportReport:
        stores = open_stores(settings, check_dirs=False)
        await stores.start()
        try:
            return await export(stores.sessions, stores.attachments, out, chat)
        finally:
            await stores.aclose()

    report = asyncio.run(go())
    if not report.threads:
        print(f"nothing to export: no conversation {'of ' + str(chat) + ' ' if chat else ''}is stored")
        return 1 if chat else 0
    print(f"ok: {report.threads} conversation(s), {report.messages} messages, {report.media} media file(s) "
          f"in {out.resolve()} (Markdown to read, JSON complete)"
          + (f"; {report.missing_media} media file(s) no longer stored" if report.missing_media else ""))
    return 0


def add_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    export = sub.add_parser(
        "export", help="write conversations as Markdown and JSON, with their media",
        description="Export one conversation (--chat telegram:123) or all: per thread a Markdown file (who said "
                    "what and when, images and files linked) and a JSON file (complete, tool calls included), "
                    "with the media files beside them.")
    export.add_argument("--chat", metavar="CHANNEL:ID", help="only this chat, e.g. telegram:123456789")
    export.add_argument("--out", metavar="DIR", help="where to write (new or empty; default talon-export-DATE)")
    export.set_defaults(func=cmd_export)
