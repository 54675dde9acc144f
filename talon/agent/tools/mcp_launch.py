"""How Talon starts a stdio MCP server: the command line, the environment, the walls.

Per-chat servers (``${WORKSPACE}`` in the config) run in the shell's bubblewrap sandbox
(``Sandbox.server_argv``): uid/gid 65534 in their own user namespace with every capability
dropped, their own PID namespace (no ``/proc`` of Talon), no network, a private ``/tmp`` (their
``HOME``), the system's programs read-only, the server's program and its Python install (the
virtualenv and its base interpreter) read-only, and the chat's workspace read-write at
``/workspace``; ``${WORKSPACE}`` in the config becomes ``/workspace``. Limits as the shell's
(``prlimit``; a pids cgroup when Talon runs as root, and a memory cgroup for the whole server
where one can be made). Where no sandbox can be made, a per-chat
server is refused (``McpUnavailable`` with the reason), never run on the host.

Shared servers run on the host, as Talon's user, as the operator configured them; where bwrap
can make a PID namespace they run in one of their own (``--unshare-pid --die-with-parent``,
nothing else changed), so every process they start dies with them and with Talon. Elsewhere a
process-group kill plus a scan for a per-start marker in each process's environment ends the
tree.

Every server's environment is built, not inherited: a few harmless variables (``PATH``,
``HOME``, ``LANG``...), then what its config's ``env`` names, then Talon's guards, which the
config cannot weaken: ``PYTHONSAFEPATH=1`` and ``PYTHONNOUSERSITE=1`` (Python never imports
from the working directory or a user site), and git's (``git_guard_env``): no system or
global config, ``GIT_CONFIG_COUNT`` overrides that turn off fsmonitor, hooks, ssh, askpass,
credential helpers, pagers, editors, signing programs and non-local transports, and a ``git``
wrapper first on ``PATH`` that blanks every driver the repository's own config names (filter,
diff and merge drivers, textconv, ``diff.external``, remote upload/receive packs, per-URL
credential helpers, submodule update commands).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from talon.agent.tools.mcp_config import WORKSPACE_VAR, McpServerConfig
from talon.agent.tools.sandbox import SANDBOX_PATH, SANDBOX_WORKDIR, CommandCgroup, Sandbox, SandboxLimits, \
    find_sandbox, remove_cgroup, trusted_program
from talon.errors import McpUnavailable, SandboxUnavailable

__all__ = ["GUARD_MOUNT", "Launch", "Launcher", "git_guard_env", "resolve_command"]

log = logging.getLogger(__name__)

# Where the git wrapper is mounted inside a per-chat sandbox (the sandbox's root is a tmpfs).
GUARD_MOUNT = "/.talon"
TREE_VAR = "TALON_MCP_TREE"

# Overrides given to every git a server runs, by GIT_CONFIG_COUNT (command-line config: it wins
# over the repository's own .git/config). Each names a setting whose value git would execute.
_GIT_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.gitProxy", "false"),
    ("credential.helper", ""),  # an empty value clears the list of helpers
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.ssh.defaultKeyCommand", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("protocol.allow", "never"),
    ("protocol.file.allow", "always"),
    ("uploadpack.packObjectsHook", ""),
)

# Settings named by the repository whose value is a command: blanked by the git wrapper.
_GIT_DRIVERS = (r"^(filter\..+\.(clean|smudge|process)|diff\..+\.(command|textconv)|merge\..+\.driver"
                r"|remote\..+\.(uploadpack|receivepack|proxy)|credential\..+\.helper|submodule\..+\.update"
                r"|diff\.external|core\.alternaterefscommand|pager\..+|alias\..+)$")

_GIT_WRAPPER = """#!/bin/sh
# Talon's git guard: every command a repository's own config names (filter, diff and merge
# drivers, textconv, external diff, remote upload/receive packs, credential helpers...) is
# blanked with a GIT_CONFIG_COUNT override before the real git runs.
real=%(real)s
n=${GIT_CONFIG_COUNT:-0}
# The repository the command will use: git's own global options (-C, --git-dir, --work-tree) are
# followed, in a subshell, before its config is asked for the drivers it names.
names=$(
  while [ $# -gt 0 ]; do
    case "$1" in
      -C) cd "$2" 2>/dev/null || exit 0; shift 2 ;;
      -C*) cd "${1#-C}" 2>/dev/null || exit 0; shift ;;
      --git-dir=*) GIT_DIR=${1#--git-dir=}; export GIT_DIR; shift ;;
      --git-dir) GIT_DIR=$2; export GIT_DIR; shift 2 ;;
      --work-tree=*) GIT_WORK_TREE=${1#--work-tree=}; export GIT_WORK_TREE; shift ;;
      --work-tree) GIT_WORK_TREE=$2; export GIT_WORK_TREE; shift 2 ;;
      -c|--namespace|--super-prefix|--config-env) shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  "$real" config --null --name-only --get-regexp '%(regexp)s' 2>/dev/null | tr '\\0' '\\n'
)
if [ -n "$names" ]; then
  while IFS= read -r name; do
    [ -n "$name" ] || continue
    eval "GIT_CONFIG_KEY_$n=\\$name"
    eval "GIT_CONFIG_VALUE_$n="
    export "GIT_CONFIG_KEY_$n" "GIT_CONFIG_VALUE_$n"
    n=$((n + 1))
  done <<EOF
$names
EOF
fi
GIT_CONFIG_COUNT=$n
export GIT_CONFIG_COUNT
exec "$real" "$@"
"""


_SITECUSTOMIZE = '''"""Talon's guard for MCP servers written in Python (first on PYTHONPATH).

GitPython (used by mcp-server-git) runs a repository's commit hooks itself, not through git, so
git's own core.hooksPath override does not reach them: its hook runner is replaced here by one
that runs nothing and says so on stderr.
"""
import importlib.abc
import sys


def _no_hook(name, index, *args):
    sys.stderr.write("talon: the repository's %s hook was not run (Talon runs no repository hooks)\\n" % name)


class _TalonGitHookGuard(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in ("git.index.fun", "git.index.base"):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if hasattr(module, "run_commit_hook"):
                module.run_commit_hook = _no_hook

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _TalonGitHookGuard())
'''


def git_guard_env(guard_bin: str | None = None) -> dict[str, str]:
    """The environment that keeps git from running anything a repository names."""
    env = {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "false",
        "SSH_ASKPASS": "false",
        "GIT_SSH_COMMAND": "false",
        "GIT_PAGER": "cat",
        "GIT_EDITOR": "false",
        "GIT_SEQUENCE_EDITOR": "false",
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_CONFIG_COUNT": str(len(_GIT_OVERRIDES)),
    }
    for n, (key, value) in enumerate(_GIT_OVERRIDES):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    if guard_bin is not None:
        env["GIT_PYTHON_GIT_EXECUTABLE"] = f"{guard_bin}/git"  # GitPython (mcp-server-git)
    return env


_PYTHON_GUARDS = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
# Passed from Talon's environment to a shared server (what the MCP SDK passes, plus the locale).
_SHARED_INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ")


def resolve_command(command: str) -> str | None:
    """The program to run: on PATH, else beside Talon's own interpreter (a server installed
    in the same virtualenv as Talon, whose bin directory is often not on PATH)."""
    if os.sep in command:
        return command if os.access(command, os.X_OK) else None
    found = shutil.which(command)
    if found:
        return found
    beside = Path(sys.executable).parent / command
    return str(beside) if os.access(beside, os.X_OK) else None


@dataclass
class Launch:
    """One start of one server: what to exec, and what to clean up after it."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    sandboxed: bool = False
    cgroup: CommandCgroup | None = None
    tree_token: str | None = None  # the marker in the environment of every process of the tree
    wrapped: bool = False  # in a PID namespace of its own (its end ends every process in it)
    notes: list[str] = field(default_factory=list)

    async def cleanup(self) -> None:
        """After the process is gone: end any process of the tree left, remove its cgroup."""
        if self.tree_token is not None:
            # A wrapped tree dies with its PID namespace, but the kernel ends the namespace's
            # processes after the wrapper is gone: they are ended here too, and waited for.
            await asyncio.to_thread(kill_marked, self.tree_token)
        if self.cgroup is not None:
            await asyncio.to_thread(remove_cgroup, self.cgroup)


def kill_marked(token: str) -> int:
    """SIGKILL every process whose environment carries ``TALON_MCP_TREE=token``; how many."""
    needle = f"{TREE_VAR}={token}".encode() + b"\0"
    killed = 0
    signalled: list[int] = []
    for _ in range(3):  # a process forking while it is scanned is caught by the next pass
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle not in f.read() + b"\0":
                        continue
                os.kill(int(entry.name), signal.SIGKILL)
                signalled.append(int(entry.name))
                found += 1
            except (OSError, ValueError):
                continue
        killed += found
        if not found:
            break
    _wait_dead(signalled, _DEAD_WAIT_S)
    return killed


_DEAD_WAIT_S = 2.0


def _wait_dead(pids: list[int], timeout: float) -> None:
    """Until each of ``pids`` is gone or a zombie (SIGKILL takes effect a moment after it is
    sent), at most ``timeout`` seconds; runs in a worker thread."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                break  # gone
            if state in (b"Z", b"X"):
                break
            time.sleep(0.01)


def _is_talon_python(program: str) -> bool:
    with contextlib.suppress(OSError):
        return os.path.realpath(program) == os.path.realpath(sys.executable)
    return False


def _read_only_paths(program: str, args: tuple[str, ...]) -> list[str]:
    """What a sandboxed server needs of the host, read-only: its program (and a script's
    interpreter), the virtualenv each lives in and that one's base install, Talon's own Python
    install, and files named in its arguments. Blocking (reads a script's first line)."""
    paths: list[str] = []

    def add(path: str) -> None:
        if path and os.path.isabs(path) and os.path.exists(path) and path not in paths and path != "/":
            paths.append(path)

    def add_program(path: str) -> None:
        for candidate in (path, os.path.realpath(path)):
            add(candidate)
            bindir = os.path.dirname(candidate)
            root = os.path.dirname(bindir)
            config = os.path.join(root, "pyvenv.cfg")
            if os.path.isfile(config):  # a virtualenv: itself and its base interpreter
                add(root)
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    for line in Path(config).read_text().splitlines():
                        key, _, value = line.partition("=")
                        if key.strip() == "home":
                            add(os.path.dirname(value.strip()))

    add_program(program)
    with contextlib.suppress(OSError):
        with open(os.path.realpath(program), "rb") as f:
            first = f.readline(512)
        if first.startswith(b"#!"):
            words = first[2:].decode("utf-8", "replace").split()
            if words:
                add_program(words[0])
    for prefix in (sys.prefix, sys.base_prefix):
        add(prefix)
    for arg in args:
        if os.path.isabs(arg) and os.path.isfile(arg):
            add(arg)
    # A path inside another one on the list is bound with it (bwrap cannot mount on a read-only one).
    dirs = [p for p in paths if os.path.isdir(p)]
    return sorted((p for p in paths if not any(p != d and p.startswith(d.rstrip("/") + "/") for d in dirs)),
                  key=len)


@functools.lru_cache(maxsize=4)
def _pid_namespace_works(bwrap: str) -> str | None:
    """None when bwrap can give a shared server a PID namespace of its own here; else why not."""
    try:
        done = subprocess.run([bwrap, "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--", "true"],
                              capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit {done.returncode}"
    return None


class Launcher:
    """Builds each server's start (``Launch``); owns the git wrapper's directory."""

    def __init__(self, sandbox_limits: SandboxLimits | None = None, *,
                 sandbox: Sandbox | None = None, sandbox_problem: str | None = None) -> None:
        self.sandbox_limits = sandbox_limits or SandboxLimits()
        self._sandbox = sandbox
        self._sandbox_problem = sandbox_problem
        self._sandbox_checked = sandbox is not None or sandbox_problem is not None
        self._reaper: str | None = None
        self._reaper_checked = False
        self._guard_dir: Path | None = None
        self._guard_lock = threading.Lock()  # guard_dir runs in worker threads, maybe two at once
        self._lock = asyncio.Lock()

    @property
    def sandbox_problem(self) -> str | None:
        """Why per-chat servers are refused, once the sandbox was looked up and none works."""
        return self._sandbox_problem

    # --- what the host offers ------------------------------------------------------------------
    async def sandbox(self) -> tuple[Sandbox | None, str | None]:
        """The sandbox per-chat servers run in, or why there is none (looked up once)."""
        async with self._lock:
            if not self._sandbox_checked:
                try:
                    self._sandbox = await asyncio.to_thread(find_sandbox, self.sandbox_limits)
                except SandboxUnavailable as exc:
                    self._sandbox_problem = str(exc)
                    log.warning("per-chat MCP servers are refused: no sandbox can be made here (%s)", exc)
                self._sandbox_checked = True
        return self._sandbox, self._sandbox_problem

    async def _reaper_bwrap(self) -> str | None:
        async with self._lock:
            if not self._reaper_checked:
                self._reaper_checked = True
                try:
                    bwrap = trusted_program("bwrap")
                    problem = await asyncio.to_thread(_pid_namespace_works, bwrap)
                except SandboxUnavailable as exc:
                    bwrap, problem = "", str(exc)
                if problem is None:
                    self._reaper = bwrap
                else:
                    log.info("shared MCP servers run without a PID namespace of their own (%s); their "
                             "process trees are ended by process group and an environment marker", problem)
        return self._reaper

    def guard_dir(self) -> Path:
        """A directory holding the ``git`` wrapper (``bin/git``) and the Python guard
        (``py/sitecustomize.py``), written once."""
        with self._guard_lock:
            return self._make_guard_dir()

    def _make_guard_dir(self) -> Path:
        if self._guard_dir is None:
            real = shutil.which("git", path="/usr/bin:/bin:/usr/local/bin") or "/usr/bin/git"
            root = Path(tempfile.mkdtemp(prefix="talon-mcp-"))
            os.chmod(root, 0o755)
            (root / "bin").mkdir(mode=0o755)
            wrapper = root / "bin" / "git"
            wrapper.write_text(_GIT_WRAPPER % {"real": _sh_quote(real), "regexp": _GIT_DRIVERS})
            wrapper.chmod(0o755)
            (root / "py").mkdir(mode=0o755)
            (root / "py" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
            self._guard_dir = root
        return self._guard_dir

    def close(self) -> None:
        with self._guard_lock:
            if self._guard_dir is not None:
                shutil.rmtree(self._guard_dir, ignore_errors=True)
                self._guard_dir = None

    # --- one start -----------------------------------------------------------------------------
    async def shared(self, config: McpServerConfig) -> Launch:
        assert config.command is not None
        program = _program(config)
        cwd = config.cwd
        if cwd is not None and not Path(cwd).is_dir():
            raise McpUnavailable(f"its working directory {cwd} does not exist")
        guard = await asyncio.to_thread(self.guard_dir)
        env = {k: v for k, v in os.environ.items() if k in _SHARED_INHERITED and not v.startswith("()")}
        env |= config.env
        env |= git_guard_env(str(guard / "bin")) | _PYTHON_GUARDS
        env["PATH"] = f"{guard / 'bin'}{os.pathsep}{env.get('PATH') or os.defpath}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(guard / "py"), config.env.get("PYTHONPATH")) if p)
        token = secrets.token_hex(8)
        env[TREE_VAR] = token
        argv = [program, *_python_flags(program), *config.args]
        reaper = await self._reaper_bwrap()
        if reaper is None:
            return Launch(argv=argv, env=env, cwd=cwd, tree_token=token)
        wrapped = [reaper, "--die-with-parent", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc"]
        if cwd is not None:
            wrapped += ["--chdir", os.path.abspath(cwd)]
        else:
            wrapped += ["--chdir", os.getcwd()]
        return Launch(argv=[*wrapped, "--", *argv], env=env, cwd=cwd, tree_token=token, wrapped=True)

    async def per_chat(self, config: McpServerConfig, workspace: Path) -> Launch:
        """A per-chat server's start in the sandbox; ``McpUnavailable`` where none can be made."""
        assert config.command is not None
        sandbox, problem = await self.sandbox()
        if sandbox is None:
            raise McpUnavailable(f"per-chat MCP servers run only in a sandbox, and none can be made here: {problem}")
        if not workspace.is_dir():
            raise McpUnavailable(f"the chat's workspace {workspace.name} does not exist")
        program = _program(config)
        inside = config.for_workspace(Path(SANDBOX_WORKDIR))
        cwd = inside.cwd or SANDBOX_WORKDIR
        if not (cwd == SANDBOX_WORKDIR or cwd.startswith(SANDBOX_WORKDIR + "/")):
            raise McpUnavailable(f"its working directory {config.cwd} is outside the chat's workspace; a per-chat "
                                 f"server sees only its workspace (give \"cwd\" as {WORKSPACE_VAR} or under it)")
        guard = await asyncio.to_thread(self.guard_dir)
        env = {"PATH": f"{GUARD_MOUNT}/bin:{SANDBOX_PATH}", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "TERM": "dumb"}
        env |= inside.env
        env |= git_guard_env(f"{GUARD_MOUNT}/bin") | _PYTHON_GUARDS
        env["PATH"] = f"{GUARD_MOUNT}/bin:{env.get('PATH') or SANDBOX_PATH}"
        env["PYTHONPATH"] = ":".join(p for p in (f"{GUARD_MOUNT}/py", inside.env.get("PYTHONPATH")) if p)
        read_only = await asyncio.to_thread(_read_only_paths, program, config.args)
        cgroup = await asyncio.to_thread(sandbox.new_cgroup)
        argv = sandbox.server_argv(workspace, [program, *_python_flags(program), *inside.args], cwd=cwd,
                                   read_only=read_only, extra_binds=((os.fspath(guard), GUARD_MOUNT),),
                                   cgroup=cgroup)
        return Launch(argv=argv, env=env, cwd=None, sandboxed=True, cgroup=cgroup, wrapped=True)


def _program(config: McpServerConfig) -> str:
    assert config.command is not None
    program = resolve_command(config.command)
    if program is None:
        raise McpUnavailable(f"the command {config.command!r} was not found (not on PATH, nor beside "
                             f"Talon's Python in {Path(sys.executable).parent})")
    return os.path.abspath(program)


def _python_flags(program: str) -> list[str]:
    """``-P`` for Talon's own Python (3.11+): no working directory or script directory on
    ``sys.path``; other interpreters get ``PYTHONSAFEPATH=1`` in their environment."""
    return ["-P"] if _is_talon_python(program) else []


def _sh_quote(text: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./-]+", text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"
