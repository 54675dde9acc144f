"""`talon chat` on a real terminal (a pty): /stop and Ctrl-C during a streamed answer, a reply
resumed after the console quit mid-answer, and what the model got of an attachment."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from tests.fakes.openai_server import FakeOpenAI
from tests.terminal import ChatTerminal, chat_env

pytestmark = pytest.mark.e2e

# Streamed 12 characters every 0.2 s: about a minute of answer, so it is surely still running.
LONG_ANSWER = " ".join(f"word{i}" for i in range(600))


@pytest.fixture
def slow_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(chunk_delay=0.2) as llm:
        yield llm


def _fake_env(tmp_path: Path, llm: FakeOpenAI, **extra: str) -> dict[str, str]:
    return chat_env(tmp_path, TALON_MODEL="openai:fake-model", OPENAI_BASE_URL=llm.base_url,
                    OPENAI_API_KEY="test", **extra)


def _start(tmp_path: Path, llm: FakeOpenAI) -> ChatTerminal:
    term = ChatTerminal(tmp_path, _fake_env(tmp_path, llm))
    term.wait_for("you> ", 60)
    return term


def test_stop_during_a_streamed_answer_stops_it_and_is_not_echoed_into_it(tmp_path: Path, slow_llm) -> None:
    slow_llm.queue(LONG_ANSWER)
    term = _start(tmp_path, slow_llm)
    try:
        assert term.echo_on()  # at the prompt, typing shows as usual
        term.type("tell me everything")
        start = term.wait_for("talon> word0", 30)
        term.wait_for("word3 ", 30, after=start)
        assert not term.echo_on()  # during the answer the terminal does not echo
        term.type("/stop")
        typed_at = time.monotonic()
        term.wait_for("talon> Stopped.", 3, after=start)  # stops within a second or two
        assert time.monotonic() - typed_at < 3
        term.wait_for("you> ", 10, after=term.output.index("Stopped."))
        assert term.echo_on()  # back at the prompt, echo is back
        [request] = slow_llm.requests
        deadline = time.monotonic() + 10  # the fake notices at its next write
        while request.status is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert request.status == 0  # the stream was cut off, not read to its end
        out = term.output[start:]
        streamed = out.split("\n", 1)[0]
        assert "/stop" not in streamed  # the typed line is not inside the streamed text
        assert "you> /stop\n" in out  # it is shown on a line of its own
        assert "word599" not in out
        term.type("what now?")
        typed = term.wait_for("you> what now?", 10, after=start) + len("you> what now?")
        # The fake echoes the last user message: Talon's note on the stop comes first in it.
        term.wait_for("what now?", 30, after=typed)
        assert "Nothing to stop" not in term.output
        term.ctrl_d()
        assert term.wait(30) == 0
    finally:
        term.close()
    # The model is told the answer was stopped, with what was said so far: as a note from Talon,
    # never as the assistant's own words (issue 27).
    messages = slow_llm.requests[-1].json["messages"]
    assert "stopped by the person before the answer was finished" in str(messages)
    assert not any("stopped by the person" in str(m) for m in messages if m["role"] == "assistant")


def test_first_ctrl_c_stops_the_answer_and_a_second_quits(tmp_path: Path, slow_llm) -> None:
    slow_llm.queue(LONG_ANSWER)
    term = _start(tmp_path, slow_llm)
    try:
        term.type("tell me everything")
        start = term.wait_for("talon> word0", 30)
        term.ctrl_c()
        term.wait_for("(stopping the answer; Ctrl-C again quits)", 3, after=start)
        term.wait_for("talon> Stopped.", 3, after=start)
        prompt = term.wait_for("you> ", 10, after=term.output.index("Stopped."))
        assert term.proc.poll() is None  # still running: the first Ctrl-C only stopped the answer
        term.ctrl_c()
        assert term.wait(15) == 130
    finally:
        term.close()
    assert "Traceback" not in term.output[prompt:]


def test_two_ctrl_c_in_a_row_during_an_answer_quit(tmp_path: Path, slow_llm) -> None:
    slow_llm.queue(LONG_ANSWER)
    term = _start(tmp_path, slow_llm)
    try:
        term.type("tell me everything")
        start = term.wait_for("talon> word0", 30)
        term.ctrl_c()
        # Two signals sent at once would merge into one: the second goes once the first was seen.
        term.wait_for("(stopping the answer", 3, after=start)
        term.ctrl_c()
        assert term.wait(15) == 130
    finally:
        term.close()
    assert "Traceback" not in term.output


def test_a_reply_resumed_after_the_console_quit_says_what_it_answers(tmp_path: Path) -> None:
    with FakeOpenAI() as llm:
        llm.hang = True  # the first run quits while the model is still thinking
        term = _start(tmp_path, llm)
        try:
            term.type("what is the capital of Peru?")
            llm.wait_for_requests_sync(1, timeout=30)
            term.proc.terminate()  # SIGTERM: the console quits; the message stays pending
            assert term.wait(20) == 143
        finally:
            term.close()
        assert "echo:" not in term.output
        llm.release()
        term = _start(tmp_path, llm)
        try:
            note = term.wait_for('(answering your earlier message', 30)
            answer = term.wait_for("echo: what is the capital of Peru?", 30)
            assert note < answer
            assert '"what is the capital of Peru?"' in term.output[note:answer]
            term.type("and of Chile?")
            after = term.wait_for("echo: and of Chile?", 30)
            # A message typed in this run is not announced as an earlier one.
            assert term.output.count("(answering your earlier message") == 1
            term.ctrl_d()
            assert term.wait(30) == 0, term.output[after:]
        finally:
            term.close()


def test_the_console_says_when_the_model_did_not_see_a_photo(tmp_path: Path) -> None:
    photo = tmp_path / "cat.png"
    Image.new("RGB", (64, 48), (10, 200, 10)).save(photo)
    with FakeOpenAI() as llm:
        result = subprocess.run([sys.executable, "-m", "talon.cli", "chat"], input=f"/attach {photo} what is it?\n",
                                text=True, capture_output=True, cwd=tmp_path, timeout=120,
                                env=_fake_env(tmp_path, llm, TALON_MODEL_VISION="false"))
        requests = list(llm.requests)
    assert result.returncode == 0, result.stderr
    assert ("! Photo cat.png: not seen by the model, it was not shown because the model takes no images; "
            "it was told the file is saved at inbox/cat.png") in result.stdout
    assert not any(part.get("type") == "image_url" for part in requests[0].json["messages"][-1]["content"]
                   if isinstance(part, dict))


def test_the_console_shows_a_photo_the_model_saw_without_a_notice(tmp_path: Path) -> None:
    photo = tmp_path / "cat.png"
    Image.new("RGB", (64, 48), (10, 200, 10)).save(photo)
    with FakeOpenAI() as llm:
        result = subprocess.run([sys.executable, "-m", "talon.cli", "chat"], input=f"/attach {photo} what is it?\n",
                                text=True, capture_output=True, cwd=tmp_path, timeout=120,
                                env=_fake_env(tmp_path, llm))
    assert result.returncode == 0, result.stderr
    assert "not seen by the model" not in result.stdout and "echo: what is it?" in result.stdout


def test_the_console_shows_the_transcript_of_a_voice_note(tmp_path: Path) -> None:
    voice = Path(__file__).parent / "fixtures" / "speech_fox.ogg"
    with FakeOpenAI() as llm:
        result = subprocess.run([sys.executable, "-m", "talon.cli", "chat"], input=f"/attach {voice}\n",
                                text=True, capture_output=True, cwd=tmp_path, timeout=300,
                                env=_fake_env(tmp_path, llm, TALON_VOICE_REPLIES="off"))
    assert result.returncode == 0, result.stderr
    [line] = [ln for ln in result.stdout.splitlines() if "transcribed for the model" in ln]
    assert line.startswith("~ Voice note (0:0") and "fox" in line.lower(), line


def test_the_banner_lists_the_chat_commands(tmp_path: Path) -> None:
    with FakeOpenAI() as llm:
        result = subprocess.run([sys.executable, "-m", "talon.cli", "chat"], input="", text=True,
                                capture_output=True, cwd=tmp_path, timeout=120, env=_fake_env(tmp_path, llm))
    assert result.returncode == 0, result.stderr
    banner = result.stdout.split("you> ", 1)[0]
    for command in ("/attach", "/stop", "/new", "/status", "/help", "Ctrl-C", "Ctrl-D"):
        assert command in banner
