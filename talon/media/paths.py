"""Containment for outbound files: only regular files inside the media root may be sent.

The path comes from model output, so it is hostile by default. Checking happens in two phases:

1. ``check_media_path`` validates the string (no URL, ``~``, NUL, ``..``), resolves it with every
   symlink followed, requires the result to be a regular file inside the resolved root, and
   records the file's identity (device, inode).
2. ``open_checked`` opens that resolved path again one component at a time from a descriptor of the
   root, refusing symlinks at every step (``O_NOFOLLOW``) and FIFOs' blocking open (``O_NONBLOCK``),
   then compares the opened file's identity with the one checked.

Anything swapped in between the phases (a symlink, another file, a directory turned into a link)
fails the second phase, so the bytes sent are always the bytes of the file that was checked. The
channel sends from the returned open file object, never from the path.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

from talon.errors import MediaPathError

__all__ = [
    "CheckedFile",
    "CheckedPath",
    "HoldsOpenFile",
    "check_media_path",
    "open_checked",
    "open_checked_media",
    "resolve_bounded_media_path",
]

# Two or more letters, so a Windows drive letter is not mistaken for a scheme.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):")
_SEPARATORS = re.compile(r"[\\/]")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)


@dataclass(frozen=True)
class CheckedPath:
    """A path that passed every check, with the identity of the file it named at the time."""

    path: Path  # fully resolved, inside ``root``
    root: Path  # the resolved media root
    device: int
    inode: int
    size: int


class HoldsOpenFile:
    """Owns an open ``file``: ``close()`` closes it, and so does leaving a ``with`` block."""

    file: BinaryIO

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class CheckedFile(HoldsOpenFile):
    """An open regular file inside the media root: send from ``file``, not from ``path``."""

    file: BinaryIO
    path: Path
    size: int
    name: str


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _validate_text(raw: str, require_relative: bool) -> None:
    if not raw.strip():
        raise MediaPathError("empty media path")
    if "\x00" in raw:
        raise MediaPathError(f"media path {raw!r} contains a NUL byte")
    scheme = _SCHEME.match(raw)
    if scheme:
        raise MediaPathError(
            f"{raw!r} is a URL ({scheme.group(1).lower()}:), not a file in the media root"
        )
    if raw.startswith("//"):
        raise MediaPathError(f"{raw!r} is a network path, not a file in the media root")
    if raw.startswith("~"):
        raise MediaPathError(f"{raw!r}: home-directory paths (~) are not allowed")
    if require_relative and os.path.isabs(raw):
        raise MediaPathError(f"{raw!r} is absolute; give a path relative to the media root")
    # Backslashes count too: on POSIX they are ordinary characters, but a name like '..\x' is
    # never a legitimate media file and may be meant for another platform.
    if ".." in _SEPARATORS.split(raw):
        raise MediaPathError(f"{raw!r} contains a '..' component")


def _refuse_links(shown: str, st: os.stat_result) -> None:
    # A hard link inside the root to a file outside it has an inside path and outside content.
    if st.st_nlink > 1:
        raise MediaPathError(
            f"{shown!r} has {st.st_nlink} hard links; files with more than one link are not sent")


def check_media_path(
    path: str | os.PathLike[str], root: str | os.PathLike[str], *, require_relative: bool = False
) -> CheckedPath:
    """Phase one: validate, resolve and stat ``path`` against the media ``root``."""
    raw = os.fspath(path)
    if not isinstance(raw, str):
        raise MediaPathError("media path must be text")
    _validate_text(raw, require_relative)

    try:
        root_resolved = Path(root).resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise MediaPathError(f"media root {os.fspath(root)!r} is not usable: {exc}") from exc
    if not root_resolved.is_dir():
        raise MediaPathError(f"media root {os.fspath(root)!r} is not a directory")

    candidate = Path(raw) if os.path.isabs(raw) else root_resolved / raw
    # Containment first, without requiring existence: a path outside the root is refused as
    # such, without telling anyone whether it exists there.
    try:
        loose = candidate.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on Python 3.11
        raise MediaPathError(f"{raw!r} cannot be resolved: {exc}") from exc
    if not loose.is_relative_to(root_resolved):
        raise MediaPathError(f"{raw!r} resolves outside the media root")

    try:
        resolved = candidate.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise MediaPathError(f"{raw!r}: no such file in the media root") from exc
    except (OSError, RuntimeError) as exc:
        raise MediaPathError(f"{raw!r} cannot be resolved: {exc}") from exc
    if not resolved.is_relative_to(root_resolved):
        raise MediaPathError(f"{raw!r} resolves outside the media root")

    try:
        st = os.stat(resolved, follow_symlinks=False)
    except OSError as exc:
        raise MediaPathError(f"{raw!r} cannot be read: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise MediaPathError(f"{raw!r} is {_kind_of(st.st_mode)}, not a regular file")
    _refuse_links(raw, st)
    return CheckedPath(
        path=resolved, root=root_resolved, device=st.st_dev, inode=st.st_ino, size=st.st_size
    )


def resolve_bounded_media_path(
    path: str | os.PathLike[str], root: str | os.PathLike[str], *, require_relative: bool = False
) -> Path:
    """The resolved path of a regular file inside ``root``; ``MediaPathError`` says why not."""
    return check_media_path(path, root, require_relative=require_relative).path


def _open_beneath(checked: CheckedPath) -> int:
    """Open the checked path from the root down without following any symlink."""
    file_flags = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC | _O_NOCTTY
    if os.open not in os.supports_dir_fd or not _O_DIRECTORY:
        return os.open(checked.path, file_flags)
    parts = checked.path.relative_to(checked.root).parts
    dir_flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
    dir_fd = os.open(checked.root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, dir_flags, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        return os.open(parts[-1], file_flags, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def open_checked(checked: CheckedPath) -> CheckedFile:
    """Phase two: open what phase one checked, or raise if it changed in between."""
    shown = checked.path.name
    try:
        fd = _open_beneath(checked)
    except OSError as exc:
        raise MediaPathError(
            f"{shown!r} changed while it was being opened ({exc.strerror}); not sent"
        ) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MediaPathError(f"{shown!r} is {_kind_of(st.st_mode)}, not a regular file")
        _refuse_links(shown, st)
        if (st.st_dev, st.st_ino) != (checked.device, checked.inode):
            raise MediaPathError(f"{shown!r} was replaced while it was being opened; not sent")
        # O_NONBLOCK only kept the open from hanging on a FIFO; reads should block as usual.
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return CheckedFile(file=file, path=checked.path, size=st.st_size, name=checked.path.name)


def open_checked_media(
    path: str | os.PathLike[str], root: str | os.PathLike[str], require_relative: bool = False
) -> CheckedFile:
    """Check ``path`` inside ``root`` and open it race-free; the caller closes the result."""
    return open_checked(check_media_path(path, root, require_relative=require_relative))
