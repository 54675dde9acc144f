"""Approvals bound to what was shown (issue 27, part 3), as the red team broke them, through the
fake Bot API and the scripted model: a call id used again with other arguments, a command padded
out of sight, a call too long for a message, "Always in this chat" from a plain group member, and
/approvals to list and revoke standing grants."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from talon.content import ToolCall
from talon.control.approvals import ApprovalPolicy, call_digest, describe_call, visible
from talon.storage.approvals import Approval, MemoryApprovalStore
from tests.conftest import ALICE, BOB, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import Call, FakeTelegram
from tests.support.control import GROUP, buttons, control_settings, has_keyboard, tool_results
CAROL = 555000333


def text_is(text: str):  # type: ignore[no-untyped-def]
    return lambda c: c.params.get("text") == text


def group_message(tg: FakeTelegram, text: str, user_id: int) -> dict[str, object]:
    if text.startswith("/"):  # a command, named to the bot
        word, _, rest = text.partition(" ")
        text = f"{word}@talon_test_bot {rest}".rstrip()
    else:
        text = f"@talon_test_bot {text}"
    return tg.text_message(GROUP, text, user_id=user_id, chat_type="supergroup")


async def prompts(tg: FakeTelegram, count: int) -> list[Call]:
    return await tg.wait_for("sendMessage", has_keyboard, count=count)


# --- 1. the decision is for the exact call (a digest), never for the model's call id -----------
async def test_a_call_id_used_again_with_other_arguments_is_asked_about_again(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo harmless"}, id="call_same"),
              FakeOpenAI.tool_call("shell", {"command": "echo EVIL > evil.txt"}, id="call_same"),
              "Done.")
    settings = control_settings(tmp_path, tg, llm)
    evil = settings.workspace_dir("telegram", str(ALICE)) / "evil.txt"
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "say something", user_id=ALICE))
        [first] = await prompts(tg, 1)
        assert "echo harmless" in first.params["text"]
        tg.push_update(tg.press_button(ALICE, first.result["message_id"], buttons(first)["Approve"], user_id=ALICE))
        # The same call id, other arguments: a prompt of its own, and nothing ran meanwhile.
        second = (await prompts(tg, 2))[1]
        assert "echo EVIL > evil.txt" in second.params["text"]
        assert not evil.exists()
        [pending] = await runtime.stores.approvals.pending("telegram", str(ALICE))  # type: ignore[union-attr]
        assert pending.call_id == "call_same"
        assert pending.digest == call_digest("shell", json.dumps({"command": "echo EVIL > evil.txt"}))
        tg.push_update(tg.press_button(ALICE, second.result["message_id"], buttons(second)["Deny"], user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("Done."))
    assert not evil.exists()
    assert "harmless" in tool_results(llm.requests[1])[-1]
    assert "denied by the user" in tool_results(llm.requests[2])[-1]


def test_the_digest_covers_the_tool_and_every_argument_in_any_key_order() -> None:
    a = call_digest("shell", '{"command": "ls", "timeout": 5}')
    assert a == call_digest("shell", '{"timeout": 5, "command": "ls"}')
    assert a != call_digest("shell", '{"command": "ls", "timeout": 6}')
    assert a != call_digest("write_file", '{"command": "ls", "timeout": 5}')
    assert call_digest("shell", "not json") != call_digest("shell", "not json ")


# --- 2. the prompt shows the whole call, nothing hidden ----------------------------------------
async def test_a_command_padded_with_700_spaces_shows_its_hidden_part(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    command = "ls -la" + " " * 700 + "; echo HIDDEN > hidden.txt"
    llm.queue(FakeOpenAI.tool_call("shell", {"command": command}), "I did not run it.")
    settings = control_settings(tmp_path, tg, llm)
    hidden = settings.workspace_dir("telegram", str(ALICE)) / "hidden.txt"
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "list the files", user_id=ALICE))
        [prompt] = await prompts(tg, 1)
        shown = prompt.params["text"]
        assert "ls -la⟨700 spaces⟩; echo HIDDEN > hidden.txt" in shown
        assert "   " not in shown  # no run of blanks left to hide anything behind
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Deny"], user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("I did not run it."))
    assert not hidden.exists()


def test_control_zero_width_and_bidi_characters_are_made_visible() -> None:
    tricky = "echo ok\t\x1b[8mrm -rf x\x1b[0m\u200b\u202egnp.exe\r\n\n\n\nls\u00a0\ufeff\u3164"
    shown = visible(tricky)
    assert shown == ("echo ok⟨tab⟩⟨U+001B⟩[8mrm -rf x⟨U+001B⟩[0m⟨U+200B⟩⟨U+202E⟩gnp.exe⟨CR⟩"
                     "⟨4 line breaks⟩\nls⟨U+00A0⟩⟨U+FEFF⟩⟨U+3164⟩")
    assert visible("a\nb  c") == "a⏎\nb  c"  # single breaks and double spaces stay readable
    # Every argument of the call is shown, not only the command.
    described = describe_call(ToolCall(id="1", name="shell", arguments=json.dumps(
        {"command": "ls", "timeout": 5, "env\u200b": "x"})), "shell")
    assert described == "run a shell command:\nls\nenv⟨U+200B⟩: x\ntimeout: 5"


async def test_a_call_too_long_for_a_message_comes_whole_as_a_file_before_the_buttons(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    command = "echo start" + "".join(f" word{i}" for i in range(1200)) + " > long.txt"
    llm.queue(FakeOpenAI.tool_call("shell", {"command": command}), "Written.")
    settings = control_settings(tmp_path, tg, llm)
    made = settings.workspace_dir("telegram", str(ALICE)) / "long.txt"
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "write many words", user_id=ALICE))
        [prompt] = await prompts(tg, 1)
        [document] = tg.sent("sendDocument")
        assert document.time <= prompt.time  # the file is there before anything can be pressed
        whole = document.files["document"].data.decode()
        assert command in whole and whole.startswith("Approval needed: the agent wants to run a shell command")
        assert "too long for one message" in prompt.params["text"] and "approval-" in prompt.params["text"]
        assert len(prompt.params["text"]) <= 4096
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Approve"], user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("Written."))
    assert made.read_text().startswith("start word0 word1")


async def test_a_call_that_cannot_be_shown_whole_is_refused_not_approved_unseen(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    command = "echo start" + "".join(f" word{i}" for i in range(1200)) + " > unseen.txt"
    llm.queue(FakeOpenAI.tool_call("shell", {"command": command}), "It could not be shown.")
    settings = control_settings(tmp_path, tg, llm)
    tg.fail_next("sendDocument", 400, "Bad Request: file upload refused", times=5)
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "write many words", user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("It could not be shown."))
        assert await runtime.stores.approvals.pending("telegram", str(ALICE)) == []  # type: ignore[union-attr]
    assert not [c for c in tg.sent("sendMessage") if has_keyboard(c)]  # nothing to press
    assert not (settings.workspace_dir("telegram", str(ALICE)) / "unseen.txt").exists()
    [result] = tool_results(llm.requests[1])
    assert "Not run: the call is too long to show to the person for approval" in result
    assert any("could not be shown here whole" in t for t in tg.texts(ALICE))


# --- 3. "Always in this chat" is the owner's; /approvals lists and revokes ---------------------
async def test_always_from_a_plain_group_member_is_refused_and_revoke_ends_a_grant(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo one"}), "One.",
              FakeOpenAI.tool_call("shell", {"command": "echo two"}), "Two.",
              FakeOpenAI.tool_call("shell", {"command": "echo three"}), "Three.",
              FakeOpenAI.tool_call("shell", {"command": "echo four"}), "Four.")
    settings = control_settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP))
    tg.set_member_status(GROUP, CAROL, "administrator")
    async with running_telegram(settings) as runtime:
        store = runtime.stores.approvals
        assert store is not None
        # Alice, a plain member, asks and presses "Always": refused, her call still waits.
        tg.push_update(group_message(tg, "first", ALICE))
        [first] = await prompts(tg, 1)
        tg.push_update(tg.press_button(GROUP, first.result["message_id"], buttons(first)["Always in this chat"],
                                       user_id=ALICE, first_name="Alice"))
        [refused] = await tg.wait_for("answerCallbackQuery")
        assert refused.params["show_alert"] is True
        assert "Only an administrator of this group or an approver" in refused.params["text"]
        assert await store.grants("telegram", str(GROUP)) == []
        assert len(await store.pending("telegram", str(GROUP))) == 1
        tg.push_update(tg.press_button(GROUP, first.result["message_id"], buttons(first)["Approve"],
                                       user_id=ALICE, first_name="Alice"))
        await tg.wait_for("sendMessage", text_is("One."))
        # The next member's shell call is still asked about.
        tg.push_update(group_message(tg, "second", BOB))
        second = (await prompts(tg, 2))[1]
        assert "echo two" in second.params["text"]
        # An administrator of the group may grant it (and so answers this call too).
        tg.push_update(tg.press_button(GROUP, second.result["message_id"], buttons(second)["Always in this chat"],
                                       user_id=CAROL, first_name="Carol"))
        await tg.wait_for("sendMessage", text_is("Two."))
        tg.push_update(group_message(tg, "/approvals", BOB))
        [listing] = await tg.wait_for("sendMessage", lambda c: "Always allowed in this chat" in c.params["text"])
        assert "1. the shell (allowed by telegram:" in listing.params["text"]
        tg.push_update(group_message(tg, "third", ALICE))
        await tg.wait_for("sendMessage", text_is("Three."))
        assert len([c for c in tg.sent("sendMessage") if has_keyboard(c)]) == 2  # the third ran unasked
        # Revoked, the next call asks again.
        tg.push_update(group_message(tg, "/approvals revoke 1", BOB))
        await tg.wait_for("sendMessage", text_is("Revoked: the shell asks first again."))
        assert await store.grants("telegram", str(GROUP)) == []
        tg.push_update(group_message(tg, "fourth", ALICE))
        fourth = (await prompts(tg, 3))[2]
        assert "echo four" in fourth.params["text"]
        tg.push_update(tg.press_button(GROUP, fourth.result["message_id"], buttons(fourth)["Deny"], user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("Four."))
        tg.push_update(group_message(tg, "/approvals", BOB))
        await tg.wait_for("sendMessage", text_is("No standing approvals in this chat: every gated call asks first."))


async def test_in_a_private_chat_its_person_may_allow_always_and_revoke_all(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo one"}), "One.",
              FakeOpenAI.tool_call("shell", {"command": "echo two"}), "Two.")
    settings = control_settings(tmp_path, tg, llm)
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "first", user_id=ALICE))
        [first] = await prompts(tg, 1)
        tg.push_update(tg.press_button(ALICE, first.result["message_id"], buttons(first)["Always in this chat"],
                                       user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("One."))
        tg.push_update(tg.text_message(ALICE, "/approvals revoke all", user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("Revoked 1 standing approval: every gated call asks first again."))
        tg.push_update(tg.text_message(ALICE, "second", user_id=ALICE))
        second = (await prompts(tg, 2))[1]
        tg.push_update(tg.press_button(ALICE, second.result["message_id"], buttons(second)["Approve"], user_id=ALICE))
        await tg.wait_for("sendMessage", text_is("Two."))


# --- 4. mcp:<server>: gated also before the server's tools exist --------------------------------
def test_a_turn_begun_before_the_mcp_servers_are_up_still_gates_their_calls(tmp_path: Path) -> None:
    """The tools of an MCP server are registered once it is up, possibly after a turn began: that
    turn's gate must be there all the same (it was left out when no gated tool existed yet)."""
    from talon.control import Control
    from talon.envelope import InboundMessage
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", TALON_APPROVAL="mcp:my.gated")
    control = Control.from_settings(settings)
    control.approvals.tool_names = lambda: {"read_file": None}  # no MCP tool yet
    message = InboundMessage(channel="telegram", chat_id=str(ALICE), sender_id=str(ALICE), message_id="1",
                             text="hi")
    hooks = control.hooks_for(message, prompter=None, chat_id=str(ALICE))  # type: ignore[arg-type]
    assert hooks.approve is not None
    assert control.approvals.policy.kind_of("mcp__my_gated__echo", "my.gated") == "mcp"
    assert control.approvals.policy.kind_of("mcp__my_gated__echo", "my_gated") is None
    assert control.approvals.policy.kind_of("mcp__a__b__echo", "a__b") is None
    assert ApprovalPolicy.parse("mcp:a__b").kind_of("mcp__a__b__echo", "a__b") == "mcp"


# --- the stores: keyed by (turn, call id, digest); grants listed and revoked; older databases ----
@pytest_asyncio.fixture(params=["memory", "embedded", "postgres"])
async def approval_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryApprovalStore()
        return
    if request.param == "embedded":
        from talon.storage.embedded.control import SqliteApprovalStore, open_control_db

        runner = open_control_db(tmp_path / "control.sqlite3")
        try:
            yield SqliteApprovalStore(runner)
        finally:
            runner.close()
        return
    from talon.storage.postgres.control import PgApprovalStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import SCHEMA_VERSION, migrate_schema

    db = AsyncDatabase(request.getfixturevalue("pg_url"), max_size=2)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgApprovalStore(db)
    finally:
        await db.close()


def approval(id: str, command: str, *, call_id: str = "call_1", group: bool = False) -> Approval:
    arguments = json.dumps({"command": command})
    return Approval(id=id, channel="telegram", chat_id="g", platform_chat="g", thread_id=None, requester="alice",
                    turn_id="turn-1", call_id=call_id, tool="shell", kind="shell", summary=command, created=1.0,
                    expires=100.0, digest=call_digest("shell", arguments), in_group=group)


async def test_a_store_keys_approvals_by_turn_call_and_digest(approval_store: Any) -> None:
    first = await approval_store.add(approval("a1", "echo harmless", group=True))
    assert first.id == "a1" and first.in_group is True
    assert await approval_store.decide("a1", "approved", "telegram:alice", 2.0)
    # The resumed turn asking about the same call finds the decision.
    again = await approval_store.add(approval("a2", "echo harmless", group=True))
    assert again.id == "a1" and again.status == "approved"
    # The same call id with other arguments is another approval, pending.
    other = await approval_store.add(approval("a3", "echo EVIL > evil.txt", group=True))
    assert other.id == "a3" and other.status == "pending" and other.digest != first.digest
    assert [a.id for a in await approval_store.pending("telegram", "g")] == ["a3"]
    assert (await approval_store.get("a3")).in_group is True


async def test_a_store_lists_and_revokes_standing_grants(approval_store: Any) -> None:
    assert await approval_store.grants("telegram", "g") == []
    await approval_store.allow_always("telegram", "g", "shell", "telegram:carol (Carol)", 10.0)
    await approval_store.allow_always("telegram", "g", "write_file", "telegram:carol (Carol)", 20.0)
    await approval_store.allow_always("telegram", "other", "shell", "telegram:dan", 5.0)
    assert [g.tool for g in await approval_store.grants("telegram", "g")] == ["shell", "write_file"]
    assert await approval_store.revoke("telegram", "g", "shell") == 1
    assert not await approval_store.always_allowed("telegram", "g", "shell")
    assert await approval_store.always_allowed("telegram", "g", "write_file")
    assert await approval_store.revoke("telegram", "g") == 1
    assert await approval_store.grants("telegram", "g") == []
    assert await approval_store.always_allowed("telegram", "other", "shell")  # another chat's stays


def test_an_embedded_control_database_of_the_first_version_is_upgraded_at_open(tmp_path: Path) -> None:
    from talon.storage.embedded.control import SqliteApprovalStore, open_control_db

    path = tmp_path / "control.sqlite3"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE approvals (
            id TEXT PRIMARY KEY, channel TEXT NOT NULL, chat_id TEXT NOT NULL, platform_chat TEXT NOT NULL,
            thread_id TEXT, requester TEXT NOT NULL, turn_id TEXT NOT NULL, call_id TEXT NOT NULL,
            tool TEXT NOT NULL, kind TEXT NOT NULL, summary TEXT NOT NULL, created REAL NOT NULL,
            expires REAL NOT NULL, status TEXT NOT NULL, decided_by TEXT NOT NULL, decided_at REAL,
            prompt_id TEXT, UNIQUE (turn_id, call_id));
        INSERT INTO approvals VALUES ('old1', 'telegram', 'g', 'g', NULL, 'alice', 'turn-1', 'call_1', 'shell',
            'shell', 'echo harmless', 1.0, 100.0, 'approved', 'telegram:alice', 2.0, '7');
    """)
    old.close()
    runner = open_control_db(path)
    try:
        store = SqliteApprovalStore(runner)
        kept = asyncio.run(store.get("old1"))
        assert kept is not None and kept.status == "approved" and kept.digest == ""
        # An approval of the old key decides no call: a call (with its digest) is asked about anew.
        fresh = asyncio.run(store.add(approval("n1", "echo harmless")))
        assert fresh.id == "n1" and fresh.status == "pending"
    finally:
        runner.close()


async def test_a_postgres_schema_of_version_6_gets_the_digest_key(pg_url: str) -> None:
    from talon.storage.postgres.control import PgApprovalStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import SCHEMA_VERSION, migrate_schema

    db = AsyncDatabase(pg_url, max_size=2)
    await db.open()
    try:
        assert await migrate_schema(db, target=6) == (0, 6)
        await db.execute("INSERT INTO talon_approvals (id, channel, chat_id, platform_chat, thread_id, requester, "
                         "turn_id, call_id, tool, kind, summary, created, expires, status, decided_by) VALUES "
                         "('old1', 'telegram', 'g', 'g', NULL, 'alice', 'turn-1', 'call_1', 'shell', 'shell', "
                         "'echo harmless', 1.0, 100.0, 'approved', 'telegram:alice')")
        assert await migrate_schema(db) == (6, SCHEMA_VERSION)
        store = PgApprovalStore(db)
        kept = await store.get("old1")
        assert kept is not None and kept.status == "approved" and kept.digest == "" and kept.in_group is False
        fresh = await store.add(approval("n1", "echo harmless"))
        assert fresh.id == "n1" and fresh.status == "pending"
    finally:
        await db.close()


# --- WhatsApp: plain text, in parts, or the whole as a file ------------------------------------
async def test_on_whatsapp_a_padded_command_shows_unformatted_and_a_long_call_comes_as_a_file(
        tmp_path: Path, llm: FakeOpenAI) -> None:
    from tests.fakes.twilio import FakeTwilio
    from tests.support.whatsapp import ALICE as WA_ALICE
    from tests.support.whatsapp import post, running, wa_settings
    padded = "ls **-la**" + " " * 700 + "; echo HIDDEN > hidden.txt"
    medium = "echo " + " ".join(f"w{i}" for i in range(700))  # about 3,900 characters: three messages
    huge = "echo " + " ".join(f"word{i}" for i in range(2000))  # past five messages: a file
    llm.queue(FakeOpenAI.tool_call("shell", {"command": padded}), "No.",
              FakeOpenAI.tool_call("shell", {"command": medium}), "No again.",
              FakeOpenAI.tool_call("shell", {"command": huge}), "Not that either.")
    async with FakeTwilio() as twilio:
        settings = wa_settings(tmp_path, twilio, llm, TALON_APPROVAL="shell", TALON_SHELL_TOOL="true",
                               TALON_SHELL_UNSANDBOXED="true", TALON_MODEL_DISCOVERY="false")
        async with running(settings) as (runtime, channel):
            for ask, answer in (("list", "No."), ("medium", "No again."), ("huge", "Not that either.")):
                await post(channel, twilio.inbound_params(WA_ALICE, ask), sign_with=twilio)
                await until_sent(twilio, WA_ALICE, lambda bodies: any("Reply yes" in b for b in bodies[-1:])
                                 or any("Reply yes or no.]" in b for b in bodies[-1:]))
                await post(channel, twilio.inbound_params(WA_ALICE, "no"), sign_with=twilio)
                await until_sent(twilio, WA_ALICE, lambda bodies, answer=answer: answer in bodies)
                await runtime.bridge.idle()
        sent = twilio.sent(to=WA_ALICE)
    bodies = [m.body for m in sent]
    first = bodies[0]
    assert first.startswith("Approval needed: the agent wants to run a shell command:")
    assert "ls **-la**⟨700 spaces⟩; echo HIDDEN > hidden.txt" in first  # exactly, not reformatted
    parts = [b for b in bodies if b.startswith("(part ")]
    assert [p.split(")", 1)[0] for p in parts] == ["(part 1 of 3", "(part 2 of 3", "(part 3 of 3"]
    assert medium in "".join(p.split(")\n", 1)[1] for p in parts)
    assert all(len(b) <= 1600 for b in bodies)
    [document] = [m for m in sent if m.media_urls]
    assert "approval-" in document.media_urls[0]
    assert any("too long for WhatsApp messages" in b and "ALL of it is in the file approval-" in b for b in bodies)
    assert not (settings.workspace_dir("whatsapp", WA_ALICE) / "hidden.txt").exists()


async def until_sent(twilio: Any, to: str, done: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done([m.body for m in twilio.sent(to=to)]):
        assert time.monotonic() < deadline, [m.body[:80] for m in twilio.sent(to=to)]
        await asyncio.sleep(0.02)
