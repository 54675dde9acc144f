"""Backup and restore of a large deployment: throughput against the disk's own, memory flat.

Run: ``python benchmarks/bench_backup.py`` (1 GB of data; ``--size-mb 200`` for a quick check).

A data dir is made with ``--size-mb`` of attachments (incompressible random files of 8 MB, the
shape of photos and documents) and a few thousand conversation lines, then, in one run:

- **disk**: the same files copied with ``shutil.copyfile`` into a scratch directory (read and
  write, what the disk does with no archive format at all): the yardstick;
- **backup**: ``talon backup PATH.tar.zst`` as a process of its own;
- **restore**: ``talon restore`` of that archive into a new directory (it verifies the archive
  first, so it reads it twice: its figure is per byte read);

each timed, with the peak RSS of the process sampled every 20 ms (tests/processes.tree_rss). The
figures: backup and restore MB/s over disk MB/s, and the peak RSS at this size over the peak at a
tenth of it (run first, the same way): flat memory is a ratio near 1, whatever the size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.processes import tree_rss  # noqa: E402

MB = 1 << 20
FILE_MB = 8


def make_deployment(root: Path, size_mb: int) -> None:
    data = root / "data"
    blobs = data / "attachments"
    for n in range(max(1, size_mb // FILE_MB)):
        name = f"{n:064x}"
        (blobs / name[:2]).mkdir(parents=True, exist_ok=True)
        with open(blobs / name[:2] / name, "wb") as fh:
            fh.write(os.urandom(FILE_MB * MB))
    chat = data / "sessions" / "telegram" / "1"
    chat.mkdir(parents=True)
    with open(chat / "main.jsonl", "w") as fh:
        for i in range(5000):
            fh.write('{"role":"user","content":[{"type":"text","text":"message %d about the boiler"}],"at":%d}\n'
                     % (i, 1_700_000_000 + i))
    (root / "media_root").mkdir()


def run_measured(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int]:
    """(seconds, peak RSS of the process tree) of a command."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    watched = psutil.Process(proc.pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, tree_rss(watched))
            except psutil.Error:
                pass
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:])} failed:\n{out.decode(errors='replace')}")
    return time.monotonic() - started, peak


def disk_copy(src: Path, dst: Path) -> float:
    started = time.monotonic()
    for path in src.rglob("*"):
        if path.is_file():
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    with open(dst / ".sync", "wb") as fh:
        os.fsync(fh.fileno())
    return time.monotonic() - started


def one_size(size_mb: int, work: Path) -> dict[str, float]:
    root = work / f"size{size_mb}"
    make_deployment(root, size_mb)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env |= {"TALON_DATA_DIR": str(root / "data"), "TALON_MEDIA_ROOT": str(root / "media_root"),
            "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(root / "config")}
    cli = [sys.executable, "-m", "talon.cli"]
    disk_s = disk_copy(root / "data", root / "copy")
    shutil.rmtree(root / "copy")
    archive = root / "talon.tar.zst"
    backup_s, backup_rss = run_measured([*cli, "backup", str(archive)], env, root)
    restore_s, restore_rss = run_measured([*cli, "restore", str(archive), "--data-dir", str(root / "restored" / "data")],
                                          env, root)
    mb = size_mb
    result = {"disk": mb / disk_s, "backup": mb / backup_s, "restore": 2 * mb / restore_s,
              "backup_rss": backup_rss / MB, "restore_rss": restore_rss / MB}
    shutil.rmtree(root)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="talon-bench-backup-", dir=os.environ.get("TMPDIR")) as tmp:
        small = one_size(max(FILE_MB, args.size_mb // 10), Path(tmp))
        big = one_size(args.size_mb, Path(tmp))
    for name, r in ((f"{max(FILE_MB, args.size_mb // 10)} MB", small), (f"{args.size_mb} MB", big)):
        print(f"{name}: disk copy {r['disk']:.0f} MB/s; backup {r['backup']:.0f} MB/s "
              f"({r['backup'] / r['disk']:.2f}x disk), peak RSS {r['backup_rss']:.0f} MB; restore "
              f"{r['restore']:.0f} MB/s read ({r['restore'] / r['disk']:.2f}x disk), peak RSS {r['restore_rss']:.0f} MB")
    print(f"memory: peak RSS at {args.size_mb} MB over at a tenth: backup {big['backup_rss'] / small['backup_rss']:.2f}x, "
          f"restore {big['restore_rss'] / small['restore_rss']:.2f}x (flat: near 1)")


if __name__ == "__main__":
    main()
