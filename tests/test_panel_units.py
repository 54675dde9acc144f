"""The panel's plain parts: the chat index's batching, transcript lines shown as voice notes, the
day chart, Host names, settings shown without secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from talon.config import Settings
from talon.content import Message, TextBlock
from talon.envelope import InboundMessage
from talon.storage.panel import ChatNote
from talon.ui import security as sec
from talon.ui import views
from talon.ui.index import ChatIndexer


class Recorder:
    def __init__(self, fail: int = 0) -> None:
        self.batches: list[list[ChatNote]] = []
        self.fail = fail

    async def note_messages(self, notes: list[ChatNote], answered: dict[str, int] | None = None) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("database away")
        self.batches.append([ChatNote(n.channel, n.chat_id, n.title, list(n.people), n.last_at, n.messages)
                             for n in notes])


def message(chat: str, sender: str, name: str, at: float, **extra: Any) -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id=chat, sender_id=sender, message_id=f"{at}", sender_name=name,
                          received_at=at, **extra)


async def test_the_chat_index_writes_many_messages_as_one_batch_and_keeps_a_failed_one() -> None:
    store = Recorder(fail=1)
    indexer = ChatIndexer(store)  # type: ignore[arg-type]
    for n in range(50):
        await indexer.observe(message("-100", str(n % 3), f"P{n % 3}", 1000.0 + n, chat_type="group",
                                      chat_title="Team"))
    await indexer.observe(message("111", "111", "Alice", 999.0))
    await indexer.flush()  # the store is away: nothing lost
    assert store.batches == [] and len(indexer.pending) == 2
    await indexer.observe(message("111", "111", "Alice", 2000.0))
    await indexer.flush()
    [batch] = store.batches
    notes = {n.chat_id: n for n in batch}
    assert notes["-100"].messages == 50 and notes["-100"].title == "Team"
    assert notes["-100"].people == ["P0 (0)", "P1 (1)", "P2 (2)"] and notes["-100"].last_at == 1049.0
    assert notes["111"].messages == 2 and notes["111"].last_at == 2000.0
    await indexer.flush()
    assert len(store.batches) == 1  # nothing new: no write


def test_transcript_lines_become_voice_notes_and_summaries_are_marked() -> None:
    from talon.agent.context.pipeline import SUMMARY

    shown = views.shown_messages([
        Message(role="user", content=[TextBlock(text="listen\n[voice note, 0:07, machine transcription, in "
                                                     "French]: bonjour à tous")]),
        Message(role="user", content=[TextBlock(text="Summary of earlier turns")], meta={SUMMARY: True}),
    ])
    assert shown[0].text == "listen" and shown[0].audio[0]["transcript"] == "bonjour à tous"
    assert shown[0].audio[0]["length"] == "0:07" and shown[1].summary


def test_day_bars_cover_fourteen_days_scaled_to_the_busiest() -> None:
    now = 1_700_000_000.0
    bars = views.day_bars({"2023-11-14": 10, "2023-11-13": 5}, 14, now=now)
    assert len(bars) == 14 and bars[-1].label == "11-14" and bars[-1].height == 100 and bars[-2].height == 50
    assert sum(b.value for b in bars) == 15


@pytest.mark.parametrize(("header", "name"), [("127.0.0.1:8080", "127.0.0.1"), ("[::1]:80", "::1"),
                                              ("Evil.Example", "evil.example"), ("", ""),
                                              ("talon.example.org:443", "talon.example.org")])
def test_host_names(header: str, name: str) -> None:
    assert sec.host_name(header) == name


def test_settings_rows_say_set_for_secrets_and_never_show_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from talon.ui.pages import settings_rows

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TALON_MAX_STEPS", "7")
    settings = Settings(_env_file=None, TELEGRAM_BOT_TOKEN="123:secret-token-value",  # type: ignore[call-arg]
                        TALON_DATABASE_URL="postgresql://talon:pg-password-1@db/talon", TALON_MAX_STEPS=7)
    rows = {r["name"]: r for r in settings_rows(settings)}
    assert rows["TELEGRAM_BOT_TOKEN"]["value"] == "set" and rows["OPENAI_API_KEY"]["value"] == "not set"
    assert rows["TALON_DATABASE_URL"]["value"] == "set"
    assert rows["TALON_MAX_STEPS"]["origin"] == "environment" and rows["TALON_MEDIA_ROOT"]["origin"] == "default"
    text = repr(rows)
    assert "secret-token-value" not in text and "pg-password-1" not in text
    assert "pg-password-1" in sec.secret_values(settings)


def test_doctor_says_whether_the_panel_is_served_and_how_to_sign_in(tmp_path: Path) -> None:
    base = dict(TALON_DATA_DIR=str(tmp_path / "d"), TALON_MEDIA_ROOT=str(tmp_path / "m"))
    assert sec.panel_row(Settings(_env_file=None, **base))[1] == "off (the HTTP server does not run)"  # type: ignore[arg-type]
    on = sec.panel_row(Settings(_env_file=None, TALON_UI="true", **base))[1]  # type: ignore[arg-type]
    assert on.startswith("/ui/ on 127.0.0.1:8080") and "talon ui link" in on
    open_net = Settings(_env_file=None, TALON_HTTP_PORT=9000, TALON_HTTP_HOST="0.0.0.0", **base)  # type: ignore[arg-type]
    assert sec.panel_row(open_net)[1].startswith("off (no password")
