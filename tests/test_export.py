"""``talon export``: Markdown that names every message with who and when and links its media,
JSON that is complete (tool calls included), media files beside them; from the embedded stores
and from PostgreSQL alike; one chat or all."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from talon.cli import main
from talon.content import AudioBlock, ImageBlock, Message, TextBlock, ToolCall
from talon.storage.factory import open_stores
from talon.storage.sessions import ChatKey

A = ChatKey("telegram", "111")
B = ChatKey("telegram", "-100:7")
PNG = bytes.fromhex("89504e470d0a1a0a") + b"image" * 20


@pytest.mark.parametrize("backend", ["embedded", "postgres"])
async def test_export_names_every_message_and_keeps_everything(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    env = {"TALON_DATA_DIR": str(tmp_path / "data"), "TALON_MEDIA_ROOT": str(tmp_path / "media_root")}
    if backend == "postgres":
        env["TALON_DATABASE_URL"] = request.getfixturevalue("pg_url")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    from talon.cli import _load_settings

    stores = open_stores(_load_settings(), check_dirs=False)
    await stores.start()
    try:
        image = await stores.attachments.put_bytes(PNG, mime="image/png", name="boiler.png")
        voice = await stores.attachments.put_bytes(b"OggS voice", mime="audio/ogg", name="voice.ogg")
        call = ToolCall(id="c1", name="schedule_task", arguments='{"when": "PT1H", "task": "check"}')
        messages = [
            Message(role="user", content=[ImageBlock(ref=image), TextBlock(text="Look at my boiler")],
                    meta={"sender": "111"}),
            Message(role="assistant", content=[], tool_calls=[call]),
            Message(role="tool", content=[TextBlock(text="Scheduled task x")], tool_call_id="c1",
                    tool_name="schedule_task"),
            Message.assistant("I will check in an hour."),
            Message(role="user", content=[AudioBlock(ref=voice, transcript="thanks a lot")]),
        ]
        await stores.sessions.append(A, *messages)
        await stores.sessions.append(B, Message.user("in a topic"))
    finally:
        await stores.aclose()
    out = tmp_path / "out"
    assert await asyncio.to_thread(main, ["export", "--out", str(out)]) == 0
    assert "2 conversation(s), 6 messages, 2 media file(s)" in capsys.readouterr().out
    md = (out / "telegram_111" / "main.md").read_text()
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert md.count(f" · {day} ") == 5  # every message, with its time
    for text in ("**user 111**", "Look at my boiler", "![boiler.png](media/", "called `schedule_task`",
                 "tool result (schedule_task)", "Scheduled task x", "**Talon (assistant)**",
                 "I will check in an hour.", "transcript: thanks a lot"):
        assert text in md, text
    data = json.loads((out / "telegram_111" / "main.json").read_text())
    assert data["chat"] == "telegram:111" and len(data["messages"]) == 5
    assert data["messages"][1]["tool_calls"][0]["name"] == "schedule_task"
    assert all(m["at"] > 0 for m in data["messages"])
    media = sorted(p.name for p in (out / "telegram_111" / "media").iterdir())
    assert media == sorted([f"{image.id[:12]}-boiler.png", f"{voice.id[:12]}-voice.ogg"])
    assert (out / "telegram_111" / "media" / f"{image.id[:12]}-boiler.png").read_bytes() == PNG
    assert "in a topic" in (out / "telegram_-100_7" / "main.md").read_text()
    # One chat only; and a chat with nothing stored says so.
    assert await asyncio.to_thread(main, ["export", "--chat", "telegram:-100:7", "--out", str(tmp_path / "one")]) == 0
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["telegram_-100_7"]
    assert await asyncio.to_thread(main, ["export", "--chat", "telegram:999", "--out", str(tmp_path / "none")]) == 1
    assert "nothing to export" in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["export", "--out", str(out)]) == 1  # never into a directory that holds something
    assert await asyncio.to_thread(main, ["export", "--chat", "nocolon"]) == 2


def test_markdown_of_an_old_line_without_a_time_says_so() -> None:
    from talon.storage.export import to_markdown

    old: Any = Message.from_json('{"role": "user", "content": [{"type": "text", "text": "from 2025"}]}')
    assert "**user** · time not recorded" in to_markdown(A, "main", [old])
