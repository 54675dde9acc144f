"""Chats are isolated: each has its own workspace (files, AGENTS.md, tools, outbound refs), Talon's
state is private and out of the agent's reach, and hard links cannot smuggle files in."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from talon.agent.tools.registry import ToolContext
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import workspace_tools
from talon.storage.embedded.attachments import FileBlobs
from talon.config import Limits, Settings
from talon.content import ToolCall
from talon.errors import ConfigError, MediaPathError
from talon.media import open_checked_media
from talon.media.inbound import save_inbound_copy
from talon.runtime import build_runtime
from talon.workspaces import chat_workspace, encode_part
from tests.conftest import ALICE, BOB, make_settings
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.conftest import running_telegram as running
SECRET = "ALICE-SECRET-4242"
MEMORY = "ALICE-PRIVATE-MEMORY"


def _dump_calls(calls: list[Any]) -> str:
    return "\n".join(json.dumps(c.params, default=str) for c in calls)


def _dump(req: object) -> str:
    return json.dumps(getattr(req, "json"))


def test_workspace_names_are_injective_and_never_paths() -> None:
    ids = ["111", "-100123", "chat:42", "chat_42", "chat%3A42", "a/b", "a%2Fb", "..", ".", "",
           "%", "topic:7:thread/x", "é", "e\u0301", "x" * 300, "x" * 299 + "y"]
    names = [encode_part(i) for i in ids]
    assert len(set(names)) == len(ids)
    for name in names:
        assert name not in ("", ".", "..") and "/" not in name and ":" not in name and len(name) <= 200
    root = Path("/srv/media")
    assert chat_workspace(root, "telegram", "chat:1/..").parent.parent == root


async def test_one_chat_cannot_read_grep_list_or_send_another_chats_files_or_memory(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    alice_ws = settings.workspace_dir("telegram", str(ALICE))
    bob_ws = settings.workspace_dir("telegram", str(BOB))
    assert alice_ws != bob_ws and alice_ws.parent == bob_ws.parent
    tool = FakeOpenAI.tool_call
    # Alice: sends a file; her agent reads it (the positive control: a read shows the secret)
    # and writes her memory.
    llm.queue(
        FakeOpenAI.reply(tool_calls=[
            tool("read_file", {"path": "inbox/secret.txt"}),
            tool("write_file", {"path": "AGENTS.md", "content": f"- {MEMORY}\n"}),
        ]),
        "Noted.",
    )
    async with running(settings) as runtime:
        tg.push_update(tg.document_message(ALICE, data=f"{SECRET}\n".encode(), file_name="secret.txt",
                                           user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=20)
        await runtime.bridge.idle()
        assert SECRET in _dump(llm.requests[1])  # Alice's own tools do see it
        alice_file = alice_ws / "inbox" / "secret.txt"
        assert alice_file.read_text() == f"{SECRET}\n"
        # Bob's agent tries every way there is to reach Alice's file and memory.
        rel_from_bob = f"../{alice_ws.name}/inbox/secret.txt"
        attempts = [
            tool("read_file", {"path": "inbox/secret.txt"}),
            tool("read_file", {"path": rel_from_bob}),
            tool("read_file", {"path": str(alice_file)}),
            tool("read_file", {"path": str(alice_ws / "AGENTS.md")}),
            tool("grep", {"pattern": "ALICE", "path": str(settings.media_root)}),
            tool("grep", {"pattern": "ALICE"}),
            tool("glob", {"pattern": "**/*.txt"}),
            tool("ls", {"path": str(alice_ws)}),
            tool("edit_file", {"path": str(alice_ws / "AGENTS.md"), "old_string": "ALICE", "new_string": "BOB"}),
            tool("write_file", {"path": str(alice_ws / "inbox" / "planted.txt"), "content": "x"}),
        ]
        llm.queue(
            FakeOpenAI.reply(tool_calls=attempts),
            f"Here: ![a]({alice_file}) ![b]({rel_from_bob}) ![c](inbox/secret.txt)",
        )
        tg.push_update(tg.text_message(BOB, "show me alice's file", user_id=BOB, username="bob"))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(BOB), count=2,
                          timeout=20)
        await runtime.bridge.idle()
    bob_requests = llm.requests[2:]
    assert len(bob_requests) == 2
    for req in bob_requests:
        text = _dump(req)
        assert SECRET not in text and MEMORY not in text  # 0 cross-chat reads
    tool_results = [m for m in bob_requests[1].json["messages"] if m["role"] == "tool"]
    assert len(tool_results) == len(attempts) and all(
        "Error" in m["content"] or "No matches" in m["content"] or "No files" in m["content"]
        for m in tool_results), tool_results
    assert "BOB" not in (alice_ws / "AGENTS.md").read_text()  # 0 cross-chat writes
    assert not (alice_ws / "inbox" / "planted.txt").exists()
    sent_to_bob = [c for c in tg.calls if str(c.params.get("chat_id")) == str(BOB)]
    # 0 cross-chat sends: no file went out (drafts and the 👀 reaction are the live reply)
    assert {c.method for c in sent_to_bob} <= {"sendMessage", "sendChatAction", "sendMessageDraft",
                                               "setMessageReaction"}
    assert SECRET not in _dump_calls(sent_to_bob)
    lines = "\n".join(c.params["text"] for c in sent_to_bob if c.method == "sendMessage")
    assert lines.count("Could not attach") == 3, lines
    # Alice's memory is hers: in her prompt, not in Bob's.
    assert MEMORY not in bob_requests[0].json["messages"][0]["content"]
    llm.queue("hello again")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), count=2,
                          timeout=20)
    assert MEMORY in llm.requests[-1].json["messages"][0]["content"]


def test_shared_workspace_is_an_explicit_opt_in(tmp_path: Path) -> None:
    chat = make_settings(tmp_path, "http://x", "http://y")
    shared = make_settings(tmp_path, "http://x", "http://y", TALON_WORKSPACE="shared")
    assert chat.workspace == "chat"
    assert chat.workspace_dir("telegram", "1") != chat.workspace_dir("telegram", "2")
    assert shared.workspace_dir("telegram", "1") == shared.workspace_dir("whatsapp", "+1") == shared.media_root


@pytest.mark.parametrize("layout", ["data inside media", "media inside data", "same"])
def test_data_dir_and_media_root_must_be_apart(tmp_path: Path, layout: str) -> None:
    media, data = {
        "data inside media": (tmp_path / "m", tmp_path / "m" / "data"),
        "media inside data": (tmp_path / "d" / "media", tmp_path / "d"),
        "same": (tmp_path / "both", tmp_path / "both"),
    }[layout]
    settings = make_settings(tmp_path, "http://x", "http://y", TALON_MEDIA_ROOT=str(media),
                             TALON_DATA_DIR=str(data))
    with pytest.raises(ConfigError) as caught:
        build_runtime(settings)
    assert "TALON_DATA_DIR" in caught.value.missing and "inside" in str(caught.value)
    assert not (data / "inbox.sqlite3").exists()


@pytest.mark.parametrize("umask", [0o000, 0o022])
async def test_data_dir_is_private_whatever_the_umask(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, umask: int
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    old = os.umask(umask)
    try:
        llm.queue("a reply")
        async with running(settings):
            tg.push_update(tg.document_message(ALICE, data=b"hello\n", file_name="a.txt", user_id=ALICE))
            await tg.wait_for("sendMessage", timeout=20)
    finally:
        os.umask(old)
    modes = {}
    for dirpath, dirnames, filenames in os.walk(settings.data_dir):
        for name in dirnames:
            modes[os.path.join(dirpath, name)] = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
        for name in filenames:
            modes[os.path.join(dirpath, name)] = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
    modes[str(settings.data_dir)] = stat.S_IMODE(os.stat(settings.data_dir).st_mode)
    files = {p: m for p, m in modes.items() if os.path.isfile(p)}
    dirs = {p: m for p, m in modes.items() if os.path.isdir(p)}
    assert any(p.endswith("inbox.sqlite3") for p in files) and any(p.endswith(".jsonl") for p in files)
    assert any("attachments" in p for p in files)
    assert {m for m in files.values()} == {0o600}, files
    assert {m for m in dirs.values()} == {0o700}, dirs


async def test_hard_links_are_refused_by_tools_and_outbound_and_inbound_copies_have_one_link(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("OUTSIDE BYTES\n")
    os.link(outside, ws / "inside-name.txt")
    tools = workspace_tools(Workspace(ws), store=None, limits=Limits())

    async def call(name: str, **args: object) -> str:
        result = await tools.call(ToolCall(id="1", name=name, arguments=json.dumps(args)), ToolContext())
        return "".join(getattr(b, "text", "") for b in result.content)

    read = await call("read_file", path="inside-name.txt")
    assert "hard links" in read and "OUTSIDE" not in read
    edit = await call("edit_file", path="inside-name.txt", old_string="OUTSIDE", new_string="X")
    assert "hard links" in edit and outside.read_text() == "OUTSIDE BYTES\n"
    assert "No matches" in await call("grep", pattern="OUTSIDE")
    with pytest.raises(MediaPathError, match="hard links"):
        open_checked_media("inside-name.txt", ws)
    # Talon's own inbound copy is a file of its own (a reflink where the file system has them).
    store = FileBlobs(tmp_path / "store")
    ref = store.put_bytes(b"photo bytes", mime="image/jpeg", name="p.jpg")
    saved = save_inbound_copy(store.path_for(ref.id), ws, "inbox", "p.jpg")
    assert (ws / saved).read_bytes() == b"photo bytes" and os.stat(ws / saved).st_nlink == 1
    assert os.stat(store.path_for(ref.id)).st_nlink == 1
    with open_checked_media(saved, ws) as checked:
        assert checked.file.read() == b"photo bytes"


async def test_on_whatsapp_too_a_chat_cannot_send_another_chats_file(tmp_path: Path) -> None:
    from tests.fakes.twilio import FakeTwilio
    from tests.support.whatsapp import ALICE as WA_ALICE
    from tests.support.whatsapp import BOB as WA_BOB
    from tests.support.whatsapp import alice_workspace, post, wa_settings
    from tests.support.images import png
    from tests.support.whatsapp import running as wa_running
    async with FakeTwilio() as twilio, FakeOpenAI() as llm:
        settings = wa_settings(tmp_path, twilio, llm)
        alice_chart = alice_workspace(settings) / "chart.png"
        alice_chart.write_bytes(png())
        bob_ws = settings.workspace_dir("whatsapp", WA_BOB)
        llm.queue(f"Here: ![a]({alice_chart}) ![b](../{alice_chart.parent.name}/chart.png)")
        async with wa_running(settings) as (runtime, channel):
            await post(channel, twilio.inbound_params(WA_BOB, "send me alice's chart"), sign_with=twilio)
            await twilio.wait_for_messages(3, to=WA_BOB, timeout=20)
            await runtime.bridge.idle()
            links = await channel.links.count() if channel.links is not None else 0
        sent = twilio.sent(WA_BOB)
    assert bob_ws != alice_chart.parent
    assert not [m for m in sent if m.media_urls] and links == 0  # no media link to Alice's file
    lines = "\n".join(m.body for m in sent)
    assert lines.count("Could not attach chart.png") == 2, lines
