"""Backup and restore end to end: `talon backup` of a RUNNING Talon that holds a conversation, a
photo, a scheduled task and memory (AGENTS.md); `talon restore` into a new directory; a Talon
started there remembers the conversation (the fake model receives the earlier messages and the
photo), shows the task in /tasks, has its memory in the prompt and sends the photo again."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from talon.cli import main
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text
from tests.fakes.telegram import Call, FakeTelegram


def to_alice(part: str) -> Callable[[Call], bool]:
    return lambda c: str(c.params.get("chat_id")) == str(ALICE) and part in str(c.params.get("text", ""))


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 120, 200)).save(out, "JPEG")
    return out.getvalue()


async def test_a_backup_of_a_running_talon_restores_into_a_talon_that_remembers(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sent_again: list[str] = []

    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Done."
        text = last_user_text(request)
        if text.startswith("remind me"):
            return FakeOpenAI.tool_call("schedule_task", {"when": "every 6 hours", "task": "water the plants"})
        if text.startswith("send the photo again"):
            return f"Here it is.\n\n![photo]({sent_again[0]})"
        return f"noted: {text[:40]}"

    llm.default_responder = respond
    extra = dict(TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false", TALON_TASK_POLL_INTERVAL=0.2)
    one = make_settings(tmp_path / "one", tg.base_url, llm.base_url, **extra)
    workspace = one.workspace_dir("telegram", str(ALICE))
    photo = jpeg()
    async with running(one):
        tg.push_update(tg.text_message(ALICE, "The boiler pressure is 1.5 bar", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice("noted: The boiler"), timeout=20)
        tg.push_update(tg.photo_message(ALICE, data=photo, caption="my boiler", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice("noted:"), count=2, timeout=20)
        tg.push_update(tg.text_message(ALICE, "remind me every 6 hours to water the plants", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice("Done."), timeout=20)
        (workspace / "AGENTS.md").write_text("The owner's boiler is a Vaillant.\n")
        saved = [p for p in workspace.rglob("*.jpg")]
        assert saved, list(workspace.rglob("*"))
        sent_again.append(saved[0].relative_to(workspace).as_posix())
        # `talon backup` while this Talon runs, from its settings (as an operator would).
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("TALON_DATA_DIR", str(one.data_dir))
        monkeypatch.setenv("TALON_MEDIA_ROOT", str(one.media_root))
        archive = tmp_path / "talon.tar.zst"
        assert await asyncio.to_thread(main, ["backup", str(archive)]) == 0
    assert "ok: " in capsys.readouterr().out
    target = tmp_path / "two"
    assert await asyncio.to_thread(main, ["restore", str(archive), "--data-dir", str(target / "data")]) == 0
    printed = capsys.readouterr().out
    assert f"TALON_DATA_DIR={target / 'data'}" in printed and f"TALON_MEDIA_ROOT={target / 'media_root'}" in printed
    # Restoring again over what is now there is refused.
    assert await asyncio.to_thread(main, ["restore", str(archive), "--data-dir", str(target / "data")]) == 1
    assert "not empty" in capsys.readouterr().err

    two = make_settings(target, tg.base_url, llm.base_url, **extra)
    before = len(llm.requests)
    async with running(two):
        tg.push_update(tg.text_message(ALICE, "what was the pressure?", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice("noted: what was the pressure"), timeout=20)
        tg.push_update(tg.text_message(ALICE, "/tasks", user_id=ALICE))
        [listing] = await tg.wait_for("sendMessage", to_alice("water the plants"), timeout=20)
        tg.push_update(tg.text_message(ALICE, "send the photo again", user_id=ALICE))
        [again] = await tg.wait_for("sendPhoto", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=20)
    request = llm.requests[before].json
    everything = json.dumps(request["messages"])
    assert "The boiler pressure is 1.5 bar" in everything and "my boiler" in everything
    assert image_urls(request), "the earlier photo reaches the model again"
    assert "Vaillant" in json.dumps(request)  # the memory (AGENTS.md) is in the prompt
    assert "'water the plants' (every 6 h" in listing.params["text"], listing.params["text"]
    [media] = again.media
    assert media.file is not None and media.file.data == (workspace / sent_again[0]).read_bytes()
