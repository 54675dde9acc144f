"""Telegram test helpers: what the fake Bot API was sent, Alice's workspace."""

from __future__ import annotations

from pathlib import Path

from talon.config import Settings
from tests.conftest import ALICE
from tests.fakes.telegram import FakeTelegram


def texts_to(tg: FakeTelegram, chat_id: int) -> list[str]:
    return [c.params["text"] for c in tg.sent("sendMessage", chat_id=chat_id)]


def to_chat(chat_id: int):
    return lambda c: str(c.params.get("chat_id")) == str(chat_id)


def root(settings: Settings) -> Path:
    """Alice's own workspace: the only place her agent's files may be sent from."""
    workspace = settings.workspace_dir("telegram", str(ALICE))
    workspace.mkdir(parents=True, exist_ok=True)
    return workspace
