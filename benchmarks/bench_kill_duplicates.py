"""SIGKILL at random moments: how many messages get answered twice?

Run: ``python benchmarks/bench_kill_duplicates.py [KILLS]`` (default 150). Each round starts
``talon run`` against loopback fakes of the Telegram Bot API and the model, sends one message,
and kills the process with SIGKILL at a random moment (uniform) between sending the message and a
little past its usual answer time, counted from the same moment. The next round first recovers
whatever the last one left pending. At the end every message must have been answered; the figure is how many were
answered more than once: the send-then-record window (between Telegram accepting a message and
the inbox recording it) is the only place a kill can double a reply.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import ALICE, TOKEN, settings_env  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402


def _start(work: Path, env_extra: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update(env_extra)
    return subprocess.Popen([sys.executable, "-m", "talon.cli", "run"], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(kills: int) -> None:
    rng = random.Random(10)
    with tempfile.TemporaryDirectory() as tmp, FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        work = Path(tmp)
        env = settings_env(work, tg.base_url, llm.base_url)
        texts = [f"message {n}" for n in range(kills)]
        answer_s = 0.0
        for n, text in enumerate(texts):
            proc = _start(work, env)
            pushed = time.monotonic()
            tg.push_update(tg.text_message(ALICE, text, user_id=ALICE))
            # Kill anywhere from arrival to a little past the usual answer time (learned from
            # the rounds where the answer came first).
            window = answer_s * 1.3 if answer_s else 3.0
            deadline = pushed + rng.uniform(0.0, window)
            seen = False
            while time.monotonic() < deadline:
                if not seen and any(c.params.get("text") == f"echo: {text}"
                                    for c in tg.sent("sendMessage", chat_id=ALICE)):
                    seen = True
                    took = time.monotonic() - pushed
                    answer_s = took if not answer_s else 0.8 * answer_s + 0.2 * took
                time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        proc = _start(work, env)  # the last round's message, if it was left pending
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = {c.params.get("text") for c in tg.sent("sendMessage", chat_id=ALICE)}
                if all(f"echo: {t}" in got for t in texts):
                    break
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        sent = [c.params.get("text") for c in tg.sent("sendMessage", chat_id=ALICE)]
        missing = [t for t in texts if f"echo: {t}" not in sent]
        doubled = [t for t in texts if sent.count(f"echo: {t}") > 1]
        # A message whose turn was cut off three times running gets an apology instead of a
        # fourth try (a poison-message guard): it is answered, just not with its echo.
        apologies = sum(1 for t in sent if t and t.startswith("Sorry, I could not process"))
        print(f"kills: {kills}; answered with the echo: {kills - len(missing)}; answered twice: "
              f"{len(doubled)}; apologies after three cut-off attempts: {apologies}; "
              f"unanswered: {max(0, len(missing) - apologies)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
