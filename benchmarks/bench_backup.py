"""Backup and restore of a large deployment against the disk's own speed, memory flat.

Run: ``python benchmarks/bench_backup.py`` (1 GB; ``--size-mb 200`` for a quick check).

A data dir and a media root are made with ``--size-mb`` of a mixed deployment (the shares are in
``make_deployment``): thousands of small conversation files (``main.jsonl``, ``CURRENT``,
``CHAT``, a summary under ``context/``), SQLite stores in WAL mode (an inbox, tasks, usage),
attachments (incompressible photos of 40 KB to 3 MB and videos of 24 MB, the shape of JPEG and
MP4; compressible documents), a workspace with a memory file per chat, and the search index over
the conversations (``search.sqlite3``, built as a running Talon keeps it; untimed). Then, in one run, on
the same data and the same disk (the archive and the restored tree beside the source):

- **reference backup**: ``tar -cf ref.tar data media_root`` (GNU tar, uncompressed) and an fsync
  of the archive (``talon backup`` fsyncs its archive too);
- **talon backup**: ``talon backup PATH.tar.zst`` (the default compression) as a process of its
  own;
- **reference restore**: ``tar -xf ref.tar`` into a new directory, then ``sync -f`` of it
  (syncfs: ``talon restore`` returns only once what it wrote is on the disk);
- **talon restore**: ``talon restore`` of the archive into a new directory (verifying every file,
  bringing the search index up to date, syncing);
- also, for the record, ``tar -I 'zstd -1 -T0' -cf`` / ``-xf``: the same with compression (the
  restore synced too).

Each is run ``--rounds`` times interleaved (reference and talon, the one first in one round, the
other in the next), with the dirty pages written out (``sync -f``) between runs, untimed, and
the restored trees kept until the size is done (see ``one_size``). Reported: the median wall time of
each and every run's (a shared machine's noise shows there), talon over the reference (the bar:
about 1.2x or less; also round by round, each pair run back to back), and CPU seconds (user + system of
the process and its children, from ``wait4``), which the other work on a shared machine moves
less than the wall time. Peak RSS is ``ru_maxrss`` of the process; flat memory is the peak at
``--size-mb`` over the peak at a tenth of it (run first, the same way), near 1 whatever the size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1 << 20


def _random_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(os.urandom(size))


def make_deployment(root: Path, size_mb: int, rng: random.Random) -> dict[str, int]:
    """A mixed deployment of about ``size_mb``: 8% conversations, 10% SQLite, 12% documents,
    70% photos and videos. How many files of each kind."""
    data, media = root / "data", root / "media_root"
    budget = size_mb * MB
    counts = {"session files": 0, "sqlite": 0, "photos": 0, "videos": 0, "documents": 0, "workspace files": 0}
    # Conversations: ~24 KB per chat, four files each.
    chats = max(10, int(budget * 0.08) // (24 << 10))
    words = "boiler kettle march invoice garden tomorrow photo meeting please thanks train dinner".split()
    for c in range(chats):
        chat = data / "sessions" / "telegram" / str(100000 + c)
        (chat / "context").mkdir(parents=True)
        lines = []
        for i in range(60):
            text = " ".join(rng.choice(words) for _ in range(40))
            lines.append(json.dumps({"role": "user" if i % 2 == 0 else "assistant",
                                     "content": [{"type": "text", "text": f"{i} {text}"}], "at": 1_700_000_000 + i}))
        (chat / "main.jsonl").write_text("\n".join(lines) + "\n")
        (chat / "CURRENT").write_text("main\n")
        (chat / "CHAT").write_text(json.dumps({"channel": "telegram", "chat_id": str(100000 + c)}))
        (chat / "context" / "1.archive.md").write_text("Summary: " + " ".join(rng.choice(words) for _ in range(300)))
        ws = media / "telegram" / str(100000 + c)
        ws.mkdir(parents=True)
        (ws / "AGENTS.md").write_text("# Memory\n" + " ".join(rng.choice(words) for _ in range(80)))
        counts["session files"] += 4
        counts["workspace files"] += 1
    # SQLite stores in WAL mode, as Talon keeps them.
    for name, share in (("inbox.sqlite3", 0.06), ("tasks.sqlite3", 0.01), ("control.sqlite3", 0.03)):
        conn = sqlite3.connect(data / name)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
        rows = int(budget * share) // 600
        conn.executemany("INSERT INTO t (body) VALUES (?)",
                         ((" ".join(rng.choice(words) for _ in range(60)) + f" {i}",) for i in range(rows)))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        counts["sqlite"] += 1
    # Attachments by sha256 name: documents (compressible), photos and videos (incompressible).
    def blob_path() -> Path:
        name = "%064x" % rng.getrandbits(256)
        return data / "attachments" / name[:2] / name

    left = int(budget * 0.12)
    while left > 0:
        size = min(left, rng.randint(20 << 10, 400 << 10))
        path = blob_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = (" ".join(rng.choice(words) for _ in range(200)) + "\n").encode()
        path.write_bytes((doc * (size // len(doc) + 1))[:size])
        left -= size
        counts["documents"] += 1
    # The search index a running Talon keeps beside its conversations (the archive carries it),
    # built in a process of its own: this one stays small (a child's peak RSS counts its parent's
    # pages from before the exec).
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from talon.cli.reindex import "
                    "index_embedded; index_embedded(Path(sys.argv[1]))", str(data)],
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    counts["sqlite"] += 1
    left = int(budget * 0.70)
    video = 24 * MB
    while left > 0:
        if counts["videos"] * video < budget * 0.30 and left >= video:
            _random_file(blob_path(), video)
            left -= video
            counts["videos"] += 1
        else:
            size = min(left, rng.randint(40 << 10, 3 * MB))
            _random_file(blob_path(), size)
            left -= size
            counts["photos"] += 1
    return counts


def tree_bytes(root: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(root) for f in files)


def timed(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
          fsync: Path | None = None) -> dict[str, float]:
    """Wall seconds, CPU seconds (user + system, with reaped children) and peak RSS of a command."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if fsync is not None:
        fd = os.open(fsync, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out.decode(errors='replace')}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024}


def settle(path: Path) -> None:
    subprocess.run(["sync", "-f", str(path)], check=True)


def one_size(size_mb: int, work: Path, rounds: int, with_zstd_tar: bool) -> dict[str, object]:
    root = work / f"size{size_mb}"
    counts = make_deployment(root, size_mb, random.Random(size_mb))
    total = tree_bytes(root / "data") + tree_bytes(root / "media_root")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env |= {"TALON_DATA_DIR": str(root / "data"), "TALON_MEDIA_ROOT": str(root / "media_root"),
            "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(root / "config")}
    cli = [sys.executable, "-m", "talon.cli"]
    runs: dict[str, list[dict[str, float]]] = {}
    settle(root)
    for r in range(rounds):
        def go(label: str, argv: list[str], fsync: Path | None = None) -> None:
            runs.setdefault(label, []).append(timed(argv, env=env, cwd=root, fsync=fsync))
            settle(root)

        ref, arch, zref = root / "ref.tar", root / "talon.tar.zst", root / "ref.tar.zst"
        # Each pair in turn first and second (round by round), so neither gains from going first.
        backups = [("ref backup", ["tar", "-cf", str(ref), "data", "media_root"], ref),
                   ("talon backup", [*cli, "backup", str(arch)], None)]
        for label, argv, synced in backups if r % 2 == 0 else backups[::-1]:
            go(label, argv, fsync=synced)
        if with_zstd_tar:
            go("tar+zstd backup", ["tar", "-I", "zstd -1 -T0", "-cf", str(zref), "data", "media_root"], fsync=zref)
        # The restored trees stay until the end: deleting 18,000 files makes ext4 pass over their
        # inode numbers for a minute or more (its recently_deleted check, at every file created),
        # so the next round's restores would pay for this round's deletions.
        (root / f"refx{r}").mkdir()
        # tar -xf, then its files written to the disk (sync -f: syncfs), as talon restore does.
        restores = [("ref restore", ["sh", "-c", 'tar -xf "$0" -C "$1" && sync -f "$1"', str(ref), str(root / f"refx{r}")]),
                    ("talon restore", [*cli, "restore", str(arch), "--data-dir", str(root / f"restored{r}" / "data")])]
        for label, argv in restores if r % 2 == 0 else restores[::-1]:
            go(label, argv)
        if with_zstd_tar:
            (root / f"zrefx{r}").mkdir()
            go("tar+zstd restore", ["sh", "-c", 'tar -I "zstd -T0" -xf "$0" -C "$1" && sync -f "$1"', str(zref),
                                    str(root / f"zrefx{r}")])
        sizes = {"archive": arch.stat().st_size, "tar": ref.stat().st_size}
        for made in (ref, arch, zref):
            made.unlink(missing_ok=True)
        settle(root)
    shutil.rmtree(root)
    med = {label: {k: statistics.median(x[k] for x in xs) for k in ("wall", "cpu")}
           | {"rss": max(x["rss"] for x in xs), "walls": [x["wall"] for x in xs]}
           for label, xs in runs.items()}
    return {"bytes": total, "counts": counts, "median": med, "sizes": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-zstd-tar", action="store_true", help="skip the tar+zstd figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="talon-bench-backup-", dir=os.environ.get("TMPDIR")) as tmp:
        tenth = max(16, args.size_mb // 10)
        small = one_size(tenth, Path(tmp), 1, False)
        big = one_size(args.size_mb, Path(tmp), args.rounds, not args.no_zstd_tar)
    m = big["median"]
    mb = big["bytes"] / MB  # type: ignore[operator]
    print(f"machine: {os.cpu_count()} cores, {os.uname().sysname} {os.uname().release}; "
          f"tree: {mb:.0f} MB, {sum(big['counts'].values())} files {big['counts']}")  # type: ignore[attr-defined]
    print(f"archive {big['sizes']['archive'] / MB:.0f} MB (.tar.zst), tar {big['sizes']['tar'] / MB:.0f} MB; "  # type: ignore[index]
          f"median of {args.rounds} rounds:")
    for label, t in m.items():  # type: ignore[attr-defined]
        print(f"  {label:17s} {t['wall']:6.2f} s wall ({mb / t['wall']:5.0f} MB/s), {t['cpu']:6.2f} s CPU, "
              f"peak RSS {t['rss']:.0f} MB; each run: {' '.join(f'{w:.2f}' for w in t['walls'])}")
    for what in ("backup", "restore"):
        ref, ours = m[f"ref {what}"], m[f"talon {what}"]  # type: ignore[index]
        rounds = " ".join(f"{a / b:.2f}x" for a, b in zip(ours["walls"], ref["walls"]))
        print(f"{what}: talon / tar = {ours['wall'] / ref['wall']:.2f}x wall, {ours['cpu'] / ref['cpu']:.2f}x CPU "
              f"(round by round: {rounds})")
    sm = small["median"]
    print(f"memory: peak RSS at {args.size_mb} MB over at {tenth} MB: backup "
          f"{m['talon backup']['rss'] / sm['talon backup']['rss']:.2f}x, restore "  # type: ignore[index]
          f"{m['talon restore']['rss'] / sm['talon restore']['rss']:.2f}x (flat: near 1)")  # type: ignore[index]


if __name__ == "__main__":
    main()
