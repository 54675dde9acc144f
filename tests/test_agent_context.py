"""Context pipeline steps, one by one, and the budget / profile arithmetic they rest on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talon.errors import ConfigError

from talon.agent.context.pipeline import (
    IDX,
    SUMMARY,
    ContextBudget,
    ContextPipeline,
    RequestContext,
    ResultFiles,
    checkpoint_record,
    choose_cut,
    clip_trailing_tool_results,
    conversation_view,
    default_steps,
    evict_tool_results,
    fit_to_budget,
    repair_tool_pairs,
    summarize_step,
    tombstone_images,
    truncate_tool_arguments,
)
from talon.agent.providers.profiles import UNKNOWN_MODEL, ModelProfile, lookup_profile, resolve_profile
from talon.agent.context.summary import render_transcript
from talon.agent.context.tokens import IMAGE_TOKENS, estimate_message, estimate_messages
from talon.content import AttachmentRef, ImageBlock, Message, TextBlock, ToolCall

SHA = "ab" * 32


def img(name: str = "cat.jpg", path: str | None = "inbox/cat.jpg") -> ImageBlock:
    return ImageBlock(ref=AttachmentRef(id=SHA, mime="image/jpeg", bytes=250_000, name=name, width=1024,
                                        height=768, path=path))


def user(text: str, *blocks: ImageBlock) -> Message:
    return Message(role="user", content=[TextBlock(text=text), *blocks])


def call(cid: str, name: str = "read_file", args: dict | str | None = None) -> Message:
    arguments = args if isinstance(args, str) else json.dumps(args or {"path": "x"})
    return Message(role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=arguments)])


def result(cid: str, text: str, *blocks: ImageBlock, name: str = "read_file") -> Message:
    return Message(role="tool", tool_call_id=cid, tool_name=name, content=[TextBlock(text=text), *blocks])


def indexed(messages: list[Message]) -> list[Message]:
    return conversation_view(messages)


# --- profiles and budget --------------------------------------------------------------------
def test_profiles_known_unknown_and_overrides() -> None:
    assert lookup_profile("openai", "gpt-4o-mini-2024-07-18").context_window == 128_000
    assert lookup_profile("openai", "gpt-4.1-mini").context_window > 1_000_000
    assert lookup_profile("openai", "o3-mini").vision is False and lookup_profile("openai", "o3").vision
    assert lookup_profile("openai", "o4-mini").reasoning
    assert lookup_profile("anthropic", "claude-3-5-haiku-latest").vision
    assert lookup_profile("openai", "openrouter/anthropic/claude-3.5-sonnet").context_window == 200_000
    assert lookup_profile("openai", "llama3.1:8b").vision is False
    assert lookup_profile("openai", "llama3.2-vision:11b").vision is True
    assert lookup_profile("openai", "qwen2.5vl:7b").vision is True
    assert lookup_profile("anthropic", "claude-some-future-model").context_window == 200_000
    unknown = lookup_profile("openai", "my-finetune")
    assert unknown == UNKNOWN_MODEL and unknown.context_window == 32 * 1024 and not unknown.known
    tuned = resolve_profile("openai", "gpt-4o", context_window=50_000, max_output=2000, vision="false")
    assert (tuned.context_window, tuned.max_output, tuned.vision) == (50_000, 2000, False)
    # An explicit reply length is honoured exactly (64 stays 64), or refused when it cannot fit.
    assert resolve_profile("openai", "x", context_window=4000, max_output=64).max_output == 64
    with pytest.raises(ConfigError, match="TALON_MODEL_MAX_OUTPUT=10000 does not fit"):
        resolve_profile("openai", "x", context_window=4000, max_output=10_000)
    assert ContextBudget.for_profile(resolve_profile("openai", "x", context_window=4000,
                                                     max_output=2500)).max_output == 2500
    # A default one is fitted to a small window (a quarter of it, at least 256).
    assert resolve_profile("openai", "x", context_window=2048).max_output == 512


def test_budget_follows_the_profile() -> None:
    budget = ContextBudget.for_profile(ModelProfile(100_000, 8_000, True))
    assert budget.trigger == 85_000 and budget.keep_tail == 10_000
    assert budget.limit == 100_000 - 8_000 - 2_000
    small = ContextBudget.for_profile(ModelProfile(8_192, 2_048, False))
    assert small.trigger == small.limit < 8_192 - 2_048


def test_images_count_as_a_fixed_estimate() -> None:
    big = ImageBlock(ref=AttachmentRef(id=SHA, mime="image/jpeg", bytes=5_000_000))
    assert estimate_message(Message(role="user", content=[big])) == IMAGE_TOKENS + 4


def test_overflow_limit_parsing() -> None:
    from talon.agent.providers.refusals import stated_window as overflow_limit

    assert overflow_limit("This model's maximum context length is 8192 tokens. However...") == 8192
    assert overflow_limit("prompt is too long: 210000 tokens > 200000 maximum") == 200_000
    assert overflow_limit("context too long") is None


# --- the view -------------------------------------------------------------------------------
def test_view_starts_at_the_last_checkpoint_and_never_carries_checkpoints() -> None:
    log = [user("one"), Message.assistant("a1"), user("two"), Message.assistant("a2")]
    log.append(checkpoint_record("summary of one", covers=2, archive=Path("/x/main.archive.md")))
    log += [user("three")]
    view = conversation_view(log)
    assert [m.text.split("\n")[0][:30] for m in view][1:] == ["two", "a2", "three"]
    assert view[0].meta[SUMMARY] and "summary of one" in view[0].text and "/x/main.archive.md" in view[0].text
    assert [m.meta[IDX] for m in view[1:]] == [2, 3, 5]


# --- 1. pairs -------------------------------------------------------------------------------
def test_repair_gives_every_call_a_result_and_drops_orphans() -> None:
    log = [user("go"), call("c1"), user("again"), result("zz", "orphan"), call("c2"), result("c2", "ok")]
    fixed = repair_tool_pairs(log)
    assert [m.role for m in fixed] == ["user", "assistant", "tool", "user", "assistant", "tool"]
    assert fixed[2].tool_call_id == "c1" and "interrupted" in fixed[2].text and fixed[2].meta["error"]


# --- 2. long arguments ----------------------------------------------------------------------
def test_old_write_arguments_are_cut_but_stay_json() -> None:
    content = "x" * 10_000
    log = indexed([
        user("write it"), call("c1", "write_file", {"path": "a.txt", "content": content}), result("c1", "ok", name="write_file"),
        call("c2", "read_file", {"path": "z" * 3000}), result("c2", "ok"),
        user("now again"), call("c3", "write_file", {"path": "b.txt", "content": content}),
    ])
    out = truncate_tool_arguments(log, max_chars=2000)
    old = json.loads(out[1].tool_calls[0].arguments)
    assert old["path"] == "a.txt" and len(old["content"]) < 1000 and "more characters cut" in old["content"]
    assert out[3].tool_calls[0].arguments == log[3].tool_calls[0].arguments  # not a write/edit tool
    assert out[6].tool_calls[0].arguments == log[6].tool_calls[0].arguments  # the current turn
    assert content in log[1].tool_calls[0].arguments  # input untouched
    broken = truncate_tool_arguments([call("c", "edit_file", "{" + "y" * 5000), user("next")], max_chars=2000)
    assert "_truncated_arguments" in json.loads(broken[0].tool_calls[0].arguments)


# --- 3. large results -----------------------------------------------------------------------
def test_large_tool_results_are_evicted_to_a_file_with_a_preview(tmp_path: Path) -> None:
    big = "\n".join(f"row {i}: " + "v" * 50 for i in range(1, 5001))
    log = [user("dump"), call("c1"), result("c1", big, img()), result("c2", "small")]
    out = evict_tool_results(log, max_tokens=1000, results=ResultFiles(tmp_path / "results"))
    preview = out[2].text
    saved = next((tmp_path / "results").iterdir())
    assert saved.read_text() == big
    assert str(saved) in preview and "5,000 lines" in preview
    assert "     1\trow 1:" in preview and "  5000\trow 5000:" in preview and "row 2500:" not in preview
    assert len(preview) <= 2000 + 400
    assert out[2].images() and out[3] is log[3]
    # Idempotent: the same output maps to the same file.
    again = evict_tool_results(log, max_tokens=1000, results=ResultFiles(tmp_path / "results"))
    assert again[2].text == preview and len(list((tmp_path / "results").iterdir())) == 1


def test_clip_trailing_tool_results(tmp_path: Path) -> None:
    log = [user("q"), call("c1"), result("c1", "a" * 8000, img()), result("c2", "short")]
    out, changed = clip_trailing_tool_results(log, max_tokens=200, results=ResultFiles(tmp_path))
    assert changed and len(out[2].text) < 2000 and not out[2].images() and "no longer attached" in out[2].text
    assert out[3].text == "short"
    _, unchanged = clip_trailing_tool_results([user("q")], max_tokens=200, results=ResultFiles(tmp_path))
    assert not unchanged


# --- 4. images ------------------------------------------------------------------------------
def test_old_images_become_tombstones_naming_the_file() -> None:
    log = [user(f"turn {i}", img(f"p{i}.jpg", f"inbox/p{i}.jpg")) for i in range(6)]
    out = tombstone_images(log, keep_turns=3, max_images=20)
    assert [bool(m.images()) for m in out] == [False, False, False, True, True, True]
    stone = out[0].content[1].text
    assert "inbox/p0.jpg" in stone and "1024x768" in stone and "244 KB" in stone and SHA[:12] in stone
    assert 'read_file with path "inbox/p0.jpg"' in stone
    capped = tombstone_images(log, keep_turns=10, max_images=2)
    assert [bool(m.images()) for m in capped] == [False] * 4 + [True, True]
    nowhere = tombstone_images([user("x", img(path=None)), user("y"), user("z"), user("w")], keep_turns=1)
    assert "ask the user to send it again" in nowhere[0].content[1].text


# --- 5. summaries ---------------------------------------------------------------------------
def test_cut_never_separates_a_call_from_its_results() -> None:
    log = indexed([user("a" * 400), call("c1"), result("c1", "r" * 4000), result("c2", "r" * 4000),
                   Message.assistant("done"), user("b" * 400)])
    cut = choose_cut(log, keep_tokens=1500)
    assert cut is not None and log[cut].role != "tool"
    assert cut == 4  # the tool group is too big for the tail, so it is summarized whole
    assert choose_cut(indexed([user("only")]), keep_tokens=10) is None


async def test_summarize_step_archives_and_records_a_checkpoint(tmp_path: Path) -> None:
    history = [user(f"message {i} " + "w" * 400) for i in range(30)]
    persisted: list[Message] = []
    seen: list[str] = []

    async def persist(message: Message) -> None:
        persisted.append(message)

    async def summarize(previous: str | None, messages: list[Message]) -> str:
        seen.append(render_transcript(messages))
        return f"SUMMARY of {len(messages)} messages"

    archive = tmp_path / "ctx" / "main.archive.md"
    ctx = RequestContext(
        budget=ContextBudget.for_profile(ModelProfile(4000, 500, True)),
        archive=archive, summarize=summarize, persist=persist, results=ResultFiles(tmp_path),
    )
    view = conversation_view(history + [user("with image", img())])
    out = await summarize_step(view, ctx)
    assert out[0].meta[SUMMARY] and "SUMMARY of" in out[0].text and str(archive) in out[0].text
    [record] = persisted
    assert record.meta["checkpoint"] == "summary" and record.meta["covers"] == out[1].meta[IDX]
    text = archive.read_text()
    assert "message 0 " in text and "<!-- talon:archived 0-" in text
    assert ctx.estimate(out) < ctx.budget.trigger
    # Summary input: images are described, never encoded.
    assert "base64" not in seen[0]
    transcript = render_transcript([user("look", img())])
    assert "[image inbox/cat.jpg 1024x768]" in transcript


async def test_below_the_trigger_nothing_is_summarized(tmp_path: Path) -> None:
    async def summarize(previous: str | None, messages: list[Message]) -> str:
        raise AssertionError("must not be called")

    async def persist(message: Message) -> None:
        raise AssertionError("nothing to record")

    ctx = RequestContext(budget=ContextBudget.for_profile(ModelProfile(100_000, 4000, True)),
                         summarize=summarize, persist=persist)
    view = conversation_view([user("hi"), Message.assistant("hello"), user("more")])
    assert await summarize_step(view, ctx) == view


# --- 6. the guard ---------------------------------------------------------------------------
def test_fit_to_budget_always_fits() -> None:
    log = indexed([
        user("old " + "o" * 20_000, img()), call("c1"), result("c1", "t" * 30_000),
        Message.assistant("fine"), user("new " + "n" * 40_000, img()),
    ])
    out = fit_to_budget(log, max_tokens=3000)
    assert estimate_messages(out) <= 3000
    assert out[-1].text.startswith("new ") and "cut to fit" in out[-1].text
    roles = [m.role for m in out]
    for i, role in enumerate(roles):  # pairs intact
        if role == "tool":
            assert roles[i - 1] in ("assistant", "tool")
    tight = fit_to_budget(log, max_tokens=600)
    assert estimate_messages(tight) <= 1200 and "left out of this request" in tight[0].text


async def test_meta_never_reaches_the_model(tmp_path: Path) -> None:
    from talon.agent.loop import Agent
    from talon.agent.providers.base import ModelRequest, ModelResponse, Provider
    from talon.storage.sessions import ChatKey
    from talon.storage.embedded.sessions import JsonlSessions

    class Recorder(Provider):
        name, model = "openai", "gpt-4o"
        requests: list[ModelRequest] = []

        async def complete(self, request: ModelRequest) -> ModelResponse:
            self.requests.append(request)
            return ModelResponse(message=Message.assistant("ok"))

    agent = Agent(Recorder(), JsonlSessions(tmp_path))
    await agent.run_turn(ChatKey("t", "1"), Message.user("hi", secret_sender="555"), turn_id="t1")
    await agent.run_turn(ChatKey("t", "1"), Message.user("again"), turn_id="t2")
    for request in Recorder.requests:
        assert all(m.meta == {} for m in request.messages)


def test_pipeline_has_the_steps_in_cost_order() -> None:
    names = [s.__name__ for s in default_steps()]
    assert names == ["repair_step", "truncate_step", "evict_step", "tombstone_step", "summarize_step", "fit_step"]
    assert isinstance(ContextPipeline(default_steps()), ContextPipeline)


@pytest.mark.parametrize("window", [8_192, 32_768, 200_000])
def test_budget_leaves_room_after_a_summary(window: int) -> None:
    budget = ContextBudget.for_profile(ModelProfile(window, 4096, True))
    assert budget.summary_tokens + budget.keep_tail < budget.trigger
