"""A lean tool list: when every tool's definition would take more than ``TALON_TOOLS_BUDGET`` of the
window (many MCP tools), only the most used tools' definitions are sent, with ``find_tools``,
which finds the others by what they do (BM25 over names and descriptions, ``bm25s``) and returns
their definitions; a found tool is offered to the chat from the model's next step on.

Which tools are sent: ``find_tools`` always; then the tools this chat found, then the others by
how often they were called in this run (ties: the registry's order, Talon's own tools first),
each while it fits the budget. The list is chosen at the start of a step and sorted in the
registry's order, so it changes only when a tool is found or the ranking changes, and the request's
prefix stays the same between those (prompt caching).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from talon.agent.context.tokens import estimate_tools
from talon.agent.providers.base import ToolSpec
from talon.agent.tools.registry import Tool, ToolContext, ToolResult
from talon.bounded import BoundedMap
from talon.errors import ToolError

log = logging.getLogger(__name__)

FIND_TOOLS = "find_tools"
MAX_FOUND = 5  # definitions one search returns
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    """Names split at '_', '-', '.', camelCase and digits, lower-cased."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return _WORD.findall(spaced.lower())


class ToolIndex:
    """BM25 over the tools' names and descriptions, built again when the set of tools changes."""

    def __init__(self) -> None:
        self._key: tuple[str, ...] = ()
        self._names: list[str] = []
        self._retriever: Any = None

    def search(self, specs: Sequence[ToolSpec], query: str, k: int) -> list[str]:
        import bm25s  # imported on first use: about half a second

        key = tuple(f"{s.name}\0{s.description}" for s in specs)
        if key != self._key:
            self._names = [s.name for s in specs]
            corpus = [" ".join(_words(s.name) * 2 + _words(s.description)) for s in specs]
            retriever = bm25s.BM25()
            retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
            self._retriever, self._key = retriever, key
        if not self._names:
            return []
        tokens = bm25s.tokenize([" ".join(_words(query))], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        try:
            found, scores = self._retriever.retrieve(tokens, k=min(k, len(self._names)), show_progress=False)
        except ValueError:  # no word of the query is in any tool's name or description
            return []
        return [self._names[int(i)] for i, score in zip(found[0], scores[0]) if score > 0]


class ToolBudget:
    """Chooses the definitions sent within the budget and keeps what each chat found."""

    def __init__(self, share: float) -> None:
        self.share = share  # of the window (TALON_TOOLS_BUDGET)
        self.uses: Counter[str] = Counter()  # calls per tool in this run
        self.found: BoundedMap[Any, set[str]] = BoundedMap("agent_found_tools")
        self.index = ToolIndex()
        self._said: tuple[int, int] | None = None

    def tokens(self, window: int) -> int:
        return int(window * self.share)

    def choose(self, specs: list[ToolSpec], window: int, chat: Any) -> list[ToolSpec]:
        """``specs`` as they are when they fit the budget; else the chosen ones and find_tools."""
        budget = self.tokens(window)
        if estimate_tools(specs) <= budget or not any(s.name == FIND_TOOLS for s in specs):
            return [s for s in specs if s.name != FIND_TOOLS]
        order = {s.name: i for i, s in enumerate(specs)}
        found = self.found.get(chat, set()) if chat is not None else set()
        ranked = sorted((s for s in specs if s.name != FIND_TOOLS),
                        key=lambda s: (s.name not in found, -self.uses[s.name], order[s.name]))
        finder = next(s for s in specs if s.name == FIND_TOOLS)
        chosen = [finder]
        used = estimate_tools(chosen)
        for spec in ranked:
            need = estimate_tools([spec])
            if used + need <= budget:
                chosen.append(spec)
                used += need
        said = (len(chosen), len(specs))
        if said != self._said:
            log.info("tool definitions: %d of %d tools sent (~%d of %d tokens, TALON_TOOLS_BUDGET); the rest "
                     "through find_tools", len(chosen), len(specs), used, budget)
            self._said = said
        return sorted(chosen, key=lambda s: order[s.name])


class FindToolsTool(Tool):
    name = FIND_TOOLS
    description = (
        "Search the tools whose definitions were left out of this request (there are more tools than "
        "fit): give a few words about what you need; you get the matching tools' definitions, and "
        "they are offered to you from your next step on."
    )
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What the tool should do, in a few words."}},
        "required": ["query"],
    }

    def __init__(self, registry_specs: Any, budget: ToolBudget, offered_now: Any) -> None:
        self.registry_specs = registry_specs  # () -> every offered tool's spec
        self.budget = budget
        self.offered_now = offered_now  # (chat) -> names sent in the current request

    async def run(self, args: dict[str, Any]) -> ToolResult:
        return await self.invoke(args, ToolContext())

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        import asyncio

        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("query must say in a few words what the tool should do")
        sent = self.offered_now(ctx.chat)
        candidates = [s for s in self.registry_specs() if s.name != FIND_TOOLS and s.name not in sent]
        if not candidates:
            return ToolResult.text("Every tool is already offered to you; no other tools exist.")
        names = await asyncio.to_thread(self.budget.index.search, candidates, query, MAX_FOUND)
        if not names:
            return ToolResult.text(f"No tool matches {query!r}. Try other words (what the tool acts on, "
                                   "or the service it belongs to).")
        if ctx.chat is not None:
            self.budget.found.setdefault(ctx.chat, set()).update(names)
        by_name = {s.name: s for s in candidates}
        parts = [json.dumps({"name": n, "description": by_name[n].description,
                             "parameters": by_name[n].parameters}, ensure_ascii=False) for n in names]
        return ToolResult.text(f"Found {len(names)} tool(s); from your next step they are offered to you "
                               "(call them then):\n" + "\n".join(parts))
