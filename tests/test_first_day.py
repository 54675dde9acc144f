"""A newcomer's first day (issue 30, part 5): a log line when Telegram polling works again after
an outage; doctor says how to get /metrics and /healthz in polling mode; `--help` of run and doctor
describes them; "see .env.example" only where that file exists; every command in the README."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from talon.cli import main
from talon.control.doctor import control_rows
from tests.conftest import make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

ROOT = Path(__file__).resolve().parent.parent


async def test_polling_that_works_again_after_an_outage_says_so_in_the_log(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="channels.telegram.polling")
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    async with running(settings) as runtime:
        [channel] = runtime.channels
        failing = True
        tg.fail_when("getUpdates", lambda params: failing, 500, times=None)
        deadline = time.monotonic() + 30
        while channel.health().ok:
            assert time.monotonic() < deadline, channel.health()
            await asyncio.sleep(0.05)
        assert not any("works again" in r.getMessage() for r in caplog.records)
        failing = False
        while not any("works again" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline + 30, [r.getMessage() for r in caplog.records]
            await asyncio.sleep(0.05)
    [line] = [r.getMessage() for r in caplog.records if "works again" in r.getMessage()]
    assert line.startswith("telegram: getUpdates works again after ") and "failed attempt(s) over" in line


def test_doctor_says_how_to_serve_metrics_in_polling_mode(tmp_path: Path) -> None:
    polling = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")
    row = dict(control_rows(polling))["metrics"]
    assert row.startswith("not served") and "TALON_HTTP_PORT=8080" in row and "/healthz" in row
    served = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", TALON_HTTP_PORT=9123)
    assert dict(control_rows(served))["metrics"] == "GET /metrics and /healthz on http://127.0.0.1:9123"


@pytest.mark.parametrize("command", ["run", "doctor", "setup", "backup", "restore", "export", "migrate"])
def test_help_describes_the_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    body = text.split("\n\n", 1)[1] if "\n\n" in text else ""
    assert len(body.split("options:")[0].split()) >= 12, text  # a description, not just the usage line


def test_missing_settings_point_at_env_example_only_where_it_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key in list(os.environ):
        if key.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "ANTHROPIC_", "TWILIO_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TALON_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert "missing settings: TALON_MODEL" in err and ".env.example" not in err and "talon setup" in err
    (tmp_path / ".env.example").write_text("# the settings\n")
    assert main(["run"]) == 2
    assert "(see .env.example)" in capsys.readouterr().err


def test_the_readme_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = readme.split("## Commands", 1)[1].split("##", 1)[0]
    parser_commands: list[str] = []

    import talon.cli as cli

    original = argparse.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                parser_commands.extend(action.choices)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign, assignment]
    try:
        with pytest.raises(SystemExit):
            cli.main([])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    assert {"run", "usage", "setup", "backup", "restore", "export"} <= set(parser_commands)
    for name in parser_commands:
        assert f"talon {name}" in commands, f"`talon {name}` is not in the README's commands"
