"""The agent's workspace (the media root) and the containment rules its file tools obey.

The rules are those of outbound media (``talon.media.resolve_bounded_media_path``), extended to
paths that do not exist yet (``write_file``) and to directories (``ls``, ``glob``, ``grep``):

- no URL scheme, no ``~``, no NUL byte, no ``..`` component;
- the path is resolved with every symbolic link followed (for a path that does not exist yet, as
  far as it exists: a dangling link is followed to where it would write), and the result must lie
  inside the resolved root;
- an existing regular file is additionally checked by ``resolve_bounded_media_path`` when that
  module is present, so the tools never accept a file the outbound side would refuse.

Two more rules hold for writes (``WorkspacePolicy``, from the settings):

- protected paths (``TALON_PROTECTED_PATHS``, default ``.git``): comma-separated globs relative to
  the workspace; a glob without ``/`` matches a path component at any depth (``.git`` protects
  ``.git/config`` and ``sub/.git/hooks/x``), one with ``/`` matches from the workspace's top, one
  component per component (``docs/*.md``). The check is made on the path as given and on the
  path with every link resolved (``g -> .git`` then ``g/config`` is refused), and a link with a
  protected plain name (``.git -> stuff``) in a directory on the way to the file protects where
  it leads (``stuff/config`` is refused). Reading is not affected;
- the workspace's size (``TALON_WORKSPACE_MAX``): a write that would take the disk space the
  workspace uses (every file and directory below it, each inode once, as ``du`` counts it)
  past the limit is refused; a write that shrinks a file is always allowed, so a full
  workspace can be cleaned up.

Besides the workspace, one call may be given read-only directories (the chat's archive and saved
large outputs, which live under the data dir). They are addressed by absolute path and can only
be read. Every refusal is a ``ToolError`` whose message tells the agent what to do instead.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from talon.agent.tools.beneath import open_file_beneath
from talon.safe_files import atomic_write_beneath
from talon.errors import ToolError, UnsafePath

# As for outbound media: two or more letters and a colon is a URL scheme (one letter would be a
# Windows drive).
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")
_SEPARATORS = re.compile(r"[\\/]")

Want = Literal["file", "dir", "any", "new"]
_GLOB_CHARS = re.compile(r"[*?\[]")


def human_bytes(n: int) -> str:
    """A size in decimal units, as the settings are written (1 GB = 1,000,000,000 bytes)."""
    return f"{n:,} bytes" if n < 10_000 else (f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB")


@dataclass(frozen=True)
class WorkspacePolicy:
    """What the agent may write in a workspace (TALON_WORKSPACE_MAX, TALON_PROTECTED_PATHS)."""

    max_bytes: int = 1_000_000_000  # disk space of the whole workspace; 0: no limit
    protected: tuple[str, ...] = (".git",)

    def protected_rule(self, parts: Sequence[str]) -> str | None:
        """The protected-path rule that covers ``parts`` (relative to the workspace), if any."""
        for rule in self.protected:
            pattern = rule.strip().strip("/")
            if not pattern:
                continue
            if "/" not in pattern:
                if any(fnmatch.fnmatchcase(part, pattern) for part in parts):
                    return rule
                continue
            steps = pattern.split("/")
            if len(parts) >= len(steps) and all(fnmatch.fnmatchcase(p, s) for p, s in zip(parts, steps)):
                return rule
        return None

    def literal_names(self) -> list[str]:
        """Protected rules that are plain names (no glob, no ``/``): checked for links too."""
        return [r.strip() for r in self.protected if r.strip() and "/" not in r.strip("/ ")
                and not _GLOB_CHARS.search(r)]


def disk_usage(root: Path) -> int:
    """Bytes of disk the tree under ``root`` takes, as ``du`` counts: allocated blocks of every
    file and directory, each inode once, no link followed. Blocking: call it off the event loop."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [os.fspath(root)]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return total


@dataclass(frozen=True)
class Resolved:
    """A checked path: ``real`` to open, ``shown`` to talk about, and where it lives.

    ``base`` is the resolved directory it lies in (the workspace or a read-only root) and
    ``parts`` its components below ``base``: the tools open exactly those, link-free, from a
    descriptor of ``base`` (``talon.agent.tools.beneath``), never ``real`` by name.
    """

    real: Path
    shown: str
    in_workspace: bool
    base: Path = Path("/")
    parts: tuple[str, ...] = ()
    # The workspace written to (its size limit is checked before each write); None: no limit.
    workspace: Workspace | None = field(default=None, compare=False, repr=False)

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
        if self.workspace is not None:
            self.workspace.check_room(self, len(data))
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

    def __init__(self, root: Path, policy: WorkspacePolicy | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy = policy or WorkspacePolicy()

    def usage(self) -> int:
        """Disk space the workspace uses now (blocking; see ``disk_usage``)."""
        return disk_usage(self.real_root)

    def full_notice(self, used: int) -> str:
        """What the agent is told when the workspace is at or over its limit."""
        return (f"the workspace is full: it uses {human_bytes(used)} and its limit is "
                f"{human_bytes(self.policy.max_bytes)} (TALON_WORKSPACE_MAX); writes that make it larger "
                "are refused until files are deleted or made smaller")

    def check_room(self, where: Resolved, size: int) -> None:
        """Refuse (``ToolError``) writing ``size`` bytes at ``where`` when the workspace would
        then use more than its limit; shrinking a file is always allowed. Blocking."""
        limit = self.policy.max_bytes
        if not limit:
            return
        try:
            old = os.lstat(where.real)
            replacing = old.st_blocks * 512 if stat.S_ISREG(old.st_mode) else 0
        except OSError:
            replacing = 0
        adding = -(-size // 4096) * 4096  # whole blocks, as the file system allocates them
        if adding <= replacing:
            return
        used = self.usage()
        after = used - replacing + adding
        if after > limit:
            raise ToolError(
                f"{where.shown!r} was not written: the workspace would use {human_bytes(after)}, over its "
                f"limit of {human_bytes(limit)} (TALON_WORKSPACE_MAX; it uses {human_bytes(used)} now). "
                "Delete files that are no longer needed or make them smaller, or write less.")

    def _check_protected(self, path: str, lexical: Path, real: Path, root: Path) -> None:
        policy = self.policy
        rule = None
        for candidate in (lexical, real):
            if _inside(candidate, root):
                rule = rule or policy.protected_rule(candidate.relative_to(root).parts)
        if rule is None:
            # A protected name that is a link elsewhere (``.git -> stuff``) protects where it leads.
            names = policy.literal_names()
            directory = real.parent
            while names and _inside(directory, root):
                for name in names:
                    link = directory / name
                    if os.path.islink(link):
                        target = Path(os.path.realpath(link))
                        if _inside(real, target):
                            rule = name
                if directory == root:
                    break
                directory = directory.parent
        if rule is not None:
            raise ToolError(
                f"{path!r} is a protected path (rule {rule!r} of TALON_PROTECTED_PATHS): the agent's file "
                "tools do not write there (reading is allowed)")

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

        if write and in_workspace:
            self._check_protected(path, lexical, real, root)
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
        return Resolved(real=real, shown=shown, in_workspace=in_workspace, base=base, parts=parts,
                        workspace=self if in_workspace else None)

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
