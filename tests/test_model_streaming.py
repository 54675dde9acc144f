"""Streaming, timeouts, retries and refusals of the providers, through the real openai / anthropic
SDKs against the loopback fakes (the real-server counterpart is tests/test_llamacpp_e2e.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from talon.agent.providers.anthropic import AnthropicProvider
from talon.agent.loop import NO_TOOLS_NOTE
from talon.agent.providers.openai import OpenAIProvider
from talon.agent.providers.profiles import ModelProfile
from talon.bridge import apology
from talon.content import ImageBlock, Message
from talon.storage.sessions import ChatKey
from talon.errors import ModelNotFound, ProviderError, ProviderUnavailable, RateLimited
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI
from tests.support.providers import CHAT, Setup, png
@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def provider(fake: FakeOpenAI, setup: Setup, **kw: object) -> OpenAIProvider:
    return OpenAIProvider(str(kw.pop("model", "gpt-4o")), api_key="k", base_url=fake.base_url,
                          hydrate=setup.hydrate, **{"max_retries": 0, **kw})  # type: ignore[arg-type]


class Deltas:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.times: list[float] = []
        self.steps: list[bool] = []

    async def text(self, delta: str) -> None:
        self.texts.append(delta)
        self.times.append(time.monotonic())

    async def step(self, tools: bool) -> None:
        self.steps.append(tools)


async def test_text_arrives_in_deltas_and_a_tool_step_is_marked(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.reply("Let me look at the files first.", [FakeOpenAI.tool_call("ls", {})]),
                   "There is nothing in the workspace yet, so there is nothing to show.")
        p = provider(fake, setup)
        live = Deltas()
        result = await setup.agent(p).run_turn(CHAT, Message.user("what files are there?"), "t1",
                                               on_text=live.text, on_step=live.step)
        await p.aclose()
    assert all(r.json.get("stream") is True for r in fake.requests)
    assert fake.requests[0].json["stream_options"] == {"include_usage": True}
    assert live.steps == [True, False]
    assert "".join(live.texts) == "Let me look at the files first." + result.text
    assert len(live.texts) > 4  # in pieces, as they came
    assert (await setup.sessions.load(CHAT))[-1].meta["usage"]["output"] > 0  # usage came through the stream


async def test_a_slow_stream_longer_than_the_timeout_completes(setup: Setup) -> None:
    async with FakeOpenAI(chunk_delay=0.25) as fake:
        fake.queue("word " * 40)  # about 17 chunks, 4 s in all
        p = provider(fake, setup, timeout_s=1.5)
        live = Deltas()
        started = time.monotonic()
        result = await setup.agent(p).run_turn(CHAT, Message.user("talk slowly"), "t1", on_text=live.text)
        elapsed = time.monotonic() - started
        await p.aclose()
    assert result.text.strip() == ("word " * 40).strip() and len(fake.requests) == 1
    assert elapsed > 1.5  # longer than the timeout, fine while chunks flow


async def test_silence_past_the_timeout_fails_once_and_is_not_repeated(setup: Setup,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    async with FakeOpenAI(chunk_delay=3.0) as fake:
        fake.queue("a long answer that never comes")
        p = provider(fake, setup, timeout_s=0.5, max_retries=2)
        with pytest.raises(ProviderUnavailable, match="sent nothing for 0.5 s") as caught:
            await setup.agent(p).run_turn(CHAT, Message.user("hello?"), "t1")
        await p.aclose()
    assert len(fake.requests) == 1  # never generated twice behind the person's back
    assert "took too long" in apology(caught.value) and "not asked twice" in apology(caught.value)


async def test_a_server_that_cannot_stream_is_asked_without_it_from_then_on(setup: Setup) -> None:
    async with FakeOpenAI(streaming=False) as fake:
        p = provider(fake, setup)
        live = Deltas()
        agent = setup.agent(p)
        first = await agent.run_turn(CHAT, Message.user("one"), "t1", on_text=live.text)
        second = await agent.run_turn(CHAT, Message.user("two"), "t2")
        await p.aclose()
    assert first.text == "echo: one" and second.text == "echo: two"
    assert [bool(r.json.get("stream")) for r in fake.requests] == [True, False, False]
    assert live.texts == ["echo: one"]  # the whole answer, once, for the live view


async def test_stream_options_refused_alone_are_dropped(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.stream_options = False
        p = provider(fake, setup)
        result = await setup.agent(p).run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
    assert result.text == "echo: hi"
    assert "stream_options" in fake.requests[0].json and "stream_options" not in fake.requests[1].json
    assert fake.requests[1].json["stream"] is True


async def test_a_window_too_small_for_the_tool_definitions_runs_without_them(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    # A 1,024-token window cannot carry the definitions of the file tools and a conversation:
    # they are left out (said once in the log, and in /status), not sent into a certain refusal.
    caplog.set_level(logging.WARNING)
    async with FakeOpenAI() as fake:
        p = provider(fake, setup, model="tiny")
        small = setup.agent(p, profile=ModelProfile(1024, 128, False, known=False))
        roomy = setup.agent(p, profile=ModelProfile(8192, 128, False, known=False))
        assert not small.tools_available and roomy.tools_available
        await small.run_turn(CHAT, Message.user("hi"), "t1")
        await roomy.run_turn(ChatKey("telegram", "other"), Message.user("hi"), "t2")
        status = await small.status_text(CHAT, "tiny")
        await p.aclose()
    assert "tools" not in fake.requests[0].json and NO_TOOLS_NOTE in fake.requests[0].json["messages"][0]["content"]
    assert "tools" in fake.requests[1].json
    assert "tools no (the window is too small for their definitions)" in status
    warnings = [r.getMessage() for r in caplog.records if "too small for the definitions" in r.getMessage()]
    assert len(warnings) == 1 and "1,024 tokens" in warnings[0], warnings


async def test_tools_refused_run_the_agent_without_tools(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, "registry.ollama.ai/library/gemma:2b does not support tools"),
                   "Answered without tools.", "Still fine.")
        p = provider(fake, setup, model="gemma:2b")
        agent = setup.agent(p)
        assert agent.tools_available
        result = await agent.run_turn(CHAT, Message.user("list my files"), "t1")
        await agent.run_turn(CHAT, Message.user("again"), "t2")
        await p.aclose()
    assert result.text == "Answered without tools." and not agent.tools_available
    assert "tools" in fake.requests[0].json and "tools" not in fake.requests[1].json
    assert "tools" not in fake.requests[2].json
    assert NO_TOOLS_NOTE in fake.requests[2].json["messages"][0]["content"]
    assert "tools no (refused by the server)" in await agent.status_text(CHAT, "openai:gemma:2b")


async def test_images_refused_with_a_500_become_notices_from_then_on(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(500, "image input is not supported - hint: if this is unexpected, "
                                         "you may need to provide the mmproj"), "A notice, then.", "Fine.")
        p = provider(fake, setup, model="gpt-4o", max_retries=2)
        agent = setup.agent(p)
        ref = await setup.store.put_bytes(png(), mime="image/png", name="photo.png", width=40, height=30)
        user = Message(role="user", content=[*Message.user("see").content, ImageBlock(ref=ref)])
        result = await agent.run_turn(CHAT, user, "t1")
        again = Message(role="user", content=[*Message.user("and this").content, ImageBlock(ref=ref)])
        await agent.run_turn(CHAT, again, "t2")
        await p.aclose()
    assert result.text == "A notice, then." and p.vision is False
    assert len(fake.requests) == 3  # the 500 was not retried as an outage
    assert fake.requests[0].image_urls() and not fake.requests[1].image_urls() and not fake.requests[2].image_urls()
    assert "not attached" in fake.requests[2].last_user_text()


async def test_rate_limit_waits_out_retry_after_and_says_so(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(429, "Rate limit reached", headers={"retry-after": "1"}), "After waiting.")
        p = provider(fake, setup, max_retries=2)
        result = await setup.agent(p).run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
    assert result.text == "After waiting."
    assert fake.requests[1].start - fake.requests[0].start >= 0.9
    assert any("retrying in 1.0 s" in r.getMessage() for r in caplog.records)


async def test_a_long_retry_after_fails_the_turn_with_rate_limited(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(429, "Rate limit reached", headers={"retry-after": "120"}))
        p = provider(fake, setup, max_retries=2)
        with pytest.raises(RateLimited) as caught:
            await setup.agent(p).run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
    assert len(fake.requests) == 1 and caught.value.retry_after == 120
    assert "rate limiting me" in apology(caught.value) and "120 s" in apology(caught.value)


async def test_a_refused_turn_is_left_out_so_the_next_message_works(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, "Invalid 'messages[1].content': unsupported control characters"),
                   "Second works.")
        p = provider(fake, setup)
        agent = setup.agent(p)
        with pytest.raises(ProviderError) as caught:
            await agent.run_turn(CHAT, Message.user("poison \x07 message"), "t1")
        text = apology(caught.value)
        result = await agent.run_turn(CHAT, Message.user("hello"), "t2")
        # A replay of the failed turn (a crash before its apology was sent) fails the same way.
        with pytest.raises(ProviderError):
            await agent.run_turn(CHAT, Message.user("poison \x07 message"), "t1")
        await p.aclose()
    assert "refused this message" in text and "unsupported control characters" in text
    assert "couldn't reach" not in text
    assert result.text == "Second works."
    assert "poison" not in str(fake.requests[1].json["messages"])
    assert len(fake.requests) == 2
    assert any(m.meta.get("failed_turn") for m in await setup.sessions.load(CHAT))  # kept in the log


async def test_model_not_found_is_named_not_an_outage(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(404, "The model `gpt-9` does not exist or you do not have access to it.",
                                    code="model_not_found"))
        p = provider(fake, setup, model="gpt-9", max_retries=2)
        with pytest.raises(ModelNotFound) as caught:
            await setup.agent(p).run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
    assert len(fake.requests) == 1
    assert "has no such model" in apology(caught.value) and "TALON_MODEL" in apology(caught.value)


async def test_a_reply_cut_at_the_limit_says_so(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.reply("The first half of a long", finish_reason="length"))
        p = provider(fake, setup)
        agent = setup.agent(p)
        result = await agent.run_turn(CHAT, Message.user("tell me everything"), "t1")
        replay = await agent.run_turn(CHAT, Message.user("tell me everything"), "t1")
        await p.aclose()
    note = f"cut off at the reply limit of {agent.profile.max_output:,} tokens"
    assert result.text.startswith("The first half of a long") and note in result.text
    assert replay.replayed and note in replay.text
    stored = (await setup.sessions.load(CHAT))[-1]
    assert stored.text == "The first half of a long"  # the note is not put in the model's mouth


async def test_anthropic_streams_text_deltas(setup: Setup) -> None:
    async with FakeAnthropic() as fake:
        fake.queue("A Claude answer that streams in several small deltas.")
        p = AnthropicProvider("claude-fake", api_key="k", base_url=fake.base_url, hydrate=setup.hydrate,
                              max_retries=0)
        live = Deltas()
        result = await setup.agent(p).run_turn(CHAT, Message.user("hi"), "t1", on_text=live.text)
        await p.aclose()
    assert fake.requests[0].json.get("stream") is True
    assert len(live.texts) > 3 and "".join(live.texts) == result.text


async def test_anthropic_overloaded_is_retried_and_logged(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with FakeAnthropic() as fake:
        fake.queue(FakeAnthropic.error(529, "Overloaded", "overloaded_error"), "Recovered.")
        p = AnthropicProvider("claude-fake", api_key="k", base_url=fake.base_url, hydrate=setup.hydrate,
                              max_retries=1)
        result = await setup.agent(p).run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
    assert result.text == "Recovered." and len(fake.requests) == 2
    assert any("retry 1 of 1" in r.getMessage() for r in caplog.records)


async def test_what_the_server_revealed_is_remembered_across_restarts(setup: Setup, tmp_path: Path) -> None:
    from talon.agent.providers.learned import LearnedFacts
    from talon.agent.providers.profiles import ModelProfile

    learned = LearnedFacts(tmp_path / "model_facts.json", "openai:local @ http://x/v1")
    # (No request count in the refusal: a count far above the estimate would, rightly, leave the
    # tools out for want of room, and this test is about remembering the refusals.)
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, "the request exceeds the available context size (4096 tokens), "
                                         "try increasing it", type="exceed_context_size_error"),
                   FakeOpenAI.error(400, "llama3 does not support tools"), "ok")
        p = provider(fake, setup, model="local")
        agent = setup.agent(p, profile=ModelProfile(32_768, 1024, True, known=False), learned=learned)
        await agent.run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
        # The next start: a new provider and agent, same data dir.
        p2 = provider(fake, setup, model="local")
        restarted = setup.agent(p2, profile=ModelProfile(32_768, 1024, True, known=False), learned=learned)
        await p2.aclose()
    assert agent.profile.context_window == 4096 and not agent.tools_available
    assert restarted.profile.context_window == 4096
    assert restarted.profile.source("context_window") == "stated by the server in an error"
    assert not restarted.tools_available and not restarted.tool_specs()


async def test_a_smaller_window_found_later_also_shrinks_the_memory_share(setup: Setup) -> None:
    from talon.agent.providers.profiles import ModelProfile

    (setup.workspace.root / "AGENTS.md").write_text("remember this. " * 2000)  # 30,000 characters
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, "request (9000 tokens) exceeds the available context size (4096 tokens)",
                                    type="exceed_context_size_error"), "ok")
        p = provider(fake, setup, model="local")
        agent = setup.agent(p, profile=ModelProfile(32_768, 1024, True, known=False))
        assert agent.memory is not None
        before = len(agent.memory.block())
        await agent.run_turn(CHAT, Message.user("hi"), "t1")
        await p.aclose()
    after = len(agent.memory.block())
    assert agent.profile.context_window == 4096
    # A tenth of the window found (4096 tokens, 1,638 characters), not of the one guessed first.
    assert before > 12_000 and after < 2_000
    assert agent.summarizer.window == 4096
    assert len(fake.requests[1].json["messages"][0]["content"]) < len(fake.requests[0].json["messages"][0]["content"]) - 10_000


def test_remembering_what_is_known_already_does_not_touch_the_disk(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from talon.agent.providers.learned import LearnedFacts

    learned = LearnedFacts(tmp_path / "model_facts.json", "m @ u")
    learned.save(vision=False)
    assert LearnedFacts(tmp_path / "model_facts.json", "m @ u").load() == {"vision": False}
    reads: list[Path] = []
    original = Path.read_text

    def counting(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting)
    for _ in range(3):  # what the agent does after every model call
        learned.save(vision=False)
    assert reads == []
    learned.save(tools=False)  # something new is read, merged and written
    assert reads and LearnedFacts(tmp_path / "model_facts.json", "m @ u").load() == {"vision": False, "tools": False}


async def test_a_call_past_its_total_cap_stops_and_is_not_repeated(setup: Setup) -> None:
    from talon.errors import ModelTimedOut

    async with FakeOpenAI(chunk_delay=0.2) as fake:
        fake.queue("word " * 60)  # chunks keep coming, for about 5 s in all
        p = provider(fake, setup, timeout_s=5, total_timeout_s=1.0, max_retries=2)
        with pytest.raises(ModelTimedOut, match="did not finish within 1 s") as caught:
            await setup.agent(p).run_turn(CHAT, Message.user("go on and on"), "t1")
        await p.aclose()
    assert len(fake.requests) == 1
    assert "took too long" in apology(caught.value)


async def test_a_refusal_at_a_small_window_retries_with_a_smaller_request(setup: Setup) -> None:
    # A 1,024-token local model refuses a fitted request (its tokenizer is denser than the
    # estimate). The retry "under a smaller budget" must really be smaller: a floor of 1,024 tokens
    # once made it the same request again, and the chat got an apology (seen with llama.cpp).
    # The refusal states no count here, so only the smaller budget can make the retry smaller.
    refusal = "the request exceeds the available context size (1024 tokens), try increasing it"
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, refusal, type="exceed_context_size_error"), "ok")
        p = provider(fake, setup, model="local")
        agent = setup.agent(p, profile=ModelProfile(1024, 64, False, known=False))
        result = await agent.run_turn(CHAT, Message.user("please summarize: " + "minutes of the meeting " * 2000), "t1")
        await p.aclose()
    assert result.text == "ok"
    sizes = [len(str(r.json["messages"])) for r in fake.requests]
    assert len(sizes) == 2
    assert sizes[1] < sizes[0] * 0.9, sizes  # the summarized retry is fitted to a smaller window
