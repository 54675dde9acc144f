"""The tar headers a backup writes itself are the ones tarfile writes, byte for byte, and its
archives read back with tarfile and with GNU tar; the restore's own tar reader reads what tarfile
reads from tarfile's archives, however they are cut, and refuses anything but plain regular files."""

from __future__ import annotations

import io
import random
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


class Ragged:
    """A decompressor's ``read(n)``: at most n bytes, often fewer (a random share), b"" at the end."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.data, self.pos, self.rng = data, 0, rng

    def read(self, n: int = -1) -> bytes:
        n = len(self.data) if n < 0 else n
        out = self.data[self.pos:self.pos + min(n, self.rng.randint(1, 300_000))]
        self.pos += len(out)
        return out


def read_all(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    from talon.storage.backup import _TarReader

    reader = _TarReader(Ragged(data, rng))
    return [(name, b"".join(reader.data(size))) for name, size in reader.members()]


def a_tar(members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT, *, end: bool = True) -> bytes:
    """A tar of ``members``; with ``end=False`` without the blocks of zeros that end it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=fmt) as tar:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        last = tar.offset
    return out.getvalue() if end else out.getvalue()[:last]


@pytest.mark.slow  # a few MB through many ragged reads
def test_the_reader_gives_what_tarfile_reads_whatever_the_reads() -> None:
    """Archives tarfile writes (PAX and ustar, long names through a PAX header or the ustar prefix,
    names not in ASCII, sizes around the block size) read back member for member as tarfile reads
    them, however the decompressor cuts its output."""
    rng = random.Random(30)
    for round_ in range(40):
        fmt = tarfile.PAX_FORMAT if round_ % 2 else tarfile.USTAR_FORMAT
        stems = (["a", "x" * rng.randint(90, 140), "Zürich é", "d/" * 30 + "deep"] if fmt == tarfile.PAX_FORMAT
                 else ["a", "Zurich", "d/" * 30 + "deep", "q" * 60 + "/" + "r" * 90])  # ustar: the prefix
        members = []
        for i in range(rng.randint(0, 12)):
            size = rng.choice([0, 1, 511, 512, 513, 1 << 20, (1 << 20) + 1, rng.randint(0, 3_000_000)])
            members.append((f"data/{i}/{rng.choice(stems)}", rng.randbytes(size)))
        data = a_tar(members, fmt)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            theirs = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
        assert read_all(data, rng) == theirs == members


def test_an_archive_cut_anywhere_ends_cleanly_at_a_header_or_is_refused() -> None:
    from talon.errors import BackupError

    rng = random.Random(31)
    members = [("data/a", b"x" * 700), ("data/" + "y" * 150, b"long"), ("data/empty", b""), ("data/b", b"z" * 1024)]
    data = a_tar(members, end=False)
    boundaries, pos = {0}, 0
    for name, body in members:  # where each member's header starts (a PAX header first for the long name)
        pos += 512 * (3 if len(name) > 100 else 1) + -(-len(body) // 512) * 512
        boundaries.add(pos)
    after_pax = 1536 + 1024  # the long name's PAX header and its records read, not the header they are for
    for cut in sorted({*range(0, len(data) + 1, 97), *boundaries, *(b + 1 for b in boundaries), after_pax}
                      - {len(data) + 1}):
        try:
            got = read_all(data[:cut], rng)
        except BackupError as exc:
            assert cut not in boundaries and "truncated" in str(exc), (cut, exc)
        else:
            assert cut in boundaries, cut
            assert got == members[:len(got)]


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "directory", "fifo", "gnu long name", "global pax",
                                  "sparse", "bad checksum", "bad size", "bad pax", "two pax"])
def test_what_is_not_a_plain_regular_file_is_refused(kind: str) -> None:
    from talon.errors import BackupError

    info = tarfile.TarInfo("data/evil")
    fmt = tarfile.PAX_FORMAT
    if kind in ("symlink", "hardlink"):
        info.type, info.linkname = (tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE), "/etc/passwd"
    elif kind == "directory":
        info.type = tarfile.DIRTYPE
    elif kind == "fifo":
        info.type = tarfile.FIFOTYPE
    elif kind == "gnu long name":
        info.name, fmt = "data/" + "z" * 120, tarfile.GNU_FORMAT
    elif kind == "sparse":
        info.pax_headers = {"GNU.sparse.map": "0,0"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=fmt) as tar:
        tar.addfile(info, io.BytesIO(b""))
    data = bytearray(out.getvalue())
    if kind == "global pax":
        data = bytearray(info.create_pax_global_header({"comment": "x"}) + bytes(data))
    if kind == "bad checksum":
        data[0] ^= 1
    if kind == "bad size":
        data[124:136] = b"0000000009x\0"
        data[148:156] = b"%06o\0 " % (sum(data[:148]) + 256 + sum(data[156:512]))
    if kind in ("bad pax", "two pax"):
        pax = tarfile.TarInfo("data/" + "p" * 120).tobuf(tarfile.PAX_FORMAT)  # a PAX header, then the file's
        pax_data = bytearray(pax[:1024])
        if kind == "bad pax":
            pax_data[512:515] = b"999"  # the first record's length, now past the end
            data = pax_data + data
        else:
            data = pax_data + pax_data + data
    why = {"sparse": "a sparse file", "bad checksum": "bad checksum", "bad size": "its size",
           "bad pax": "damaged PAX header", "two pax": "two PAX headers"}.get(kind, "not a regular file")
    with pytest.raises(BackupError, match=f"{why}.*refused"):
        read_all(bytes(data), random.Random(32))


def test_a_size_in_base_256_is_read() -> None:
    from talon.storage.backup import _parse_header

    info = tarfile.TarInfo("data/big")
    info.size = 8 ** 11 + 5  # past ustar's 11 octal digits: GNU writes it base-256
    head = info.tobuf(tarfile.GNU_FORMAT)
    assert _parse_header(head[:512]) == ("data/big", 8 ** 11 + 5, b"0")


def test_damaged_headers_are_refused_never_crash() -> None:
    """Random bytes changed in the headers of a small archive: whatever is read is refused with a
    BackupError or read as members (then the manifest's sums catch changed data), never anything else."""
    from talon.errors import BackupError

    rng = random.Random(33)
    good = a_tar([("data/a", b"hello"), ("data/" + "é" * 70, b"x" * 600), ("media/t/1/m.md", b"")])
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.choice([0, 512, 1024, 1536, 2048, 2560]) + rng.randrange(512)] = rng.randrange(256)
        try:
            read_all(bytes(data), rng)
        except BackupError:
            pass
