"""The agent's file tools (issue 27, parts 1 and 7): no writes into a workspace's .git (or any
path of TALON_PROTECTED_PATHS), whatever the path trick, and no writes past the workspace's size
limit (TALON_WORKSPACE_MAX). Reading .git stays allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.agent.tools.workspace import Workspace, WorkspacePolicy, disk_usage
from talon.agent.tools.workspace_tools import workspace_tools
from talon.config import Settings
from talon.content import ToolCall
from tests.conftest import ALICE, make_settings, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

FSMONITOR = "[core]\n\tfsmonitor = sh pwn.sh\n"


async def call(tools: ToolRegistry, name: str, **args: object) -> tuple[bool, str]:
    result = await tools.call(ToolCall(id="c1", name=name, arguments=json.dumps(args)), ToolContext())
    return result.is_error, "".join(getattr(b, "text", "") for b in result.content)


def repo(tmp_path: Path, policy: WorkspacePolicy | None = None) -> tuple[Path, ToolRegistry]:
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (ws / "sub" / ".git").mkdir(parents=True)
    (ws / "sub" / ".git" / "config").write_text("[core]\n")
    (ws / "a").mkdir()
    return ws, workspace_tools(Workspace(ws, policy), store=None)


@pytest.mark.parametrize("path", [
    ".git/config", "./.git/config", ".git/hooks/pre-commit", ".git/HEAD", ".git/refs/heads/main",
    ".git", "sub/.git/config", "sub/.git/hooks/post-checkout", "a/../.git/hooks/pre-commit",
    "a/.git/config",  # a new .git anywhere is a repository too
])
async def test_write_file_into_git_is_refused(tmp_path: Path, path: str) -> None:
    ws, tools = repo(tmp_path)
    before = (ws / ".git" / "config").read_text()
    is_error, text = await call(tools, "write_file", path=path, content=FSMONITOR)
    assert is_error
    if ".." in path:  # refused before any other rule: '..' is never allowed
        assert "'..' is not allowed" in text, text
    else:
        assert "protected path" in text and "'.git'" in text and "TALON_PROTECTED_PATHS" in text, text
    assert (ws / ".git" / "config").read_text() == before
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws / "a" / ".git").exists()
    assert "fsmonitor" not in (ws / "sub" / ".git" / "config").read_text()


async def test_edit_file_in_git_is_refused_and_reading_stays_allowed(tmp_path: Path) -> None:
    ws, tools = repo(tmp_path)
    is_error, text = await call(tools, "edit_file", path=".git/config", old_string="repositoryformatversion = 0",
                                new_string="repositoryformatversion = 0\n\tfsmonitor = sh pwn.sh")
    assert is_error and "protected path" in text and "'.git'" in text
    assert "fsmonitor" not in (ws / ".git" / "config").read_text()
    is_error, text = await call(tools, "read_file", path=".git/config")
    assert not is_error and "repositoryformatversion" in text
    assert not (await call(tools, "ls", path=".git"))[0]


async def test_a_link_to_git_does_not_lead_into_it(tmp_path: Path) -> None:
    ws, tools = repo(tmp_path)
    (ws / "g").symlink_to(".git")  # planted by a shell command, an archive, a synced folder
    (ws / "cfg").symlink_to(".git/config")
    for path in ("g/config", "g/hooks/pre-commit"):
        is_error, text = await call(tools, "write_file", path=path, content=FSMONITOR)
        assert is_error and "protected path" in text and "'.git'" in text, text
    is_error, text = await call(tools, "edit_file", path="cfg", old_string="[core]", new_string="[core]\n\tfsmonitor = x")
    assert is_error and "protected path" in text
    assert "fsmonitor" not in (ws / ".git" / "config").read_text()
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()


async def test_a_git_link_protects_where_it_leads(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "stuff").mkdir(parents=True)
    (ws / ".git").symlink_to("stuff")  # git reads .git/config = stuff/config
    tools = workspace_tools(Workspace(ws), store=None)
    is_error, text = await call(tools, "write_file", path="stuff/config", content=FSMONITOR)
    assert is_error and "protected path" in text
    assert not (ws / "stuff" / "config").exists()
    assert not (await call(tools, "write_file", path="other.txt", content="fine"))[0]


async def test_configured_protected_paths(tmp_path: Path) -> None:
    policy = WorkspacePolicy(protected=(".git", "secrets/*.key", ".env*"))
    ws, tools = repo(tmp_path, policy)
    for path in ("secrets/a.key", "deep/.envrc", ".env", ".git/config"):
        is_error, text = await call(tools, "write_file", path=path, content="x")
        assert is_error and "protected path" in text, (path, text)
    is_error, _ = await call(tools, "write_file", path="secrets/readme.txt", content="ok")
    assert not is_error  # only what the globs name
    is_error, _ = await call(tools, "write_file", path="deep/secrets/a.key", content="ok")
    assert not is_error  # a rule with '/' is anchored at the workspace's top
    configured: dict[str, object] = {"TALON_PROTECTED_PATHS": ".git, build/*"}
    assert Settings(_env_file=None, **configured).protected_globs == (".git", "build/*")  # type: ignore[call-arg, arg-type]
    assert Settings(_env_file=None).protected_globs == (".git",)  # type: ignore[call-arg]


async def test_writes_past_the_workspace_limit_are_refused_and_shrinking_is_allowed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    tools = workspace_tools(Workspace(ws, WorkspacePolicy(max_bytes=3_000_000)), store=None)
    chunk = "x" * 900_000
    for n in range(3):
        is_error, text = await call(tools, "write_file", path=f"part{n}.txt", content=chunk)
        assert not is_error, text
    is_error, text = await call(tools, "write_file", path="part3.txt", content=chunk)
    assert is_error and "TALON_WORKSPACE_MAX" in text and "not written" in text and "3.0 MB" in text, text
    assert not (ws / "part3.txt").exists()
    # Growing a file by editing it counts too; shrinking one is always allowed.
    is_error, text = await call(tools, "edit_file", path="part0.txt", old_string=chunk, new_string="y" * 1_900_000)
    assert is_error and "TALON_WORKSPACE_MAX" in text
    assert not (await call(tools, "write_file", path="part0.txt", content="small"))[0]
    assert not (await call(tools, "write_file", path="part3.txt", content=chunk))[0]
    assert disk_usage(ws) <= 3_000_000


async def test_a_full_workspace_refuses_writes_until_files_are_removed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(2_000_000))  # put there by the shell, or a sent file
    tools = workspace_tools(Workspace(ws, WorkspacePolicy(max_bytes=1_000_000)), store=None)
    is_error, text = await call(tools, "write_file", path="note.txt", content="hello")
    assert is_error and "TALON_WORKSPACE_MAX" in text
    (ws / "big.bin").unlink()
    assert not (await call(tools, "write_file", path="note.txt", content="hello"))[0]
    unlimited = workspace_tools(Workspace(ws, WorkspacePolicy(max_bytes=0)), store=None)
    assert not (await call(unlimited, "write_file", path="more.txt", content="x" * 2_000_000))[0]


def test_usage_counts_hard_links_once_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge").write_bytes(b"x" * 3_000_000)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"y" * 1_000_000)
    os.link(ws / "f", ws / "f2")
    (ws / "out").symlink_to(outside)
    used = disk_usage(ws)
    assert 1_000_000 <= used < 1_200_000


async def test_in_a_real_chat_the_git_plant_and_a_write_past_the_limit_are_refused(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    # The red team's plant, with the shell off and default approvals, through the runtime: the
    # settings reach each chat's own workspace.
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_WORKSPACE_MAX="40000")
    ws = settings.workspace_dir("telegram", str(ALICE))
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    tool = FakeOpenAI.tool_call
    llm.queue(
        FakeOpenAI.reply(tool_calls=[
            tool("write_file", {"path": ".git/config", "content": FSMONITOR}),
            tool("write_file", {"path": "pwn.sh", "content": "cat /proc/$PPID/environ > leak\n"}),
            tool("write_file", {"path": "big.txt", "content": "x" * 50_000}),
        ]),
        "Done.",
    )
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "set up the repository"))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=20)
        await runtime.bridge.idle()
    seen = json.dumps([r.json for r in llm.requests])  # what the model was told of its three calls
    assert "protected path" in seen and "TALON_PROTECTED_PATHS" in seen
    assert "TALON_WORKSPACE_MAX" in seen
    assert "fsmonitor" not in (ws / ".git" / "config").read_text()
    assert (ws / "pwn.sh").exists() and not (ws / "big.txt").exists()
