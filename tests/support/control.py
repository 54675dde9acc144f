"""Control test helpers: settings with the shell tool and no streaming, approval buttons, tool results."""

from __future__ import annotations

from pathlib import Path

from talon.config import Settings
from tests.conftest import make_settings
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import Call, FakeTelegram


GROUP = -1001234567890


def control_settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, **extra: object) -> Settings:
    values: dict[str, object] = dict(TALON_SHELL_TOOL="true", TALON_SHELL_UNSANDBOXED="true",
                                     TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false",
                                     TALON_TELEGRAM_ACK_REACTION="")
    values.update(extra)
    return make_settings(tmp_path, tg.base_url, llm.base_url, **values)


def has_keyboard(call: Call) -> bool:
    return bool(call.params.get("reply_markup"))


def buttons(call: Call) -> dict[str, str]:
    """Button label -> callback data of an approval prompt."""
    return {b["text"]: b["callback_data"] for row in call.params["reply_markup"]["inline_keyboard"] for b in row}


def tool_results(req: Req) -> list[str]:
    return [str(m.get("content")) for m in req.json["messages"] if m.get("role") == "tool"]
