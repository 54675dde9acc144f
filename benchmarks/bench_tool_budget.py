"""Tokens sent per turn with 60 MCP tools, before and after TALON_TOOLS_BUDGET, in one run.

Run: ``python benchmarks/bench_tool_budget.py`` (about a minute). Talon runs in process with its
Telegram channel against the loopback fake Bot API and the fake OpenAI-compatible model
(tests/fakes/), with an MCP server of 60 tools (tests/mcp_test_server.py, MCP_TEST_EXTRA_TOOLS=60)
beside Talon's own tools. Each setup answers the same ten plain messages in one chat; the figure
is the input tokens per request as the fake server counts them (the request's JSON over four
characters), and the tool definitions' share of them.

- **before**: ``TALON_TOOLS_BUDGET=1`` (every definition is sent: the behaviour before the budget);
- **after**: the default, 0.15 of the window (32,768 tokens for the fake model), and 0.05.

The saving is what the budget leaves out, so it follows the window: at 0.15 of a 32k window most
of 85 definitions still fit; a 128k window would fit them all (the budget is 19,660 tokens).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from talon.agent.context.tokens import estimate_tools  # noqa: E402
from talon.agent.providers.base import ToolSpec  # noqa: E402
from tests.conftest import ALICE, make_settings, running_telegram  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402
from tests.conftest import TOKEN  # noqa: E402

MESSAGES = 10
SERVER = str(ROOT / "tests" / "mcp_test_server.py")


async def run(budget: str) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        base = Path(tmp)
        config = base / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"svc": {
            "command": sys.executable, "args": [SERVER, "stdio"], "env": {"MCP_TEST_EXTRA_TOOLS": "60"}}}}))
        async with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
            settings = make_settings(base, tg.base_url, llm.base_url, TALON_MCP_CONFIG=str(config),
                                     TALON_TOOLS_BUDGET=budget, TALON_APPROVAL="off")
            async with running_telegram(settings):
                for i in range(MESSAGES):
                    llm.queue(f"Answer {i}.")
                    tg.push_update(tg.text_message(ALICE, f"question number {i}", user_id=ALICE))
                    await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE),
                                      count=i + 1, timeout=120)
            prompt = [r.response["usage"]["prompt_tokens"] for r in llm.requests if r.response]
            tools = [estimate_tools([ToolSpec(t["function"]["name"], t["function"].get("description", ""),
                                              t["function"]["parameters"]) for t in r.json.get("tools", [])])
                     for r in llm.requests]
            return statistics.mean(prompt), statistics.mean(tools), len(llm.requests[0].json.get("tools", []))


async def main() -> None:
    before = await run("1")
    rows = [("before (all)", before)] + [(f"after ({share})", await run(share)) for share in ("0.15", "0.05")]
    for label, (prompt, tools, count) in rows:
        saved = f"; {before[0] - prompt:,.0f} fewer ({(1 - prompt / before[0]) * 100:.0f}%)" if prompt != before[0] else ""
        print(f"{label:>13}: {prompt:,.0f} input tokens per request, {count} tool definitions "
              f"(~{tools:,.0f} tokens, {tools * 100 / prompt:.0f}% of the request){saved}")


if __name__ == "__main__":
    asyncio.run(main())
