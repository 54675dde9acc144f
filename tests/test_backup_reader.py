"""The backup's reading thread: a file that is shorter than announced, or a failure while reading,
fails the backup in the caller's thread and leaves no archive (nor its scratch files) behind."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

import talon.storage.backup as backup_module
from talon.errors import BackupError
from talon.storage.backup import backup, restore, verify
from tests.support.archives import listing

pytestmark = pytest.mark.slow  # real archives written


def tree(root: Path, log_bytes: int) -> tuple[Path, Path]:
    data, media = root / "data", root / "media_root"
    chat = data / "sessions" / "telegram" / "100"
    chat.mkdir(parents=True)
    line = json.dumps({"role": "user", "content": [{"type": "text", "text": "x" * 900}], "at": 1.0}) + "\n"
    (chat / "main.jsonl").write_text(line * (log_bytes // len(line) + 1))
    (data / "attachments" / "ab").mkdir(parents=True)
    (data / "attachments" / "ab" / ("ab" + "0" * 62)).write_bytes(os.urandom(3 << 20))  # read chunk by chunk
    (media / "telegram" / "100").mkdir(parents=True)
    (media / "telegram" / "100" / "AGENTS.md").write_text("memory")
    return data, media


def left_over(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name not in ("data", "media_root"))


def open_under(root: Path) -> list[str]:
    """The files under ``root`` this process holds open (other tests' threads may open and close
    their own files meanwhile: only these count)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(str(root) + "/"):
            held.append(target)
    return held


def stat_says_longer(monkeypatch: pytest.MonkeyPatch, *files: Path) -> None:
    """``os.fstat`` of these files gives 100 bytes more than they hold: the size they had a moment
    before they were cut short, between the backup's look at their size and its read."""
    real_fstat, names = os.fstat, {str(f) for f in files}

    def fstat(fd: int) -> os.stat_result:
        result = real_fstat(fd)
        if os.readlink(f"/proc/self/fd/{fd}") in names:
            return os.stat_result((result.st_mode, *tuple(result)[1:6], result.st_size + 100, *tuple(result)[7:]))
        return result

    monkeypatch.setattr(os, "fstat", fstat)


# Who reads a large file and compresses (_Source._run): the reading thread (compressing large
# files' chunks and packing small files into compressed tar itself), or the writing thread (large
# files handed over to it, everything compressed there), as the other one falls behind; here
# forced one way or the other.
SHARES = {"reader-does-all": (0, 0), "writer-does-all": (99, 99)}  # (_HAND_OVER, _COMPRESS_HERE)


def share_work(monkeypatch: pytest.MonkeyPatch, share: tuple[int, int]) -> None:
    monkeypatch.setattr(backup_module, "_HAND_OVER", share[0])
    monkeypatch.setattr(backup_module, "_COMPRESS_HERE", share[1])


@pytest.mark.parametrize("share", SHARES.values(), ids=SHARES.keys())
@pytest.mark.parametrize("log_bytes", [10_000, 3 << 20])  # read whole, and chunk by chunk
def test_a_file_shorter_than_announced_fails_the_backup_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_bytes: int, share: tuple[int, int]) -> None:
    data, media = tree(tmp_path, log_bytes)
    share_work(monkeypatch, share)
    log = data / "sessions" / "telegram" / "100" / "main.jsonl"
    if log_bytes > 1 << 20:  # its last complete line looked for from the end, then read to there
        real = backup_module._complete_lines_size
        monkeypatch.setattr(backup_module, "_complete_lines_size", lambda fd, size: real(fd, size) + 100)
    else:  # read whole, as long as its stat said
        stat_says_longer(monkeypatch, log)
    with pytest.raises(BackupError, match="main.jsonl changed while it was archived"):
        backup(tmp_path / "a.tar.zst", data, media)
    assert left_over(tmp_path) == []


def test_a_failure_in_the_reading_thread_is_raised_and_leaves_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    data, media = tree(tmp_path, 10_000)
    (data / "tasks.sqlite3").write_bytes(b"")

    def broken(src: Path, dst: Path) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(backup_module, "_sqlite_snapshot", broken)
    with pytest.raises(OSError, match="disk on fire"):
        backup(tmp_path / "a.tar.zst", data, media)
    assert left_over(tmp_path) == []
    monkeypatch.undo()
    manifest = backup(tmp_path / "a.tar.zst", data, media)  # and it works once the cause is gone
    assert verify(tmp_path / "a.tar.zst") == manifest
    assert listing(tmp_path / "a.tar.zst")["data/attachments/ab/ab" + "0" * 62][0] == 3 << 20


def test_a_file_removed_after_the_scan_is_passed_over_and_a_data_dir_error_still_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the scan and the read a file can go (an attachment retired, a file the agent
    deleted): it is not in the archive, and nothing fails. A data dir file that cannot be read
    for any other reason still fails the backup (that would be a store lost)."""
    data, media = tree(tmp_path, 10_000)
    real = backup_module._scan
    gone = media / "telegram" / "100" / "gone.md"

    def scan_then_remove(top: str, prefix: str, left_out: list[str] | None = None):  # type: ignore[no-untyped-def]
        for path, rel, entry in real(top, prefix, left_out):
            yield path, rel, entry
            if rel == "media/telegram/100/AGENTS.md":  # scanned, read later by the reading thread
                yield str(gone), "media/telegram/100/gone.md", entry

    monkeypatch.setattr(backup_module, "_scan", scan_then_remove)
    manifest = backup(tmp_path / "a.tar.zst", data, media)
    assert "media/telegram/100/gone.md" not in listing(tmp_path / "a.tar.zst") and manifest.left_out == []
    assert "media/telegram/100/AGENTS.md" in listing(tmp_path / "a.tar.zst")
    monkeypatch.undo()
    locked = data / "sessions" / "telegram" / "100" / "CHAT"
    locked.mkdir()  # a directory where a file is read: not a regular file, in the data dir
    real_scan = backup_module._scan

    def scan_dir_as_file(top: str, prefix: str, left_out: list[str] | None = None):  # type: ignore[no-untyped-def]
        yield from real_scan(top, prefix, left_out)
        if prefix == "":
            yield str(locked), "sessions/telegram/100/CHAT", None

    monkeypatch.setattr(backup_module, "_scan", scan_dir_as_file)
    with pytest.raises(OSError, match="no longer a regular file"):
        backup(tmp_path / "b.tar.zst", data, media)
    assert not (tmp_path / "b.tar.zst").exists()


def test_a_workspace_file_swapped_for_a_link_or_a_pipe_after_the_scan_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the scan and the read an agent can replace a file of its workspace with a link to a
    host file (which the archive, and a restore, would then hand back to it) or with a pipe (whose
    open waits for a writer: the backup would hang). Neither is followed or waited on: both are
    left out and named, and the rest is archived."""
    import threading

    import zstandard

    data, media = tree(tmp_path, 10_000)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP SECRET of the host")
    workspace = media / "telegram" / "100"
    (workspace / "link.md").symlink_to(secret)
    os.mkfifo(workspace / "pipe.md")
    real = backup_module._scan

    def scan_then_swap(top: str, prefix: str, unreadable=None):  # type: ignore[no-untyped-def]
        for path, rel, entry in real(top, prefix, unreadable):
            yield path, rel, entry
            if rel == "media/telegram/100/AGENTS.md":  # as if they had been regular files at the scan
                for name in ("link.md", "pipe.md"):
                    yield str(workspace / name), f"media/telegram/100/{name}", entry

    monkeypatch.setattr(backup_module, "_scan", scan_then_swap)
    done: dict[str, backup_module.Manifest] = {}
    worker = threading.Thread(target=lambda: done.setdefault("manifest", backup(tmp_path / "a.tar.zst", data, media)),
                              daemon=True)
    worker.start()
    worker.join(60)  # the bound of a wait for the backup to end, not a guess at its time
    assert not worker.is_alive(), "the backup is waiting on the pipe"
    manifest = done["manifest"]
    assert manifest.left_out == ["media/telegram/100/link.md (Too many levels of symbolic links)",
                                 "media/telegram/100/pipe.md (no longer a regular file)"]
    listed = listing(tmp_path / "a.tar.zst")
    assert "media/telegram/100/AGENTS.md" in listed and not any("link" in n or "pipe" in n for n in listed)
    with open(tmp_path / "a.tar.zst", "rb") as raw:
        assert b"TOP SECRET" not in zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()


@pytest.mark.parametrize("share", SHARES.values(), ids=SHARES.keys())
def test_a_small_workspace_file_that_shrinks_while_read_is_archived_as_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: tuple[int, int]) -> None:
    """A workspace file cut short between the reader's look at its size and its read (an agent
    rewriting it) is archived as it was read, not a failed backup; the same in the data dir still
    fails it (a store or a log cut short is a fault to report). Also when the reading thread packs
    and compresses the small files itself."""
    data, media = tree(tmp_path, 10_000)
    share_work(monkeypatch, share)
    notes = media / "telegram" / "100" / "notes.md"
    notes.write_text("a long note that the agent is about to cut")
    stat_says_longer(monkeypatch, notes, data / "sessions" / "telegram" / "100" / "CHAT")
    manifest = backup(tmp_path / "a.tar.zst", data, media)
    assert listing(tmp_path / "a.tar.zst")["media/telegram/100/notes.md"][0] == len("a long note that the agent is about to cut")
    assert verify(tmp_path / "a.tar.zst") == manifest
    (data / "sessions" / "telegram" / "100" / "CHAT").write_text("telegram:100")
    with pytest.raises(BackupError, match="CHAT changed while it was archived"):
        backup(tmp_path / "b.tar.zst", data, media)


def test_a_workspace_directory_swapped_for_a_link_after_the_scan_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's own name is opened without following a link; a directory above it swapped for a
    link to a host directory after the scan would still lead elsewhere, so the file opened must be
    the one the scan saw (its inode): the host file is left out, never archived."""
    import zstandard

    data, media = tree(tmp_path, 10_000)
    host = tmp_path / "host"
    host.mkdir()
    (host / "notes.md").write_text("TOP SECRET of the host")
    workspace = media / "telegram" / "100"
    (workspace / "docs").mkdir()
    (workspace / "docs" / "notes.md").write_text("the agent's notes")
    real = backup_module._scan

    def scan_then_swap(top: str, prefix: str, unreadable=None):  # type: ignore[no-untyped-def]
        for path, rel, entry in real(top, prefix, unreadable):
            if rel == "media/telegram/100/docs/notes.md":  # scanned; then the directory becomes a link
                (workspace / "docs").rename(tmp_path / "docs-moved")
                (workspace / "docs").symlink_to(host, target_is_directory=True)
            yield path, rel, entry

    monkeypatch.setattr(backup_module, "_scan", scan_then_swap)
    manifest = backup(tmp_path / "a.tar.zst", data, media)
    assert manifest.left_out == ["media/telegram/100/docs/notes.md (no longer the file the scan saw)"]
    assert "media/telegram/100/docs/notes.md" not in listing(tmp_path / "a.tar.zst")
    with open(tmp_path / "a.tar.zst", "rb") as raw:
        assert b"TOP SECRET" not in zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()


def test_a_restore_never_loops_on_a_parent_that_is_a_dangling_link(tmp_path: Path) -> None:
    """A directory to make whose parent exists as a link to nowhere (planted in the target by
    someone else): the mkdir fails, and so does the restore's file, instead of trying forever."""
    import threading

    (tmp_path / "data").mkdir()
    (tmp_path / "media").mkdir()
    (tmp_path / "data" / "link").symlink_to(tmp_path / "nowhere")
    placer = backup_module._Placer(lambda name: tmp_path / name, threads=1)
    outcome: list[BaseException | None] = []

    def make() -> None:
        try:
            placer._make(tmp_path / "data" / "link" / "child")
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=make, daemon=True)
    worker.start()
    worker.join(30)  # the bound of a wait for the call to end, not a guess at its time
    placer.abort()
    assert not worker.is_alive(), "making the directory loops"
    assert isinstance(outcome[0], FileNotFoundError)


@pytest.mark.parametrize("share", SHARES.values(), ids=SHARES.keys())
def test_whichever_thread_hashes_and_compresses_the_archive_holds_every_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: tuple[int, int]) -> None:
    """Large files are read and hashed by the reading thread or the writing one, and the tar
    stream compressed in either (a large file's chunks, small files packed: a zstd frame each),
    whichever has time: the manifest's sums are the files' own either way, and the archive is a
    series of frames that zstd reads as one tar stream."""
    data, media = tree(tmp_path, 5 << 20)
    # Names a plain tar header cannot hold (a PAX header first), packed or not.
    (media / "telegram" / "100" / ("notes-ünïcødé-" + "n" * 120 + ".md")).write_text("long and not ASCII")
    share_work(monkeypatch, share)
    archive = tmp_path / "a.tar.zst"
    manifest = backup(archive, data, media)
    assert any(len(name) > 100 and not name.isascii() for name in listing(archive))
    sources = {"data": data, "media": media}
    for name, (size, digest) in listing(archive).items():
        top, rel = name.split("/", 1)
        body = (sources[top] / rel).read_bytes()
        assert (size, digest) == (len(body), hashlib.sha256(body).hexdigest()), name
    assert verify(archive) == manifest
    rest, frames = archive.read_bytes(), []
    while rest:  # frame by frame: a decompressobj stops at the end of its frame
        one = zstandard.ZstdDecompressor().decompressobj()
        frames.append(one.decompress(rest))
        rest = one.unused_data
    assert len(frames) > 5  # a frame per chunk of the large files at least
    whole = b"".join(frames)
    with open(archive, "rb") as raw:
        assert zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read() == whole
    with tarfile.open(fileobj=io.BytesIO(whole), mode="r:") as tar:
        got = {m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest()  # type: ignore[union-attr]
               for m in tar if m.name != "manifest.json"}
    assert got == {name: digest for name, (_, digest) in listing(archive).items()}


def test_files_handed_over_but_never_written_are_closed_when_a_backup_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large files handed to the writing thread wait in the queue open; a backup that fails
    meanwhile closes every one of them (no descriptor left behind in a long-running process)."""
    data, media = tree(tmp_path, 10_000)
    for n in range(6):
        (data / "attachments" / "ab" / (f"ab{n}" + "1" * 61)).write_bytes(os.urandom(2 << 20))
    share_work(monkeypatch, SHARES["writer-does-all"])

    def full_disk(self: object, *args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(backup_module._Writer, "add", full_disk)
    with pytest.raises(OSError, match="No space left"):
        backup(tmp_path / "a.tar.zst", data, media)
    assert open_under(tmp_path) == []
    assert left_over(tmp_path) == []


def test_the_progress_total_is_summed_only_for_a_backup_long_enough_to_show_a_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Summing the total walks the whole tree a second time (a tenth of a 1 GB backup's CPU); a
    backup over before the first progress line is due never does it, and leaves no timer behind.
    One that runs long enough sums both places."""
    data, media = tree(tmp_path, 10_000)
    summed: list[Path] = []
    both = threading.Event()
    real = backup_module._dir_size

    def counted(root: Path) -> int:
        summed.append(root)
        if len(summed) == 2:
            both.set()
        return real(root)

    monkeypatch.setattr(backup_module, "_dir_size", counted)
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(backup_module, "_SIZE_UP_AFTER", 3600.0)
    backup(tmp_path / "a.tar.zst", data, media, progress=lambda done, total: seen.append((done, total)))
    assert summed == [] and seen and all(total == 0 for _, total in seen)
    for timer in [t for t in threading.enumerate() if t.name == "talon-backup-size"]:
        timer.join(30)  # cancelled: it ends without summing
        assert not timer.is_alive()
    assert summed == []
    monkeypatch.setattr(backup_module, "_SIZE_UP_AFTER", 0.0)
    backup(tmp_path / "b.tar.zst", data, media, progress=lambda done, total: None)
    assert both.wait(30)
    assert summed == [data, media]


def test_a_file_handed_over_behind_one_that_fails_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large file handed to the writing thread can wait in the same batch behind a small one
    that fails there (a store cut short while it is archived): it is closed all the same."""
    data, media = tree(tmp_path, 10_000)
    small = data / "attachments" / "ab" / ("aa" + "2" * 62)
    small.write_bytes(b"cut short")
    (data / "attachments" / "ab" / ("ab" + "3" * 62)).write_bytes(os.urandom(2 << 20))
    share_work(monkeypatch, SHARES["writer-does-all"])
    stat_says_longer(monkeypatch, small)
    with pytest.raises(BackupError, match="changed while it was archived"):
        backup(tmp_path / "a.tar.zst", data, media)
    assert open_under(tmp_path) == []
    assert left_over(tmp_path) == []


def test_large_files_handed_over_go_into_a_gzip_archive_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With gzip nothing is compressed by the reading thread, but large files are still handed to
    the writing thread when it waits: the archive holds them whole, with their own sums."""
    data, media = tree(tmp_path, 5 << 20)
    share_work(monkeypatch, SHARES["writer-does-all"])
    archive = tmp_path / "a.tar.gz"
    manifest = backup(archive, data, media)
    assert listing(archive)["data/attachments/ab/ab" + "0" * 62][1] == hashlib.sha256(
        (data / "attachments" / "ab" / ("ab" + "0" * 62)).read_bytes()).hexdigest()
    assert verify(archive) == manifest


@pytest.mark.parametrize("share", SHARES.values(), ids=SHARES.keys())
@pytest.mark.parametrize("log_bytes", [10_000, 3 << 20])  # cut in the bytes read, and found from the end first
def test_a_line_being_written_is_left_out_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 log_bytes: int, share: tuple[int, int]) -> None:
    data, media = tree(tmp_path, log_bytes)
    share_work(monkeypatch, share)
    log = data / "sessions" / "telegram" / "100" / "main.jsonl"
    whole = log.read_bytes()
    with open(log, "ab") as fh:
        fh.write(b'{"role": "user", "content": [{"type": "te')  # a message half written
    manifest = backup(tmp_path / "a.tar.zst", data, media)
    name = "data/sessions/telegram/100/main.jsonl"
    assert listing(tmp_path / "a.tar.zst")[name] == (len(whole), hashlib.sha256(whole).hexdigest())
    assert verify(tmp_path / "a.tar.zst") == manifest


def test_a_large_log_that_cannot_be_read_back_fails_without_a_descriptor_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looking for a large log's last complete line reads it from the end; a disk error there
    fails the backup (a store of the data dir) and leaves its descriptor closed."""
    data, media = tree(tmp_path, 3 << 20)

    def broken_pread(fd: int, n: int, offset: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pread", broken_pread)
    with pytest.raises(OSError, match="Input/output error"):
        backup(tmp_path / "a.tar.zst", data, media)
    assert open_under(tmp_path) == []
    assert left_over(tmp_path) == []


@pytest.mark.parametrize("share", SHARES.values(), ids=SHARES.keys())
def test_a_large_workspace_file_cut_short_while_read_is_archived_as_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        share: tuple[int, int]) -> None:
    """An agent rewriting a large file in its workspace while the backup reads it (here: cut to
    half between the backup's stat and its read) does not fail the operator's backup. The member
    (its size already in its header) is filled up with zeros and named in the manifest; a restore
    gives back the bytes that were read. (In the data dir it still fails the backup:
    test_a_file_shorter_than_announced_fails_the_backup_and_leaves_nothing.)"""
    from talon.cli import main

    data, media = tree(tmp_path, 10_000)
    big = media / "telegram" / "100" / "video.mp4"
    original = os.urandom(3 << 20)
    big.write_bytes(original)
    share_work(monkeypatch, share)
    real_fstat = os.fstat

    def fstat_then_cut(fd: int) -> os.stat_result:
        result = real_fstat(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == str(big) and result.st_size == len(original):
            os.truncate(big, len(original) // 2)  # the agent rewrites it right after the look
        return result

    monkeypatch.setattr(os, "fstat", fstat_then_cut)
    archive = tmp_path / "a.tar.zst"
    manifest = backup(archive, data, media)
    name = "media/telegram/100/video.mp4"
    assert manifest.cut == {name: len(original) // 2}
    assert listing(archive)[name][0] == len(original)
    monkeypatch.undo()
    assert verify(archive).cut == manifest.cut
    assert main(["backup", "--verify", str(archive)]) == 0
    assert f"{name} (1.5 MB)" in capsys.readouterr().err
    result = restore(archive, tmp_path / "r" / "data")
    assert (result.media_root / "telegram" / "100" / "video.mp4").read_bytes() == original[:len(original) // 2]
    assert (result.media_root / "telegram" / "100" / "AGENTS.md").read_text() == "memory"


def test_a_manifest_that_cuts_what_it_may_not_is_refused(tmp_path: Path) -> None:
    """``cut`` comes from the archive, so it is checked like the rest: only workspace files the
    manifest lists, never longer than they are."""
    data, media = tree(tmp_path, 10_000)
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    with open(archive, "rb") as raw:
        whole = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(whole), mode="r:") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    for label, cut in (("data", {"data/sessions/telegram/100/CHAT": 0}),
                       ("longer", {"media/telegram/100/AGENTS.md": 10_000}),
                       ("unlisted", {"media/telegram/100/other.md": 0}),
                       ("not-a-mapping", ["media/telegram/100/AGENTS.md"])):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
            for info, body in members:
                if info.name == "manifest.json":
                    body = json.dumps({**json.loads(body), "cut": cut}).encode()
                    info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        hostile = tmp_path / f"{label}.tar.zst"
        hostile.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))
        refused = "manifest is unreadable" if label == "not-a-mapping" else "cuts .* which it may not"
        with pytest.raises(BackupError, match=refused):
            verify(hostile)
        with pytest.raises(BackupError, match=refused):
            restore(hostile, tmp_path / "r" / label / "data")
        assert not (tmp_path / "r").exists()


def test_two_restore_threads_racing_for_a_parent_directory_both_get_their_file(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writing threads need the same missing directory: one's mkdir of the child fails while
    the other makes the parent and marks it made. The first must then make the child, not take
    the parent for a dangling link (a restore failed so, now and then, with "No such file or
    directory"). The interleaving is played here in one thread, step by step."""
    (tmp_path / "data").mkdir()
    (tmp_path / "media").mkdir()
    placer = backup_module._Placer(lambda name: tmp_path / name, threads=1)
    parent = tmp_path / "data" / "attachments"
    child = parent / "ab"
    real_mkdir = os.mkdir
    raced = []

    def mkdir(path: os.PathLike[str] | str, mode: int = 0o777) -> None:
        if Path(path) == child and not raced:
            raced.append(True)
            real_mkdir(parent, mode)  # the other thread, between this mkdir's failure and its check
            placer.made.add(parent)
            raise FileNotFoundError(2, "No such file or directory", str(child))
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    try:
        placer._make(child)
    finally:
        placer.abort()
    assert raced and child.is_dir() and child in placer.made
