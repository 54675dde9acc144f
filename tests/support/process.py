"""`talon run` as a real process for the tests: start it, stop it, a port nothing listens on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

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
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
