"""Memory at rest: Talon's idle RSS against the naive 30-line bot, in one run.

Run: ``python benchmarks/bench_rss.py`` (about a minute; ``--voice`` also sends voice notes and
measures after them, ``--runs N`` repeats each start). Each bot is a real process polling its own
loopback fake Bot API (tests/fakes/telegram.py) with the fake OpenAI-compatible server
(tests/fakes/openai_server.py) behind it, both served from this process:

- **naive**: benchmarks/naive_bot.py, python-telegram-bot + ``AsyncOpenAI``;
- **talon**: ``talon run`` with its defaults (Telegram long polling, the embedded stores, local
  Whisper and Piper as installed), given only what the fakes need;
- **talon, warm-up on**: the same with ``TALON_SPEECH_WARMUP=true`` (the models load at start, as
  they did by default before issue 28).

The figure is the RSS of the bot's whole process tree (the process and every descendant, psutil),
read once the bot is idle: it has polled the Bot API (it is in its polling loop) and used almost
no CPU for a second. With ``--voice``, a voice note
(tests/fixtures/speech_fox.ogg) is then sent to Talon and the tree's RSS is read again once the
answer is out and the process is quiet, with the time from the note to the answer; then a second
note, to show later notes cost what they did before. The CPU seconds the tree spent on each note
(to its text answer) are shown too: on a loaded machine the wall time swings, the CPU time less.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import TOKEN  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402
from tests.processes import tree_cpu, tree_rss, wait_quiet  # noqa: E402

USER = 4242
FIXTURE = ROOT / "tests" / "fixtures" / "speech_fox.ogg"


def env_for(kind: str, work: Path, tg: FakeTelegram, llm: FakeOpenAI, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env |= {"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_BASE_URL": tg.base_url, "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "test-key", "PYTHONPATH": str(ROOT)}
    if kind == "naive":
        return env | {"MODEL": "gpt-fake"}
    return env | {"TALON_MODEL": "openai:gpt-fake", "TALON_MEDIA_ROOT": str(work / "media_root"),
                  "TALON_DATA_DIR": str(work / "data"), "TALON_TELEGRAM_ALLOWED_USERS": str(USER)} | extra


def measure(kind: str, extra: dict[str, str], voice: bool) -> dict[str, float]:
    """One start of one bot: idle RSS in MB (and after voice notes with ``voice``)."""
    figures: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        tg = stack.enter_context(FakeTelegram(token=TOKEN))
        llm = stack.enter_context(FakeOpenAI())
        argv = [sys.executable, str(ROOT / "benchmarks" / "naive_bot.py")] if kind == "naive" \
            else [sys.executable, "-m", "talon.cli", "run"]
        log = stack.enter_context((work / "bot.log").open("wb"))
        popen = subprocess.Popen(argv, cwd=work, env=env_for(kind, work, tg, llm, extra), stdout=log,
                                 stderr=subprocess.STDOUT)

        def stop() -> None:
            popen.terminate()
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()

        stack.callback(stop)
        proc = psutil.Process(popen.pid)
        try:
            tg.wait_for_sync("getUpdates", timeout=180, include_failed=True)
            wait_quiet(proc)
            figures["idle"] = tree_rss(proc) / 1e6
            if voice and kind != "naive":
                for n in (1, 2):
                    started, cpu = time.monotonic(), tree_cpu(proc)
                    tg.push_update(tg.voice_message(USER, data=FIXTURE.read_bytes(), duration=4, user_id=USER))
                    tg.wait_for_sync("sendMessage", lambda c: "fox" in str(c.params.get("text", "")).lower(),
                                     count=n, timeout=180)
                    figures[f"answer {n} s"] = time.monotonic() - started
                    figures[f"cpu {n} s"] = tree_cpu(proc) - cpu
                    wait_quiet(proc)
                    figures[f"after voice {n}"] = tree_rss(proc) / 1e6
        except Exception:
            log.flush()
            sys.stderr.write((work / "bot.log").read_text(errors="replace")[-3000:])
            raise
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voice", action="store_true", help="also measure after a first and a second voice note")
    parser.add_argument("--runs", type=int, default=1, help="starts per bot (the lowest idle figure is shown)")
    args = parser.parse_args()
    print(f"RSS of each bot's process tree once idle (psutil); {psutil.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}\n", flush=True)
    bots = [("naive", "naive", {}), ("talon (defaults)", "talon", {}),
            ("talon, warm-up on", "talon", {"TALON_SPEECH_WARMUP": "true"})]
    naive = 0.0
    for label, kind, extra in bots:
        runs = [measure(kind, extra, args.voice and not extra) for _ in range(args.runs)]
        best = min(runs, key=lambda f: f["idle"])
        naive = naive or best["idle"]
        rest = "".join(f", {k} {v:.1f}" + ("" if k.endswith(" s") else " MB") for k, v in best.items() if k != "idle")
        print(f"  {label:20} idle {best['idle']:6.1f} MB  ({best['idle'] / naive:.2f}x naive){rest}", flush=True)


if __name__ == "__main__":
    main()
