"""The tar headers a backup writes itself are the ones tarfile writes, byte for byte, and its
archives read back with tarfile and with GNU tar."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from talon.storage.backup import _header


@pytest.mark.parametrize("name,size,mtime", [
    ("data/inbox.sqlite3", 0, 0),
    ("media/telegram/100/AGENTS.md", 1, 1_700_000_000),
    ("data/attachments/ab/" + "ab" * 32, 511, 1_800_000_000),
    ("d/" + "x" * 98, 512, 7),  # exactly 100 bytes: still plain ustar
    ("d/" + "x" * 99, 513, 7),  # 101 bytes: a PAX header, from tarfile
    ("media/whatsapp/+4915/Zürich notes.md", 10, 7),  # not ASCII: a PAX header
    ("data/big.bin", 8 ** 11, 7),  # 8 GiB: a PAX size
    ("data/x", 5, 8 ** 11),  # a time past 2242: a PAX mtime
])
def test_headers_equal_tarfiles(name: str, size: int, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, mtime
    ours, theirs = _header(name, size, mtime), info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    if theirs[329:345] == bytes(16):  # tarfile leaves a regular file's device numbers empty (3.11 on)
        assert ours == theirs
    # and whatever the Python, tarfile reads it back as the same regular file (checksum included)
    back = tarfile.open(fileobj=io.BytesIO(ours + bytes(2048)), mode="r:").next()
    assert back is not None and back.isfile()
    assert (back.name, back.size, back.mtime, back.mode, back.uid, back.gid) == (name, size, mtime, 0o600, 0, 0)


@pytest.mark.e2e  # runs GNU tar
def test_an_archive_reads_back_with_tarfile_and_gnu_tar(tmp_path: Path) -> None:
    from talon.storage.backup import Manifest, _Writer

    names = {"data/a.txt": b"hello\n", "data/empty": b"", "data/" + "y" * 120: b"long name",
             "media/t/1/Zürich.md": "é".encode() * 700}
    writer = _Writer(tmp_path / "a.tar.gz", None, 0)
    for name, body in names.items():
        writer.add(name, io.BytesIO(body), len(body), 1_700_000_000)
    writer.finish(Manifest(source="embedded", schema_version=1, created=0.0))
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar if m.name != "manifest.json"}  # type: ignore[union-attr]
    assert got == names
    if shutil.which("tar"):
        listing = subprocess.run(["tar", "-tzf", str(tmp_path / "a.tar.gz")], capture_output=True, text=True, check=True)
        assert sorted(listing.stdout.split("\n")[:-1]) == sorted([*names, "manifest.json"])
        assert listing.stderr == ""


@pytest.mark.parametrize("name", ["data", "/data/a", "data//a", "data/./a", "data/../x", "media/a/", "x/a",
                                  "data\\a", "data/a\x00", "./data/a", "data/.", "data/a/..", "", "Data/a",
                                  "//data/a", "media/.."])
def test_unsafe_member_names_are_refused(name: str) -> None:
    from talon.errors import BackupError
    from talon.storage.backup import _safe_member_name

    with pytest.raises(BackupError, match="unsafe or unexpected name"):
        _safe_member_name(name)


@pytest.mark.parametrize("name", ["data/a", "media/t/1/x.md", "data/..a", "data/a..", "data/.hidden"])
def test_plain_member_names_pass(name: str) -> None:
    from talon.storage.backup import _safe_member_name

    assert _safe_member_name(name) == name


@pytest.mark.slow  # a few MB shuffled through many reads
def test_the_forward_reader_gives_the_stream_byte_for_byte_whatever_the_reads() -> None:
    """tarfile's reads of a decompressed stream (512-byte headers, 1 MB blocks, forward seeks past
    padding, read-all) come out exactly as the stream, however the decompressor cuts its output."""
    import random

    from talon.storage.backup import _Forward

    rng = random.Random(30)

    class Ragged:  # returns at most a random share of what is asked, as a decompressor may
        def __init__(self, data: bytes) -> None:
            self.data, self.pos = data, 0

        def read(self, n: int = -1) -> bytes:
            n = len(self.data) if n < 0 else n
            out = self.data[self.pos:self.pos + min(n, rng.randint(1, 300_000))]
            self.pos += len(out)
            return out

    for _ in range(25):
        data = rng.randbytes(rng.randint(0, 3_000_000))
        reader, pos = _Forward(Ragged(data)), 0
        while pos < len(data):
            op = rng.random()
            if op < 0.1:
                skip = rng.randint(0, 2_000_000)
                reader.seek(skip, 1)
                pos = min(len(data), pos + skip)
            elif op < 0.12:
                assert reader.read() == data[pos:]
                pos = len(data)
            else:
                n = rng.choice([512, 1, 1 << 20, 10240, rng.randint(0, 2_500_000)])
                assert reader.read(n) == data[pos:pos + n]
                pos = min(len(data), pos + n)
            assert reader.tell() == pos
        assert reader.read(512) == b""
