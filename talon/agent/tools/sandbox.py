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
otherwise a warning at start says the process limit does not hold). An address-space limit
holds per process only, so every command also gets a memory cgroup of its own limited to
``TALON_SHELL_MAX_MEMORY`` for all its processes together (cgroup v1 ``memory.limit_in_bytes``,
or v2 ``memory.max``; swap included where accounted): past it the kernel kills a process of the
command, and the shell tool says so. Where no memory cgroup can be made, a warning at start says
the memory limit is per process. A launcher (the host's ``/bin/sh``) writes its own pid into
the command's cgroups and then becomes bwrap, so nothing of the command runs outside them.

The file-size limit is the smaller of ``TALON_SHELL_MAX_FILE_SIZE`` and what is left of the
workspace's size limit (``TALON_WORKSPACE_MAX``), as the shell tool passes it for each command.

``bwrap`` and ``prlimit`` are looked up ONCE, when the shell tool is built at start, in the
system's own directories (never on ``PATH``), and each must be owned by root in directories only
root can write: a ``bwrap`` planted anywhere else is never run.

Per-chat MCP servers run in the same walls (``Sandbox.server_argv``), long-lived, with their
program and Python install bound read-only (``talon.agent.tools.mcp_launch``).

On timeout the sandbox is killed as a whole: bwrap runs with ``--die-with-parent`` as the leader
of its own process group, and killing it ends the PID namespace's init, upon which the kernel
kills every process in the namespace, ``setsid`` or not.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

__all__ = ["SANDBOX_PATH", "SANDBOX_WORKDIR", "CommandCgroup", "Sandbox", "SandboxLimits", "find_sandbox",
           "remove_cgroup", "trusted_program"]

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
    # Memory of the whole command (a memory cgroup, where one can be made) and address space of
    # each of its processes, bytes.
    max_memory: int = 4_000_000_000
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


# --- cgroups per command: pids (for root) and memory (for the whole command) --------------------


def _cgroup_parent(controller: str) -> Path | None:
    """A directory where this process may make cgroups with ``controller`` (``pids``, ``memory``):
    its own cgroup in the v1 hierarchy of that controller, or in the v2 hierarchy when the
    controller is available there (enabled for children if need be)."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    paths = {}
    for line in own:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") or [""]:
            paths[name] = path
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup" and controller in options and controller in paths:
            base = Path(fields[4]) / paths[controller].lstrip("/")
        elif fstype == "cgroup2" and "" in paths:
            base = Path(fields[4]) / paths[""].lstrip("/")
            try:
                if controller not in (base / "cgroup.controllers").read_text().split():
                    continue
                if controller not in (base / "cgroup.subtree_control").read_text().split():
                    (base / "cgroup.subtree_control").write_text(f"+{controller}")
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


def _pids_cgroup_parent() -> Path | None:
    return _cgroup_parent("pids")


def _is_v2(group: Path) -> bool:
    return (group / "cgroup.controllers").exists()


@dataclass(frozen=True)
class CommandCgroup:
    """The cgroups of one command: a pids cgroup (root only) and a memory cgroup, each a
    directory (one directory for both on cgroup v2 when they share a hierarchy)."""

    dirs: tuple[Path, ...]
    memory: Path | None = None

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def oom_kills(self) -> int:
        """How many of the command's processes the kernel killed at the memory limit."""
        if self.memory is None:
            return 0
        name = "memory.events" if _is_v2(self.memory) else "memory.oom_control"
        try:
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0


def _limit_memory(group: Path, limit: int) -> None:
    """The memory limit of a cgroup, swap included where the kernel accounts it."""
    if _is_v2(group):
        (group / "memory.max").write_text(str(limit))
        swap = group / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")
        return
    (group / "memory.limit_in_bytes").write_text(str(limit))
    memsw = group / "memory.memsw.limit_in_bytes"  # only with swap accounting; after the limit above
    if memsw.exists():
        memsw.write_text(str(limit))


@dataclass(frozen=True)
class Sandbox:
    """A bwrap found and tried at start, and the limits every command gets."""

    bwrap: str
    prlimit: str
    limits: SandboxLimits
    # Root only: where each command gets a pids cgroup (see the module docstring), and the
    # host's /bin/sh that moves itself into its cgroups before it becomes bwrap.
    pids_cgroup: Path | None = None
    launcher: str | None = None
    # Where each command gets a memory cgroup limited to ``limits.max_memory`` for all its
    # processes together; None where none can be made (the limit is then per process only).
    memory_cgroup: Path | None = None

    def argv(self, workspace: Path, command: str, *, cgroup: CommandCgroup | Path | None = None,
             max_file_size: int | None = None, read_only_binds: tuple[tuple[str, str], ...] = ()) -> list[str]:
        """The command line that runs ``/bin/sh -c command`` inside the sandbox (in ``cgroup``,
        from ``new_cgroup``; a ``Path`` is one cgroup directory). ``max_file_size`` lowers the
        file-size limit for this command (the workspace's remaining room); ``read_only_binds``
        (host path, path inside) are mounted read-only (the shared skills at ``/skills``)."""
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
        fsize = limits.max_file_size if max_file_size is None else max(0, min(max_file_size, limits.max_file_size))
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for source, target in read_only_binds:
            argv += ["--ro-bind", source, target]
        argv += [
            "--bind", os.fspath(workspace), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR,
            "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_WORKDIR,
            "--setenv", "LANG", "C.UTF-8", "--setenv", "LC_ALL", "C.UTF-8", "--setenv", "TERM", "dumb",
            # Hard limits (soft = hard): nothing inside can raise them without CAP_SYS_RESOURCE.
            self.prlimit, f"--nproc={limits.max_procs}", f"--as={limits.max_memory}",
            f"--cpu={limits.cpu_seconds}", f"--fsize={fsize}", "--",
            "/bin/sh", "-c", command,
        ]
        return self._in_cgroups(argv, cgroup)

    def _in_cgroups(self, argv: list[str], cgroup: CommandCgroup | Path | None) -> list[str]:
        procs = ([cgroup / "cgroup.procs"] if isinstance(cgroup, Path)
                 else cgroup.procs_files if cgroup is not None else [])
        if procs and self.launcher is not None:
            # The shell writes its own pid into each cgroup and then becomes bwrap, so no process
            # of the sandbox ever exists outside them ($0 is how many cgroup.procs files follow).
            script = ('n=$0; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; '
                      'exec "$@"')
            return [self.launcher, "-c", script, str(len(procs)), *map(os.fspath, procs), *argv]
        return argv

    def server_argv(self, workspace: Path, argv: list[str], *, cwd: str = SANDBOX_WORKDIR,
                    read_only: tuple[str, ...] | list[str] = (), extra_binds: tuple[tuple[str, str], ...] = (),
                    cgroup: CommandCgroup | Path | None = None) -> list[str]:
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
        return self._in_cgroups(out, cgroup)

    def new_cgroup(self) -> CommandCgroup | None:
        """Fresh cgroups for one command: pids (root only) and memory, where they can be made;
        give them back to ``remove_cgroup``."""
        made: list[Path] = []
        memory: Path | None = None
        name = f"talon-shell-{secrets.token_hex(8)}"
        try:
            if self.pids_cgroup is not None:
                group = self.pids_cgroup / name
                group.mkdir()
                made.append(group)
                (group / "pids.max").write_text(str(self.limits.max_procs))
            if self.memory_cgroup is not None:
                group = self.memory_cgroup / name
                if group not in made:  # cgroup v2: the same directory as the pids one
                    group.mkdir()
                    made.append(group)
                _limit_memory(group, self.limits.max_memory)
                memory = group
        except BaseException:
            for group in reversed(made):
                with contextlib.suppress(OSError):
                    group.rmdir()
            raise
        return CommandCgroup(tuple(made), memory) if made else None


def remove_cgroup(group: CommandCgroup | Path) -> None:
    """Remove a command's cgroups once their last process is gone (blocking, up to 5 s each)."""
    for directory in group.dirs if isinstance(group, CommandCgroup) else (group,):
        _remove_dir(directory)


def _remove_dir(group: Path) -> None:
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


@lru_cache(maxsize=1)
def _warn_memory_per_process() -> None:
    log.warning(
        "no memory cgroup can be made here, so the shell's memory limit is per process: "
        "TALON_SHELL_MAX_MEMORY limits the address space of each process of a command, not the "
        "command as a whole, and a command with several processes can use more. Give Talon a "
        "writable memory cgroup (cgroup v1 memory or v2 memory.max) to limit the whole command.")


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
        if cgroup is None:
            log.warning(
                "Talon runs as root and cannot make a pids cgroup here: the kernel does not apply "
                "TALON_SHELL_MAX_PROCS to root's processes, so the shell sandbox has no process "
                "limit. Run Talon as a normal user, or give it a writable pids cgroup.")
    memory = _cgroup_parent("memory")
    if memory is None:
        _warn_memory_per_process()
    if cgroup is not None or memory is not None:
        launcher = trusted_program("sh")
    sandbox = Sandbox(bwrap=bwrap, prlimit=prlimit, limits=limits, pids_cgroup=cgroup, launcher=launcher,
                      memory_cgroup=memory)
    problem = _probe(sandbox)
    if problem is not None and memory is not None:
        # A memory cgroup that cannot be used must not cost the shell: per-process limits then.
        without = dataclasses.replace(sandbox, memory_cgroup=None,
                                      launcher=sandbox.launcher if cgroup is not None else None)
        if _probe(without) is None:
            log.warning("the memory cgroup under %s cannot be used (%s)", memory, problem)
            _warn_memory_per_process()
            return without
    if problem is not None:
        raise SandboxUnavailable(problem)
    return sandbox
