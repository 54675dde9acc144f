"""File operations that cannot be redirected out of a directory, whatever changes under them.

The workspace tools check a path first (``Workspace.resolve``: lexical rules, symlinks resolved,
containment), then do the work here, on the *resolved* path, from a descriptor of the root down:
every directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor,
and the file itself with ``O_NOFOLLOW``. A component that another writer turned into a symbolic
link after the check fails to open (``ELOOP`` / ``ENOTDIR``) instead of being followed, so a
read never returns outside bytes and a write never lands outside. Temp files of atomic writes are
created (``O_EXCL``) and renamed inside the same directory descriptor, so neither the temp file
nor the rename can be pointed elsewhere either.

Files with more than one hard link are refused: a link made inside the root to a file outside it
has an inside path but outside content.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "BeneathError",
    "LinkedFile",
    "atomic_write_beneath",
    "dir_beneath",
    "open_file_beneath",
]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC


class BeneathError(OSError):
    """A path that changed, or is not what the tools accept, while being opened."""


class LinkedFile(BeneathError):
    """A regular file with more than one hard link."""


def _explain(exc: OSError, shown: str) -> BeneathError:
    if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
        return BeneathError(exc.errno, f"{shown!r} is (or changed into) a symbolic link; it cannot be used")
    if exc.errno == errno.ENOENT:
        return BeneathError(exc.errno, f"{shown!r} does not exist (it may have just been removed)")
    return BeneathError(exc.errno or errno.EIO, f"{shown!r} cannot be opened: {exc.strerror or exc}")


def _check_regular(fd: int, shown: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise BeneathError(errno.EINVAL, f"{shown!r} is not a regular file")
    if st.st_nlink > 1:
        raise LinkedFile(
            errno.EMLINK,
            f"{shown!r} has {st.st_nlink} hard links; files with more than one link are refused "
            "(a link can give a path inside the workspace to a file outside it)",
        )
    return st


@contextmanager
def dir_beneath(root: Path, parts: Sequence[str], *, create: bool = False,
                shown: str = "") -> Iterator[int]:
    """A descriptor of ``root/parts...`` reached without following any link (created if asked)."""
    shown = shown or "/".join(parts) or "."
    try:
        fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError as exc:
        raise _explain(exc, ".") from exc
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise BeneathError(errno.EINVAL, f"{shown!r} has an unusable component {part!r}")
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise BeneathError(errno.ENOENT, f"directory {shown!r} does not exist") from None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _explain(exc, shown) from exc
            except OSError as exc:
                raise _explain(exc, shown) from exc
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def open_file_beneath(root: Path, parts: Sequence[str], *, shown: str = "") -> tuple[int, os.stat_result]:
    """Open ``root/parts...`` for reading, link-free all the way; a regular file with one link.

    Returns the descriptor (blocking, close-on-exec) and its status; the caller closes it.
    """
    if not parts:
        raise BeneathError(errno.EISDIR, "the workspace itself is not a file")
    shown = shown or "/".join(parts)
    with dir_beneath(root, parts[:-1], shown=shown) as parent:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC | _O_NOCTTY,
                         dir_fd=parent)
        except OSError as exc:
            raise _explain(exc, shown) from exc
    try:
        st = _check_regular(fd, shown)
        os.set_blocking(fd, True)  # O_NONBLOCK only kept the open from hanging on a FIFO
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def atomic_write_beneath(root: Path, parts: Sequence[str], data: bytes, *, shown: str = "") -> bool:
    """Replace (or create) ``root/parts...`` with ``data`` atomically; True if it existed.

    Parents are created as needed, one link-free step at a time. The temp file is made with
    ``O_EXCL | O_NOFOLLOW`` in the same directory descriptor and renamed over the target there,
    which replaces a symbolic link at the target instead of writing through it.
    """
    if not parts:
        raise BeneathError(errno.EISDIR, "the workspace itself is not a file")
    shown = shown or "/".join(parts)
    leaf = parts[-1]
    with dir_beneath(root, parts[:-1], create=True, shown=shown) as parent:
        mode = 0o644
        existed = False
        try:
            old = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            existed = True
            if stat.S_ISDIR(old.st_mode):
                raise BeneathError(errno.EISDIR, f"{shown!r} is a directory; give a file path")
            if stat.S_ISREG(old.st_mode):
                mode = stat.S_IMODE(old.st_mode)
        for _ in range(100):
            tmp = f".talon-write-{secrets.token_hex(8)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                             0o600, dir_fd=parent)
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 100 collisions of 64 random bits
            raise BeneathError(errno.EEXIST, f"no temporary name free next to {shown!r}")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, leaf, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise
    return existed
