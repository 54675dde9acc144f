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
        primary.queue(FakeOpenAI.error(503, "the server is overloaded"))
        claude.queue("Answered by the fallback.", "Still the fallback.", "Fallback again.")
        try:
            async with running(settings) as runtime:
                with caplog.at_level(logging.INFO, logger="talon.agent.loop"):
                    tg.push_update(tg.text_message(ALICE, "are you there?", user_id=ALICE))
                    [first] = await tg.wait_for("sendMessage", to_alice)
                    tg.push_update(tg.text_message(ALICE, "/status", user_id=ALICE))
                    replies = await tg.wait_for("sendMessage", to_alice, count=2)
                    # Resting: the next turn goes straight to the fallback.
                    tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
                    replies = await tg.wait_for("sendMessage", to_alice, count=3)
                    assert len(primary.requests) == 1
                    # The first model's server goes away (connection refused), and its cool-down ends.
                    await primary.stop()
                    agent = runtime.agent
                    later = agent.clock() + settings.model_fallback_cooldown_s + 1
                    agent.clock = lambda: later
                    tg.push_update(tg.text_message(ALICE, "one more", user_id=ALICE))
                    replies = await tg.wait_for("sendMessage", to_alice, count=4)
                metrics = runtime.bridge.metrics
                assert metrics is not None
                calls = {model: metrics.registry.get_sample_value(
                    "talon_model_calls_total", {"model": model, "purpose": "turn"})
                    for model in ("fake-model", "claude-3-5-haiku-latest")}
                tokens = metrics.registry.get_sample_value(
                    "talon_model_tokens_total", {"model": "claude-3-5-haiku-latest", "type": "input"})
        finally:
            await primary.stop()
    assert first.params["text"] == "Answered by the fallback."
    status = replies[1].params["text"]
    assert "Model: anthropic:claude-3-5-haiku-latest, a fallback: openai:fake-model failed" in status
    assert "503" in status and "overloaded" in status and "tried again in" in status
    assert "Last answer by: anthropic:claude-3-5-haiku-latest (fallback: openai:fake-model failed" in status
    assert replies[2].params["text"] == "Still the fallback."
    assert replies[3].params["text"] == "Fallback again."
    assert len(claude.requests) == 3
    # The fallback got the conversation: the first question is in its third request.
    assert "are you there?" in str(claude.requests[2].json["messages"])
    # Usage is counted per model: both were called, the fallback's tokens under its own name.
    # (the first model's two calls: the 503, and the one refused after its cool-down).
    assert calls["fake-model"] == 2 and calls["claude-3-5-haiku-latest"] == 3 and tokens and tokens > 0
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
