"""The agent's workspace (the media root) and the containment rules its file tools obey.

The rules are those of outbound media (``talon.media.resolve_bounded_media_path``), extended to
paths that do not exist yet (``write_file``) and to directories (``ls``, ``glob``, ``grep``):

- no URL scheme, no ``~``, no NUL byte, no ``..`` component;
- the path is resolved with every symbolic link followed (for a path that does not exist yet, as
  far as it exists: a dangling link is followed to where it would write), and the result must lie
  inside the resolved root;
- an existing regular file is additionally checked by ``resolve_bounded_media_path`` when that
  module is present, so the tools never accept a file the outbound side would refuse.

Besides the workspace, one call may be given read-only directories (the chat's archive and saved
large outputs, which live under the data dir). They are addressed by absolute path and can only
be read. Every refusal is a ``ToolError`` whose message tells the agent what to do instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from talon.agent.beneath import open_file_beneath
from talon.safe_files import atomic_write_beneath
from talon.errors import ToolError, UnsafePath

# As for outbound media: two or more letters and a colon is a URL scheme (one letter would be a
# Windows drive).
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")
_SEPARATORS = re.compile(r"[\\/]")

Want = Literal["file", "dir", "any", "new"]


@dataclass(frozen=True)
class Resolved:
    """A checked path: ``real`` to open, ``shown`` to talk about, and where it lives.

    ``base`` is the resolved directory it lies in (the workspace or a read-only root) and
    ``parts`` its components below ``base``: the tools open exactly those, link-free, from a
    descriptor of ``base`` (``talon.agent.beneath``), never ``real`` by name.
    """

    real: Path
    shown: str
    in_workspace: bool
    base: Path = Path("/")
    parts: tuple[str, ...] = ()

    def open_read(self) -> BinaryIO:
        """The file, opened link-free beneath ``base``; one hard link only. Raises ToolError."""
        try:
            fd, _ = open_file_beneath(self.base, self.parts, shown=self.shown)
        except UnsafePath as exc:
            raise ToolError(exc.strerror or str(exc)) from exc
        return os.fdopen(fd, "rb")

    def write_atomic(self, data: bytes) -> bool:
        """Replace or create the file with ``data``; True if something was there."""
        if not self.in_workspace:
            raise ToolError(f"{self.shown!r} is read-only")
        try:
            return atomic_write_beneath(self.base, self.parts, data, shown=self.shown)
        except UnsafePath as exc:
            raise ToolError(exc.strerror or str(exc)) from exc


def _lexical_checks(raw: object) -> str:
    if not isinstance(raw, str):
        raise ToolError("path must be a string")
    path = raw.strip()
    if not path:
        raise ToolError("path is empty")
    if "\x00" in path:
        raise ToolError("path contains a NUL byte")
    if _SCHEME.match(path) or path.startswith("//"):
        raise ToolError(f"{path!r} is a URL, not a workspace path; use a path relative to the workspace")
    if path.startswith("~"):
        raise ToolError(f"{path!r}: '~' (home directory) paths are not allowed; use a path relative to the workspace")
    if ".." in _SEPARATORS.split(path):
        raise ToolError(f"{path!r}: '..' is not allowed; use a path inside the workspace")
    return path


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class Workspace:
    """The media root as the agent's file tools see it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def real_root(self) -> Path:
        # Resolved on every use: the root itself may legitimately be a symlink that is re-pointed.
        return Path(os.path.realpath(self.root))

    def show(self, real: Path) -> str:
        """How to name a resolved path to the agent (relative inside the workspace)."""
        root = self.real_root
        if _inside(real, root):
            rel = real.relative_to(root).as_posix()
            return rel or "."
        return str(real)

    def resolve(
        self,
        raw: object,
        *,
        want: Want = "any",
        write: bool = False,
        read_only_roots: Sequence[Path] = (),
    ) -> Resolved:
        """Check and resolve a path the agent gave; raise ``ToolError`` with the reason."""
        path = _lexical_checks(raw)
        root = self.real_root
        given = Path(path)
        candidate = given if given.is_absolute() else root / given
        try:
            real = Path(os.path.realpath(candidate))
        except OSError as exc:  # a component changed under the resolution (another writer)
            raise ToolError(f"{path!r} changed while it was being checked ({exc.strerror}); try again") from exc
        lexical = Path(os.path.normpath(candidate))

        in_workspace = _inside(real, root)
        readable_extra = next(
            (r for r in (Path(os.path.realpath(x)) for x in read_only_roots) if _inside(real, r)), None
        )
        if write and readable_extra is not None:
            raise ToolError(f"{path!r} is read-only (the conversation archive); write inside the workspace instead")
        if not in_workspace and readable_extra is None:
            if _inside(lexical, root) or any(_inside(lexical, Path(os.path.realpath(x))) for x in read_only_roots):
                raise ToolError(
                    f"{path!r} is a symbolic link (or goes through one) that points outside the "
                    "workspace; it cannot be used"
                )
            raise ToolError(f"{path!r} is outside the workspace; use a path relative to the workspace")

        shown = self.show(real) if in_workspace else str(real)
        base = root if in_workspace else (readable_extra or root)
        parts = real.relative_to(base).parts
        exists = real.exists()
        if want == "file":
            if not exists:
                raise ToolError(f"{shown!r} does not exist (use ls or glob to find files)")
            if not real.is_file():
                raise ToolError(f"{shown!r} is not a regular file")
            if in_workspace:
                self._outbound_check(real, root)
        elif want == "dir":
            if not exists:
                raise ToolError(f"directory {shown!r} does not exist")
            if not real.is_dir():
                raise ToolError(f"{shown!r} is not a directory")
        elif want == "new":
            if exists and real.is_dir():
                raise ToolError(f"{shown!r} is a directory; give a file path")
            if exists and not real.is_file():
                raise ToolError(f"{shown!r} is not a regular file")
        return Resolved(real=real, shown=shown, in_workspace=in_workspace, base=base, parts=parts)

    @staticmethod
    def _outbound_check(real: Path, root: Path) -> None:
        try:
            from talon.media.paths import resolve_bounded_media_path
        except ImportError:  # the media layer's checker is optional here; our rules already ran
            return
        from talon.errors import MediaPathError

        try:
            resolve_bounded_media_path(real.relative_to(root).as_posix(), root)
        except MediaPathError as exc:
            raise ToolError(str(exc)) from exc
