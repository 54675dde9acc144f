"""The shell tool's sandbox: bubblewrap (``bwrap``), one fresh sandbox per command.

What a command sees inside:

- the chat's workspace, read-write, at the fixed path ``/workspace`` (its working directory and
  ``HOME``); nothing inside names the workspace's host path except the kernel's mount table
  (``/proc/self/mountinfo``), and that path leads nowhere in the sandbox: nothing of the host
  is mounted there, and Talon never follows a link when it writes (``talon.safe_files``);
- the system's programs and libraries read-only (``/usr``, ``/bin``, ``/lib*``, ``/opt``, ``/sbin``)
  and a few harmless files of ``/etc`` (name resolution, certificates, time zone, the dynamic
  linker's cache), nothing else of the host: no ``/home``, ``/root``, ``/srv``, ``/var``, no
  Talon install or ``.env``, no data dir, no other chat's workspace;
- a private ``/tmp``, a minimal ``/dev`` and its own ``/proc``: in its own PID namespace it sees only
  its own processes, so Talon's environment (bot token, API keys) cannot be read through
  ``/proc/<pid>/environ`` or ``ps``;
- no network (its own empty network namespace), no IPC with the host, its own host name;
- an empty environment apart from ``PATH``, ``HOME``, ``LANG``, ``TERM``.

Whoever runs Talon, root included (common in containers), the command runs as uid/gid 65534 in
its own user namespace with every capability dropped (``--cap-drop ALL``) and no way to make
another user namespace (``--disable-userns``): it cannot remount, mount or change ownership.
Limits on processes, address space, CPU time and file size are set inside the sandbox with
``prlimit`` before the command starts, as hard limits it cannot raise. The kernel does not apply a
process-count rlimit to processes whose host uid is root, so when Talon runs as root every
command also gets a pids cgroup of its own with the same limit (where a pids cgroup can be made;
otherwise a warning at start says the process limit does not hold).

``bwrap`` and ``prlimit`` are looked up ONCE, when the shell tool is built at start, in the
system's own directories (never on ``PATH``), and each must be owned by root in directories only
root can write: a ``bwrap`` planted anywhere else is never run.

Per-chat MCP servers run in the same walls (``Sandbox.server_argv``), long-lived, with their
program and Python install bound read-only (``talon.agent.mcp_launch``).

On timeout the sandbox is killed as a whole: bwrap runs with ``--die-with-parent`` as the leader
of its own process group, and killing it ends the PID namespace's init, upon which the kernel
kills every process in the namespace, ``setsid`` or not.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from talon.errors import SandboxUnavailable

__all__ = ["SANDBOX_PATH", "SANDBOX_WORKDIR", "Sandbox", "SandboxLimits", "find_sandbox", "remove_cgroup",
           "trusted_program"]

log = logging.getLogger(__name__)

SANDBOX_WORKDIR = "/workspace"
SANDBOX_UID = 65534  # "nobody": owns nothing on the host's side of the mapping but the workspace
_RO_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
_ETC_FILES = (
    "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl",
    "/etc/ca-certificates", "/etc/localtime", "/etc/timezone", "/etc/mime.types", "/etc/nsswitch.conf",
    "/etc/hosts", "/etc/host.conf", "/etc/os-release", "/etc/debian_version", "/etc/magic",
)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# Where the sandbox's own programs may come from: the distribution's directories, never PATH
# (which may hold a directory someone else can write, or /usr/local before /usr).
SYSTEM_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits (TALON_SHELL_MAX_PROCS, _MAX_MEMORY, _CPU_SECONDS, _MAX_FILE_SIZE)."""

    max_procs: int = 256  # processes and threads of one command, all together
    max_memory: int = 4_000_000_000  # address space of each process, bytes
    cpu_seconds: int = 300  # CPU time of each process
    max_file_size: int = 1_000_000_000  # largest file a command may write, bytes


def _unsafe_owner(path: str, st: os.stat_result) -> str | None:
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{path} can be written by users other than root (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trusted_program(name: str, dirs: tuple[str, ...] = SYSTEM_DIRS) -> str:
    """The absolute path of ``name`` in ``dirs``, checked: the file and every directory above it
    owned by root and writable by no one else. ``SandboxUnavailable`` says why when none is."""
    refused: list[str] = []
    for directory in dirs:
        candidate = os.path.join(directory, name)
        real = os.path.realpath(candidate)
        try:
            st = os.stat(real)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            continue
        problem = _unsafe_owner(real, st)
        parent = os.path.dirname(real)
        while problem is None:
            problem = _unsafe_owner(parent, os.stat(parent))
            if parent == "/":
                break
            parent = os.path.dirname(parent)
        if problem is None:
            return real
        refused.append(problem)
    if refused:
        raise SandboxUnavailable(f"{name} was found but is not safe to run: {'; '.join(refused)}")
    raise SandboxUnavailable(f"{name} is not installed in {', '.join(dirs)}")


# --- a pids cgroup per command, for Talon running as root ----------------------------------------


def _pids_cgroup_parent() -> Path | None:
    """A directory where this process may make pids cgroups (v1 ``pids`` or v2 with ``pids``)."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    paths = {}
    for line in own:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") or [""]:
            paths[controller] = path
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup" and "pids" in options and "pids" in paths:
            base = Path(fields[4]) / paths["pids"].lstrip("/")
        elif fstype == "cgroup2" and "" in paths:
            base = Path(fields[4]) / paths[""].lstrip("/")
            try:
                if "pids" not in (base / "cgroup.controllers").read_text().split():
                    continue
                if "pids" not in (base / "cgroup.subtree_control").read_text().split():
                    (base / "cgroup.subtree_control").write_text("+pids")
            except OSError:
                continue
        else:
            continue
        probe = base / f"talon-probe-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        return base
    return None


@dataclass(frozen=True)
class Sandbox:
    """A bwrap found and tried at start, and the limits every command gets."""

    bwrap: str
    prlimit: str
    limits: SandboxLimits
    # Root only: where each command gets a pids cgroup (see the module docstring), and the
    # host's /bin/sh that moves itself into it before it becomes bwrap.
    pids_cgroup: Path | None = None
    launcher: str | None = None

    def argv(self, workspace: Path, command: str, *, cgroup: Path | None = None) -> list[str]:
        """The command line that runs ``/bin/sh -c command`` inside the sandbox."""
        argv = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-all",
                "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                "--disable-userns", "--cap-drop", "ALL", "--clearenv", "--hostname", "talon-sandbox"]
        for directory in _RO_DIRS:
            if os.path.islink(directory):  # merged /usr: /bin -> usr/bin
                argv += ["--symlink", os.readlink(directory), directory]
            elif os.path.isdir(directory):
                argv += ["--ro-bind", directory, directory]
        for entry in _ETC_FILES:
            if os.path.exists(entry):
                argv += ["--ro-bind", entry, entry]
        limits = self.limits
        argv += [
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", os.fspath(workspace), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR,
            "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_WORKDIR,
            "--setenv", "LANG", "C.UTF-8", "--setenv", "LC_ALL", "C.UTF-8", "--setenv", "TERM", "dumb",
            # Hard limits (soft = hard): nothing inside can raise them without CAP_SYS_RESOURCE.
            self.prlimit, f"--nproc={limits.max_procs}", f"--as={limits.max_memory}",
            f"--cpu={limits.cpu_seconds}", f"--fsize={limits.max_file_size}", "--",
            "/bin/sh", "-c", command,
        ]
        if cgroup is not None and self.launcher is not None:
            # The shell writes its own pid into the cgroup and then becomes bwrap, so no process
            # of the sandbox ever exists outside it.
            return [self.launcher, "-c", 'echo $$ > "$0" && exec "$@"', os.fspath(cgroup / "cgroup.procs"), *argv]
        return argv

    def server_argv(self, workspace: Path, argv: list[str], *, cwd: str = SANDBOX_WORKDIR,
                    read_only: tuple[str, ...] | list[str] = (), extra_binds: tuple[tuple[str, str], ...] = (),
                    cgroup: Path | None = None) -> list[str]:
        """The command line that runs a long-lived program (a per-chat MCP server) in the same
        walls as a shell command: uid 65534, no capabilities, its own PID, network, IPC and UTS
        namespaces, the workspace read-write at ``/workspace``, ``read_only`` host paths (its
        program and Python install) read-only at the same paths, ``extra_binds`` read-only at the
        given paths, a private ``/tmp``, the same limits. Its environment is the one bwrap is
        started with (the caller builds it from nothing)."""
        out = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-all",
               "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
               "--disable-userns", "--cap-drop", "ALL", "--hostname", "talon-sandbox"]
        for directory in _RO_DIRS:
            if os.path.islink(directory):
                out += ["--symlink", os.readlink(directory), directory]
            elif os.path.isdir(directory):
                out += ["--ro-bind", directory, directory]
        for entry in _ETC_FILES:
            if os.path.exists(entry):
                out += ["--ro-bind", entry, entry]
        out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        covered = [d for d in _RO_DIRS if os.path.isdir(d) and not os.path.islink(d)]
        for path in read_only:
            if not any(path == d or path.startswith(d + "/") for d in covered):
                out += ["--ro-bind", path, path]
        for source, target in extra_binds:
            out += ["--ro-bind", source, target]
        limits = self.limits
        out += [
            "--bind", os.fspath(workspace), SANDBOX_WORKDIR, "--chdir", cwd,
            self.prlimit, f"--nproc={limits.max_procs}", f"--as={limits.max_memory}",
            f"--cpu={limits.cpu_seconds}", f"--fsize={limits.max_file_size}", "--", *argv,
        ]
        if cgroup is not None and self.launcher is not None:
            return [self.launcher, "-c", 'echo $$ > "$0" && exec "$@"', os.fspath(cgroup / "cgroup.procs"), *out]
        return out

    def new_cgroup(self) -> Path | None:
        """A fresh pids cgroup for one command (root only); give it back to ``remove_cgroup``."""
        if self.pids_cgroup is None:
            return None
        group = self.pids_cgroup / f"talon-shell-{secrets.token_hex(8)}"
        group.mkdir()
        try:
            (group / "pids.max").write_text(str(self.limits.max_procs))
        except BaseException:
            group.rmdir()
            raise
        return group


def remove_cgroup(group: Path) -> None:
    """Remove a command's cgroup once its last process is gone (blocking, up to 5 s)."""
    # The sandbox's processes die with its PID namespace's init; rmdir succeeds once the kernel
    # has reaped them (a few milliseconds after the kill).
    deadline = time.monotonic() + 5.0
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("shell sandbox: cgroup %s could not be removed: %s", group, exc)
                return
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), 9)
            except OSError:
                pass
            time.sleep(0.02)


@lru_cache(maxsize=8)
def _probe(sandbox: Sandbox) -> str | None:
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        cgroup = sandbox.new_cgroup()
        try:
            done = subprocess.run(sandbox.argv(probe, "exit 0", cgroup=cgroup), capture_output=True,
                                  timeout=20, stdin=subprocess.DEVNULL)
        finally:
            if cgroup is not None:
                remove_cgroup(cgroup)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not be run: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap cannot create a sandbox here: {detail[-1] if detail else f'exit {done.returncode}'}"
    return None


def find_sandbox(limits: SandboxLimits | None = None) -> Sandbox:
    """The sandbox every shell command of this process runs in; ``SandboxUnavailable`` says why
    none can start here. Called once, when the shell tool is built."""
    limits = limits or SandboxLimits()
    try:
        bwrap = trusted_program("bwrap")
    except SandboxUnavailable as exc:
        if "not installed" in str(exc):
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)") from None
        raise
    prlimit = trusted_program("prlimit")  # util-linux; sets the limits inside the sandbox
    cgroup = launcher = None
    if os.geteuid() == 0:
        cgroup = _pids_cgroup_parent()
        launcher = trusted_program("sh") if cgroup is not None else None
        if cgroup is None:
            log.warning(
                "Talon runs as root and cannot make a pids cgroup here: the kernel does not apply "
                "TALON_SHELL_MAX_PROCS to root's processes, so the shell sandbox has no process "
                "limit. Run Talon as a normal user, or give it a writable pids cgroup.")
    sandbox = Sandbox(bwrap=bwrap, prlimit=prlimit, limits=limits, pids_cgroup=cgroup, launcher=launcher)
    problem = _probe(sandbox)
    if problem is not None:
        raise SandboxUnavailable(problem)
    return sandbox
