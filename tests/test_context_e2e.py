"""/context end to end: what fills the model's context, part by part, adds up to the request
actually sent (the fake model counts its prompt as the request's JSON over four characters)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram


def to_alice(c) -> bool:
    return str(c.params.get("chat_id")) == str(ALICE)


def tokens(line: str) -> int:
    match = re.search(r"([\d,]+) tokens", line)
    assert match, line
    return int(match.group(1).replace(",", ""))


async def test_context_adds_up_to_the_request_sent(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SKILLS_DIR=str(tmp_path / "skills"))
    skill = tmp_path / "skills" / "tidy"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: tidy\ndescription: Tidy up the workspace\n---\nSteps.\n")
    workspace = settings.workspace_dir("telegram", str(ALICE))
    workspace.mkdir(parents=True)
    (workspace / "AGENTS.md").write_text("Alice prefers short answers. " * 20)
    llm.queue("Hello Alice. " * 40, "Fine.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "hello there, " * 30, user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice)
        tg.push_update(tg.text_message(ALICE, "/context", user_id=ALICE))
        _, shown = await tg.wait_for("sendMessage", to_alice, count=2)
        tg.push_update(tg.text_message(ALICE, "ok", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice, count=3)
    text = shown.params["text"]
    lines = text.splitlines()
    total = int(re.search(r"~([\d,]+) of", lines[0]).group(1).replace(",", ""))
    sent = llm.requests[1].response["usage"]["prompt_tokens"]  # the next request, as the server counted it
    assert abs(total - sent) <= 0.05 * sent, (total, sent, text)
    # (the channel renders the Markdown list: "- " is shown as "• ", indented for each tool)
    parts = {line[2:].split(":")[0].split(" (")[0]: tokens(line) for line in lines[1:] if line.startswith("• ")}
    for name in ("system prompt", "skills list", "memory", "tool definitions", "messages"):
        assert parts.get(name, 0) > 0, (name, text)
    assert abs(sum(parts.values()) - total) <= len(parts)  # the parts add up (each rounded up)
    per_tool = [line.strip() for line in lines if line.startswith("    • ")]
    assert any(line.startswith("• read_file: ") for line in per_tool)
    assert any(line.startswith("• load_skill: ") for line in per_tool)
    assert abs(sum(tokens(line) for line in per_tool) - parts["tool definitions"]) <= len(per_tool)
