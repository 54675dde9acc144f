"""`talon run` as a real process for the tests: start it, stop it, a port nothing listens on."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.support.ports import free_port
from tests.support.zygote import TalonProcess, start_talon_process


def start_talon(tmp_path: Path, env_extra: dict[str, str], log_name: str) -> tuple[TalonProcess, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env.update(env_extra)
    log_path = tmp_path / log_name
    return start_talon_process(["run"], cwd=tmp_path, env=env, out=log_path), log_path


def stop_talon(proc: TalonProcess) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return proc.returncode


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused): one of the run's own
    (tests/support/ports.py), which no other test is given, so no server of another worker can
    take it while the test counts on the refusal (a port-0 number could be)."""
    return free_port()
