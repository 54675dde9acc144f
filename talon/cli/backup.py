"""``talon backup PATH``, ``talon backup --verify PATH`` and ``talon restore PATH --data-dir DIR``
(talon.storage.backup does the work; this module reads the settings and says what happened)."""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

from talon.errors import BackupError

_SHOW_ABOVE = 64 << 20  # progress lines only for archives larger than this
_EVERY_S = 2.0


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class _Progress:
    """Progress lines on stderr for large archives, at most one every two seconds."""

    def __init__(self, what: str) -> None:
        self.what, self.last = what, time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < _EVERY_S or max(done, total) < _SHOW_ABOVE:
            return
        self.last = now
        share = f" of {_size(total)} ({100 * done / total:.0f}%)" if total else ""
        print(f"{self.what}: {_size(done)}{share}", file=sys.stderr, flush=True)


def _keep_freed_memory() -> None:
    """For this process's bulk copying: glibc's allocator keeps up to 32 MB of freed memory per
    arena instead of handing it back to the system at once, and serves the 1 MB buffers from its
    arenas rather than from fresh mappings. By default each buffer a backup frees went back to
    the system and the next one was faulted in anew: 50,000 to 84,000 page faults in a backup of
    1 GB, against 19,000 (and 0.1 s less system CPU) with these settings. What is kept is bounded
    (a few tens of MB, as the work's queues and buffers are). Elsewhere (musl, macOS) nothing is
    changed."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return
    mallopt(_M_MMAP_THRESHOLD, 2 << 20)
    mallopt(_M_TRIM_THRESHOLD, 32 << 20)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def cmd_backup(args: argparse.Namespace) -> int:
    from talon.cli import _load_settings
    from talon.storage.backup import backup, verify

    _keep_freed_memory()
    path = Path(args.path)
    try:
        if args.verify:
            manifest = verify(path, _Progress("verified"))
            print(f"ok: {path} is a complete Talon archive: {manifest.count} files, "
                  f"{_size(manifest.total_bytes)}, from a {manifest.source} Talon (schema version "
                  f"{manifest.schema_version}), made {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(manifest.created))}")
            _say_left_out(manifest.left_out, manifest.cut)
            return 0
        settings = _load_settings()
        manifest = backup(path, settings.data_dir, settings.media_root, database_url=settings.database_url,
                          progress=_Progress("backed up"))
    except BackupError as exc:
        print(f"talon: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {path}: {manifest.count} files, {_size(manifest.total_bytes)} "
          f"({'PostgreSQL' if manifest.source == 'postgres' else 'embedded'} stores, media root); "
          f"check it with `talon backup --verify {path}`")
    _say_left_out(manifest.left_out, manifest.cut)
    return 0


def _say_left_out(left_out: list[str], cut: dict[str, int]) -> None:
    """What the workspaces held that could not be read (and so is not in the archive), and the
    workspace files cut short while they were read (in it as far as they were read), on stderr."""
    if left_out:
        print(f"talon: warning: {len(left_out)} path(s) in the workspaces could not be read and are not in "
              "the archive:", file=sys.stderr)
        _say_some(left_out)
    if cut:
        print(f"talon: warning: {len(cut)} workspace file(s) were cut short while they were read (being "
              "rewritten?) and are in the archive as far as they were read:", file=sys.stderr)
        _say_some([f"{name} ({_size(read)})" for name, read in sorted(cut.items())])


def _say_some(lines: list[str]) -> None:
    for line in lines[:20]:
        print(f"  {line}", file=sys.stderr)
    if len(lines) > 20:
        print(f"  ... and {len(lines) - 20} more (all are listed in the archive's manifest.json)", file=sys.stderr)


def cmd_restore(args: argparse.Namespace) -> int:
    from talon.storage.backup import restore

    _keep_freed_memory()
    try:
        result = restore(Path(args.path), Path(args.data_dir),
                         Path(args.media_root) if args.media_root else None,
                         database_url=(args.database_url or "").strip(), progress=_Progress("restored"))
    except BackupError as exc:
        print(f"talon: restore refused: {exc}", file=sys.stderr)
        return 1
    where = "the database" if result.database_url else str(result.data_dir)
    print(f"ok: restored {result.manifest.count} files into {where} and {result.media_root}"
          + (f"; {result.indexed} messages indexed for search" if not result.database_url else ""))
    print("point a Talon at it with these settings (in its .env):")
    print(f"TALON_DATA_DIR={result.data_dir}")
    print(f"TALON_MEDIA_ROOT={result.media_root}")
    if result.database_url:
        from talon.storage.postgres.db import redact

        print(f"TALON_DATABASE_URL={redact(result.database_url)}")
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    backup = sub.add_parser(
        "backup", help="archive everything Talon keeps into PATH (.tar.zst or .tar.gz), or check one with --verify",
        description="Write one archive of the stores (embedded or PostgreSQL), sessions and their archives, "
                    "attachments, workspaces, tasks, usage and approvals, with a manifest of sha256 sums. "
                    "Safe while Talon runs. See docs/backup.md.")
    backup.add_argument("path", metavar="PATH", help="the archive to write (must not exist), e.g. talon.tar.zst")
    backup.add_argument("--verify", action="store_true", help="check the archive at PATH instead of writing one")
    backup.set_defaults(func=cmd_backup)
    restore = sub.add_parser(
        "restore", help="restore an archive into an empty data dir (and media root, or a database)",
        description="Verify the archive, then restore it into places that are empty or absent (never over "
                    "live data), and print the settings that point a Talon at it. See docs/backup.md.")
    restore.add_argument("path", metavar="PATH", help="the archive (from `talon backup`)")
    restore.add_argument("--data-dir", required=True, metavar="DIR", help="the new TALON_DATA_DIR (empty or absent)")
    restore.add_argument("--media-root", metavar="DIR",
                         help="the new TALON_MEDIA_ROOT for the workspaces (default: media_root beside the data dir)")
    restore.add_argument("--database-url", metavar="URL",
                         help="restore the stores into this empty PostgreSQL database instead of the data dir")
    restore.set_defaults(func=cmd_restore)
