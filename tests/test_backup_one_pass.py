"""The one-pass restore and the faster archive writer (issue 30, "backup and restore at disk
speed"): archives of the earlier writer still restore, a tampered member found only after other
files were written still leaves nothing behind, an interrupted restore leaves nothing, and the
search index built in bulk counts and finds every message. Small trees: the speed is measured in
benchmarks/bench_backup.py, not here."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from talon.errors import BackupError
from talon.storage.backup import MANIFEST, backup, restore, verify
from tests.support.archives import listing, members, nothing_left, tree, write_as_before
from talon.storage.embedded.search import INDEX_FILE, SearchIndex
from talon.storage.sessions import ChatKey
from talon.cli.reindex import index_embedded


def test_an_archive_of_the_earlier_writer_verifies_and_restores(tmp_path: Path) -> None:
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "now.tar.zst"
    manifest = backup(archive, data, media)
    old = tmp_path / "before.tar.zst"
    write_as_before(old, members(archive))
    assert verify(old) == manifest
    result = restore(old, tmp_path / "new" / "deep" / "data")
    assert result.indexed == 15
    assert (result.media_root / "telegram" / "101" / "AGENTS.md").read_text() == "memory of chat 1"
    for name, (size, _) in listing(archive).items():
        top, rel = name.split("/", 1)
        restored = (result.data_dir if top == "data" else result.media_root) / rel
        assert restored.stat().st_size == size
        assert oct(restored.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o177])
def test_every_restored_directory_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    """Directories are made 0700 in one mkdir each; a umask that takes an owner's bit (0o177
    leaves mkdir 0600: no way in) is seen and the mode set outright."""
    import talon.storage.backup as backup_module

    data, media = tree(tmp_path / "src")
    (data / "sessions" / "telegram" / "100" / "context" / "deep").mkdir(parents=True)
    (data / "sessions" / "telegram" / "100" / "context" / "deep" / "1.md").write_text("summary")
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    old = os.umask(umask)
    try:
        assert backup_module._umask_spares_owner() is (umask & 0o700 == 0)
        result = restore(archive, tmp_path / "r" / "data")
    finally:
        os.umask(old)
    dirs = [p for root in (result.data_dir, result.media_root) for p in root.rglob("*") if p.is_dir()]
    assert len(dirs) >= 12 and result.data_dir / "sessions" / "telegram" / "100" / "context" / "deep" in dirs
    assert {oct(p.stat().st_mode & 0o777) for p in dirs} == {"0o700"}


def test_a_member_tampered_after_others_were_written_leaves_nothing(tmp_path: Path) -> None:
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "good.tar.zst"
    backup(archive, data, media)
    entries = members(archive)
    last_data = max(i for i, (m, _) in enumerate(entries) if m.name != MANIFEST)
    info, body = entries[last_data]
    entries[last_data] = (info, body[:-1] + bytes([body[-1] ^ 1]))  # same size, one bit off
    bad = tmp_path / "bad.tar.zst"
    write_as_before(bad, entries)
    with pytest.raises(BackupError, match="does not match its sha256"):
        verify(bad)
    target = tmp_path / "restore" / "under"
    with pytest.raises(BackupError, match="does not match its sha256"):
        restore(bad, target / "data")
    nothing_left(tmp_path / "restore")
    # a member past the manifest, and one not in it, are refused the same way
    extra = tarfile.TarInfo("media/telegram/100/late.md")
    extra.size = 4
    for label, changed in (("after", [*entries[:last_data], (info, body), *entries[last_data + 1:], (extra, b"late")]),
                           ("unlisted", [(extra, b"late"), *entries[:last_data], (info, body), *entries[last_data + 1:]])):
        hostile = tmp_path / f"{label}.tar.zst"
        write_as_before(hostile, changed)
        with pytest.raises(BackupError, match="after its manifest|not in its manifest"):
            restore(hostile, tmp_path / label / "data")
        nothing_left(tmp_path / label)


def test_a_long_name_that_climbs_out_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A name too long for a ustar header comes in a PAX header: it passes the same name checks,
    so a long name with ``..`` in it (or an absolute one) is refused and nothing is written."""
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "good.tar.zst"
    backup(archive, data, media)
    entries = members(archive)
    for label, name in (("climbs", "data/" + "a/" * 60 + "../" * 70 + "escaped.txt"),
                        ("absolute", "/" + "x" * 120 + "/escaped.txt")):
        evil = tarfile.TarInfo(name)
        evil.size = 3
        hostile = tmp_path / f"{label}.tar.zst"
        write_as_before(hostile, [*entries[:2], (evil, b"bad"), *entries[2:]])
        with tarfile.open(fileobj=io.BytesIO(zstandard.ZstdDecompressor().stream_reader(
                hostile.read_bytes()).read()), mode="r:") as tar:
            assert tar.getmembers()[2].pax_headers.get("path") == name  # it did come as a PAX header
        with pytest.raises(BackupError, match="unsafe or unexpected name"):
            restore(hostile, tmp_path / label / "data")
        nothing_left(tmp_path / label)
        assert not (tmp_path / "escaped.txt").exists()


@pytest.mark.slow  # 1,500 directories made and removed
def test_a_member_thousands_of_directories_deep_is_handled_like_any_other(tmp_path: Path) -> None:
    """A safe name 1,500 directories deep (3 KB, under PATH_MAX): its directories are made (no
    recursion to run out of), then the archive is refused for carrying it outside its manifest,
    and nothing is left."""
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "good.tar.zst"
    backup(archive, data, media)
    entries = members(archive)
    deep = tarfile.TarInfo("data/" + "a/" * 1500 + "f")
    deep.size = 1
    hostile = tmp_path / "deep.tar.zst"
    write_as_before(hostile, [*entries[:-1], (deep, b"x"), entries[-1]])
    with pytest.raises(BackupError, match="not in its manifest"):
        restore(hostile, tmp_path / "r" / "data")
    nothing_left(tmp_path / "r")


def deep_dirs(top: Path, names: list[str]) -> str:
    """Directories ``names`` one inside the next under ``top``, made relative to each other (so
    the whole path may be longer than the system lets one call name); the deepest, as a string."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        return str(top) + "".join("/" + n for n in names)
    finally:
        os.close(fd)


@pytest.mark.slow  # 1,200 directories made, archived, restored and removed
def test_a_workspace_thousands_of_levels_deep_is_archived_and_restored(tmp_path: Path) -> None:
    """An agent can make a tree deeper than Python's recursion limit in its workspace: the backup
    walks it (it raised RecursionError) and the restore makes it again."""
    import talon.storage.backup as backup_module

    data, media = tree(tmp_path / "src")
    workspace = media / "telegram" / "100"
    deepest = deep_dirs(workspace, ["d"] * 1200)
    Path(deepest, "note.md").write_text("at the bottom")
    restored = tmp_path / "r" / "data"
    try:
        manifest = backup(tmp_path / "a.tar.zst", data, media)
        name = "media/telegram/100/" + "d/" * 1200 + "note.md"
        assert name in listing(tmp_path / "a.tar.zst") and manifest.left_out == []
        result = restore(tmp_path / "a.tar.zst", restored)
        assert Path(str(result.media_root / "telegram" / "100") + "/d" * 1200, "note.md").read_text() == "at the bottom"
    finally:  # pytest's own cleanup would recurse through them
        backup_module._remove_tree(workspace / "d")
        backup_module._remove_tree(tmp_path / "r")


def test_what_a_workspace_holds_that_cannot_be_read_is_named_not_fatal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Paths longer than the system lets one call name (an agent can make them, one directory at a
    time): the backup leaves them out and names them (in the manifest, and on stderr), and archives
    everything else."""
    from talon.cli import main

    data, media = tree(tmp_path / "src")
    plain = backup(tmp_path / "plain.tar.zst", data, media)
    workspace = media / "telegram" / "100"
    near = deep_dirs(workspace, ["n" * 200] * 19)  # about 3,900 bytes: listable
    assert len(near) < 4096
    fd = os.open(near, os.O_RDONLY | os.O_DIRECTORY)
    try:  # a file whose own path is past 4,096 bytes, made relative to its directory
        out = os.open("x" * 250, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(out, b"too far to open")
        os.close(out)
    finally:
        os.close(fd)
    beyond = deep_dirs(Path(near), ["b" * 200] * 2)  # its own path is past 4,096 bytes: not listable
    assert len(beyond) > 4096
    archive = tmp_path / "a.tar.zst"
    manifest = backup(archive, data, media)
    # The progress total (summed in a thread of its own) counts what can be read, quietly.
    import talon.storage.backup as backup_module

    assert backup_module._dir_size(media) == sum(len(f"memory of chat {c}") for c in range(3))
    rel = "media/telegram/100/" + ("n" * 200 + "/") * 19
    assert manifest.left_out == sorted([f"{rel}{'b' * 200}/ (File name too long)",
                                        f"{rel}{'x' * 250} (File name too long)"])
    assert set(listing(archive)) == set(listing(tmp_path / "plain.tar.zst"))  # everything else, as without them
    assert main(["backup", "--verify", str(archive)]) == 0
    err = capsys.readouterr().err
    assert "2 path(s) in the workspaces could not be read" in err and "x" * 250 in err


def test_an_interrupted_restore_leaves_nothing_half_written(tmp_path: Path) -> None:
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    seen: list[int] = []

    def interrupt(done: int, total: int) -> None:
        seen.append(done)
        if done > 100_000:  # inside the attachment, after the sessions were written
            raise KeyboardInterrupt

    empty_media = tmp_path / "m"
    empty_media.mkdir()  # an empty media root that exists stays, emptied
    with pytest.raises(KeyboardInterrupt):
        restore(archive, tmp_path / "r" / "data", empty_media, progress=interrupt)
    assert seen and max(seen) > 100_000
    nothing_left(tmp_path / "r")
    assert empty_media.is_dir() and not any(empty_media.iterdir())
    # and the same archive restores whole afterwards
    assert restore(archive, tmp_path / "r" / "data", empty_media).indexed == 15


def test_a_restore_is_on_the_disk_before_it_reports_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore syncs both places' file systems after everything is written and indexed, and a
    write error that sync reports fails the restore and leaves nothing."""
    import talon.storage.backup as backup_module

    data, media = tree(tmp_path / "src")
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    real, calls = backup_module._sync, []

    def spy(*places: Path) -> None:
        calls.append((places, (places[0] / INDEX_FILE).is_file(), sorted(p.name for p in places[1].rglob("*.md"))))
        real(*places)  # the real syncfs(2) of the file system under tmp_path

    monkeypatch.setattr(backup_module, "_sync", spy)
    new_data, new_media = tmp_path / "r" / "data", tmp_path / "r" / "media_root"
    restore(archive, new_data)
    assert calls == [((new_data, new_media), True, ["AGENTS.md"] * 3)]

    def broken(*places: Path) -> None:
        raise BackupError(f"could not write {places[0]} to the disk: Input/output error")

    monkeypatch.setattr(backup_module, "_sync", broken)
    with pytest.raises(BackupError, match="to the disk"):
        restore(archive, tmp_path / "r2" / "data")
    nothing_left(tmp_path / "r2")


def test_the_archive_goes_to_the_disk_as_it_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writeback of the archive is started stretch by stretch while it is written (so the fsync at
    the end waits for the last one only), every byte once, and the archive is whole; a restore
    starts it for each large file once written (so its sync at the end has less left)."""
    import talon.storage.backup as backup_module

    data, media = tree(tmp_path / "src")
    (data / "attachments" / "cd").mkdir()
    (data / "attachments" / "cd" / ("cd" + "0" * 62)).write_bytes(os.urandom(5 << 20))  # a video
    real, ranges = os.posix_fadvise, []

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        ranges.append((offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(backup_module, "_WRITTEN_BACK", 64 << 10)
    monkeypatch.setattr(os, "posix_fadvise", spy)
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    size = archive.stat().st_size
    assert len(ranges) >= 4 and all(a == os.POSIX_FADV_DONTNEED for _, _, a in ranges)
    assert [o for o, _, _ in ranges] == [0, *(o + n for o, n, _ in ranges[:-1])]  # back to back, from 0
    assert size - (ranges[-1][0] + ranges[-1][1]) <= 1 << 20  # only the last write left to the fsync
    # A restore sends each large file (the video) to the disk as soon as it is written.
    ranges.clear()
    assert restore(archive, tmp_path / "r" / "data").indexed == 15
    assert ranges == [(0, 0, os.POSIX_FADV_DONTNEED)]


def test_an_archive_recompressed_as_several_zstd_frames_restores(tmp_path: Path) -> None:
    """zstd allows a stream of several frames (what `pzstd` or a concatenation makes); the archive
    reads through all of them, wherever they are cut, not to the end of the first."""
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    with open(archive, "rb") as raw:
        tar = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
    for cuts in ([1], [512, 513, 100_000], [len(tar) // 3, len(tar) // 2]):
        framed = tmp_path / f"framed-{len(cuts)}-{cuts[0]}.tar.zst"
        edges = [0, *cuts, len(tar)]
        framed.write_bytes(b"".join(zstandard.ZstdCompressor(level=1).compress(tar[a:b]) for a, b in zip(edges, edges[1:])))
        assert verify(framed) == verify(archive)
    assert restore(framed, tmp_path / "r" / "data").indexed == 15


def test_a_truncated_zstd_archive_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    data, media = tree(tmp_path / "src")
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    cut = tmp_path / "cut.tar.zst"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    with pytest.raises(BackupError, match="damaged|not a complete"):
        restore(cut, tmp_path / "r" / "data")
    nothing_left(tmp_path / "r")


def test_bulk_indexing_counts_and_finds_every_message_of_long_logs(tmp_path: Path) -> None:
    data, _ = tree(tmp_path, chats=3, lines=1300)  # past one batch of 500 and one FTS flush
    assert index_embedded(data) == (3900, 3900)
    assert index_embedded(data) == (0, 0)  # covered: nothing twice
    index = SearchIndex(data / INDEX_FILE)
    try:
        hits = index.search(ChatKey("telegram", "102"), ["kettle", "1299"], 10)
        assert [h.text for h in hits] == ["kettle 2 line 1299"]
        # chat 102's line, asked in chat 101: never found there
        assert index.search(ChatKey("telegram", "101"), ["kettle", "2", "line", "1299"], 10) == []
    finally:
        index.close()
