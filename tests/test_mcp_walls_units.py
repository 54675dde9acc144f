"""The pieces of the MCP walls that need no server: the sandbox's command line for a per-chat
server, what it binds read-only, git's guard environment, and the stderr log's rate limit (the
end-to-end proofs are in tests/test_mcp_hardening_e2e.py)."""

from __future__ import annotations

import logging
import os
import sys
from collections import deque
from pathlib import Path

import pytest

from talon.agent.tools.mcp_launch import _read_only_paths, git_guard_env, resolve_command
from talon.agent.tools.mcp_stdio import _StderrLog
from talon.agent.tools.sandbox import Sandbox, SandboxLimits


def test_a_per_chat_servers_command_line_has_the_shells_walls(tmp_path: Path) -> None:
    sandbox = Sandbox(bwrap="/usr/bin/bwrap", prlimit="/usr/bin/prlimit", limits=SandboxLimits(max_procs=64))
    argv = sandbox.server_argv(tmp_path, ["/venv/bin/python", "-P", "-m", "srv"], cwd="/workspace",
                               read_only=["/venv", "/usr/lib/python3"], extra_binds=(("/tmp/g", "/.talon"),))
    joined = " ".join(argv)
    for wall in ("--unshare-all", "--unshare-user --uid 65534 --gid 65534", "--disable-userns", "--cap-drop ALL",
                 "--die-with-parent", "--new-session", "--proc /proc", "--tmpfs /tmp", "--nproc=64"):
        assert wall in joined
    assert "--share-net" not in argv and "--clearenv" not in argv  # bwrap gets the built environment
    assert f"--bind {tmp_path} /workspace" in joined and "--ro-bind /venv /venv" in joined
    assert "--ro-bind /tmp/g /.talon" in joined
    assert "--ro-bind /usr/lib/python3" not in joined  # already inside /usr
    assert argv[-4:] == ["/venv/bin/python", "-P", "-m", "srv"]
    # The read-only binds come after the private /tmp, so a path under /tmp is not hidden by it.
    assert argv.index("--tmpfs") < argv.index("/venv")


def test_what_a_sandboxed_server_gets_read_only_is_its_program_and_its_python() -> None:
    program = resolve_command("mcp-server-git")
    assert program is not None
    paths = _read_only_paths(program, ("--repository", "/workspace"))
    assert sys.prefix in paths and sys.base_prefix in paths
    assert not any(p != q and p.startswith(q + "/") for p in paths for q in paths)  # nothing nested
    assert all(os.path.isabs(p) and p != "/" for p in paths)


def test_gits_guard_turns_off_every_fixed_name_setting_that_runs_a_program() -> None:
    env = git_guard_env("/.talon/bin")
    pairs = {env[f"GIT_CONFIG_KEY_{n}"]: env[f"GIT_CONFIG_VALUE_{n}"] for n in range(int(env["GIT_CONFIG_COUNT"]))}
    assert pairs["core.fsmonitor"] == "false" and pairs["core.hooksPath"] == "/dev/null"
    assert pairs["core.sshCommand"] == "false" and pairs["credential.helper"] == ""
    assert pairs["protocol.allow"] == "never" and pairs["gpg.program"] == "false"
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert env["GIT_PYTHON_GIT_EXECUTABLE"] == "/.talon/bin/git"


def test_a_stderr_flood_is_cut_and_rate_limited_with_the_drop_said(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("talon.mcp.unit")
    caplog.set_level(logging.INFO, logger="talon.mcp.unit")
    tail: deque[str] = deque(maxlen=5)
    log = _StderrLog(logger, tail)
    chunk = (b"e" * 999 + b"\n") * 64
    for _ in range(320):  # 20 MB in 64 KB chunks
        log.feed(chunk)
    log.feed(b"x" * 3_000_000)  # a line with no end, 3 MB
    log.feed(b" still the same line\nlast words\n")
    log.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "talon.mcp.unit"]
    assert sum(len(m) for m in messages) < 200_000
    assert any("bytes of this server's stderr" in m and "not logged" in m for m in messages)
    assert tail[-1] == "last words" and any(t.endswith("[line cut]") for t in tail)
    assert all(len(m) <= 2_000 + len(" [line cut]") or "not logged" in m for m in messages)


def test_the_new_settings_reach_the_manager(tmp_path: Path) -> None:
    import json

    from talon.agent.tools.registry import ToolRegistry
    from talon.runtime import outside_tools
    from talon.storage.embedded.attachments import FileAttachments
    from tests.conftest import make_settings

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"git": {"command": "mcp-server-git",
                                                         "args": ["--repository", "${WORKSPACE}"]}}}))
    settings = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", TALON_MCP_CONFIG=str(config),
                             TALON_MCP_PER_CHAT_MAX=3, TALON_MCP_MAX_RESULT=500_000, TALON_SHELL_MAX_PROCS=99)
    manager = outside_tools(settings, ToolRegistry(), FileAttachments(tmp_path / "store"))
    assert manager is not None
    assert manager.per_chat_max == 3 and manager.max_result == 500_000
    assert manager.launcher.sandbox_limits.max_procs == 99  # per-chat servers get the shell's limits
    manager.launcher.close()
