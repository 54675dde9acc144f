"""`talon chat`: the console channel runs the same agent core and sessions, and takes files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text


def _env(tmp_path: Path, llm: FakeOpenAI) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update({
        "TALON_MODEL": "openai:fake-model",
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "test",
        "TALON_MEDIA_ROOT": str(tmp_path / "media_root"),
        "TALON_DATA_DIR": str(tmp_path / "data"),
        "TALON_MODEL_MAX_RETRIES": "0",
    })
    return env


def test_talon_chat_round_trip_with_attachment(tmp_path: Path) -> None:
    photo = tmp_path / "cat.png"
    Image.new("RGB", (64, 48), (10, 200, 10)).save(photo)
    script = f"hello console\n/attach {photo} what is this?\n/attach {tmp_path}/missing.png\n"
    with FakeOpenAI() as llm:
        result = subprocess.run([sys.executable, "-m", "talon.cli", "chat"], input=script, text=True,
                                capture_output=True, cwd=tmp_path, env=_env(tmp_path, llm), timeout=120)
        requests = list(llm.requests)
    assert result.returncode == 0, result.stderr
    assert "echo: hello console" in result.stdout
    assert "no such file" in result.stdout  # a bad /attach is reported, not sent
    assert len(requests) == 2
    assert last_user_text(requests[1]).startswith("what is this?")
    assert len(image_urls(requests[1])) == 1
    # same session store as the chat channels: the console conversation is on disk
    sessions = list((tmp_path / "data" / "sessions" / "console").rglob("*.jsonl"))
    assert sessions and "hello console" in sessions[0].read_text()
