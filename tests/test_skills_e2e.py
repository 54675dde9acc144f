"""Skills end to end: Talon with its Telegram channel (the real client against the loopback fake
Bot API) and the fake OpenAI-compatible model, with shared skills and each chat's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from talon.config import Settings
from tests.conftest import ALICE, BOB, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import FakeTelegram

SHARED_BODY = "STEP-ONE: fetch the ledger. STEP-TWO: sum the column."
B_BODY = "BOB-ONLY instructions, never for Alice."


def write_skill(folder: Path, name: str, description: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n")


def system_of(req: Req) -> str:
    first = req.json["messages"][0]
    assert first["role"] == "system"
    return first["content"] if isinstance(first["content"], str) else json.dumps(first["content"])


def tool_results(req: Req) -> list[str]:
    return [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
            for m in req.json["messages"] if m["role"] == "tool"]


def to(chat: int):
    return lambda c: str(c.params.get("chat_id")) == str(chat)


def settings_with_skills(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, **extra: Any) -> Settings:
    return make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SKILLS_DIR=str(tmp_path / "skills"), **extra)


async def test_skills_are_listed_loaded_on_demand_and_kept_per_chat(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = settings_with_skills(tmp_path, tg, llm)
    write_skill(tmp_path / "skills" / "ledger", "ledger-sum", "Sum a ledger column", SHARED_BODY)
    write_skill(settings.workspace_dir("telegram", str(BOB)) / "skills" / "bobs", "bob-secret",
                "Bob's private procedure", B_BODY)
    llm.queue(FakeOpenAI.tool_call("load_skill", {"name": "ledger-sum"}), "Summed.",
              FakeOpenAI.tool_call("load_skill", {"name": "bob-secret"}), "No such skill.",
              "Hi Bob.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "sum my ledger", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
        tg.push_update(tg.text_message(ALICE, "use bob's procedure", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), count=2)
        tg.push_update(tg.text_message(BOB, "hello", user_id=BOB, username="bob"))
        await tg.wait_for("sendMessage", to(BOB))
        tg.push_update(tg.text_message(ALICE, "/skills", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to(ALICE), count=3)
    first, loaded, second, refused, bobs = llm.requests
    # Listed by name and description, the body only once the model asked for it.
    assert "ledger-sum: Sum a ledger column" in system_of(first)
    assert SHARED_BODY not in json.dumps(first.json)
    assert "load_skill" in [t["function"]["name"] for t in first.json["tools"]]
    assert any(SHARED_BODY in r for r in tool_results(loaded))
    # Bob's skill is in Bob's prompt, never in Alice's, and not loadable from her chat.
    for req in (first, loaded, second, refused):
        assert "bob-secret" not in system_of(req) and B_BODY not in json.dumps(req.json)
    [error] = tool_results(refused)[-1:]
    assert "no skill named 'bob-secret'" in error and "ledger-sum" in error
    assert "bob-secret: Bob's private procedure" in system_of(bobs) and "ledger-sum" in system_of(bobs)
    # The stable prefix (base prompt, guide, skills list) is the same bytes in every request.
    assert system_of(first) == system_of(second)
    listing = replies[2].params["text"]
    assert "ledger-sum (shared): Sum a ledger column" in listing and "bob-secret" not in listing


async def test_a_skill_the_agent_writes_is_listed_on_the_next_turn_and_problems_show(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = settings_with_skills(tmp_path, tg, llm)
    (tmp_path / "skills").mkdir()
    write_skill(tmp_path / "skills" / "broken", "", "no name here", "x")
    content = "---\nname: greet-politely\ndescription: How to greet this user\n---\nSay good morning, sir.\n"
    llm.queue(FakeOpenAI.tool_call("write_file", {"path": "skills/greet/SKILL.md", "content": content}),
              "Saved a skill.", "Good morning, sir.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "remember how to greet me", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), count=2)
        tg.push_update(tg.text_message(ALICE, "/skills", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to(ALICE), count=3)
    before, after_write, next_turn = llm.requests
    assert "greet-politely" not in system_of(before) and "greet-politely" not in system_of(after_write)
    assert "- greet-politely: How to greet this user" in system_of(next_turn)
    assert "Say good morning, sir." not in system_of(next_turn)
    listing = replies[2].params["text"]
    assert "greet-politely (this chat): How to greet this user" in listing
    assert "broken: front matter has no name; left out" in listing


async def test_the_example_skill_runs_its_script_in_the_sandbox_read_only(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples" / "skills"
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SKILLS_DIR=str(examples),
                             TALON_SHELL_TOOL=True, TALON_APPROVAL="off")  # approvals: tested elsewhere
    workspace = settings.workspace_dir("telegram", str(ALICE))
    workspace.mkdir(parents=True)
    (workspace / "sales.csv").write_text("region,amount\nnorth,10\nsouth,32\n")
    llm.queue(FakeOpenAI.tool_call("load_skill", {"name": "csv-summary"}),
              FakeOpenAI.tool_call("shell", {"command": "python3 /skills/csv-summary/scripts/summarize.py sales.csv"}),
              FakeOpenAI.tool_call("shell", {"command": "echo x > /skills/csv-summary/planted; ls /skills"}),
              "42 in total.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "summarize sales.csv", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
    *_, last = llm.requests
    loaded, ran, planted = tool_results(last)
    assert "/skills/csv-summary/" in loaded and "scripts/summarize.py" in loaded
    assert "rows: 2" in ran and "amount: sum 42" in ran
    assert "Read-only file system" in planted and "csv-summary" in planted
    assert not (examples / "csv-summary" / "planted").exists()
