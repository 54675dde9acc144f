"""The last line of defence (``fit_to_budget`` / ``fit_step``) really fits the request.

The case a real llama.cpp server found (tests/test_llamacpp_e2e.py, seed 1234): Talon guessed a
32k window, summarized the older turns for that window, then the server stated 1,024 tokens. The
refitted view held only the summary and the newest message (a 100 KB document), each clipped no
shorter than MIN_CLIP_CHARS, and with the system prompt and tool definitions that was ~1,240
estimated tokens against a limit of 948: sent anyway, and refused again.
"""

from __future__ import annotations

from talon.agent.context.pipeline import (
    IDX,
    SUMMARY,
    ContextBudget,
    RequestContext,
    checkpoint_record,
    fit_step,
    fit_to_budget,
)
from talon.agent.context.tokens import estimate_messages
from talon.agent.providers.profiles import ModelProfile
from talon.content import Message, TextBlock

DOCUMENT = "The committee met on Tuesday to review the budget for the new library and the park.\n" * 1200


def _summary_head(chars: int) -> Message:
    record = checkpoint_record("s" * chars, covers=4, archive=None)
    return record.model_copy(update={"meta": {SUMMARY: True}})


def _newest(text: str) -> Message:
    return Message(role="user", content=[TextBlock(text=text)], meta={IDX: 4})


async def test_a_summary_and_a_document_fit_the_stated_window() -> None:
    # The numbers of the failing run: a window of 1,024 with 12 reserved for the reply, and 555
    # estimated tokens of system prompt and tool definitions.
    budget = ContextBudget.for_profile(ModelProfile(1024, 12, False, explicit_output=True))
    assert budget.limit == 948
    ctx = RequestContext(budget=budget, overhead=555)
    view = [_summary_head(1400), _newest("summarize\n" + DOCUMENT)]
    out = await fit_step(view, ctx)
    assert ctx.estimate(out) <= budget.limit
    # Both kept, each as head and tail with the cut said, and the summary still first.
    assert len(out) == 2 and out[0].meta.get(SUMMARY)
    assert out[1].text.startswith("summarize") and "cut to fit the context window" in out[1].text
    assert out[0].text.startswith("[Summary of the earlier conversation")


def test_a_learned_scale_is_applied_to_the_fit() -> None:
    # After the server counted 1.17 tokens per estimated token, the same window holds less.
    budget = ContextBudget.for_profile(ModelProfile(1024, 12, False, explicit_output=True))
    ctx = RequestContext(budget=budget, overhead=555, scale=1.171)
    out = fit_to_budget([_summary_head(1400), _newest(DOCUMENT)], max_tokens=ctx.message_budget(budget.limit))
    assert ctx.estimate(out) <= budget.limit


def test_when_nothing_can_be_cut_further_the_texts_stay_whole_enough_to_read() -> None:
    # A budget below what two minimal previews take: the clipping stops at its floor (no text is
    # cut to nothing) instead of looping, and says how much remains over.
    out = fit_to_budget([_summary_head(5000), _newest(DOCUMENT)], max_tokens=20)
    assert len(out) == 2 and all(len(m.text) >= 200 for m in out)
    assert estimate_messages(out) < 250
