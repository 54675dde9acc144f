"""The helper that forks `talon` processes for the tests (tests/support/zygote.py): each child is a
process of its own with the working directory, environment, log and exit status a real start
would have, and a signal ends it as it would end a real one."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.process import closed_port
from tests.support.waiting import until_sync
from tests.support.zygote import Forked, start_talon_process

pytestmark = pytest.mark.e2e


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_"))}
    env.update({"XDG_CONFIG_HOME": str(tmp_path / "config"), "TALON_TESTS_NO_FORK": "0"}, **extra)
    return env


def test_a_forked_child_has_its_own_directory_environment_log_and_exit_code(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TALON_MODEL=anthropic:from-the-file\nTALON_PAIRING=false\n")
    env = env_for(tmp_path, TALON_DATA_DIR=str(tmp_path / "data"), TALON_MODEL="openai:from-the-env")
    proc = start_talon_process(["doctor"], cwd=tmp_path, env=env, out=tmp_path / "doctor.log")
    code = proc.wait(timeout=60)
    log = (tmp_path / "doctor.log").read_text()
    if os.environ.get("TALON_TESTS_NO_FORK") != "1":
        assert isinstance(proc, Forked) and proc.pid != os.getpid()
    # The .env in its working directory was read; the environment given wins over it.
    assert f"{tmp_path / '.env'} (the current directory)" in log and "(TALON_PAIRING=false)" in log, log
    assert "the openai provider needs OPENAI_API_KEY" in log and "anthropic" not in log, log
    assert code == 1, log  # no token: doctor fails, with its own exit code
    assert proc.poll() == 1


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_ends_a_forked_run_as_it_ends_a_real_one(tmp_path: Path, sig: int) -> None:
    env = env_for(tmp_path, TELEGRAM_BOT_TOKEN="123:abc", TELEGRAM_API_BASE_URL=f"http://127.0.0.1:{closed_port()}",
                  TALON_MODEL="openai:x", OPENAI_BASE_URL=f"http://127.0.0.1:{closed_port()}", OPENAI_API_KEY="k",
                  TALON_DATA_DIR=str(tmp_path / "data"), TALON_MEDIA_ROOT=str(tmp_path / "media"),
                  TALON_TRANSCRIBER="off", TALON_SPEECH_WARMUP="false")
    log = tmp_path / "run.log"
    proc = start_talon_process(["run"], cwd=tmp_path, env=env, out=log)
    try:
        until_sync(lambda: "getMe failed at the Bot API" in log.read_text(), 60, "a failed getMe")
        assert proc.poll() is None
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == (-9 if sig == signal.SIGKILL else 0), log.read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)  # reaped, not left a zombie
