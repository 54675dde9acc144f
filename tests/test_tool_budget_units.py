"""Which tool definitions are sent within TALON_TOOLS_BUDGET (talon.agent.tools.find_tools.ToolBudget)."""

from __future__ import annotations

from talon.agent.context.tokens import estimate_tools
from talon.agent.providers.base import ToolSpec
from talon.agent.tools.find_tools import FIND_TOOLS, ToolBudget

PARAMS = {"type": "object", "properties": {"query": {"type": "string"}}}


def spec(name: str, words: int = 30) -> ToolSpec:
    return ToolSpec(name, "does a thing " * (words // 3), PARAMS)


def test_everything_is_sent_while_it_fits_and_find_tools_only_when_it_does_not() -> None:
    budget = ToolBudget(0.15)
    small = [spec("a"), spec("b"), spec(FIND_TOOLS)]
    assert [s.name for s in budget.choose(small, 100_000, "chat")] == ["a", "b"]
    many = [spec(f"t{i:02}") for i in range(60)] + [spec(FIND_TOOLS)]
    chosen = budget.choose(many, 10_000, "chat")
    assert FIND_TOOLS in [s.name for s in chosen]
    assert estimate_tools(chosen) <= 1_500 < estimate_tools(many)
    # In the registry's order, the first ones first while nothing was used yet.
    names = [s.name for s in chosen if s.name != FIND_TOOLS]
    assert names == [f"t{i:02}" for i in range(len(names))]


def test_the_most_used_and_the_found_ones_are_sent_first() -> None:
    budget = ToolBudget(0.15)
    many = [spec(f"t{i:02}") for i in range(60)] + [spec(FIND_TOOLS)]
    budget.uses.update({"t59": 3, "t58": 1})
    budget.found["chat"] = {"t57"}
    names = [s.name for s in budget.choose(many, 10_000, "chat")]
    assert {"t57", "t58", "t59"} <= set(names) and "t40" not in names
    assert names.index("t57") < names.index("t58") < names.index("t59")  # the registry's order, kept stable
    other = [s.name for s in budget.choose(many, 10_000, "another chat")]
    assert "t57" not in other and "t59" in other  # found in one chat only; uses are the run's
