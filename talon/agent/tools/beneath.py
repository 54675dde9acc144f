"""File operations that cannot be redirected out of a directory, whatever changes under them.

The workspace tools check a path first (``Workspace.resolve``: lexical rules, symlinks resolved,
containment), then do the work here, on the *resolved* path, from a descriptor of the root down:
every directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor,
and the file itself with ``O_NOFOLLOW``. A component that another writer turned into a symbolic
link after the check fails to open (``ELOOP`` / ``ENOTDIR``) instead of being followed, so a
read never returns outside bytes and a write never lands outside. Temp files of atomic writes are
created (``O_EXCL``) and renamed inside the same directory descriptor, so neither the temp file
nor the rename can be pointed elsewhere either. The directory walk and the writes are
``talon.safe_files``, the one way Talon writes under a directory the agent can change.

Files with more than one hard link are refused: a link made inside the root to a file outside it
has an inside path but outside content.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from talon.safe_files import dir_beneath, explain
from talon.errors import LinkedFile, UnsafePath

__all__ = [
    "dir_beneath",
    "open_file_beneath",
]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)


def _check_regular(fd: int, shown: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(errno.EINVAL, f"{shown!r} is not a regular file")
    if st.st_nlink > 1:
        raise LinkedFile(
            errno.EMLINK,
            f"{shown!r} has {st.st_nlink} hard links; files with more than one link are refused "
            "(a link can give a path inside the workspace to a file outside it)",
        )
    return st


def open_file_beneath(root: Path, parts: Sequence[str], *, shown: str = "") -> tuple[int, os.stat_result]:
    """Open ``root/parts...`` for reading, link-free all the way; a regular file with one link.

    Returns the descriptor (blocking, close-on-exec) and its status; the caller closes it.
    """
    if not parts:
        raise UnsafePath(errno.EISDIR, "the workspace itself is not a file")
    shown = shown or "/".join(parts)
    with dir_beneath(root, parts[:-1], shown=shown) as parent:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC | _O_NOCTTY,
                         dir_fd=parent)
        except OSError as exc:
            raise explain(exc, shown, root) from exc
    try:
        st = _check_regular(fd, shown)
        os.set_blocking(fd, True)  # O_NONBLOCK only kept the open from hanging on a FIFO
    except BaseException:
        os.close(fd)
        raise
    return fd, st
