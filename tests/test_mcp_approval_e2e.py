"""``TALON_APPROVAL=mcp:<server>`` matches the configured server name, whatever its tools are called
(issue 27): a dot, a ``__`` and a 60-character name all change in the tool name (``mcp__<server>__
<tool>``, sanitised and cut to 64 characters), so a server guessed back from it was never gated.
Real MCP servers (tests/mcp_test_server.py over stdio) behind the fake Bot API and the scripted
model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from talon.agent.tools.mcp import mcp_tool_name
from tests.conftest import ALICE, make_settings, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.control import buttons, has_keyboard, tool_results
from tests.support.waiting import until

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
LONG = "gated-" + "x" * 54  # 60 characters


async def test_mcp_server_approval_matches_dotted_double_underscore_and_long_server_names(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    gated = ["my.gated", "a__b", LONG]
    server = {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {name: server for name in [*gated, "open"]}}))
    names = {name: mcp_tool_name(name, "echo", set()) for name in [*gated, "open"]}
    assert names["my.gated"] == "mcp__my_gated__echo" and names["a__b"] == "mcp__a__b__echo"
    assert LONG not in names[LONG]  # cut to 64 characters
    calls = [FakeOpenAI.tool_call(names[name], {"text": f"from {name}"}) for name in [*gated, "open"]]
    llm.queue(calls, "Done.")
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MCP_CONFIG=str(config),
                             TALON_APPROVAL=",".join(f"mcp:{name}" for name in gated),
                             TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false",
                             TALON_TELEGRAM_ACK_REACTION="")
    async with running_telegram(settings) as runtime:
        assert runtime.mcp is not None
        registry = runtime.mcp.registry
        await until(lambda: all(name in registry.tools for name in names.values()), 60)  # every server up
        tg.push_update(tg.text_message(ALICE, "use every server", user_id=ALICE))
        for n, name in enumerate(gated, 1):
            prompt = (await tg.wait_for("sendMessage", has_keyboard, count=n, timeout=30))[n - 1]
            assert f"from {name}" in prompt.params["text"]
            tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Deny"],
                                           user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Done.", timeout=60)
    assert len([c for c in tg.sent("sendMessage") if has_keyboard(c)]) == 3  # "open" was not asked about
    results = tool_results(llm.requests[1])
    assert all("denied by the user" in r for r in results[:3])
    assert "echo from pid" in results[3] and "from open" in results[3]
