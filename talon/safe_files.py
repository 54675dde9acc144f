"""Files Talon creates under a directory the agent can change: never through a link.

A chat's workspace belongs to its agent, and with the shell tool the agent can put a symbolic
link anywhere in it: at the name of a file Talon is about to write, or in place of a folder
Talon writes into. Whatever Talon itself writes there (voice replies, inbound files, the file
tools' writes) is therefore created from a descriptor of the root down:

- every directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor
  (and made with ``mkdirat`` when missing), so a folder that is, or turns into, a link is refused;
- a new file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` in that directory, so a name that is
  taken, by a link or anything else, is never opened;
- a replaced file is written under a temporary name drawn from ``secrets`` (unguessable, so no
  link can be waiting there) and renamed over its target with ``renameat`` inside the same
  directory descriptor, which replaces a link at the target instead of writing through it.

A refusal is an ``UnsafePath`` (``talon.errors``), logged with the root and the path it concerns.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from talon.errors import UnsafePath

__all__ = ["atomic_write_beneath", "dir_beneath", "new_file_beneath"]

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC


def explain(exc: OSError, shown: str, root: Path | None = None) -> UnsafePath:
    """The refusal for an ``OSError`` met while walking ``shown``; links are logged."""
    if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
        log.warning("refused %r under %s: it is (or changed into) a symbolic link", shown, root or "?")
        return UnsafePath(exc.errno, f"{shown!r} is (or changed into) a symbolic link; it cannot be used")
    if exc.errno == errno.ENOENT:
        return UnsafePath(exc.errno, f"{shown!r} does not exist (it may have just been removed)")
    return UnsafePath(exc.errno or errno.EIO, f"{shown!r} cannot be opened: {exc.strerror or exc}")


@contextmanager
def dir_beneath(root: Path, parts: Sequence[str], *, create: bool = False,
                shown: str = "", mode: int = 0o755) -> Iterator[int]:
    """A descriptor of ``root/parts...`` reached without following any link (created if asked)."""
    shown = shown or "/".join(parts) or "."
    if create:
        # The root itself is Talon's (a workspace, the media root): only below it is the agent's.
        Path(root).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError as exc:
        raise explain(exc, ".", root) from exc
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise UnsafePath(errno.EINVAL, f"{shown!r} has an unusable component {part!r}")
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise UnsafePath(errno.ENOENT, f"directory {shown!r} does not exist") from None
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise explain(exc, shown, root) from exc
            except OSError as exc:
                raise explain(exc, shown, root) from exc
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _open_temp(parent: int, shown: str) -> tuple[int, str]:
    for _ in range(100):
        tmp = f".talon-write-{secrets.token_hex(8)}"
        try:
            return os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=parent), tmp
        except FileExistsError:
            continue
    raise UnsafePath(errno.EEXIST, f"no temporary name free next to {shown!r}")  # pragma: no cover


def atomic_write_beneath(root: Path, parts: Sequence[str], data: bytes, *, shown: str = "",
                         mode: int | None = None, dir_mode: int = 0o755) -> bool:
    """Replace (or create) ``root/parts...`` with ``data`` atomically; True if it existed.

    Parents are created as needed, one link-free step at a time. The file gets ``mode``, or by
    default the mode of the regular file it replaces (0644 for a new one).
    """
    if not parts:
        raise UnsafePath(errno.EISDIR, "the directory itself is not a file")
    shown = shown or "/".join(parts)
    leaf = parts[-1]
    with dir_beneath(root, parts[:-1], create=True, shown=shown, mode=dir_mode) as parent:
        new_mode = 0o644 if mode is None else mode
        existed = False
        try:
            old = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            existed = True
            if stat.S_ISDIR(old.st_mode):
                raise UnsafePath(errno.EISDIR, f"{shown!r} is a directory; give a file path")
            if stat.S_ISLNK(old.st_mode):
                log.warning("replacing the symbolic link at %r under %s instead of writing through it",
                            shown, root)
            elif stat.S_ISREG(old.st_mode) and mode is None:
                new_mode = stat.S_IMODE(old.st_mode)
        fd, tmp = _open_temp(parent, shown)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), new_mode)
                os.fsync(fh.fileno())
            os.replace(tmp, leaf, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise
    return existed


@contextmanager
def new_file_beneath(root: Path, dir_parts: Sequence[str], names: Iterable[str], *,
                     mode: int = 0o644, shown: str = "") -> Iterator[tuple[BinaryIO, str]]:
    """A new file in ``root/dir_parts...`` under the first of ``names`` that is free, open for
    writing, and the name it got. A name taken by anything (a link included) is skipped, never
    opened. Should the block fail, the file is removed again."""
    shown = shown or "/".join(dir_parts) or "."
    with dir_beneath(root, dir_parts, create=True, shown=shown) as parent:
        for name in names:
            if name in ("", ".", "..") or "/" in name:
                raise UnsafePath(errno.EINVAL, f"{name!r} is not a file name")
            try:
                fd = os.open(name, _NEW_FLAGS, mode, dir_fd=parent)
                break
            except FileExistsError:
                continue
        else:
            raise UnsafePath(errno.EEXIST, f"no free file name left in {shown!r}")
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh, name
        except BaseException:
            try:
                os.unlink(name, dir_fd=parent)
            except OSError:
                pass
            raise
