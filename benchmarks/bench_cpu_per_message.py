"""CPU per answered message: Talon against a naive 30-line bot, side by side in one run.

Run: ``python benchmarks/bench_cpu_per_message.py`` (a few minutes on a loaded 2-core machine;
``--part cpu`` or ``--part history`` runs one half). Every bot is a real process polling the same
kind of loopback fake Bot API (tests/fakes/telegram.py), answered by the fake OpenAI-compatible
server (tests/fakes/openai_server.py) after a fixed 200 ms, both served from this process. The
figure is the bot process's own CPU time (user + system, psutil, children included) between the
first message and the moment it has gone quiet after the last answer, divided by the messages
answered. Startup is not counted.

The bots:

- **naive**: benchmarks/naive_bot.py, python-telegram-bot + ``AsyncOpenAI``, one history list per
  chat, no streaming, no storage. Its cost swings from run to run, so it runs twice and the
  ratios are taken against its cheaper run.
- **talon default**: ``talon run`` with its defaults (live replies as drafts, the acknowledgement
  reaction, the SQLite inbox and JSONL sessions); only the speech warm-up is off, a startup cost.
- **talon lean**: the same with ``TALON_TELEGRAM_STREAMING=off`` and
  ``TALON_TELEGRAM_ACK_REACTION=`` (no reaction).

Part ``cpu``: 50 chats x 10 messages; each chat sends its next message once the last is answered.
Part ``history``: 5 chats, 11 rounds of 10 messages per chat; CPU per message per round. The first
round runs at 0-18 messages of history (about 10), the last at 200-218: the ratio last/first is
how the cost of a turn grows with the conversation. The request bodies grow about 15-fold between
them; the naive bot's own ratio shows what that growth costs a bot that does nothing else.

``--profile DIR`` records each Talon run's measured phase with py-spy (``pip install py-spy``) as
speedscope files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import TOKEN  # noqa: E402
from tests.fakes import UploadedFile  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402

MODEL_DELAY_S = 0.2
FIRST_USER = 5001
ROUND_TIMEOUT_S = 300.0
QUESTION = "what makes the tide come in twice a day, and why is it later every day?"


class People(FakeTelegram):
    """The fake Bot API, playing the people too: a chat's next message goes out once its last is
    answered (sent from the fake's own loop, so the bot never waits on this process's polling)."""

    def __init__(self) -> None:
        super().__init__(token=TOKEN)
        self._round = threading.Event()
        self._expected: dict[int, str] = {}
        self._left: dict[int, int] = {}
        self._count: dict[int, int] = {}
        self._tag = ""

    def start_round(self, chats: list[int], per_chat: int, tag: str) -> None:
        with self._cond:
            self._round.clear()
            self._tag = tag
            self._left = {chat: per_chat for chat in chats}
            for chat in chats:
                self._send(chat)

    def wait_round(self, timeout: float) -> None:
        if not self._round.wait(timeout):
            with self._cond:
                raise TimeoutError(f"round {self._tag!r} unanswered after {timeout:.0f} s: waiting for "
                                   f"{len(self._expected)} chats, e.g. {list(self._expected.values())[:3]}")

    def _send(self, chat: int) -> None:
        self._count[chat] = self._count.get(chat, 0) + 1
        text = f"{self._tag} message {self._count[chat]}: {QUESTION}"
        self._expected[chat] = f"echo: {text}"
        self.push_update(self.text_message(chat, text, user_id=chat))

    async def _api_sendMessage(self, params: dict[str, Any], files: dict[str, UploadedFile]) -> Any:
        result = await super()._api_sendMessage(params, files)
        chat = int(params.get("chat_id") or 0)
        with self._cond:
            if chat in self._expected and params.get("text") == self._expected[chat]:
                del self._expected[chat]
                self._left[chat] -= 1
                if self._left[chat]:
                    self._send(chat)
                elif not self._expected:
                    self._round.set()
        return result


def py_spy() -> str:
    """py-spy from PATH or next to this Python (a virtualenv's bin/, not always on PATH)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    return found


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def settle(proc: psutil.Process, *, quiet_s: float = 0.3, limit_s: float = 20.0) -> None:
    """Wait until the process has used (almost) no CPU for ``quiet_s``: its work is done."""
    deadline = time.monotonic() + limit_s
    last = cpu_seconds(proc)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu_seconds(proc)
        if now - last < 0.005:
            return
        last = now


@dataclass
class Bot:
    label: str
    kind: str  # "naive" or "talon"
    env: dict[str, str] = field(default_factory=dict)


BOTS = {
    "naive": Bot("naive", "naive"),
    "talon-default": Bot("talon default", "talon"),
    "talon-lean": Bot("talon lean", "talon", {"TALON_TELEGRAM_STREAMING": "off", "TALON_TELEGRAM_ACK_REACTION": ""}),
}


def bot_env(bot: Bot, work: Path, tg: FakeTelegram, llm: FakeOpenAI, users: list[int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env |= {"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_BASE_URL": tg.base_url, "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "test-key", "PYTHONPATH": str(ROOT)}
    if bot.kind == "naive":
        return env | {"MODEL": "gpt-fake"}
    return env | {"TALON_MODEL": "openai:gpt-fake", "TALON_MEDIA_ROOT": str(work / "media_root"),
                  "TALON_DATA_DIR": str(work / "data"), "TALON_SPEECH_WARMUP": "false",
                  "TALON_TELEGRAM_ALLOWED_USERS": ",".join(map(str, users))} | bot.env


@dataclass
class Measured:
    label: str
    rounds: list[tuple[float, int]]  # (CPU seconds, messages answered) per round
    request_bytes: list[float]  # mean chat-completion request body size per round
    api_calls: dict[str, int] = field(default_factory=dict)  # Bot API calls while measured, by method

    def per_message_ms(self, index: int | None = None) -> float:
        rounds = self.rounds if index is None else [self.rounds[index]]
        return 1000 * sum(c for c, _ in rounds) / sum(n for _, n in rounds)


class Running:
    """One bot process with its own fakes and directory, measured round by round."""

    def __init__(self, bot: Bot, chats: int, stack: contextlib.ExitStack) -> None:
        self.bot = bot
        self.users = list(range(FIRST_USER, FIRST_USER + chats))
        self.work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        self.tg = stack.enter_context(People())
        self.llm = stack.enter_context(FakeOpenAI(delay=MODEL_DELAY_S))
        argv = [sys.executable, str(ROOT / "benchmarks" / "naive_bot.py")] if bot.kind == "naive" \
            else [sys.executable, "-m", "talon.cli", "run"]
        self.log = stack.enter_context((self.work / "bot.log").open("wb"))
        self.popen = subprocess.Popen(argv, cwd=self.work, env=bot_env(bot, self.work, self.tg, self.llm, self.users),
                                      stdout=self.log, stderr=subprocess.STDOUT)
        stack.callback(self.stop)
        self.proc = psutil.Process(self.popen.pid)
        self.spy: subprocess.Popen[bytes] | None = None
        self.measured = Measured(bot.label, [], [])
        self._before = 0.0
        self._seen = 0
        self._startup_calls = 0

    def profile(self, directory: Path, name: str) -> None:
        out = directory / f"{self.bot.label.replace(' ', '-')}-{name}.speedscope.json"
        self.spy = subprocess.Popen([py_spy(), "record", "--pid", str(self.popen.pid), "--format", "speedscope",
                                     "--output", str(out), "--rate", "100", "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start_round(self, index: int, per_chat: int) -> None:
        if index == 0:
            self._startup_calls = len(self.tg.sent(include_failed=True))
        self._seen = len(self.llm.requests)
        self._before = cpu_seconds(self.proc)
        self.tg.start_round(self.users, per_chat, f"round {index + 1}")

    def end_round(self, per_chat: int) -> None:
        self.tg.wait_round(ROUND_TIMEOUT_S)
        settle(self.proc)
        self.measured.rounds.append((cpu_seconds(self.proc) - self._before, len(self.users) * per_chat))
        bodies = [len(json.dumps(r.json)) for r in self.llm.requests[self._seen:]]
        self.measured.request_bytes.append(sum(bodies) / max(1, len(bodies)))
        calls = self.tg.sent(include_failed=True)[self._startup_calls:]
        self.measured.api_calls = dict(Counter(c.method for c in calls if c.method != "getUpdates"))

    def failed(self) -> None:
        self.log.flush()
        sys.stderr.write(f"--- {self.bot.label}: the end of its log\n")
        sys.stderr.write((self.work / "bot.log").read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            try:
                self.spy.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.spy.kill()
                self.spy.wait()
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def side_by_side(bots: list[Bot], chats: int, rounds: int, per_chat: int, profile: Path | None) -> list[Measured]:
    """Run the bots at the same time, so that each round finds them all under the same load: on a
    shared machine the CPU time of the same work drifts with what else runs."""
    with contextlib.ExitStack() as stack:
        running = [Running(bot, chats, stack) for bot in bots]
        try:
            for r in running:
                r.tg.wait_for_sync("getUpdates", timeout=180)
            for r in running:
                settle(r.proc)
            if profile is not None:
                for r in running:
                    if r.bot.kind == "talon":
                        r.profile(profile, f"{chats}x{rounds * per_chat}")
                time.sleep(1.0)  # py-spy attaching
            for index in range(rounds):
                for r in running:
                    r.start_round(index, per_chat)
                for r in running:
                    r.end_round(per_chat)
        except Exception:
            for r in running:
                r.failed()
            raise
        return [r.measured for r in running]


def part_cpu(profile: Path | None, bots: list[str]) -> None:
    chats, per_chat = 50, 10
    print(f"== CPU per answered message: {chats} chats x {per_chat} messages, model answers after "
          f"{MODEL_DELAY_S * 1000:.0f} ms; all bots at once ==", flush=True)
    # Two naive bots: its cost swings, and the cheaper of the two is the yardstick.
    results = side_by_side([BOTS["naive"], *(BOTS[b] for b in bots if b != "naive"), BOTS["naive"]],
                           chats, 1, per_chat, profile)
    for m in results:
        answered = sum(n for _, n in m.rounds)
        calls = ", ".join(f"{method} {n / answered:.2f}" for method, n in sorted(m.api_calls.items()))
        print(f"  {m.label:14} {m.per_message_ms():6.2f} ms per message; Bot API calls per message: {calls}",
              flush=True)
    naive = min((m for m in results if m.label == "naive"), key=lambda m: m.per_message_ms())
    for m in results:
        if m.label != "naive":
            print(f"  {m.label} / naive (cheaper run): {m.per_message_ms() / naive.per_message_ms():.2f}x")


def part_history(profile: Path | None, bots: list[str]) -> None:
    chats, rounds, per_chat = 5, 11, 10
    print(f"\n== CPU per message as the conversation grows: {chats} chats, {rounds} rounds of {per_chat} "
          f"messages per chat; all bots at once ==", flush=True)
    for m in side_by_side([BOTS[name] for name in bots], chats, rounds, per_chat, profile):
        row = "  ".join(f"{m.per_message_ms(i):5.1f}" for i in range(rounds))
        print(f"  {m.label:14} ms per message by round: {row}", flush=True)
        print(f"  {'':14} request bytes, first round {m.request_bytes[0]:,.0f}, last {m.request_bytes[-1]:,.0f}; "
              f"last round / first round: {m.per_message_ms(-1) / m.per_message_ms(0):.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("cpu", "history", "all"), default="all")
    parser.add_argument("--bots", default=",".join(BOTS), help=f"comma-separated, of {', '.join(BOTS)}")
    parser.add_argument("--profile", type=Path, help="write py-spy speedscope profiles of Talon here")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"psutil CPU time of each bot process (user + system); {psutil.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}\n", flush=True)
    bots = [b.strip() for b in args.bots.split(",") if b.strip()]
    if unknown := set(bots) - set(BOTS):
        parser.error(f"unknown bots: {', '.join(sorted(unknown))}")
    if args.part in ("cpu", "all"):
        part_cpu(args.profile, bots)
    if args.part in ("history", "all"):
        part_history(args.profile, bots)


if __name__ == "__main__":
    main()
