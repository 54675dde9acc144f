"""Talon's own state is private to the user running it: directories 0700, files 0600.

The data dir holds sessions (every message of every chat), the inbox, approvals and attachments.
Modes are given at creation, never left to the umask: ``mkdir(mode=0o700)`` and
``open(..., 0o600)`` can only lose bits to a umask, not gain them, so the result is private under
any umask. SQLite creates its ``-wal`` and ``-shm`` files with the mode of the database file, so
creating that file 0600 first covers them too.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "create_private_file", "open_private", "private_dir"]

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents as 0700 directories; tighten ``path`` itself."""
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
    if (os.stat(path).st_mode & 0o777) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def create_private_file(path: Path) -> None:
    """Make sure ``path`` exists as a 0600 file (before a library such as SQLite opens it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        if (os.fstat(fd).st_mode & 0o777) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` that creates the file 0600."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
