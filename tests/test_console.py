"""`talon chat`: the console channel runs the same agent core and sessions, and takes files."""

from __future__ import annotations

import io
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


class _Terminal(io.RawIOBase):
    """Raw input that, like a terminal in canonical mode, returns at most one line per read."""

    def __init__(self, data: bytes) -> None:
        self._lines = data.splitlines(keepends=True)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "memoryview | bytearray") -> int:  # type: ignore[override]
        if not self._lines:
            return 0
        line = self._lines.pop(0)
        buffer[: len(line)] = line
        return len(line)


async def _chat_in_process(tmp_path: Path, raw_input: bytes, errors: str) -> str:
    """Run the console channel in this process on ``raw_input``; its output once it finished."""
    import asyncio

    from channels.console import ConsoleChannel
    from talon.runtime import build_runtime
    from tests.conftest import make_settings

    async with FakeOpenAI() as llm:
        settings = make_settings(tmp_path, "http://127.0.0.1:9", llm.base_url)
        out = io.StringIO()
        stdin = io.TextIOWrapper(io.BufferedReader(_Terminal(raw_input)), encoding="utf-8", errors=errors)
        console = ConsoleChannel(stdin=stdin, stdout=out, media_root=settings.media_root)
        runtime = build_runtime(settings, [console])
        await runtime.start()
        try:
            await asyncio.wait_for(console.finished.wait(), 30)
        finally:
            await runtime.stop()
    return out.getvalue()


async def test_console_line_that_is_not_utf8_does_not_stop_the_chat(tmp_path: Path) -> None:
    # A terminal in a C.UTF-8 locale hands Python undecodable bytes as surrogate escapes; a UTF-8
    # one raises UnicodeDecodeError. Either way the chat goes on, and Ctrl-D still ends it.
    for errors in ("surrogateescape", "strict"):
        shown = await _chat_in_process(tmp_path / errors, b"caf\xe9 au lait\nhello after\n", errors)
        assert "echo: hello after" in shown, shown


def test_ctrl_c_at_the_prompt_ends_talon_chat(tmp_path: Path) -> None:
    import signal
    import time

    with FakeOpenAI() as llm:
        proc = subprocess.Popen([sys.executable, "-m", "talon.cli", "chat"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                                env=_env(tmp_path, llm))
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(b"hello\n")
            proc.stdin.flush()
            deadline = time.monotonic() + 60
            seen = b""
            while not seen.endswith(b"you> ") or b"echo: hello" not in seen:
                assert time.monotonic() < deadline, seen
                seen += proc.stdout.read1(4096)
            time.sleep(0.5)  # the console is blocked reading the next line
            proc.send_signal(signal.SIGINT)  # waiting at the prompt, stdin still open
            code = proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 130


def test_talon_chat_prints_the_answer_as_it_streams_and_only_once(tmp_path: Path) -> None:
    answer = "A slowly streamed answer, written word by word, as a local model would send it."
    with FakeOpenAI(chunk_delay=0.15) as llm:
        llm.queue(answer, FakeOpenAI.reply("Cut short here", finish_reason="length"))
        proc = subprocess.Popen([sys.executable, "-m", "talon.cli", "chat"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                                env=_env(tmp_path, llm), text=True, bufsize=1)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("tell me\n")
        proc.stdin.flush()
        seen = ""
        while "talon> " not in seen:  # the first piece appears while the rest is still coming
            char = proc.stdout.read(1)
            if not char:  # the process ended without answering: the asserts below say how
                break
            seen += char
        partial_at_first_sight = llm.requests[0].end is None
        proc.stdin.write("and then?\n")
        proc.stdin.close()
        out = seen + proc.stdout.read()
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert partial_at_first_sight  # the model was still writing when the answer began to show
    assert out.count(answer) == 1  # streamed, then not printed again by the final reply
    assert out.count("Cut short here") == 1 and "cut off at the reply limit" in out
