"""Requests a provider would refuse, and replies a person would never see, found in review.

Each test drives the real SDK against the loopback fake and checks what went over the wire.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talon.agent.context.pipeline import SUMMARY, ContextBudget, RequestContext, ResultFiles, conversation_view, summarize_step
from talon.agent.providers.profiles import ModelProfile
from talon.storage.sessions import ChatKey
from talon.content import ImageBlock, Message, TextBlock, ToolCall
from talon.errors import ProviderUnavailable
from tests.fakes.anthropic_server import FakeAnthropic, Reply as AnthropicReply, ToolUse
from tests.fakes.openai_server import FakeOpenAI, ToolCall as WireToolCall
from tests.support.providers import Setup, anthropic_provider, openai_provider, png
CHAT = ChatKey("telegram", "7")


def _texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    found: list[str] = []
    for block in content or []:  # type: ignore[union-attr]
        if block.get("type") == "text":
            found.append(block.get("text", ""))
        if block.get("type") == "tool_result":
            found += _texts(block.get("content"))
    return found


# --- Anthropic: whitespace-only text ----------------------------------------------------------
async def test_anthropic_whitespace_text_before_a_tool_use_does_not_wedge_the_chat(tmp_path: Path) -> None:
    # Claude often opens a tool-use turn with a text block of bare newlines. Sent back as is, the
    # API refuses every later request ("text content blocks must contain non-whitespace text").
    setup = Setup(tmp_path)
    (setup.root / "notes.txt").write_text("hello\n")
    async with FakeAnthropic() as fake:
        fake.queue(AnthropicReply(text="\n\n", tool_uses=(ToolUse("read_file", {"path": "notes.txt"}),)),
                   "It says hello.")
        provider = anthropic_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("read notes.txt"), "t1")
        await provider.aclose()
    assert [r.status for r in fake.requests] == [200, 200]
    assert result.text == "It says hello."
    for message in fake.requests[1].json["messages"]:
        for text in _texts(message["content"]):
            assert text.strip(), fake.requests[1].json["messages"]


async def test_anthropic_whitespace_only_reply_then_next_turn_is_accepted(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    async with FakeAnthropic() as fake:
        fake.queue(" \n ", "second answer")
        provider = anthropic_provider(fake, setup)
        agent = setup.agent(provider)
        await agent.run_turn(CHAT, Message.user("first"), "t1")
        result = await agent.run_turn(CHAT, Message.user("second"), "t2")
        await provider.aclose()
    assert [r.status for r in fake.requests] == [200, 200]
    assert result.text == "second answer"


# --- an empty final reply ---------------------------------------------------------------------
async def test_an_empty_model_reply_still_answers_the_user(tmp_path: Path) -> None:
    # A reasoning model that spends its whole output budget thinking returns no content and no
    # tool calls. The channels send nothing for empty text: the person would get silence.
    setup = Setup(tmp_path)
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.reply(None, finish_reason="length"), "later answer")
        provider = openai_provider(fake, setup)
        agent = setup.agent(provider)
        result = await agent.run_turn(CHAT, Message.user("hard question"), "t1")
        assert result.text.strip()
        assert "output limit" in result.text
        # The stored reply is what a restart replays and what later requests carry.
        again = await agent.run_turn(CHAT, Message.user("hard question"), "t1")
        assert again.replayed and again.text == result.text
        await agent.run_turn(CHAT, Message.user("next"), "t2")
        await provider.aclose()
    # Later requests carry it as Talon's note, never as the assistant's words (issue 27).
    messages = fake.requests[1].json["messages"]
    assert not [m for m in messages if m["role"] == "assistant"]
    assert "Note from Talon" in str(messages) and "output limit" in str(messages)


async def test_an_empty_anthropic_reply_still_answers_the_user(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    async with FakeAnthropic() as fake:
        fake.queue(AnthropicReply())
        provider = anthropic_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("hi"), "t1")
        await provider.aclose()
    assert result.text.strip()


# --- OpenAI-compatible servers that give tool calls no id -------------------------------------
async def test_tool_calls_without_ids_each_get_their_own_result(tmp_path: Path) -> None:
    # Gemini's and LM Studio's OpenAI-compatible endpoints answer tool calls with id "" (or none).
    setup = Setup(tmp_path)
    (setup.root / "a.txt").write_text("alpha\n")
    (setup.root / "b.txt").write_text("beta\n")
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.reply(None, [WireToolCall("read_file", {"path": "a.txt"}, id=""),
                                           WireToolCall("read_file", {"path": "b.txt"}, id="")]),
                   "both read")
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("read a and b"), "t1")
        await provider.aclose()
    assert result.text == "both read"
    assert fake.requests[1].status == 200
    messages = fake.requests[1].json["messages"]
    [assistant] = [m for m in messages if m["role"] == "assistant"]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert all(ids) and len(set(ids)) == 2
    tools = [m for m in messages if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == ids
    assert "alpha" in tools[0]["content"] and "beta" in tools[1]["content"]


async def test_a_tool_call_with_a_null_id_does_not_crash_the_turn(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    (setup.root / "a.txt").write_text("alpha\n")

    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.reply(None, [WireToolCall("read_file", {"path": "a.txt"}, id="")]), "done")
        original = fake._completion

        def completion(request: dict, reply: object) -> dict:
            payload = original(request, reply)  # type: ignore[arg-type]
            for call in payload["choices"][0]["message"].get("tool_calls") or []:
                call["id"] = None
            return payload

        fake._completion = completion  # type: ignore[method-assign]
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("read a"), "t1")
        await provider.aclose()
    assert result.text == "done"
    tool = next(m for m in fake.requests[1].json["messages"] if m["role"] == "tool")
    assert tool["tool_call_id"] and "alpha" in tool["content"]


# --- refused images stay withheld through overflow recovery ----------------------------------
async def test_a_refused_image_is_not_sent_again_when_the_request_is_also_too_long(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    ref = await setup.store.put_bytes(png(), mime="image/png", name="photo.png", width=40, height=30)
    photo = Message(role="user", content=[TextBlock(text="what is this?"), ImageBlock(ref=ref)])
    profile = ModelProfile(context_window=16_000, max_output=1000, vision=True, known=True)
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(400, "Invalid image: the image could not be processed"),
                   FakeOpenAI.context_length_exceeded(16_000, 17_000),
                   "done")
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider, profile).run_turn(CHAT, photo, "t1")
        await provider.aclose()
    assert result.text == "done"
    assert len(fake.requests[0].image_urls()) == 1
    # After the refusal the picture never travels again, whatever the recovery path does.
    assert [len(r.image_urls()) for r in fake.requests[1:]] == [0] * (len(fake.requests) - 1)


# --- a summary never loses the request being worked on ----------------------------------------
async def test_summary_inside_a_long_turn_keeps_the_users_request_verbatim(tmp_path: Path) -> None:
    # A long agentic turn (many tool steps) is bigger than the kept tail, so the cut falls after
    # the user's message and the request is folded into the summary. Whether it survives must
    # not depend on the summary model following its instructions.
    ask = "Compare the Q3 totals in report.csv with last year's and mail me the three biggest changes."
    history = [Message.user(f"old question {i} " + "w" * 300) for i in range(6)]
    history.append(Message.user(ask))
    for step in range(8):
        cid = f"c{step}"
        history.append(Message(role="assistant", tool_calls=[ToolCall(id=cid, name="read_file", arguments="{}")]))
        history.append(Message(role="tool", tool_call_id=cid, tool_name="read_file",
                               content=[TextBlock(text=f"rows {step} " + "r" * 3200)]))
    persisted: list[Message] = []

    async def persist(message: Message) -> None:
        persisted.append(message)

    async def summarize(previous: str | None, messages: list[Message]) -> str:
        return "- The assistant has been reading files."  # a summary that forgot the request

    ctx = RequestContext(
        budget=ContextBudget.for_profile(ModelProfile(8000, 500, True)),
        archive=tmp_path / "a.md", summarize=summarize, persist=persist,
        results=ResultFiles(tmp_path / "r"),
    )
    out = await summarize_step(conversation_view(history), ctx)
    assert out[0].meta[SUMMARY]
    assert not any(m.role == "user" and m.text == ask for m in out[1:])  # the cut is mid-turn
    assert ask in out[0].text
    [record] = persisted
    assert ask in record.text  # later requests start from the record


# --- an image whose bytes are gone from the store ---------------------------------------------
async def test_an_image_missing_from_the_store_becomes_a_placeholder_not_a_failed_turn(tmp_path: Path) -> None:
    # The data dir was restored from an older backup, or attachments/ was cleaned by hand: the
    # log still names the picture. Each request used to fail (for every turn the image stayed in
    # the window) with an AttachmentError instead of reaching the model.
    setup = Setup(tmp_path)
    ref = await setup.store.put_bytes(png(), mime="image/png", name="gone.png", width=40, height=30)
    setup.store.path_for(ref.id).unlink()
    photo = Message(role="user", content=[TextBlock(text="and this one?"), ImageBlock(ref=ref)])
    async with FakeOpenAI() as fake:
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, photo, "t1")
        await provider.aclose()
    assert result.text.startswith("echo:")
    assert "gone.png not attached" in fake.requests[0].last_user_text()
    async with FakeAnthropic() as fake_a:
        provider_a = anthropic_provider(fake_a, setup)
        result = await setup.agent(provider_a).run_turn(ChatKey("telegram", "8"), photo, "t1")
        await provider_a.aclose()
    assert result.text.startswith("echo:") and "gone.png not attached" in result.text


# --- strict role alternation (Gemma / Mistral chat templates on vLLM, llama.cpp) ---------------
def _alternating_template(body: dict) -> object:
    """What a strict chat template answers: 400 unless user and assistant turns alternate."""
    roles = [m["role"] for m in body["messages"] if m["role"] in ("user", "assistant")]
    if any(a == b == "user" for a, b in zip(roles, roles[1:])):
        return FakeOpenAI.error(400, "Conversation roles must alternate user/assistant/user/assistant/...")
    return f"echo: {body['messages'][-1]['content']}"


async def test_a_message_left_unanswered_by_an_outage_does_not_wedge_a_strict_server(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(503, "model is loading"))
        fake.default_responder = _alternating_template  # type: ignore[assignment]
        provider = openai_provider(fake, setup)
        agent = setup.agent(provider)
        with pytest.raises(ProviderUnavailable):
            await agent.run_turn(CHAT, Message.user("first question"), "t1")
        result = await agent.run_turn(CHAT, Message.user("second question"), "t2")
        await provider.aclose()
    assert fake.requests[-1].status == 200
    assert "first question" in result.text and "second question" in result.text


# --- a proxy that refuses large bodies --------------------------------------------------------
async def test_a_413_from_a_proxy_in_front_of_the_model_costs_the_image_not_the_chat(tmp_path: Path) -> None:
    # A local server behind nginx (client_max_body_size defaults to 1 MB) refuses a request that
    # carries a photo with 413. That used to fail the turn, and every turn while the photo stayed
    # in the window.
    setup = Setup(tmp_path)
    ref = await setup.store.put_bytes(png(), mime="image/png", name="big.png", width=40, height=30)
    photo = Message(role="user", content=[TextBlock(text="what is this?"), ImageBlock(ref=ref)])
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.error(413, "Request Entity Too Large"), "I cannot see it, sorry.")
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, photo, "t1")
        await provider.aclose()
    assert result.text == "I cannot see it, sorry."
    assert len(fake.requests[0].image_urls()) == 1 and fake.requests[1].image_urls() == []
    assert "big.png not attached" in fake.requests[1].last_user_text()
    async with FakeAnthropic() as fake_a:
        fake_a.queue(FakeAnthropic.error(413, "Request exceeds the maximum allowed number of bytes",
                                         "request_too_large"), "No image here.")
        provider_a = anthropic_provider(fake_a, setup)
        result = await setup.agent(provider_a).run_turn(ChatKey("telegram", "8"), photo, "t1")
        await provider_a.aclose()
    assert result.text == "No image here."
    assert len(fake_a.requests[0].images()) == 1 and fake_a.requests[1].images() == []


# --- malformed tool-call arguments in the history ---------------------------------------------
def _vllm_like(body: dict) -> object:
    """vLLM (and llama.cpp) parse every assistant tool call's arguments as JSON before templating;
    a string that is not JSON fails the whole request."""
    for message in body["messages"]:
        for call in message.get("tool_calls") or []:
            try:
                json.loads(call["function"]["arguments"])
            except ValueError:
                return FakeOpenAI.error(400, "Expecting ',' delimiter: line 1 column 17 (char 16)")
    return "recovered"


async def test_a_cut_off_tool_call_does_not_wedge_a_server_that_parses_arguments(tmp_path: Path) -> None:
    # A small local model (or one stopped by its output limit) writes a call whose arguments are
    # not JSON. The tool layer answers with an error, but the call stays in the history and is
    # sent with every later request.
    setup = Setup(tmp_path)
    async with FakeOpenAI() as fake:
        fake.queue(FakeOpenAI.reply(None, [WireToolCall("read_file", '{"path": "a.txt"')], finish_reason="length"))
        fake.default_responder = _vllm_like  # type: ignore[assignment]
        provider = openai_provider(fake, setup)
        result = await setup.agent(provider).run_turn(CHAT, Message.user("read a.txt"), "t1")
        await provider.aclose()
    assert result.text == "recovered"
    tool = next(m for m in fake.requests[1].json["messages"] if m["role"] == "tool")
    assert "not valid JSON" in tool["content"]
    [call] = next(m for m in fake.requests[1].json["messages"] if m.get("tool_calls"))["tool_calls"]
    assert '{"path": "a.txt"' in json.loads(call["function"]["arguments"]).values()
