"""The shell tool's sandbox: bubblewrap (``bwrap``), one fresh sandbox per command.

What a command sees inside:

- the chat's workspace, read-write, at ``/workspace`` (its working directory and ``HOME``);
- the system's programs and libraries read-only (``/usr``, ``/bin``, ``/lib*``, ``/opt``, ``/sbin``)
  and a few harmless files of ``/etc`` (name resolution, certificates, time zone, the dynamic
  linker's cache), nothing else of the host: no ``/home``, ``/root``, ``/srv``, ``/var``, no
  Talon install or ``.env``, no data dir, no other chat's workspace;
- a private ``/tmp``, a minimal ``/dev`` and its own ``/proc``: in its own PID namespace it sees only
  its own processes, so Talon's environment (bot token, API keys) cannot be read through
  ``/proc/<pid>/environ`` or ``ps``;
- no network (its own empty network namespace), no IPC with the host, its own host name;
- an empty environment apart from ``PATH``, ``HOME``, ``LANG``, ``TERM``.

On timeout the sandbox is killed as a whole: bwrap runs with ``--die-with-parent`` as the leader
of its own process group, and killing it ends the PID namespace's init, upon which the kernel
kills every process in the namespace, ``setsid`` or not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

__all__ = ["SANDBOX_WORKDIR", "sandbox_argv", "sandbox_problem"]

SANDBOX_WORKDIR = "/workspace"
_RO_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
_ETC_FILES = (
    "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl",
    "/etc/ca-certificates", "/etc/localtime", "/etc/timezone", "/etc/mime.types", "/etc/nsswitch.conf",
    "/etc/hosts", "/etc/host.conf", "/etc/os-release", "/etc/debian_version", "/etc/magic",
)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def sandbox_argv(workspace: Path, command: str) -> list[str]:
    """The bwrap command line that runs ``/bin/sh -c command`` inside the sandbox."""
    bwrap = _bwrap() or "bwrap"
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--clearenv",
            "--hostname", "talon-sandbox"]
    for directory in _RO_DIRS:
        if os.path.islink(directory):  # merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
    for entry in _ETC_FILES:
        if os.path.exists(entry):
            argv += ["--ro-bind", entry, entry]
    argv += [
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--bind", os.fspath(workspace), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR,
        "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_WORKDIR,
        "--setenv", "LANG", "C.UTF-8", "--setenv", "LC_ALL", "C.UTF-8", "--setenv", "TERM", "dumb",
        "/bin/sh", "-c", command,
    ]
    return argv


@lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Why no sandbox can start here, or None when bwrap works (tried once per process)."""
    if _bwrap() is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        done = subprocess.run(sandbox_argv(probe, "exit 0"), capture_output=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not be run: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap cannot create a sandbox here: {detail[-1] if detail else f'exit {done.returncode}'}"
    return None
