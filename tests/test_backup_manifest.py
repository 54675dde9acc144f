"""An archive's manifest read as a stream (issue 30, "memory flat"): a backup writes its list of
files line by line to a scratch file, and verify and restore read it with ijson into a table on the
disk, so neither holds one entry per file in memory. Manifests of every Talon layout still read; a
hostile one (the wrong types, a key twice, a file listed twice, a member archived twice) is refused
by name, and a restore then leaves nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import talon.storage.backup as backup_module
from talon.errors import BackupError
from talon.storage.backup import MANIFEST, backup, restore, verify
from tests.support.archives import listing, members, nothing_left, tree, write_as_before


def with_manifest(tmp_path: Path, label: str, change: Callable[[dict[str, Any]], bytes]) -> Path:
    """A copy of a small tree's archive whose manifest is ``change(the manifest as read)``."""
    source = tmp_path / "source.tar.zst"
    if not source.exists():
        backup(source, *tree(tmp_path / "src"))
    entries = members(source)
    out = []
    for info, data in entries:
        if info.name == MANIFEST:
            data = change(json.loads(data))
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
        out.append((info, data))
    hostile = tmp_path / f"{label}.tar.zst"
    write_as_before(hostile, out)
    return hostile


def test_a_manifest_in_the_first_writers_layout_verifies_and_restores(tmp_path: Path) -> None:
    """The first Talon wrote its manifest with json's indenting encoder, files sorted by name."""
    def first_layout(manifest: dict[str, Any]) -> bytes:
        manifest["files"] = sorted(manifest["files"], key=lambda f: f["path"], reverse=True)
        return json.dumps(manifest, indent=1).encode()

    old = with_manifest(tmp_path, "first", first_layout)
    assert b'\n   "path"' in next(d for i, d in members(old) if i.name == MANIFEST)  # the old layout
    assert verify(old) == verify(tmp_path / "source.tar.zst")
    result = restore(old, tmp_path / "r" / "data")
    assert result.manifest.count == len(listing(old)) >= 8
    assert (result.media_root / "telegram" / "101" / "AGENTS.md").read_text() == "memory of chat 1"


def test_keys_in_any_order_and_keys_no_talon_knows_are_read_as_json_reads_them(tmp_path: Path) -> None:
    """A newer Talon may add keys, at the top or in a file's entry; any order is JSON. A key no
    Talon knows is passed over whole, even one whose value holds a "files" list or a "path" of its
    own."""
    def reordered(manifest: dict[str, Any]) -> bytes:
        head = {k: v for k, v in manifest.items() if k != "files"}
        manifest["files"][0] = {"later": {"path": [1]}, **manifest["files"][0], "mode": [{"x": "0600"}], "n": 1}
        return json.dumps({"files": manifest["files"], "future": {"files": [{"path": "media/telegram/100/evil.md",
                                                                               "size": 1, "sha256": "0" * 64}]},
                           "note": "from a newer Talon", "later": [[], {}, [{"x": [1]}]], **head}).encode()

    archive = with_manifest(tmp_path, "reordered", reordered)
    assert verify(archive) == verify(tmp_path / "source.tar.zst")
    assert restore(archive, tmp_path / "r" / "data").manifest.count == len(listing(archive))


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], bytes]:
    return lambda m: json.dumps({**m, key: value}).encode()


def _first_file(**fields: Any) -> Callable[[dict[str, Any]], bytes]:
    def change(m: dict[str, Any]) -> bytes:
        m["files"][0] = {k: v for k, v in {**m["files"][0], **fields}.items() if v is not ...}
        return json.dumps(m).encode()
    return change


def _twice(key: str) -> Callable[[dict[str, Any]], bytes]:
    def change(m: dict[str, Any]) -> bytes:
        text = json.dumps(m)
        return (text[:-1] + f", {json.dumps(key)}: {json.dumps(m[key])}}}").encode()
    return change


HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "a list, not an object": (lambda m: json.dumps([m]).encode(), "not a JSON object"),
    "cut off": (lambda m: json.dumps(m).encode()[:-40], "not JSON"),
    "not JSON at all": (lambda m: b"\xff\xfe manifest", "not JSON"),
    "no files": (lambda m: json.dumps({k: v for k, v in m.items() if k != "files"}).encode(), "no 'files'"),
    "no format": (lambda m: json.dumps({k: v for k, v in m.items() if k != "format"}).encode(), "no 'format'"),
    "files twice": (_twice("files"), "'files' twice"),
    "format twice": (_twice("format"), "'format' twice"),
    "format as text": (_set("format", "1"), "'format' is not a whole number"),
    "format as true": (_set("format", True), "'format' is not a whole number"),
    "created as a list": (_set("created", [1]), "'created' is not a number"),
    "files an object": (_set("files", {"a": 1}), "'files' is not a list"),
    "an entry not an object": (lambda m: json.dumps({**m, "files": ["data/x"]}).encode(), "entry is not an object"),
    "a size as text": (_first_file(size="300000"), "a whole 'size'"),
    "a size as a fraction": (_first_file(size=12.5), "a whole 'size'"),
    "a size as false": (_first_file(size=False), "a whole 'size'"),
    "no path": (_first_file(path=...), "a text 'path'"),
    "a sum in a list": (_first_file(sha256=["0" * 64]), "'sha256' is not a plain value"),
    "left_out holding objects": (_set("left_out", [{"a": 1}]), "'left_out' holds more than plain values"),
    "cut not an object": (_set("cut", 5), "'cut' is not an object"),
    "cut as text": (_set("cut", {"media/telegram/100/AGENTS.md": "3"}), "'cut' holds more than numbers"),
}


@pytest.mark.parametrize("label", sorted(HOSTILE))
def test_a_manifest_of_the_wrong_shape_is_refused_by_name_and_a_restore_leaves_nothing(
        tmp_path: Path, label: str) -> None:
    change, why = HOSTILE[label]
    archive = with_manifest(tmp_path, "hostile", change)
    with pytest.raises(BackupError, match="manifest is unreadable") as refused:
        verify(archive)
    assert why in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(BackupError, match="manifest is unreadable"):
        restore(archive, tmp_path / "r" / "under" / "data")
    nothing_left(tmp_path / "r")


def test_a_manifest_of_another_format_is_named_as_such_whatever_its_shape(tmp_path: Path) -> None:
    """A later format may lay its manifest out otherwise: "not one this Talon reads", not
    "unreadable", once its format is known."""
    for label, change in (("same-shape", _set("format", 2)),
                          ("new-shape", lambda m: json.dumps({"format": 2, "files": {"by": "chunks"}}).encode())):
        archive = with_manifest(tmp_path, label, change)
        with pytest.raises(BackupError, match=r"archive format 2 is not one this Talon reads \(1\)"):
            verify(archive)
        with pytest.raises(BackupError, match="archive format 2 is not one"):
            restore(archive, tmp_path / label / "data")
        nothing_left(tmp_path / label)


def test_what_a_manifest_keeps_in_memory_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its list of files goes to the disk; 'left_out' and 'cut' are kept, so they are bounded
    (64 MB of names, as the whole manifest was before it was streamed; 200 characters here)."""
    monkeypatch.setattr(backup_module, "_HEAD_MAX", 200)
    for label, left_out, cut in (("within", ["m" * 100], {}),
                                 ("left_out", ["m" * 100] * 3, {}),
                                 ("cut", ["m" * 100], {f"media/telegram/100/{'c' * 100}.md": 1})):
        archive = with_manifest(tmp_path, label, lambda m: json.dumps({**m, "left_out": left_out,
                                                                          "cut": cut}).encode())
        if label == "within":
            assert verify(archive).left_out == left_out
            continue
        with pytest.raises(BackupError, match="implausibly large"):
            verify(archive)
        with pytest.raises(BackupError, match="implausibly large"):
            restore(archive, tmp_path / label / "data")
        nothing_left(tmp_path / label)


def test_a_file_listed_twice_is_refused(tmp_path: Path) -> None:
    def doubled(m: dict[str, Any]) -> bytes:
        m["files"].append(dict(m["files"][2]))
        return json.dumps(m).encode()

    archive = with_manifest(tmp_path, "doubled", doubled)
    name = json.loads(next(d for i, d in members(archive) if i.name == MANIFEST))["files"][2]["path"]
    with pytest.raises(BackupError, match=f"manifest lists '{name}' twice: refused"):
        verify(archive)
    with pytest.raises(BackupError, match="twice"):
        restore(archive, tmp_path / "r" / "data")
    nothing_left(tmp_path / "r")


def test_a_member_archived_twice_is_refused_though_the_manifest_lists_it(tmp_path: Path) -> None:
    """The same name, the same bytes, twice in the tar: each copy matches the manifest's one entry,
    so only counting the names catches it. A restore refuses at the second copy (never writing
    over the first) and leaves nothing."""
    backup(tmp_path / "a.tar.zst", *tree(tmp_path / "src"))
    entries = members(tmp_path / "a.tar.zst")
    again = next(e for e in entries if e[0].name.endswith("AGENTS.md"))
    twice = tmp_path / "twice.tar.zst"
    write_as_before(twice, [*entries[:-1], again, entries[-1]])
    with pytest.raises(BackupError, match=f"the archive holds '{again[0].name}' twice"):
        verify(twice)
    with pytest.raises(BackupError, match=f"the archive holds '{again[0].name}' twice"):
        restore(twice, tmp_path / "r" / "data")
    nothing_left(tmp_path / "r")


# Run in a process of its own, which prints its peak RSS in KB: the whole process counts (SQLite's
# page cache and ijson's buffers are C memory, which tracemalloc does not see). VmHWM, not
# ru_maxrss: that one keeps the peak of the process before exec, here pytest's.
_MANY = """
import json, sys, tempfile
from pathlib import Path
import talon.storage.backup as b
what, n = sys.argv[1], int(sys.argv[2])
rows = lambda: ((f"media/telegram/{i % 97}/files/{i}.txt", i, f"{i:064x}") for i in range(n))
if what == "backup":
    with tempfile.TemporaryDirectory() as tmp:
        writer = b._Writer(Path(tmp) / "list.tar.zst", None, 0)
        for row in rows():
            writer._list(*row)
        writer.finish(b.Manifest(source="embedded", schema_version=1, created=1.5))
        assert writer.count == n
else:
    def chunks():
        yield memoryview(b'{"format": 1, "source": "embedded", "schema_version": 1, "created": 1.5, "files": [\\n')
        block = bytearray()
        for i, (name, size, digest) in enumerate(rows()):
            block += (b",\\n" if i else b"") + json.dumps({"path": name, "size": size, "sha256": digest}).encode()
            if len(block) >= 1 << 20:
                yield memoryview(bytes(block))
                block = bytearray()
        yield memoryview(bytes(block) + b"\\n]}\\n")
    tally = b._Tally()
    seen = []
    for row in rows():
        seen.append(row)
        if len(seen) == 2048:
            tally.saw(seen)
            seen = []
    tally.saw(seen)
    manifest = b._read_manifest(chunks(), tally)
    assert tally.check() == (n, n * (n - 1) // 2)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _peak_kb(what: str, n: int) -> int:
    done = subprocess.run([sys.executable, "-c", _MANY, what, str(n)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("what", ["backup", "verify"])
def test_many_files_take_no_more_memory_than_few(what: str) -> None:
    """The backup's list of files, and a verify's or restore's reading of the manifest and check
    against what it saw, for 20,000 and for 200,000 files: the peak RSS of the process is the same
    within a few MB (each file held about 1 KB before: 180 MB more for the larger)."""
    small, large = _peak_kb(what, 20_000), _peak_kb(what, 200_000)
    assert large - small < 12 << 10, (small, large)


def test_directories_made_are_forgotten_past_a_bound_and_made_again_as_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore remembers at most ``_MADE_KEPT`` directories; with the bound at 2, every
    directory of a tree is still made (0700) and every file written, and the media root keeps the
    mode it had, whatever the umask."""
    data, media = tree(tmp_path / "src")
    for i in range(30):
        (media / "telegram" / "100" / f"d{i}" / "e").mkdir(parents=True)
        (media / "telegram" / "100" / f"d{i}" / "e" / "f.md").write_text(f"file {i}")
    (media / "zz.md").write_text("in the media root itself, after the directories")
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    monkeypatch.setattr(backup_module, "_MADE_KEPT", 2)
    for umask in (0o022, 0o177):
        target = tmp_path / f"r{umask:o}"
        (target / "data").mkdir(parents=True, mode=0o750)
        (target / "media_root").mkdir(mode=0o751)
        os.chmod(target / "data", 0o750)
        os.chmod(target / "media_root", 0o751)
        old = os.umask(umask)
        try:
            result = restore(archive, target / "data")
        finally:
            os.umask(old)
        assert [(result.media_root / "telegram" / "100" / f"d{i}" / "e" / "f.md").read_text()
                for i in range(30)] == [f"file {i}" for i in range(30)]
        dirs = [p for root in (result.data_dir, result.media_root) for p in root.rglob("*") if p.is_dir()]
        assert len(dirs) > 60 and {oct(p.stat().st_mode & 0o777) for p in dirs} == {"0o700"}
        assert oct(result.data_dir.stat().st_mode & 0o777) == "0o700"  # the data dir is made private
        assert oct(result.media_root.stat().st_mode & 0o777) == "0o751"
        assert (result.media_root / "zz.md").read_text() == "in the media root itself, after the directories"


def test_a_table_that_cannot_grow_fails_the_restore_by_name_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tally's table is on the disk (a restore's in the data dir, a verify's in TMPDIR): a full
    disk is a clear refusal, not a traceback, and the restore removes what it wrote (the table's
    file included)."""
    archive = tmp_path / "a.tar.zst"
    backup(archive, *tree(tmp_path / "src"))

    def full(self: Any, rows: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(backup_module._Tally, "saw", full)
    with pytest.raises(BackupError, match=r"table failed \(database or disk is full\).*in the data dir"):
        restore(archive, tmp_path / "r" / "data")
    nothing_left(tmp_path / "r")
    with pytest.raises(BackupError, match=r"table failed \(database or disk is full\).*in TMPDIR"):
        verify(archive)


def test_a_restores_table_is_a_file_in_the_data_dir_and_gone_after(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On the disk the restore writes anyway (TMPDIR may be memory: tmpfs), and removed with the
    restore done; a verify, which has no data dir, uses SQLite's temporary database."""
    archive = tmp_path / "a.tar.zst"
    backup(archive, *tree(tmp_path / "src"))
    files: list[str | None] = []
    close = backup_module._Tally.close

    def noted(self: Any) -> None:
        files.append(self.file)
        assert self.file is None or Path(self.file).stat().st_size > 0
        close(self)

    monkeypatch.setattr(backup_module._Tally, "close", noted)
    result = restore(archive, tmp_path / "r" / "data")
    verify(archive)
    assert files[0] is not None and Path(files[0]).parent == result.data_dir and files[1] is None
    assert not Path(files[0]).exists() and not list(result.data_dir.glob(".talon-check-*"))
