"""Helpers for the multi-worker tests and the benchmark: `talon run` workers as real processes
against one PostgreSQL, the Bot API fake and the OpenAI fake, and a client that plays Telegram
(webhook mode) behind a load balancer."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.ports import free_port
from tests.support.zygote import TalonProcess, start_talon_process
from tests.conftest import TOKEN

SECRET = "multi_worker-secret"
WEBHOOK_URL = "https://talon.example.com/telegram/webhook"
WEBHOOK_PATH = "/telegram/webhook"


@dataclass
class Worker:
    name: str
    port: int
    proc: TalonProcess
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)

    def start(self, name: str, **extra: str) -> Worker:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
        env.update(self.env)
        env.update({"TALON_WORKER_ID": name, "TALON_HTTP_PORT": str(port), "TALON_HTTP_HOST": "127.0.0.1"})
        env.update(extra)
        log = self.root / f"{name}.log"
        proc = start_talon_process(["run"], cwd=self.root, env=env, out=log)
        worker = Worker(name, port, proc, log)
        self.workers.append(worker)
        return worker

    def kill(self, worker: Worker) -> None:
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(timeout=10)

    def stop_all(self) -> list[int]:
        codes = []
        for worker in self.workers:
            if worker.alive():
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                codes.append(worker.proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                codes.append(-9)
        return codes

    def logs(self) -> str:
        return "\n".join(f"--- {w.name} ---\n{w.log_text()[-4000:]}" for w in self.workers)


def base_env(root: Path, tg_base: str, llm_base: str, database_url: str, users: Iterable[int],
             **extra: str) -> dict[str, str]:
    env = {
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "TELEGRAM_API_BASE_URL": tg_base,
        "OPENAI_BASE_URL": llm_base,
        "OPENAI_API_KEY": "test-key",
        "TALON_MODEL": "openai:fake-model",
        "TALON_MEDIA_ROOT": str(root / "shared" / "media_root"),
        "TALON_DATA_DIR": str(root / "shared" / "data"),
        "TALON_TELEGRAM_ALLOWED_USERS": ",".join(str(u) for u in users),
        "TALON_TELEGRAM_POLL_TIMEOUT": "1",
        "TALON_MODEL_MAX_RETRIES": "0",
        "TALON_LOG_LEVEL": "INFO",
        "TALON_DATABASE_URL": database_url,
        "TALON_TRANSCRIBER": "off",
        # No worker here speaks: loading Piper at start (seconds of CPU in each worker at once)
        # would only starve the lease renewals the tests are about.
        "TALON_SPEECH_WARMUP": "false",
        "TALON_VOICE_REPLIES": "off",
    }
    env.update(extra)
    return env


def webhook_env() -> dict[str, str]:
    return {"TALON_TELEGRAM_WEBHOOK_URL": WEBHOOK_URL, "TALON_TELEGRAM_WEBHOOK_SECRET": SECRET}


async def wait_healthy(session: aiohttp.ClientSession, workers: list[Worker], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for worker in workers:
        while True:
            if not worker.alive():
                raise AssertionError(f"{worker.name} exited:\n{worker.log_text()}")
            try:
                async with session.get(worker.url + "/healthz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{worker.name} never became healthy:\n{worker.log_text()}")
            await asyncio.sleep(0.1)


class LoadBalancer:
    """Posts each update as Telegram would, to the workers in turn; a worker that refuses the
    connection or answers 5xx is skipped and the next one tried, as a load balancer does."""

    def __init__(self, session: aiohttp.ClientSession, workers: list[Worker]) -> None:
        self.session = session
        self.workers = workers
        self.turn = 0
        self.retries = 0
        self.posted = 0

    async def post(self, update: dict[str, Any], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            worker = self.workers[self.turn % len(self.workers)]
            self.turn += 1
            try:
                async with self.session.post(worker.url + WEBHOOK_PATH, json=update,
                                             headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
                                             timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    if resp.status == 200:
                        self.posted += 1
                        return worker.name
                    if resp.status < 500:
                        raise AssertionError(f"{worker.name} answered {resp.status}: {await resp.text()}")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            self.retries += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"no worker took update {update['update_id']}")
            await asyncio.sleep(0.05)
