"""TALON_TOOLS_BUDGET and find_tools end to end: an MCP server with 60 tools (tests/mcp_test_server.py,
MCP_TEST_EXTRA_TOOLS) behind Talon's Telegram channel and the fake model. The request carries the
tools' definitions within the budget; find_tools finds a named one, offered from the next step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from talon.agent.context.tokens import estimate_tools
from talon.agent.providers.base import ToolSpec
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import FakeTelegram

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
WINDOW = 32_768  # what Talon assumes for a model nobody describes (the fake's)


def specs_of(req: Req) -> list[ToolSpec]:
    return [ToolSpec(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"])
            for t in req.json.get("tools", [])]


async def test_many_mcp_tools_stay_within_the_budget_and_find_tools_brings_one_in(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"svc": {
        "command": sys.executable, "args": [TEST_SERVER, "stdio"], "env": {"MCP_TEST_EXTRA_TOOLS": "60"}}}}))
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MCP_CONFIG=str(config),
                             TALON_APPROVAL="off")
    wanted = "mcp__svc__telescope_summarize"  # the last of the server's tools
    llm.queue(FakeOpenAI.tool_call("find_tools", {"query": "a short report of the telescope records"}),
              FakeOpenAI.tool_call(wanted, {"query": "March"}),
              "The telescope log for March is summarized.",
              FakeOpenAI.tool_call("delegate", {"task": "list the garden records"}), "No garden records.", "None.")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "summarize March's telescope log", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=60)
        tg.push_update(tg.text_message(ALICE, "and the garden?", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "None.", timeout=60)
        every = runtime.agent.tools.specs()
    first, second, third, _, child, _ = llm.requests
    budget = int(WINDOW * settings.tools_budget)
    assert sum(1 for s in every if s.name.startswith("mcp__svc__")) >= 60
    assert estimate_tools(every) > budget  # all of them would not fit
    assert "You are a sub-agent" in str(child.json["messages"][0]["content"])
    for req in (first, second, third, child):  # a sub-agent's requests keep to the budget too
        assert estimate_tools(specs_of(req)) <= budget
    sent = [s.name for s in specs_of(first)]
    assert "find_tools" in sent and wanted not in sent and "read_file" in sent and len(sent) < len(every)
    [found] = [m["content"] for m in second.json["messages"] if m["role"] == "tool"]
    assert wanted in found and '"parameters"' in found
    assert wanted in [s.name for s in specs_of(second)]  # offered from the next step on
    results = [m["content"] for m in third.json["messages"] if m["role"] == "tool"]
    assert any("telescope_summarize answered: March" in r for r in results)
