"""Model failover end to end (TALON_MODEL_FALLBACKS): the first model (the fake OpenAI-compatible
server) answers 503, then refuses connections; the fallback (the fake Anthropic server, through the
real SDKs) answers the turn, and /status and the log name it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from talon.config import Settings
from talon.errors import ConfigError
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram


def to_alice(c) -> bool:
    return str(c.params.get("chat_id")) == str(ALICE)


async def test_a_down_model_hands_the_turn_to_the_fallback_and_status_names_it(
        tg: FakeTelegram, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    primary = await FakeOpenAI().start()
    async with FakeAnthropic() as claude:
        settings = make_settings(tmp_path, tg.base_url, primary.base_url, ANTHROPIC_API_KEY="test-anthropic",
                                 ANTHROPIC_BASE_URL=claude.base_url,
                                 TALON_MODEL_FALLBACKS="anthropic:claude-3-5-haiku-latest")
        primary.queue("The first model answers.", FakeOpenAI.error(503, "the server is overloaded"))
        claude.queue("Answered by the fallback.", "Still the fallback.", "Fallback again.")
        try:
            async with running(settings) as runtime:
                tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
                [before] = await tg.wait_for("sendMessage", to_alice)
                with caplog.at_level(logging.INFO, logger="talon.agent.loop"):
                    for count, text in enumerate(("are you there?", "/status", "and now?"), start=2):
                        # (the third: the first model rests, the turn goes straight to the fallback)
                        tg.push_update(tg.text_message(ALICE, text, user_id=ALICE))
                        _, *replies = await tg.wait_for("sendMessage", to_alice, count=count)
                    assert len(primary.requests) == 2
                    # The first model's server goes away (connection refused), and its cool-down ends.
                    await primary.stop()
                    agent = runtime.agent
                    later = agent.clock() + settings.model_fallback_cooldown_s + 1
                    agent.clock = lambda: later
                    tg.push_update(tg.text_message(ALICE, "one more", user_id=ALICE))
                    tg.push_update(tg.text_message(ALICE, "/usage", user_id=ALICE))
                    _, *replies = await tg.wait_for("sendMessage", to_alice, count=6)
                metrics = runtime.bridge.metrics
                assert metrics is not None
                calls = {model: metrics.registry.get_sample_value(
                    "talon_model_calls_total", {"model": model, "purpose": "turn"})
                    for model in ("fake-model", "claude-3-5-haiku-latest")}
                tokens = metrics.registry.get_sample_value(
                    "talon_model_tokens_total", {"model": "claude-3-5-haiku-latest", "type": "input"})
        finally:
            await primary.stop()
    assert before.params["text"] == "The first model answers."
    assert replies[0].params["text"] == "Answered by the fallback."
    status = replies[1].params["text"]
    assert "Model: anthropic:claude-3-5-haiku-latest, a fallback: openai:fake-model failed" in status
    assert "503" in status and "overloaded" in status and "tried again in" in status
    assert "Last answer by: anthropic:claude-3-5-haiku-latest (fallback: openai:fake-model failed" in status
    assert replies[2].params["text"] == "Still the fallback."
    assert replies[3].params["text"] == "Fallback again."
    assert len(claude.requests) == 3
    # The fallback got the conversation: what the first model was asked is in its requests.
    assert "hello" in str(claude.requests[0].json["messages"])
    assert "are you there?" in str(claude.requests[2].json["messages"])
    # Usage is counted per model: both were called, the fallback's tokens under its own name.
    # (the first model's three calls: an answer, the 503, and the one refused after its cool-down).
    assert calls["fake-model"] == 3 and calls["claude-3-5-haiku-latest"] == 3 and tokens and tokens > 0
    usage = replies[4].params["text"]
    assert "By model, this month:" in usage
    assert "• claude-3-5-haiku-latest: " in usage and "in 3 model calls" in usage.split("claude-3-5-haiku-latest: ")[1]
    # The first model's refused calls cost nothing: its one answer is what it is charged for.
    assert "in 1 model call" in usage.split("• fake-model: ")[1]
    said = [r.getMessage() for r in caplog.records]
    assert any("model openai:fake-model failed after its retries" in m and "503" in m
               and "goes on with anthropic:claude-3-5-haiku-latest" in m for m in said)
    assert any("could not reach" in m and "goes on with anthropic" in m for m in said)
    assert any("answered by anthropic:claude-3-5-haiku-latest" in m for m in said)
    assert any("openai:fake-model has rested its cool-down: trying it again" in m for m in said)


def test_a_fallback_without_its_key_is_refused_at_start(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, TALON_MODEL="openai:gpt-4o", OPENAI_API_KEY="k",  # type: ignore[call-arg]
                        TALON_MODEL_FALLBACKS="openai:gpt-4o-mini, anthropic:claude-3-5-haiku-latest")
    with pytest.raises(ConfigError, match="needs ANTHROPIC_API_KEY"):
        settings.check_fallbacks()
    local = Settings(_env_file=None, TALON_MODEL="openai:gpt-4o", OPENAI_API_KEY="k",  # type: ignore[call-arg]
                     TALON_MODEL_FALLBACKS="local:bundled")
    with pytest.raises(ConfigError, match="cannot be one"):
        local.check_fallbacks()
