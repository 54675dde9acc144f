"""Provider adapters on the wire (real openai / anthropic SDKs against loopback fakes), images
from tools, text-only placeholders, and recovery from "context too long"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from talon.agent.providers.anthropic import AnthropicProvider
from talon.agent.providers.openai import OpenAIProvider
from talon.agent.providers.profiles import ModelProfile
from talon.agent.context.session import is_checkpoint
from talon.storage.embedded.attachments import FileAttachments
from talon.content import ImageBlock, Message
from talon.errors import ContextOverflow
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI
from tests.support.providers import CHAT, Dump, Setup, anthropic_provider, openai_provider, png


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


# --- images returned by tools ---------------------------------------------------------------
async def test_openai_tool_image_goes_in_a_user_message_after_the_tool_message(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.tool_call("read_file", {"path": "pic.png"}), "A red rectangle.")
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("what is in pic.png?"), "t1")
        await provider.aclose()
    assert result.text == "A red rectangle."
    messages = fake.requests[1].json["messages"]
    tool_at = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    tool, after = messages[tool_at], messages[tool_at + 1]
    assert isinstance(tool["content"], str) and "image(s) follow in the next message" in tool["content"]
    assert after["role"] == "user"
    [url] = [p["image_url"]["url"] for p in after["content"] if p["type"] == "image_url"]
    assert url.startswith("data:image/png;base64,")
    assert fake.requests[1].status == 200  # the strict fake accepted the layout


async def test_openai_text_only_model_gets_a_placeholder_and_no_image(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.tool_call("read_file", {"path": "pic.png"}), "ok")
        provider = openai_provider(fake, setup, vision=False)
        await setup.agent(provider).run_turn(CHAT, Message.user("look at pic.png"), "t1")
        await provider.aclose()
    request = fake.requests[1]
    assert request.image_urls() == []
    tool = next(m for m in request.json["messages"] if m["role"] == "tool")
    assert "[image pic.png not attached: this model takes no images]" in tool["content"]


async def test_anthropic_tool_image_goes_inside_tool_result(setup: Setup) -> None:
    (setup.root / "AGENTS.md").write_text("The user's cat is called Miso.\n")
    async with FakeAnthropic() as fake:
        fake.queue(FakeAnthropic.tool_use("read_file", {"path": "pic.png"}), "A red rectangle.")
        provider = anthropic_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("what is in pic.png?"), "t1")
        await provider.aclose()
    assert result.text == "A red rectangle."
    body = fake.requests[1].json
    last = body["messages"][-1]
    assert last["role"] == "user" and last["content"][0]["type"] == "tool_result"
    inner = last["content"][0]["content"]
    [image] = [b for b in inner if b["type"] == "image"]
    assert image["source"]["media_type"] == "image/png" and image["source"]["data"]
    assert len(fake.requests[1].images()) == 1  # no second copy in a synthetic turn
    # Cache breakpoints: after the stable system prompt, after the memory block.
    system = body["system"]
    assert [("cache_control" in b) for b in system] == [True, True]
    assert system[1]["text"].lstrip().startswith("<<<MEMORY AGENTS.md") and "Miso" in system[1]["text"]
    assert "Miso" not in system[0]["text"]
    assert body["tools"][0]["input_schema"]["type"] == "object"


async def test_anthropic_text_only_model_gets_a_placeholder(setup: Setup) -> None:
    async with FakeAnthropic() as fake:
        fake.queue(FakeAnthropic.tool_use("read_file", {"path": "pic.png"}), "ok")
        provider = anthropic_provider(fake, setup, vision=False)
        await setup.agent(provider).run_turn(CHAT, Message.user("look"), "t1")
        await provider.aclose()
    assert fake.requests[1].images() == []
    assert "not attached: this model takes no images" in json.dumps(fake.requests[1].json)


async def test_unknown_openai_model_falls_back_to_placeholders_when_images_are_refused(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, "This model does not support image input."), "ok")
        provider = openai_provider(fake, setup, model="my-local-model", vision=True)
        agent = setup.agent(provider)
        ref = await setup.store.put_bytes(png(), mime="image/png", name="photo.png", width=40, height=30)
        user = Message(role="user", content=[*Message.user("see").content, ImageBlock(ref=ref)])
        result = await agent.run_turn(CHAT, user, "t1")
        await provider.aclose()
    assert result.text == "ok" and provider.vision is False
    assert fake.requests[0].image_urls() and not fake.requests[1].image_urls()
    assert "not attached" in fake.requests[1].last_user_text()


async def test_reasoning_models_get_max_completion_tokens(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        provider = openai_provider(fake, setup, model="o4-mini", reasoning=True)
        await setup.agent(provider).run_turn(CHAT, Message.user("hi"), "t1")
        await provider.aclose()
    assert "max_completion_tokens" in fake.requests[0].json and "max_tokens" not in fake.requests[0].json


# --- "context too long" -------------------------------------------------------------------------
async def test_openai_overflow_once_is_recovered_by_clipping_tool_output(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.tool_call("dump"), FakeOpenAI.context_length_exceeded(), "Summary of the dump.")
        provider = openai_provider(fake, setup)
        agent = setup.agent(provider, profile=ModelProfile(128_000, 4096, True))
        agent.tools.add(Dump(20_000))
        result = await agent.run_turn(CHAT, Message.user("dump it"), "t1")
        await provider.aclose()
    assert result.text == "Summary of the dump."
    assert len(fake.requests) == 3
    refused = next(m for m in fake.requests[1].json["messages"] if m["role"] == "tool")["content"]
    retried = next(m for m in fake.requests[2].json["messages"] if m["role"] == "tool")["content"]
    assert len(refused) == 20_000 and len(retried) < 5_000 and "too long to keep" in retried
    # The session log still has the whole output.
    tool = next(m for m in await setup.sessions.load(CHAT) if m.role == "tool")
    assert len(tool.text) == 20_000


async def test_openai_overflow_once_on_a_fresh_chat_is_retried_and_completes(setup: Setup) -> None:
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.context_length_exceeded(limit=8192, requested=9000), "Recovered.")
        provider = openai_provider(fake, setup)
        agent = setup.agent(provider, profile=ModelProfile(32_768, 4096, True))
        result = await agent.run_turn(CHAT, Message.user("hello"), "t1")
        await provider.aclose()
    assert result.text == "Recovered." and len(fake.requests) == 2
    # The stated window is believed from now on, and the retry was sized for it.
    assert agent.profile.context_window == 8192
    assert fake.requests[1].json["max_tokens"] <= 8192 // 4


async def test_overflow_twice_summarizes_and_completes(setup: Setup) -> None:
    for i in range(12):
        await setup.sessions.append(CHAT, Message.user(f"old question {i}", turn_id=f"o{i}"),
                              Message.assistant(f"old answer {i} " + "z" * 300, turn_id=f"o{i}", final=True))
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.context_length_exceeded(), "SUMMARY: twelve old questions were asked.",
                   "Fresh answer.")
        provider = openai_provider(fake, setup)
        agent = setup.agent(provider, profile=ModelProfile(128_000, 4096, True))
        result = await agent.run_turn(CHAT, Message.user("new question"), "t-new")
        await provider.aclose()
    assert result.text == "Fresh answer."
    assert len(fake.requests) == 3
    summary_request = fake.requests[1].json
    assert "old question 0" in summary_request["messages"][-1]["content"]
    final = json.dumps(fake.requests[2].json)
    assert "SUMMARY: twelve old questions" in final and "old question 0" not in final
    assert "new question" in final
    log = await setup.sessions.load(CHAT)
    assert sum(is_checkpoint(m) for m in log) == 1
    archive = setup.sessions.archive_path(CHAT, "main")
    assert "old question 0" in archive.read_text()


async def test_overflow_that_never_ends_fails_the_turn_without_looping(setup: Setup) -> None:
    await setup.sessions.append(CHAT, Message.user("earlier", turn_id="o"), Message.assistant("sure", turn_id="o", final=True))
    async with FakeOpenAI() as fake:
        fake.default_responder = lambda body: FakeOpenAI.context_length_exceeded()
        provider = openai_provider(fake, setup)
        agent = setup.agent(provider, profile=ModelProfile(128_000, 4096, True))
        with pytest.raises(ContextOverflow, match="still too long"):
            await agent.run_turn(CHAT, Message.user("hello"), "t1")
        await provider.aclose()
    assert len(fake.requests) <= 4


async def test_anthropic_prompt_too_long_is_recovered_and_the_window_learned(setup: Setup) -> None:
    async with FakeAnthropic() as fake:
        fake.queue(FakeAnthropic.tool_use("dump"), FakeAnthropic.prompt_too_long(60_000, 40_000), "done")
        provider = anthropic_provider(fake, setup)
        agent = setup.agent(provider)
        agent.tools.add(Dump(30_000))
        result = await agent.run_turn(CHAT, Message.user("dump"), "t1")
        await provider.aclose()
    assert result.text == "done" and len(fake.requests) == 3
    assert agent.profile.context_window == 40_000
    tool_result = fake.requests[2].json["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result" and "too long to keep" in json.dumps(tool_result)
    assert fake.requests[2].json["max_tokens"] <= 10_000


async def test_anthropic_mapping_merges_and_starts_with_user(setup: Setup) -> None:
    from talon.agent.providers.anthropic import to_anthropic_messages

    messages = [
        Message.assistant("(earlier reply)"),
        Message.user("one"),
        Message.user("two"),
    ]
    wire = to_anthropic_messages(messages, setup.hydrate)
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert [b["text"] for b in wire[2]["content"]] == ["one", "two"]
    assert wire[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


async def test_build_provider_picks_adapter_and_profile(tmp_path: Path) -> None:
    from talon.config import Settings
    from talon.runtime import build_provider

    store = FileAttachments(tmp_path / "att")
    base = dict(OPENAI_API_KEY="k", ANTHROPIC_API_KEY="k")
    claude = build_provider(Settings(_env_file=None, TALON_MODEL="anthropic:claude-3-5-haiku-latest", **base), store)
    assert isinstance(claude, AnthropicProvider) and claude.vision
    o3mini = build_provider(Settings(_env_file=None, TALON_MODEL="openai:o3-mini", **base), store)
    assert isinstance(o3mini, OpenAIProvider) and not o3mini.vision and o3mini.reasoning
    forced = build_provider(Settings(_env_file=None, TALON_MODEL="openai:o3-mini", TALON_MODEL_VISION="true", **base), store)
    assert forced.vision
    unknown = build_provider(Settings(_env_file=None, TALON_MODEL="openai:my-model", **base), store)
    assert unknown.vision
    summary = build_provider(Settings(_env_file=None, TALON_MODEL="anthropic:claude-x", **base), store, "claude-haiku-4-5")
    assert isinstance(summary, AnthropicProvider) and summary.model == "claude-haiku-4-5"
    for p in (claude, o3mini, forced, unknown, summary):
        await p.aclose()


async def test_anthropic_accepts_every_request_of_a_summarized_conversation(setup: Setup) -> None:
    from talon.content import TextBlock, ToolCall

    for i in range(15):
        call = ToolCall(id=f"toolu_{i}", name="ls", arguments="{}")
        await setup.sessions.append(
            CHAT,
            Message.user(f"question {i} " + "q" * 2000, turn_id=f"o{i}"),
            Message(role="assistant", tool_calls=[call], meta={"turn_id": f"o{i}"}),
            Message(role="tool", tool_call_id=call.id, tool_name="ls", content=[TextBlock(text="pic.png")]),
            Message.assistant(f"answer {i}", turn_id=f"o{i}", final=True),
        )
    main_replies: list[Any] = [FakeAnthropic.tool_use("ls"), "All done."]

    def respond(body: dict[str, Any]) -> Any:
        if "You condense a conversation" in json.dumps(body.get("system")):
            return "- the user asked fifteen questions"
        return main_replies.pop(0)

    async with FakeAnthropic() as fake:
        fake.default_responder = respond
        provider = anthropic_provider(fake, setup)
        agent = setup.agent(provider, profile=ModelProfile(8_000, 1_000, True))
        result = await agent.run_turn(CHAT, Message.user("and now?"), "t-new")
        await provider.aclose()
    assert result.text == "All done."
    assert all(r.status == 200 for r in fake.requests)
    summaries = [r.json for r in fake.requests if "You condense" in json.dumps(r.json.get("system"))]
    first, second = (r.json for r in fake.requests if r.json not in summaries)
    assert summaries and "cache_control" not in json.dumps(summaries[0]["messages"])  # one-off: no cache write
    assert "question 0 " in summaries[0]["messages"][0]["content"][0]["text"]
    assert "fifteen questions" in json.dumps(first["messages"][0]) and "question 0 " not in json.dumps(first)
    assert second["messages"][-1]["content"][0]["type"] == "tool_result"
