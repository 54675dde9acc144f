"""``talon backup | backup --verify | restore``: one archive of everything a Talon keeps.

The archive is a tar stream (``.tar.zst`` with zstandard, or ``.tar.gz``) in ONE layout whatever
the source: the embedded layout of ``TALON_DATA_DIR`` under ``data/`` and the media root (the
per-chat workspaces: memory files, skills, files the agent made) under ``media/``, then
``manifest.json`` last: the sha256 and size of every member, the format, the schema version and
where it came from. So an archive of an embedded Talon restores into PostgreSQL and back.

Taken from an embedded Talon, running or not: each SQLite database through SQLite's online backup
API (a consistent snapshot while writers go on; WhatsApp delivery claims and the panel's sign-ins
are cleared in it), each
session log up to its last complete line (a message being written is left out whole, never half
in), the other files as they are. The search index (``EMBEDDED_DERIVED``) is snapshotted the same
way before any session log is read: the logs only grow, so every line it covers is in the archive,
and a restore indexes only the lines past that (rebuilding it took a third of a restore's time).
From PostgreSQL: every table ``talon.storage.pg_export``
declares archived, read with ``COPY ... TO STDOUT`` inside one REPEATABLE READ, read-only
transaction (one consistent snapshot of all of them) and written in the embedded layout;
attachments chunk by chunk. Files go
through temporary files (the snapshots of the stores before the logs together, taken ahead; any
other one at a time), and so does the manifest's list of files (``_Writer``): memory stays flat
whatever the size and however many files.

``verify`` reads the whole archive: only regular files under ``data/`` and ``media/`` with safe
relative names, each exactly once, each matching the manifest, nothing missing, nothing extra;
the manifest read as a stream (``_read_manifest``) and compared on the disk (``_Tally``).
``restore`` reads the archive once, into a data dir and a media root that are empty or absent
(never over live data): each member is checked as ``verify`` checks it before it is written, and
hashed as it is written; only when the whole archive matched its manifest does it bring the
search index up to the restored logs, or, with a database URL, copy the stores into that (empty) database with
``talon.storage.migrate`` and its checks, and sync what it wrote to the disk before it returns.
Anything that fails, a tampered archive or Ctrl-C included, removes what the restore wrote. The
tar stream is read by ``_TarReader`` (regular files only, every header checked), not tarfile.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import queue
import sqlite3
import stat
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from talon.errors import BackupError
from talon.permissions import DIR_MODE, open_private, private_dir

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
_CHUNK = 1 << 20
_QUEUED = 8  # batches of about _CHUNK between a restore's reading and writing threads
_MADE_KEPT = 4096  # directories a restore remembers having made (``_Placer.made``)
_TALLY_BATCH = 2048  # rows that go into a ``_Tally`` table at once
# A backup's two threads (``_Source``): at most _BACKUP_QUEUED items of about _CHUNK between them
# (16 MB: a thread busy with a large file does not stall the other, as 8 did: 4% of the wall
# time); the reading thread hands a large file over whole to the writing thread when fewer than
# _HAND_OVER items wait (that thread is idle), and compresses a large file's chunk, or packs a
# batch of small files into compressed tar, itself when at least _COMPRESS_HERE wait (that thread
# is behind). Other values nearby measured the same, within the noise.
_BACKUP_QUEUED = 16
_HAND_OVER = 4
_COMPRESS_HERE = 8
# A backup's progress total is summed (a second walk of the whole tree: 0.2 s of CPU for 18,000
# files, a tenth of a 1 GB backup) only once it has run this long: the CLI's first progress line
# comes at 2 s (with the bytes done; the total joins the lines after it), so a shorter backup
# shows none and needs no total.
_SIZE_UP_AFTER = 2.0
# zstd level 1 on every core: faster than the disk here, and within a few % of level 3 on what
# Talon keeps (photos and voice notes are compressed already); see docs/backup.md, Figures.
ZSTD_LEVEL = 1
GZIP_LEVEL = 1
# Files of a data dir that are not archived: derived (the search index), SQLite's side files (the
# backup API reads through them), logs and leftovers of interrupted writes.
_SKIP_NAMES = {"local_model.log"}
_SKIP_SUFFIXES = ("-wal", "-shm", "-journal", ".tmp")
_SKIP_DIRS = {"migrate-check"}
_INDEX = "search.sqlite3"
# Embedded store files that are not archived, and why (every other file of the data dir is;
# tests/test_backup_coverage.py checks each store file the embedded stores make is one or the other).
EMBEDDED_NOT_ARCHIVED: dict[str, str] = {}
# Embedded store files that are archived but derived: never copied into PostgreSQL (which keeps its
# own index) and, when unreadable, rebuilt from the conversations.
EMBEDDED_DERIVED = {
    # The full-text index: snapshotted before any session log is read (the logs only grow, so every
    # line it covers is in the archive), and on restore brought up to the restored logs' end.
    _INDEX: "search index (a snapshot taken before the logs; caught up on restore)",
}

Progress = Callable[[int, int], None]  # (bytes done, bytes expected; 0 when unknown)


@dataclass
class Manifest:
    """An archive's manifest without its list of files: that list is as long as the archive has
    files, so it is never held whole in memory. A backup writes it line by line to a scratch file
    as it goes (``_Writer``); a restore or verify reads it as a stream (``_read_manifest``) into
    a table on the disk (``_Tally``)."""

    source: str  # "embedded" or "postgres"
    schema_version: int
    created: float
    format: int = FORMAT
    count: int = 0  # the files it lists
    total_bytes: int = 0  # their sizes, summed
    # What a workspace held that could not be read, with why ("media/t/1/x (Permission denied)")
    left_out: list[str] = field(default_factory=list)
    # Workspace files cut short while they were read (an agent rewriting one): name -> the bytes
    # read. Each member holds those bytes then zeros to the size its header had already given; a
    # restore cuts the file back to the bytes read. (An optional key: older Talons ignore it.)
    cut: dict[str, int] = field(default_factory=dict)

    def head(self) -> bytes:
        """The manifest's JSON up to its list of files (which follows, one file a line, then
        ``_MANIFEST_END``)."""
        head = json.dumps({"format": self.format, "source": self.source, "schema_version": self.schema_version,
                           "created": self.created, **({"left_out": self.left_out} if self.left_out else {}),
                           **({"cut": dict(sorted(self.cut.items()))} if self.cut else {})})
        return (head[:-1] + ', "files": [\n').encode("utf-8")


_MANIFEST_END = b"\n]}\n"


# --- archives ---------------------------------------------------------------------------------
def _compression(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".tar.zst") or name.endswith(".tzst"):
        return "zst"
    if name.endswith(".tar.gz") or name.endswith(".tgz"):
        return "gz"
    raise BackupError(f"{path.name}: name the archive .tar.zst or .tar.gz")


class _Sink:
    """The tar stream on its way into the compressor: counts the bytes (the end record's padding
    needs the position) and gathers small writes (headers, padding, small files) into blocks of
    about ``_CHUNK``, so the compressor sees large writes only. ``write_frame`` puts a piece the
    ``_Source`` thread compressed already (zstd only) in its place."""

    def __init__(self, out: Any) -> None:
        self.out, self.pos, self.buf = out, 0, bytearray()

    def write(self, data: bytes | memoryview) -> int:
        n = len(data)
        self.pos += n
        if n >= _CHUNK // 4:
            if self.buf:
                self.out.write(self.buf)
                self.buf = bytearray()
            self.out.write(data)
        else:
            self.buf += data
            if len(self.buf) >= _CHUNK:
                self.out.write(self.buf)
                self.buf = bytearray()
        return n

    def write_frame(self, frame: bytes, n: int) -> None:
        """A zstd frame of the next ``n`` bytes of the tar stream."""
        self.flush()
        self.pos += n
        self.out.raw.write(frame)

    def flush(self) -> None:
        if self.buf:
            self.out.write(self.buf)
            self.buf = bytearray()


class _Frames:
    """zstd's side of a ``_Sink``: each block of the tar stream becomes a zstd frame of its own
    (``ZstdCompressor.compress``, the GIL let go). One streaming frame copied every byte into its
    window and matched across calls; one-shot frames of about 1 MB took 10% less CPU for the whole
    backup and a fifth less wall time, at the same size on what Talon keeps (docs/backup.md).
    And a frame can be made in either thread: ``_Source`` compresses chunks itself when this one
    falls behind. Any zstd reads a series of frames as one stream (``zstd -d``, ``tar --zstd``,
    and ``_open_stream`` here)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self._compress = raw, _zstd_compress()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.raw.write(self._compress(data))
        return len(data)

    def close(self) -> None:
        pass


def _zstd_compress() -> Callable[[bytes | bytearray | memoryview], bytes]:
    import zstandard

    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress


_BLOCK = tarfile.BLOCKSIZE  # 512
_RECORD = tarfile.RECORDSIZE  # what a tar stream is padded to at its end (tarfile's and GNU tar's 10 KB)
_USTAR_MAX = 8 ** 11  # sizes and times that fit the header's 11 octal digits


def _header(name: str, size: int, mtime: int) -> bytes:
    """The tar header of a regular file, mode 0600, owner 0, as tarfile's PAX format writes it.
    For the common case (an ASCII name of at most 100 bytes, under 8 GiB) that is one plain
    ustar block, built here byte for byte as tarfile builds it (tests/test_backup_tar_format.py)
    at a tenth of its CPU (tarfile's per-member work was a fifth of a backup of many small
    files); anything else is tarfile's own (a PAX extended header first)."""
    if len(name) <= 100 and name.isascii() and 0 <= size < _USTAR_MAX and 0 <= mtime < _USTAR_MAX:
        head = b"%s0000600\x000000000\x000000000\x00%011o\x00%011o\x00" % (name.encode("ascii").ljust(100, b"\0"),
                                                                     size, mtime)
        chksum = sum(head) + 8 * 32 + _TAIL_SUM
        return head + b"%06o\x00 " % chksum + _TAIL
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, mtime
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _padding(size: int) -> bytes:
    """The zeros after a member of ``size`` bytes, to the next whole tar block."""
    return bytes(-size % _BLOCK)


# After the checksum: type "0" (a regular file), no link, "ustar\0" "00", no user or group names,
# no device numbers (empty, as tarfile writes them for a regular file), no prefix, padding.
_TAIL = (b"0" + b"\0" * 100 + b"ustar\x0000").ljust(_BLOCK - 156, b"\0")
_TAIL_SUM = sum(_TAIL)


class _Writer:
    """A tar stream into ``path`` (written as ``path.partial``, renamed when complete).

    zstandard compresses at level 1, a frame per block (``_Frames``), here or in the ``_Source``
    thread, which reads and hashes meanwhile: reading, hashing and compressing overlap, and each
    thread takes on the other's share when that one falls behind (``_Source._run``). The tar
    stream is written here (``_header``: what tarfile writes, without its per-member cost) into a
    ``_Sink``, which hands the compressor large writes only."""

    def __init__(self, path: Path, progress: Progress | None, expected: int) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.kind = _compression(path)
        self._raw = _ArchiveFile(open_private(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
        self._zst: Any = None  # the compressing stream (zstd frames, or gzip)
        if self.kind == "zst":
            self._zst = _Frames(self._raw)
        else:
            import gzip

            self._zst = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=GZIP_LEVEL)
        self._sink = _Sink(self._zst)
        # The manifest's list of files, a line each as the files are archived: in a scratch file
        # beside the archive (unnamed where the system can: nothing to clean up), not in memory.
        self._listing = tempfile.TemporaryFile(dir=self.partial.parent, prefix=".talon-manifest-")
        self.count = self.total = 0
        self.cut: dict[str, int] = {}  # Manifest.cut
        self.progress, self.expected, self.done = progress, expected, 0

    def _member(self, name: str, size: int, mtime: float | None) -> None:
        self._sink.write(_header(name, size, int(mtime if mtime is not None else time.time())))

    def _pad(self, size: int) -> None:
        if size % _BLOCK:
            self._sink.write(_padding(size))

    def add(self, name: str, fh: IO[bytes], size: int, mtime: float | None = None) -> None:
        self._member(name, size, mtime)
        reader = _HashingReader(fh, size, self._advance)
        while data := reader.read(_CHUNK):
            self._sink.write(data)
        if reader.read_bytes != size:
            if not _cut_short_allowed(name, reader.read_bytes, size):
                raise BackupError(f"{name} changed while it was archived (read {reader.read_bytes} of {size} bytes)")
            for zeros in _zeros(size - reader.read_bytes):
                reader.sha.update(zeros)
                self._sink.write(zeros)
            self.cut[name] = reader.read_bytes
        self._pad(size)
        self._list(name, size, reader.sha.hexdigest())

    def add_read(self, read: _Read, source: _Source) -> None:
        """A file the ``_Source`` thread read (and hashed): whole, or chunk by chunk from it; or
        handed over, to be read (hashed, compressed) here."""
        if read.fd is not None:
            fd, read.fd = read.fd, None
            with open(fd, "rb", buffering=0) as fh:
                self.add(read.name, fh, read.size, read.mtime)
            return
        self._member(read.name, read.size, read.mtime)
        if read.data is not None:
            got, digest = len(read.data), read.sha256
            if got == read.size:
                self._sink.write(read.data)
                self._advance(got)
        else:
            while (item := source.chunk())[0] == "chunk":
                _, piece, n = item
                if n is None:
                    self._sink.write(piece)
                    n = len(piece)
                else:  # compressed there: a zstd frame of the next n bytes
                    self._sink.write_frame(piece, n)
                self._advance(n)
            _, got, digest, cut = item
            if cut is not None:
                self.cut[read.name] = cut
        if got != read.size:
            raise BackupError(f"{read.name} changed while it was archived (read {got} of {read.size} bytes)")
        self._pad(read.size)
        self._list(read.name, read.size, digest)

    def add_packed(self, packed: _Packed) -> None:
        """Small files the ``_Source`` thread packed and compressed (their sizes checked there)."""
        self._sink.write_frame(packed.frame, packed.size)
        for read in packed.reads:
            self._list(read.name, read.size, read.sha256)
            self._advance(read.size)

    def _list(self, name: str, size: int, digest: str) -> None:
        """The file's line in the manifest (in the archive's order)."""
        line = json.dumps({"path": name, "size": size, "sha256": digest})
        self._listing.write((",\n" + line if self.count else line).encode("utf-8"))
        self.count += 1
        self.total += size

    def add_file(self, name: str, path: Path | str, size: int | None = None) -> None:
        with open(path, "rb", buffering=0) as fh:
            st = os.fstat(fh.fileno())
            self.add(name, fh, st.st_size if size is None else size, st.st_mtime)

    def size_up(self, data_dir: Path, media_root: Path) -> None:
        """The bytes to expect (the progress lines' total; 0 until known)."""
        self.expected = _dir_size(data_dir) + _dir_size(media_root)

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.expected)

    def finish(self, manifest: Manifest) -> None:
        manifest.count, manifest.total_bytes, manifest.cut = self.count, self.total, self.cut
        head, listed = manifest.head(), self._listing.tell()
        size = len(head) + listed + len(_MANIFEST_END)
        self._member(MANIFEST, size, None)
        self._sink.write(head)
        self._listing.seek(0)
        while data := self._listing.read(_CHUNK):
            self._sink.write(data)
        self._listing.close()
        self._sink.write(_MANIFEST_END)
        self._pad(size)
        # The end of the archive: two zero blocks, then zeros to a whole record (as tarfile and tar).
        self._sink.write(bytes(2 * _BLOCK))
        if self._sink.pos % _RECORD:
            self._sink.write(bytes(_RECORD - self._sink.pos % _RECORD))
        self._sink.flush()
        if self._zst is not None:
            self._zst.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        for closer in (*(() if self._zst is None else (self._zst.close,)), self._raw.close, self._listing.close):
            try:
                closer()
            except Exception:
                pass
        self.partial.unlink(missing_ok=True)


class _ArchiveFile(io.FileIO):
    """The archive being written (unbuffered), its pages sent to the disk as it grows: every
    ``_WRITTEN_BACK`` bytes, ``posix_fadvise(DONTNEED)`` starts the writeback of what was written
    since (without waiting for it) and lets the page cache drop what is already on the disk. The
    fsync at the end then waits for the last stretch only, not for the whole archive (0.4 s of a
    2.3 s backup of 1 GB), and a backup does not fill the page cache with its archive."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd, "wb")
        self.written = self.started = 0

    def write(self, data: Any) -> int:
        n = super().write(data) or 0
        self.written += n
        if self.written - self.started >= _WRITTEN_BACK:
            _start_writeback(self.fileno(), self.started, self.written - self.started)
            self.started = self.written
        return n


_WRITTEN_BACK = 32 << 20


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing ``length`` bytes of ``fd`` from ``offset`` (0: to the end)
    to the disk without waiting for it, and drop from the page cache what is there already:
    ``posix_fadvise(DONTNEED)`` (Linux starts the writeback of dirty pages and frees clean ones;
    elsewhere, if there is no such call, nothing)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class _HashingReader(io.RawIOBase):
    """Reads at most ``limit`` bytes of ``fh``, hashing them (what tar stores is what is summed)."""

    def __init__(self, fh: IO[bytes], limit: int, advance: Callable[[int], None]) -> None:
        self.fh, self.left, self.sha, self.read_bytes, self.advance = fh, limit, hashlib.sha256(), 0, advance

    def read(self, n: int | None = -1) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fh.read(want)
        self.left -= len(data)
        self.read_bytes += len(data)
        self.sha.update(data)
        self.advance(len(data))
        return data


class _TarReader:
    """The regular files of a tar stream, read forward from a decompressing stream in blocks of
    about ``_CHUNK``: ``members()`` gives (name, size) of each, then ``data(size)`` its bytes as
    memoryviews into those blocks (no copy; the blocks are freed when the last view goes).

    What it reads is what ``_Writer`` writes (and what tarfile and GNU tar write for regular
    files): ustar headers (the prefix field honoured), a PAX extended header before a member whose
    name or size does not fit one. Each header's checksum is checked. Anything else (links,
    directories, devices, GNU long names, sparse files, global PAX headers) is refused by name, as
    is a header or a member that the stream ends inside of: a Talon archive holds regular files
    only. The end is the first block of zeros (or the stream's end at a header), as for tar.
    (tarfile parsed a header in about 35 microseconds and copied every member's bytes twice more:
    a third of a restore's reading thread; tests/test_backup_tar_format.py reads the same
    members as tarfile does from archives tarfile writes.)"""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.block, self.view, self.at = b"", memoryview(b""), 0

    def _fill(self) -> bool:
        self.block = self.stream.read(_CHUNK)
        self.view, self.at = memoryview(self.block), 0
        return bool(self.block)

    def _header(self) -> bytes | None:
        """The next 512-byte block; None when the stream ends exactly here."""
        if len(self.block) - self.at >= _BLOCK:
            self.at += _BLOCK
            return self.block[self.at - _BLOCK:self.at]
        head = self.block[self.at:]
        while len(head) < _BLOCK:
            if not self._fill():
                if head:
                    raise BackupError("the archive is damaged: it ends inside a tar header (truncated): refused")
                return None
            take = _BLOCK - len(head)
            head += self.block[:take]
            self.at = min(take, len(self.block))
        return head

    def data(self, size: int) -> Iterator[memoryview]:
        """The member's ``size`` bytes (in views of at most ``_CHUNK``), then past its padding."""
        padding = -size % _BLOCK
        left = size + padding
        while left:
            if self.at >= len(self.block) and not self._fill():
                raise BackupError("the archive is damaged: it ends inside a member's data (truncated): refused")
            n = min(left, len(self.block) - self.at)
            part = min(n, max(0, left - padding))  # the member's own bytes in this step
            if part:
                yield self.view[self.at:self.at + part]
            self.at += n
            left -= n

    def members(self) -> Iterator[tuple[str, int]]:
        pax: dict[str, str] = {}
        while True:
            head = self._header()
            if head is None or head == _ZERO_BLOCK:
                if pax:
                    raise BackupError("the archive is damaged: it ends after a PAX header (truncated): refused")
                return
            name, size, kind = _parse_header(head)
            if kind == b"x":
                if pax:
                    raise BackupError(f"two PAX headers in a row before {name!r}: refused")
                if size > 1 << 20:
                    raise BackupError("a PAX header of implausible size: refused")
                pax = _parse_pax(b"".join(self.data(size)))
                continue
            name, size = pax.get("path", name), int(pax["size"]) if "size" in pax else size
            pax = {}
            if kind not in (b"0", b"\0"):
                raise BackupError(f"the archive holds {name!r}, which is not a regular file "
                                  f"(tar type {kind.decode('latin-1')!r}): refused")
            yield name, size


_ZERO_BLOCK = bytes(_BLOCK)


def _parse_header(head: bytes) -> tuple[str, int, bytes]:
    """(name, size, type flag) of a tar header block whose checksum holds, else BackupError."""
    try:
        stored = int(head[148:156].split(b"\0", 1)[0].strip() or b"x", 8)
    except ValueError:
        raise BackupError("the archive holds a damaged tar header (no checksum): refused") from None
    unsigned = sum(head[:148]) + 256 + sum(head[156:])
    if stored != unsigned and stored != unsigned - 256 * sum(1 for b in head[:148] + head[156:] if b >= 128):
        raise BackupError("the archive holds a damaged tar header (bad checksum): refused")
    name = head[:100].split(b"\0", 1)[0]
    prefix = head[345:500].split(b"\0", 1)[0]
    if prefix:
        name = prefix + b"/" + name
    field = head[124:136]
    if field[0] == 0o200:  # base-256 (GNU), for sizes of 8 GiB and more
        size = int.from_bytes(field[1:], "big")
    else:
        try:
            size = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            raise BackupError("the archive holds a damaged tar header (its size): refused") from None
    if size < 0:
        raise BackupError("the archive holds a damaged tar header (its size): refused")
    return name.decode("utf-8", "surrogateescape"), size, head[156:157]


def _parse_pax(data: bytes) -> dict[str, str]:
    """The records of a PAX extended header ("LENGTH KEY=VALUE\\n" each); only ``path`` and
    ``size`` change what is read (a sparse file, which they would not describe, is refused)."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 21)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        end = pos + length
        if length <= 0 or end > len(data) or data[end - 1:end] != b"\n" or b"=" not in data[space + 1:end]:
            raise BackupError("the archive holds a damaged PAX header: refused")
        key, _, value = data[space + 1:end - 1].partition(b"=")
        text = key.decode("utf-8", "surrogateescape")
        if text.startswith("GNU.sparse."):
            raise BackupError("the archive holds a sparse file, which is not a Talon archive's: refused")
        records[text] = value.decode("utf-8", "surrogateescape")
        pos = end
    if "size" in records and not records["size"].isdigit():
        raise BackupError("the archive holds a damaged PAX header (its size): refused")
    return records


def _open_stream(path: Path) -> tuple[Any, list[Any]]:
    """The archive's decompressed tar stream (``read(n)``), and what to close after it."""
    kind = _compression(path)
    raw = open(path, "rb", buffering=0)
    if kind == "zst":
        import zstandard

        # Every frame, not the first only: zstd allows several in one stream (pzstd, concatenation).
        stream: Any = zstandard.ZstdDecompressor().stream_reader(raw, read_size=_CHUNK, closefd=False,
                                                                 read_across_frames=True)
    else:
        import gzip

        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    return stream, [stream, raw]


def _safe_member_name(name: str) -> str:
    """``name`` when it is a plain relative name under ``data/`` or ``media/``: no empty, ``.`` or
    ``..`` part (so nothing absolute, nothing that a path would normalize differently), no
    backslash, no NUL; else BackupError. (String checks: a PurePosixPath per member cost 40
    microseconds of the restore's reading thread.)"""
    parts = name.split("/")
    if (len(parts) < 2 or parts[0] not in ("data", "media") or "" in parts or "." in parts or ".." in parts
            or "\\" in name or "\x00" in name):
        raise BackupError(f"the archive holds an unsafe or unexpected name {name!r}: refused")
    return name


class _damaged:
    """Turns what a broken stream raises (gzip, zstandard, a short file) into BackupError (the tar
    reader raises BackupError itself)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, (BackupError, GeneratorExit, KeyboardInterrupt)):
            return
        broken = isinstance(exc, (EOFError, OSError)) or (
            type(exc).__module__.startswith("zstandard") or "zstd" in type(exc).__name__.lower())
        if broken:
            raise BackupError(f"{self.path.name} is damaged or not a Talon archive ({exc}): refused") from None


def verify(path: Path, progress: Progress | None = None) -> Manifest:
    """Read the whole archive and check it against its manifest; the manifest, or BackupError."""
    return _read_checked(path, progress, None)


def _placers() -> int:
    """Threads that create, hash and write a restore's files: creating many small files is
    mostly waiting on the file system's metadata (a few hundred microseconds a file on a virtual
    disk), which threads overlap; at least two, at most four."""
    return max(2, min(os.cpu_count() or 1, 4))


class _Placer:
    """The hashing and writing half of a restore (of a verify: hashing only), in threads of their
    own (``_placers``), so that decompressing and reading the tar (the main thread) overlaps
    hashing, creating and writing the files (hashlib and the system calls let go of the GIL).
    Each member goes whole to one thread, in batches of (name, data, first, last) through that
    thread's bounded queue: memory stays flat (at most ``_QUEUED`` batches of about ``_CHUNK``
    per thread in flight). A failure in a thread is raised in the main thread at its next batch;
    the threads keep draining their queues until ``finish`` or ``abort``, which always wait for
    them, so nothing is written after either returns. A file of ``_CHUNK`` or more is sent to
    the disk once written (``_start_writeback``), so the restore's closing sync has less left."""

    def __init__(self, place: Callable[[str], Path] | None, threads: int | None = None) -> None:
        self.place = place
        # (name, size, sha256) of each member written, until the main thread takes them (``take``)
        self.done: deque[tuple[str, int, str]] = deque()
        # The directories made (or found) so far, for all the threads: a file's directory is made
        # before the file is opened, not after an open failed (a failed open is a whole path
        # lookup: 10,900 of them in a restore of 18,400 files).
        # The two places themselves exist already (and keep the mode they have). At most
        # ``_MADE_KEPT`` are kept (the archive holds a directory's files together, so the ones made
        # last are the ones asked for again; forgetting one costs a ``mkdir`` that finds it).
        self._roots = frozenset({place(f"{top}/-").parent for top in ("data", "media")} if place else ())
        self.made: set[Path] = set(self._roots)
        self.exact_modes = _umask_spares_owner()
        self.error: BaseException | None = None
        self.cancel = False
        n = threads or _placers()
        self._queues: list[queue.Queue[list[tuple[str, bytes | memoryview, bool, bool]] | None]] = [
            queue.Queue(maxsize=_QUEUED) for _ in range(n)]
        self._batches: list[list[tuple[str, bytes | memoryview, bool, bool]]] = [[] for _ in range(n)]
        self._bytes = [0] * n
        self._to = 0  # the thread the member being read goes to
        self._threads = [threading.Thread(target=self._run, args=(q,), name=f"talon-restore-{i}", daemon=True)
                         for i, q in enumerate(self._queues)]
        for thread in self._threads:
            thread.start()

    def put(self, name: str, data: bytes | memoryview, first: bool, last: bool) -> None:
        if first:  # a new member: to the thread with the least waiting
            self._to = min(range(len(self._queues)), key=lambda i: self._queues[i].qsize() * _CHUNK + self._bytes[i])
        to = self._to
        self._batches[to].append((name, data, first, last))
        self._bytes[to] += len(data) + 4096  # a file's creation costs as much as writing a few KB
        if self._bytes[to] >= _CHUNK or len(self._batches[to]) >= 128:
            self._send(to)

    def _send(self, to: int) -> None:
        if self.error is not None:
            raise self.error
        if self._batches[to]:
            self._queues[to].put(self._batches[to])
            self._batches[to], self._bytes[to] = [], 0

    def take(self) -> list[tuple[str, int, str]]:
        """(name, size, sha256) of the members written since the last call."""
        done, taken = self.done, []
        while done:
            taken.append(done.popleft())
        return taken

    def finish(self) -> list[tuple[str, int, str]]:
        """Wait until everything is written; what ``take`` had not given yet, or the failure."""
        for to in range(len(self._queues)):
            self._send(to)
        self._stop()
        if self.error is not None:
            raise self.error
        return self.take()

    def abort(self) -> None:
        self.cancel = True
        self._batches = [[] for _ in self._queues]
        self._stop()

    def _stop(self) -> None:
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join()

    def _make(self, directory: Path) -> None:
        """``directory`` and its missing parents, 0700 as ``private_dir`` makes them, in one
        ``mkdir`` each where it can (``private_dir`` looks before it leaps: three or four calls a
        directory, for 10,700 directories in a restore of 18,400 files). A loop, not recursion:
        an archive's names may be a few thousand levels deep."""
        todo, again = [directory], set()
        while todo:
            here = todo[-1]
            try:
                os.mkdir(here, DIR_MODE)
            except FileExistsError:  # made by the other thread a moment ago, or a file: open says so
                pass
            except FileNotFoundError:
                if here.parent == here or here in again:
                    raise  # its parent is there, yet not (a dangling link, or removed): never loop on it
                if here.parent in self.made:
                    # Made by another thread since this mkdir failed (the two raced for it): once
                    # more. If it fails again, the parent is there yet not.
                    again.add(here)
                else:
                    todo.append(here.parent)  # its parent first, then it again
                continue
            todo.pop()
            if not self.exact_modes:  # a umask that takes owner bits: set the mode itself
                os.chmod(here, DIR_MODE)
            self.made.add(here)
        if len(self.made) > _MADE_KEPT:
            self.made = set(self._roots)

    def _run(self, batches: "queue.Queue[list[tuple[str, bytes | memoryview, bool, bool]] | None]") -> None:
        out, target, sha, size = -1, Path(), hashlib.sha256(), 0
        try:
            while (batch := batches.get()) is not None:
                if self.error is not None or self.cancel:
                    continue  # drained, not written
                try:
                    for name, data, first, last in batch:
                        if first:
                            sha, size = hashlib.sha256(), 0
                            if self.place is not None:
                                target = self.place(name)
                                try:
                                    if target.parent not in self.made:  # one directory of many files: made once
                                        self._make(target.parent)
                                    out = open_private(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                                except FileExistsError:  # the places were empty: the archive made it
                                    raise BackupError(f"the archive holds {name!r} twice (or as a file and as a "
                                                      "directory): refused") from None
                                except OSError as exc:
                                    raise BackupError(f"could not write {target}: {exc}") from None
                        if data:
                            sha.update(data)
                            size += len(data)
                            if out >= 0:
                                _write_all(out, memoryview(data), target)
                        if last:
                            if out >= 0:
                                if size >= _CHUNK:  # large: to the disk now, not all at the sync
                                    _start_writeback(out, 0, 0)
                                os.close(out)
                                out = -1
                            self.done.append((name, size, sha.hexdigest()))
                except BaseException as exc:
                    if out >= 0:
                        os.close(out)
                        out = -1
                    self.error = exc
        finally:
            if out >= 0:
                os.close(out)


def _umask_spares_owner() -> bool:
    """Whether this process's umask leaves the owner's bits alone (so ``mkdir(path, 0o700)`` makes
    exactly 0700), read where Linux shows it without changing it; False (then each directory
    is chmodded) where that cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o700 == 0
    except (OSError, ValueError):
        pass
    return False


class _Tally:
    """What a verify or restore saw in an archive and what its manifest lists, checked against each
    other in two tables of a SQLite database on the disk, of which a few MB are cached: a file in
    ``directory`` (a restore's data dir, which it writes anyway; removed when closed), else
    SQLite's own temporary database (in ``TMPDIR``, once the cache is full). So checking an
    archive of a million files takes no more memory than one of ten. Rows go in batches; only the
    main thread uses it."""

    def __init__(self, directory: Path | None = None) -> None:
        self.file: str | None = None
        if directory is not None:
            fd, self.file = tempfile.mkstemp(prefix=".talon-check-", suffix=".sqlite3", dir=directory)
            os.close(fd)
        self.db = sqlite3.connect(self.file or "", isolation_level=None)
        self.db.execute("PRAGMA cache_size = -4096")  # KB
        self.db.execute("PRAGMA journal_mode = OFF")
        for table in ("seen", "listed"):
            self.db.execute(f"CREATE TABLE {table} (name TEXT PRIMARY KEY, size INTEGER, sha256 TEXT) WITHOUT ROWID")
        self.db.execute("BEGIN")
        self._rows = {"seen": 0, "listed": 0}
        self._listed: list[tuple[str, int, str]] = []

    def saw(self, rows: list[tuple[str, int, str]]) -> None:
        """Members read whole (name, size, sha256)."""
        self._insert("seen", rows, "the archive holds {!r} twice: refused")

    def lists(self, name: str, size: int, sha256: str) -> None:
        self._listed.append((name, size, sha256))
        if len(self._listed) >= _TALLY_BATCH:
            self._flush()

    def _flush(self) -> None:
        rows, self._listed = self._listed, []
        self._insert("listed", rows, "the archive's manifest lists {!r} twice: refused")

    def _insert(self, table: str, rows: list[tuple[str, int, str]], twice: str) -> None:
        try:
            self.db.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", rows)
        except sqlite3.IntegrityError:
            # The rows before the one refused went in (nothing is rolled back without a journal):
            # their count says which one it was.
            went_in = self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] - self._rows[table]
            raise BackupError(twice.format(rows[went_in][0])) from None
        self._rows[table] += len(rows)

    def check(self) -> tuple[int, int]:
        """(files, bytes) the manifest lists, once every one was seen as listed and nothing else;
        BackupError naming the first that was not."""
        self._flush()
        one = self.db.execute
        missing = one("SELECT l.name FROM listed l LEFT JOIN seen s ON s.name = l.name WHERE s.name IS NULL "
                      "LIMIT 1").fetchone()
        if missing:
            raise BackupError(f"{missing[0]} is in the manifest but not in the archive: refused")
        changed = one("SELECT l.name FROM listed l JOIN seen s ON s.name = l.name "
                      "WHERE s.size IS NOT l.size OR s.sha256 IS NOT l.sha256 LIMIT 1").fetchone()
        if changed:
            raise BackupError(f"{changed[0]} does not match its sha256 in the manifest (damaged or tampered): refused")
        extra = one("SELECT s.name FROM seen s LEFT JOIN listed l ON l.name = s.name WHERE l.name IS NULL "
                    "ORDER BY s.name LIMIT 1").fetchone()
        if extra:
            raise BackupError(f"{extra[0]} is in the archive but not in its manifest: refused")
        count, total = one("SELECT count(*), coalesce(sum(size), 0) FROM listed").fetchone()
        return int(count), int(total)

    def size_listed(self, name: str) -> int | None:
        row = self.db.execute("SELECT size FROM listed WHERE name = ?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def close(self) -> None:
        self.db.close()
        if self.file is not None:
            Path(self.file).unlink(missing_ok=True)


class _Chunks:
    """A member's data (``_TarReader.data``) as a file to read from, for ijson."""

    def __init__(self, chunks: Iterator[memoryview]) -> None:
        self.chunks = chunks

    def read(self, n: int = -1) -> bytes:
        return bytes(next(self.chunks, b"")) if n else b""  # (ijson reads 0 bytes first, to see their type)


# The manifest's plain values (what each must be), and its lists (what each must start with)
_HEAD: dict[str, tuple[Any, str]] = {"format": (int, "a whole number"), "schema_version": (int, "a whole number"),
                                     "source": (str, "text"), "created": ((int, float), "a number")}
_LISTS = {"left_out": "start_array", "cut": "start_map", "files": "start_array"}
_OPENS, _CLOSES = frozenset({"start_map", "start_array"}), frozenset({"end_map", "end_array"})
# What the manifest's ``left_out`` and ``cut`` may hold (names and reasons, in characters), as the
# whole manifest could before it was read as a stream: they are kept in memory, the list of files
# is not.
_HEAD_MAX = 64 << 20


def _other_format(format: int) -> BackupError:
    return BackupError(f"archive format {format} is not one this Talon reads ({FORMAT}): refused")


def _read_manifest(data: Iterator[memoryview], tally: _Tally) -> Manifest:
    """The manifest, read as a stream of JSON events (ijson): its list of files goes into
    ``tally`` entry by entry, never into a list, so a manifest of a million files is read in the
    memory one takes. Anything but a manifest's shape (a value of the wrong type, a key twice, a
    missing one, JSON that is not) is refused as unreadable."""
    import ijson

    def unreadable(why: str) -> BackupError:
        if head.get("format", FORMAT) != FORMAT:  # another format may well have another shape
            return _other_format(head["format"])
        return BackupError(f"the archive's manifest is unreadable ({why})")

    head: dict[str, Any] = {}  # the top object's keys read so far (a list's: True)
    left_out: list[str] = []
    cut: dict[str, int] = {}
    entry: dict[str, Any] = {}
    # Where the parser is: depth 1 is the top object, 2 a list or object in it, 3 a file's entry;
    # ``keys`` the last key at each of them; ``skip`` the depth inside the list or object of a key
    # no Talon knows (passed over, as json.loads' reader passed it over), at the top or in an entry.
    keys: list[str] = ["", "", ""]
    depth = skip = held = 0  # held: characters kept of left_out and cut
    try:
        for event, value in ijson.basic_parse(_Chunks(data), use_float=True):
            if skip:
                skip += (event in _OPENS) - (event in _CLOSES)
                continue
            if depth == 3:  # in a file's entry: most of a manifest, so first
                if event == "map_key":
                    keys[2] = value
                elif event == "end_map":  # the entry, whole
                    name, size, digest = entry.get("path"), entry.get("size"), entry.get("sha256")
                    if not isinstance(name, str) or not isinstance(digest, str) or \
                            not isinstance(size, int) or isinstance(size, bool):
                        raise unreadable("a file's entry lacks a text 'path' or 'sha256', or a whole 'size'")
                    tally.lists(name, size, digest)
                    depth = 2
                elif event in _OPENS:
                    if keys[2] in ("path", "size", "sha256"):
                        raise unreadable(f"a file's {keys[2]!r} is not a plain value")
                    skip = 1  # a key no Talon knows
                else:
                    entry[keys[2]] = value
                continue
            opens, closes = event in _OPENS, event in _CLOSES
            if event == "map_key":
                if depth == 1 and value in head:
                    raise unreadable(f"{value!r} twice")
                keys[depth - 1] = value
                continue
            if closes:
                depth -= 1
                continue
            top = keys[0]
            if depth == 0:
                if event != "start_map":
                    raise unreadable("not a JSON object")
            elif depth == 1:
                if top in _HEAD:
                    kind, what = _HEAD[top]
                    if opens or not isinstance(value, kind) or isinstance(value, bool):
                        raise unreadable(f"{top!r} is not {what}")
                    head[top] = value
                    continue
                if top in _LISTS:
                    if event != _LISTS[top]:
                        raise unreadable(f"{top!r} is not a{'n object' if top == 'cut' else ' list'}")
                    head[top] = True
                elif opens:  # a key no Talon knows, with a list or an object
                    skip = 1
                    continue
                else:  # a key no Talon knows, with a plain value
                    continue
            elif depth == 2:
                if top == "files":
                    if event != "start_map":
                        raise unreadable("a file's entry is not an object")
                    entry = {}
                else:  # a value of left_out or cut
                    if opens:
                        raise unreadable(f"{top!r} holds more than plain values")
                    if top == "left_out":
                        left_out.append(str(value))
                        held += len(left_out[-1])
                    else:
                        if not isinstance(value, int) or isinstance(value, bool):
                            raise unreadable("'cut' holds more than numbers of bytes")
                        cut[keys[1]] = value
                        held += len(keys[1])
                    if held > _HEAD_MAX:
                        raise BackupError("the archive's manifest is implausibly large (its 'left_out' and 'cut'): "
                                          "refused")
                    continue
            depth += 1  # only a list or an object gets here
    except ijson.JSONError as exc:
        raise unreadable(f"not JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    for key in ("format", "source", "schema_version", "created", "files"):
        if key not in head:
            raise unreadable(f"no {key!r}")
    return Manifest(source=head["source"], schema_version=head["schema_version"], created=float(head["created"]),
                    format=head["format"], left_out=left_out, cut=cut)


def _read_checked(path: Path, progress: Progress | None, place: Callable[[str], Path] | None,
                  scratch: Path | None = None) -> Manifest:
    """One pass over the archive checking every member (and, with ``place``, writing each one to
    ``place(name)`` as it is read and hashed, in a ``_Placer``); the manifest once everything
    matched it, else BackupError. What was written is only good when this returns: the caller
    removes it otherwise. What was seen and what the manifest lists are compared in a ``_Tally``
    (on the disk), not in memory."""
    manifest: Manifest | None = None
    done = 0
    try:
        tally = _Tally(scratch)
    except (OSError, sqlite3.Error) as exc:
        raise BackupError(f"could not make the check's table in {scratch or 'TMPDIR'}: {exc}") from None
    placer = _Placer(place)
    finished = False
    try:
        with _damaged(path):
            if not path.is_file():
                raise BackupError(f"{path}: no such archive")
            stream, closers = _open_stream(path)
            try:
                reader = _TarReader(stream)
                for name, size in reader.members():
                    if manifest is not None:
                        raise BackupError(f"the archive holds {name!r} after its manifest: refused")
                    if name == MANIFEST:
                        manifest = _read_manifest(reader.data(size), tally)
                        continue
                    _safe_member_name(name)
                    if len(placer.done) >= _TALLY_BATCH:
                        tally.saw(placer.take())
                    first = True
                    for data in reader.data(size):
                        placer.put(name, data, first, False)
                        first = False
                        done += len(data)
                        if progress is not None:
                            progress(done, 0)
                    placer.put(name, b"", first, True)
            finally:
                for closer in closers:
                    closer.close()
            tally.saw(placer.finish())
            finished = True
        if manifest is None:
            raise BackupError(f"{path.name} has no manifest (not a complete Talon archive): refused")
        if manifest.format != FORMAT:
            raise _other_format(manifest.format)
        from talon.storage.postgres.schema import SCHEMA_VERSION

        if manifest.schema_version > SCHEMA_VERSION:
            raise BackupError(f"the archive was made by a newer Talon (schema version {manifest.schema_version}, "
                              f"this one knows {SCHEMA_VERSION}): upgrade Talon to restore it")
        manifest.count, manifest.total_bytes = tally.check()
        for name, read in manifest.cut.items():
            listed = tally.size_listed(name)
            if not name.startswith("media/") or listed is None or not 0 <= read <= listed:
                raise BackupError(f"the archive's manifest cuts {name!r} to {read} bytes, which it may not: refused")
        return manifest
    except sqlite3.Error as exc:  # the table's temporary file: no room, or no place to make it
        raise BackupError(f"the check's table failed ({exc}): it needs about 300 bytes a file on the disk, "
                          f"{'in the data dir' if scratch else 'in TMPDIR'}") from None
    finally:
        if not finished:
            placer.abort()
        tally.close()


def _write_all(fd: int, chunk: memoryview, target: Path) -> None:
    try:
        while chunk:
            chunk = chunk[os.write(fd, chunk):]
    except OSError as exc:  # the target's disk, not the archive
        raise BackupError(f"could not write {target}: {exc}") from None


# --- backup ---------------------------------------------------------------------------------
def _dir_size(root: Path) -> int:
    """The bytes under ``root``, for the progress lines only (what cannot be read is passed over
    quietly here: the backup names it)."""
    total = 0
    for _, _, entry in _scan(str(root), "", lambda rel, exc: None):
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            pass
    return total


def _scan(top: str, prefix: str, unreadable: Callable[[str, OSError], None] | None = None,
          ) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
    """(path, relative name, entry) of the regular files under ``top``, sorted by name, without
    following or yielding symbolic links (one ``scandir`` per directory, no ``stat`` per file).
    A loop over a stack, not recursion: a workspace's tree can be thousands of levels deep (an
    agent can make one). With ``unreadable``, a directory under ``top`` that cannot be listed (its
    path longer than the system allows, no permission) is passed to it (relative name, error) and
    passed over; without it, that is an error."""
    def listed(directory: str, rel: str) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(directory) as it:
                return sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if unreadable is None or not rel:
                raise
            unreadable(rel, exc)
            return []

    stack = [(iter(listed(top, "")), prefix)]
    while stack:
        entries, under = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        rel = under + entry.name
        if entry.is_dir(follow_symlinks=False):
            stack.append((iter(listed(entry.path, rel + "/")), rel + "/"))
        elif entry.is_file(follow_symlinks=False):
            yield entry.path, rel, entry


def _walk(root: Path) -> Iterator[tuple[Path, str]]:
    """Regular files under ``root`` (symbolic links are not followed nor archived), sorted."""
    for path, rel, _ in _scan(str(root), ""):
        yield Path(path), rel


def _skip_data_file(rel: str, *, postgres: bool) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    if name in _SKIP_NAMES or name.startswith(tuple(EMBEDDED_NOT_ARCHIVED)) or name.endswith(_SKIP_SUFFIXES):
        return True
    if parts[0] in _SKIP_DIRS or parts[:2] == ["attachments", "tmp"]:
        return True
    if postgres:
        # The stores are read from the database; the data dir holds only the context files (and
        # a cache of attachments, which the database has whole).
        if name.endswith(".sqlite3") or parts[0] == "attachments":
            return True
        if parts[0] == "sessions" and (name.endswith(".jsonl") or name in ("CURRENT", "CHAT")):
            return True
    return False


def _complete_lines_size(fd: int, size: int) -> int:
    """Of the first ``size`` bytes of the open file ``fd``, those up to and including the last
    newline (a line being written is left out whole); read backwards with ``pread``, so the file's
    offset stays where it was."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0


# What a snapshot of an embedded store leaves out, as in an archive of PostgreSQL
# (talon.storage.pg_export.SKIPPED_COLUMNS): a worker's claim on delivering a chat's waiting
# WhatsApp messages means nothing to the Talon that is restored.
# Nor do the web panel's sign-ins (sessions, one-time links, failed attempts): a restored Talon
# asks to sign in again. (table, statement) per file; a table an older file lacks is skipped.
_SCRUB = {"whatsapp.sqlite3": [("wa_windows", "UPDATE wa_windows SET holder = NULL, until = NULL "
                                              "WHERE holder IS NOT NULL")],
          "control.sqlite3": [(t, f"DELETE FROM {t}") for t in ("panel_sessions", "panel_links", "panel_failures")]}


def _sqlite_snapshot(src_path: Path, dst_path: Path) -> None:
    """A consistent copy through SQLite's online backup API (writers are not stopped)."""
    src = sqlite3.connect(f"file:{src_path}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(str(dst_path))
        try:
            # A scratch file, read into the archive at once: no journal, no waiting for the disk.
            dst.execute("PRAGMA journal_mode=OFF")
            dst.execute("PRAGMA synchronous=OFF")
            src.backup(dst, pages=-1)  # in one step: a writer cannot make it start over
            with dst:
                for table, statement in _SCRUB.get(src_path.name, []):
                    if dst.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                   (table,)).fetchone() is not None:
                        dst.execute(statement)
        finally:
            dst.close()
    finally:
        src.close()


def _index_snapshot(index: Path, dst: Path) -> Path | None:
    """A snapshot of the search index, or None (none kept, or unreadable: it is derived, so the
    archive goes without it and the restore builds it from the conversations)."""
    if not index.is_file():
        return None
    try:
        _sqlite_snapshot(index, dst)
        return dst
    except sqlite3.Error as exc:
        log.warning("search index %s left out of the backup (%s): the restore rebuilds it", index, exc)
        dst.unlink(missing_ok=True)
        return None


_PG_TURN = ("postgres",)  # where the stores read from PostgreSQL go, between the data dir and the media root
# The conversation logs' directory: the stores whose names sort before it (as ``_scan`` sorts) are
# snapshotted ahead of the reading thread, and all before the first log is read.
_LOGS = "sessions"


class _Snapshots:
    """The SQLite snapshots that come before the conversation logs (the search index first, then
    each store of the data dir whose name sorts before ``sessions/``), taken one after another in
    a thread of their own while the reading thread reads the attachments (the search index's
    snapshot took a tenth of a backup, the compressor idle meanwhile). All of them are taken
    before any log is read (``wait_all``), as before. A failure is raised by ``get`` in the
    reading thread; ``close`` waits for the thread (before the scratch directory goes)."""

    def __init__(self, jobs: list[tuple[str, Path, Path]]) -> None:
        self._jobs = jobs  # (member name, the store, its snapshot)
        self._names = {job[0] for job in jobs}
        self._done: dict[str, tuple[Path | None, BaseException | None]] = {}
        self._finished = False
        self._ready = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="talon-backup-snapshots", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for name, src, dst in self._jobs:
                if self._stop:
                    break
                result: tuple[Path | None, BaseException | None]
                try:
                    if name == f"data/{_INDEX}":
                        result = (_index_snapshot(src, dst), None)
                    else:
                        _sqlite_snapshot(src, dst)
                        result = (dst, None)
                except BaseException as exc:  # raised where the reading thread gets to it
                    result = (None, exc)
                with self._ready:
                    self._done[name] = result
                    self._ready.notify_all()
        finally:
            with self._ready:
                self._finished = True
                self._ready.notify_all()

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def get(self, name: str) -> Path | None:
        """The snapshot of ``name`` (None: the search index, left out), once it is taken."""
        with self._ready:
            while name not in self._done and not self._finished:
                self._ready.wait()
            snap, exc = self._done.get(name, (None, None))
        if exc is not None:
            raise exc
        return snap

    def wait_all(self) -> None:
        with self._ready:
            while not self._finished:
                self._ready.wait()

    def close(self) -> None:
        self._stop = True
        self._thread.join()


def _snapshot_jobs(data_dir: Path, postgres: bool, scratch: Path) -> list[tuple[str, Path, Path]]:
    """What ``_Snapshots`` takes ahead: the search index, then the stores before the logs."""
    if postgres:
        return []
    jobs = [(f"data/{_INDEX}", data_dir / _INDEX, scratch / "index.sqlite3")]
    try:
        with os.scandir(data_dir) as it:
            names = sorted(e.name for e in it if e.is_file(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return jobs
    for n, rel in enumerate(names):
        if rel.endswith(".sqlite3") and rel != _INDEX and rel < _LOGS and not _skip_data_file(rel, postgres=False):
            jobs.append((f"data/{rel}", data_dir / rel, scratch / f"snapshot-{n}.sqlite3"))
    return jobs


def _sources(data_dir: Path, media_root: Path, postgres: bool, scratch: Path, snapshots: _Snapshots,
             left_out: list[str]) -> Iterator[tuple[str, str, bool, bool, int | None] | tuple[str]]:
    """What a backup archives, in order: (member name, file to read, whether to read it only up
    to its last complete line (a conversation log), remove the file once read, the inode the scan
    saw for a workspace file, else None), and
    ``_PG_TURN``. Run in the ``_Source`` thread. The search
    index and the stores before the logs come from ``snapshots``, all taken before the first log
    is read (the logs only grow, so every line the index covers is then in the archive); the
    stores after them are snapshotted here, each just before it is read. What a workspace holds
    that cannot be read (a path longer than the system allows, no permission: an agent can make
    either) is named in ``left_out`` and passed over; in the data dir that is an error."""
    logs = False
    for file, rel, _ in _scan(str(data_dir), ""):
        if _skip_data_file(rel, postgres=postgres):
            continue
        name = f"data/{rel}"
        if not logs and rel >= _LOGS:  # the first log, or what follows them
            snapshots.wait_all()
            logs = True
        if name in snapshots:
            snap = snapshots.get(name)
            if snap is not None:  # None: an unreadable search index, left out
                yield name, str(snap), False, True, None
        elif rel == _INDEX:
            continue  # with PostgreSQL: the database keeps its own
        elif rel.endswith(".sqlite3"):
            snap = scratch / "snapshot.sqlite3"
            _sqlite_snapshot(Path(file), snap)
            yield name, str(snap), False, True, None
        elif rel.startswith("sessions/") and rel.endswith(".jsonl"):
            yield name, file, True, False, None
        else:
            yield name, file, False, False, None
    snapshots.wait_all()
    if postgres:
        yield _PG_TURN
    if media_root.is_dir():
        for file, rel, entry in _scan(str(media_root), "media/", lambda rel, exc: _leave_out(left_out, rel, exc)):
            yield rel, file, False, False, entry.inode()


def _open_regular(file: str, inode: int | None) -> tuple[int, os.stat_result]:
    """``file`` opened for reading (a descriptor), and its stat, if it is still the regular file
    the scan saw (its inode, when given): never a symbolic link, never waiting on a FIFO, and
    never another file reached through a directory swapped for a link since the scan (any of
    these can replace a workspace file between the scan and the read: an agent could swap in a
    link to a host file, or a pipe that stalls the backup forever); else OSError."""
    fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "no longer a regular file")
        if inode is not None and st.st_ino != inode:
            raise OSError(errno.EINVAL, "no longer the file the scan saw")
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def _leave_out(left_out: list[str], name: str, exc: OSError) -> None:
    """Name what a workspace holds that cannot be read, and why, for the manifest and the log."""
    left_out.append(f"{name} ({exc.strerror})")
    log.warning("left out of the backup: %s (%s)", name, exc.strerror)


@dataclass
class _Read:
    """A file the ``_Source`` thread read: whole (``data``, ``sha256``) when small; else its
    chunks follow through ``_Source.chunk``; or, a large one handed over, opened only (``fd``:
    the writing thread reads it, and closes it)."""
    name: str
    size: int
    mtime: float
    data: bytes | None = None
    sha256: str = ""
    fd: int | None = None


@dataclass
class _Packed:
    """Small files the ``_Source`` thread read, hashed, wrote as tar (headers, bytes, padding) and
    compressed itself while the writing thread was behind: one zstd frame of ``size`` bytes of
    the tar stream (``reads`` keep their names, sizes and sums; their bytes are in the frame)."""
    reads: list[_Read]
    frame: bytes
    size: int


def _read_small(fd: int, size: int, name: str) -> tuple[bytes, int]:
    """A small file's bytes (at most ``size``) from its descriptor, which is closed, and the size
    to archive: a workspace file that shrank since its stat is archived as read; in the data dir
    the size stays, and the writing thread says the file changed (a store, or a log cut short)."""
    try:
        data = os.read(fd, size)  # on the descriptor: no file object for each of many small files
        if len(data) != size:
            data += os.read(fd, size - len(data))
    finally:
        os.close(fd)
    if len(data) != size and name.startswith("media/"):
        size = len(data)
    return data, size


def _cut_short_allowed(name: str, read: int, size: int) -> bool:
    """Whether a file that gave ``read`` of its ``size`` bytes is archived all the same: a large
    workspace file cut short while it was read (its header, with the size, is written already),
    its member filled up with zeros and named in ``Manifest.cut``. An agent rewriting a file in
    its workspace must not make the operator's backups fail. In the data dir, Talon's own
    stores, that is a fault to report."""
    if read >= size or not name.startswith("media/"):
        return False
    log.warning("%s was cut short while it was archived (read %d of %d bytes): archived as read", name, read, size)
    return True


def _zeros(n: int) -> Iterator[bytes]:
    """``n`` zero bytes, in pieces of at most ``_CHUNK``."""
    while n > 0:
        yield bytes(min(n, _CHUNK))
        n -= _CHUNK


def _close_handed(reads: list[_Read]) -> None:
    """Close the descriptors of files handed over that will not be read."""
    for read in reads:
        if read.fd is not None:
            os.close(read.fd)
            read.fd = None


class _Source:
    """The reading half of a backup, in a thread of its own: it takes the snapshots, opens, reads
    and hashes the files (hashlib, zstandard and the reads let go of the GIL) while the main
    thread writes the tar stream and compresses it. Each takes on the other's work when that one
    falls behind, so that both cores stay busy whatever the mix of files:

    - the main thread waiting for this one (fewer than ``_HAND_OVER`` items queued): a large file
      is handed over opened but unread, to be read, hashed and compressed there (each byte while
      it is in that core's cache), while this thread goes on with the next ones (small files are
      not: two threads doing the per-file Python work at once wait on each other for the GIL,
      +0.3 s of CPU and wall for 18,000 files);
    - the main thread behind (at least ``_COMPRESS_HERE`` queued): this thread compresses a large
      file's chunks itself, and packs a batch of small files it read into tar and compresses it
      (``_Packed``).

    Through a bounded queue (memory flat: at most ``_BACKUP_QUEUED`` items of about ``_CHUNK``):
    batches of files (read, or handed over), packed batches, or one large file's ``_Read`` then
    its chunks (or their frames) then its (bytes read, sha256). A failure there is raised here;
    ``close`` stops the thread and waits for it, closing what was handed over and not read."""

    def __init__(self, items: Iterator[Any], left_out: list[str], zstd: bool) -> None:
        self._items, self.left_out = items, left_out
        self._compress = _zstd_compress() if zstd else None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=_BACKUP_QUEUED)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="talon-backup", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop:
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _send(self, batch: list[_Read]) -> bool:
        """Queue a batch: packed and compressed here when the main thread is behind and every
        file of it was read here, whole."""
        if self._compress is not None and self._queue.qsize() >= _COMPRESS_HERE:
            whole = [r.data for r in batch if r.data is not None and len(r.data) == r.size]
            if len(whole) == len(batch):
                tar = bytearray()
                for r, data in zip(batch, whole):
                    tar += _header(r.name, r.size, int(r.mtime))
                    tar += data
                    tar += _padding(r.size)
                    r.data = None
                return self._put(("packed", _Packed(batch, self._compress(tar), len(tar))))
        return self._put(("batch", batch))

    def _run(self) -> None:
        batch: list[_Read] = []  # not yet queued: closed here if it never is
        held = 0
        try:
            for item in self._items:
                if self._stop:
                    return
                if item is _PG_TURN:
                    if batch and not self._send(batch):
                        return
                    batch, held = [], 0
                    if not self._put(("turn",)):
                        return
                    continue
                name, file, lines, remove, inode = item
                try:
                    fd, st = _open_regular(file, inode)
                except FileNotFoundError:
                    continue  # removed since the scan (a message, a file the agent deleted): not there to keep
                except OSError as exc:
                    if not name.startswith("media/"):
                        raise
                    _leave_out(self.left_out, name, exc)
                    continue
                size = st.st_size
                if lines and size > _CHUNK:  # a conversation log: up to its last complete line
                    try:
                        size = _complete_lines_size(fd, size)
                    except BaseException:
                        os.close(fd)
                        raise
                if size > _CHUNK and not remove and self._queue.qsize() < _HAND_OVER:
                    batch.append(_Read(name, size, st.st_mtime, fd=fd))  # the main thread reads it
                    held += size
                elif size <= _CHUNK:
                    data, got = _read_small(fd, size, name)
                    if lines and len(data) == size:  # read whole: cut after its last complete line
                        got = data.rfind(b"\n") + 1
                        data = data[:got]
                    size = got
                    batch.append(_Read(name, size, st.st_mtime, data, hashlib.sha256(data).hexdigest()))
                    held += size + 512
                else:
                    with open(fd, "rb", buffering=0) as fh:
                        if batch and not self._send(batch):
                            return
                        batch, held = [], 0
                        if not self._put(("large", _Read(name, size, st.st_mtime))):
                            return
                        sha, left, cut = hashlib.sha256(), size, None
                        while left > 0 and (data := fh.read(min(_CHUNK, left))):
                            sha.update(data)
                            left -= len(data)
                            piece: tuple[str, bytes, int | None] = ("chunk", data, None)
                            if self._compress is not None and self._queue.qsize() >= _COMPRESS_HERE:
                                piece = ("chunk", self._compress(data), len(data))  # the frame only
                            if not self._put(piece):
                                return
                        if left and _cut_short_allowed(name, size - left, size):
                            cut = size - left
                            for zeros in _zeros(left):
                                sha.update(zeros)
                                if not self._put(("chunk", zeros, None)):
                                    return
                            left = 0
                        if not self._put(("end", size - left, sha.hexdigest(), cut)):
                            return
                if held >= _CHUNK or len(batch) >= 256:
                    if not self._send(batch):
                        return
                    batch, held = [], 0
                if remove:
                    os.unlink(file)
            if batch and not self._send(batch):
                return
            batch = []
            self._put(("done",))
        except BaseException as exc:
            self._put(("error", exc))
        finally:
            _close_handed(batch)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            kind = item[0]
            if kind == "batch":
                reads, taken = item[1], 0
                try:
                    for read in reads:
                        yield read  # a file handed over is the taker's to close from here
                        taken += 1
                finally:
                    _close_handed(reads[taken + 1:])
            elif kind in ("packed", "large"):
                yield item[1]
            elif kind == "turn":
                yield _PG_TURN
            elif kind == "done":
                return
            elif kind == "error":
                raise item[1]
            else:
                raise RuntimeError(f"backup reader out of step ({kind})")

    def chunk(self) -> tuple[Any, ...]:
        """The next piece of the large file being read: ("chunk", bytes, None), ("chunk", a zstd
        frame, the bytes it holds) or ("end", bytes archived, sha256, the bytes read when a
        workspace file was cut short while read, else None)."""
        item = self._queue.get()
        if item[0] == "error":
            raise item[1]
        return item

    def close(self) -> None:
        """Stop the thread and wait for it; files handed over but not taken are closed."""
        self._stop = True
        while True:
            alive = self._thread.is_alive()
            try:
                item = self._queue.get(timeout=0.2) if alive else self._queue.get_nowait()
            except queue.Empty:
                if alive:
                    continue
                break
            if item[0] == "batch":
                _close_handed(item[1])
        self._thread.join()


def backup(path: Path, data_dir: Path, media_root: Path, *, database_url: str = "",
           progress: Progress | None = None) -> Manifest:
    """Write the archive at ``path`` (it must not exist); its manifest."""
    from talon.storage.postgres.schema import SCHEMA_VERSION

    path = Path(path)
    if path.exists():
        raise BackupError(f"{path} exists: choose a new name (a backup never overwrites)")
    if not data_dir.is_dir():
        raise BackupError(f"TALON_DATA_DIR={data_dir} does not exist: nothing to back up")
    _compression(path)
    postgres = bool(database_url)
    writer = _Writer(path, progress, 0)
    sizing = None
    if progress is not None:
        # The total for the progress lines, summed beside the work (not before it), and only once
        # the backup has run long enough for a line to show (``_SIZE_UP_AFTER``).
        sizing = threading.Timer(_SIZE_UP_AFTER, writer.size_up, args=(data_dir, media_root))
        sizing.name, sizing.daemon = "talon-backup-size", True
        sizing.start()
    try:
        with tempfile.TemporaryDirectory(prefix=".talon-backup-", dir=path.parent) as scratch:
            snapshots = _Snapshots(_snapshot_jobs(data_dir, postgres, Path(scratch)))
            left_out: list[str] = []
            try:
                source = _Source(_sources(data_dir, media_root, postgres, Path(scratch), snapshots, left_out),
                                 left_out, writer.kind == "zst")
                try:
                    for item in source:
                        if item is _PG_TURN:
                            from talon.storage.pg_export import export_postgres

                            export_postgres(database_url, writer, Path(scratch))
                        elif isinstance(item, _Packed):
                            writer.add_packed(item)
                        else:
                            writer.add_read(item, source)
                finally:
                    source.close()
            finally:
                snapshots.close()
        manifest = Manifest(source="postgres" if postgres else "embedded", schema_version=SCHEMA_VERSION,
                            created=time.time(), left_out=sorted(left_out))
        writer.finish(manifest)
        return manifest
    except BaseException:
        writer.abort()
        raise
    finally:
        if sizing is not None:
            sizing.cancel()


# --- restore --------------------------------------------------------------------------------
def _empty_or_absent(path: Path, what: str) -> bool:
    """True when ``path`` must be created; BackupError when it holds anything."""
    if not path.exists():
        return True
    if not path.is_dir():
        raise BackupError(f"{what} {path} is not a directory: refused")
    if any(path.iterdir()):
        raise BackupError(f"{what} {path} is not empty: a restore never writes over live data. "
                          "Name a new or empty directory.")
    return False


@dataclass
class RestoreResult:
    manifest: Manifest
    data_dir: Path
    media_root: Path
    database_url: str
    indexed: int


def _topmost_missing(path: Path) -> Path | None:
    """The highest directory of ``path`` (itself included) that does not exist yet."""
    if path.exists():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def restore(path: Path, data_dir: Path, media_root: Path | None = None, *, database_url: str = "",
            progress: Progress | None = None) -> RestoreResult:
    """Restore into empty places, verifying as it goes, in one pass; what was restored where.

    Every member is checked as ``verify`` does while it is written (never outside the data dir or
    the media root: safe relative names, regular files only, each created anew); the archive counts
    as restored only once the whole of it matched its manifest. Until then nothing else happens
    (no search index, no database), and any failure (a tampered or truncated archive, a full disk,
    Ctrl-C) removes everything the restore wrote, directories it made included. It returns once
    what it wrote is on the disk (``_sync``)."""
    from talon.workspaces import check_dirs_apart
    from talon.errors import ConfigError

    path = Path(path)
    data_dir = Path(data_dir).absolute()
    media_root = Path(media_root).absolute() if media_root is not None else data_dir.parent / "media_root"
    try:
        check_dirs_apart(media_root, data_dir)
    except ConfigError as exc:
        raise BackupError(f"the data dir and the media root may not nest: {exc}") from None
    _compression(path)
    if not path.is_file():
        raise BackupError(f"{path}: no such archive")
    create_data = _empty_or_absent(data_dir, "the data dir")
    create_media = _empty_or_absent(media_root, "the media root")
    if database_url:
        _check_database_empty(database_url)
    made = [m for m in (_topmost_missing(data_dir), _topmost_missing(media_root)) if m is not None]

    def place(name: str) -> Path:
        top, rel = name.split("/", 1)
        return (data_dir if top == "data" else media_root) / rel

    try:
        private_dir(data_dir)
        media_root.mkdir(parents=True, exist_ok=True)
        manifest = _read_checked(path, progress, place, data_dir)
        for name, read in manifest.cut.items():  # back to the bytes that were read (checked above)
            os.truncate(place(name), read)
        indexed = 0
        if database_url:
            _into_database(data_dir, database_url)
        else:
            indexed = _restored_index(data_dir)
        _sync(data_dir, media_root)
        return RestoreResult(manifest, data_dir, media_root, database_url, indexed)
    except BaseException:
        # Nothing half-restored: the places were empty or absent, so all of it goes.
        for directory, created in ((data_dir, create_data), (media_root, create_media)):
            if created:
                _remove_tree(directory)
            elif directory.is_dir():
                for child in directory.iterdir():
                    _remove_tree(child)
        for top in made:  # and the directories above them the restore made
            _remove_tree(top)
        if database_url:
            _empty_database(database_url)
        raise


def _remove_tree(top: Path) -> None:
    """Remove ``top`` and all under it, never following a link, leaving what cannot be removed
    (as ``shutil.rmtree(ignore_errors=True)``), with a loop instead of recursion: a hostile
    archive's names can be thousands of directories deep, and Python 3.11's rmtree recurses once a
    level (it raised RecursionError and left the tree behind)."""
    if top.is_symlink() or not top.is_dir():
        top.unlink(missing_ok=True)
        return
    dirs, todo = [str(top)], [str(top)]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        dirs.append(entry.path)
                        todo.append(entry.path)
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            pass
        except OSError:
            pass
    for directory in reversed(dirs):  # every directory after all that are under it
        try:
            os.rmdir(directory)
        except OSError:
            pass


def _sync(*places: Path) -> None:
    """What a restore wrote, on the disk before it reports success (a power cut just after must
    not leave empty files behind a "restored"): syncfs(2) of each file system holding one of
    ``places`` where the C library has it (Linux), else sync(2). A write error the kernel held
    back (EIO) fails the restore, which then removes what it wrote."""
    import ctypes

    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    synced: set[int] = set()
    for place in places:
        fd = os.open(place, os.O_RDONLY | os.O_DIRECTORY)
        try:
            device = os.fstat(fd).st_dev
            if device not in synced:
                synced.add(device)
                if syncfs(fd) != 0:
                    raise BackupError(f"could not write {place} to the disk: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)


def _restored_index(data_dir: Path) -> int:
    """Bring the restored search index up to the restored logs (only the lines past what its
    snapshot covered are read), or build it when the archive had none or it is unreadable; the
    number of messages it holds."""
    from talon.cli.reindex import index_embedded
    from talon.storage.embedded.search import SearchIndex

    def caught_up() -> int:
        index_embedded(data_dir)
        index = SearchIndex(data_dir / _INDEX)
        try:
            return index.count()
        finally:
            index.close()

    try:
        return caught_up()
    except sqlite3.DatabaseError as exc:
        log.warning("the restored search index is unreadable (%s): rebuilding it from the conversations", exc)
        for side in data_dir.glob(_INDEX + "*"):
            side.unlink()
        return caught_up()


def _filled_tables() -> tuple[str, ...]:
    """The tables a restore fills (and empties again when it fails): every table a backup of
    PostgreSQL reads (``talon.storage.pg_export.ARCHIVED_TABLES``); all must be empty first."""
    from talon.storage.pg_export import ARCHIVED_TABLES

    return ARCHIVED_TABLES


def _check_database_empty(url: str) -> None:
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        have = {str(r[0]) for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()}
        for table in _filled_tables():
            if table in have and conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone() != (False,):
                raise BackupError(f"the database already holds Talon data ({table} is not empty): a restore "
                                  "never writes over live data. Name a new, empty database.")


def _empty_database(url: str) -> None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            have = {str(r[0]) for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()}
            from talon.storage.pg_export import DERIVED_TABLES

            tables = [t for t in (*_filled_tables(), *DERIVED_TABLES) if t in have]
            if tables:
                conn.execute(f"TRUNCATE {', '.join(tables)}")
    except Exception as exc:
        log.error("could not empty the database after the failed restore (%s): empty it before trying again", exc)


def _into_database(data_dir: Path, url: str) -> None:
    """Copy the restored embedded layout into the database (checked), then remove the embedded
    stores from the data dir: it keeps the context files and the attachments (as the cache)."""
    import asyncio

    from talon.storage.migrate import EMBEDDED_FILES, migrate_embedded
    from talon.storage.postgres.db import AsyncDatabase

    for derived in EMBEDDED_DERIVED:  # the database keeps its own search index
        for file in data_dir.glob(derived + "*"):
            file.unlink()
    unknown = sorted(f.name for f in data_dir.glob("*.sqlite3") if f.name not in EMBEDDED_FILES)
    if unknown:  # never removed below without having been copied
        raise BackupError(f"the archive holds {unknown[0]}, a store this Talon cannot copy into a database: "
                          "restore it without --database-url (or with the Talon that made it)")

    async def go() -> Any:
        db = AsyncDatabase(url, max_size=2)
        await db.open()
        try:
            return await migrate_embedded(data_dir, db)
        finally:
            await db.close()

    report = asyncio.run(go())
    if not report.ok:
        problems = [p for s in report.stores for p in s.problems] or ["not every item was verified"]
        raise BackupError("copying into the database failed its checks: " + "; ".join(problems[:3]))
    for file in list(data_dir.glob("*.sqlite3*")):
        file.unlink()
    sessions = data_dir / "sessions"
    if sessions.is_dir():
        for file, rel in list(_walk(sessions)):
            if rel.endswith(".jsonl") or file.name in ("CURRENT", "CHAT"):
                file.unlink()


def session_dir_name(channel: str, chat_id: str) -> str:
    from talon.storage.sessions import safe_path_part

    return f"sessions/{safe_path_part(channel)}/{safe_path_part(chat_id)}"
