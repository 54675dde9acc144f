"""Backup, verify and restore memory against the number of files: flat, or growing per file.

Run: ``python benchmarks/bench_backup_files.py`` (10,000 and 100,000 files; ``--files 5000``
for a quick check; ``--root DIR`` runs the ``talon`` of another checkout, to compare).

``bench_backup.py`` grows the bytes and the files together. Here the bytes stay small and only the
count grows: a data dir with a conversation log, and workspaces of ``--files`` small files (200
bytes each, 100 to a directory, under 100 chats), then the same with ten times as many. Each of
``talon backup``, ``talon backup --verify`` and ``talon restore`` runs as a process of its own;
reported are its peak RSS (``ru_maxrss``, from ``wait4``) and wall time, and the peak at ten
times the files over the peak at ``--files``: near 1 when memory is flat per file. (Before the
manifest was streamed, each file held about 1 KB until the end: about 100 MB more for 100,000
files.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_tree(root: Path, files: int) -> None:
    data, media = root / "data", root / "media_root"
    chat = data / "sessions" / "telegram" / "100"
    chat.mkdir(parents=True)
    (chat / "CHAT").write_text("telegram:100")
    (chat / "main.jsonl").write_text('{"role": "user", "content": [{"type": "text", "text": "hello"}]}\n')
    body = b"x" * 199 + b"\n"
    for i in range(files):
        directory = media / "telegram" / str(100 + i % 100) / "notes" / str(i // 10_000)  # 100 files each
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / f"{i}.md", "wb") as fh:
            fh.write(body)


def run(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[3:])} failed: {err}")
    return {"wall": wall, "rss": usage.ru_maxrss / 1024}


def one_count(files: int, work: Path, talon_root: Path) -> dict[str, dict[str, float]]:
    root = work / f"files{files}"
    make_tree(root, files)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALON_", "TELEGRAM_", "OPENAI_", "TWILIO_"))}
    env |= {"TALON_DATA_DIR": str(root / "data"), "TALON_MEDIA_ROOT": str(root / "media_root"),
            "PYTHONPATH": str(talon_root), "XDG_CONFIG_HOME": str(root / "config")}
    cli = [sys.executable, "-m", "talon.cli"]
    archive = root / "talon.tar.zst"
    subprocess.run(["sync", "-f", str(root)], check=True)
    out = {"backup": run([*cli, "backup", str(archive)], env, root),
           "verify": run([*cli, "backup", "--verify", str(archive)], env, root),
           "restore": run([*cli, "restore", str(archive), "--data-dir", str(root / "restored" / "data")], env, root)}
    shutil.rmtree(root)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose talon runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="talon-bench-files-", dir=os.environ.get("TMPDIR")) as tmp:
        counts = [args.files, args.files * 10]
        got = {n: one_count(n, Path(tmp), args.root.resolve()) for n in counts}
    print(f"talon from {args.root.resolve()}")
    for n, runs in got.items():
        print(f"  {n:8,d} files: " + ", ".join(f"{what} {r['rss']:5.0f} MB peak RSS ({r['wall']:.1f} s)"
                                               for what, r in runs.items()))
    small, large = got[counts[0]], got[counts[1]]
    print(f"peak RSS at {counts[1]:,} files over at {counts[0]:,}: "
          + ", ".join(f"{what} {large[what]['rss'] / small[what]['rss']:.2f}x" for what in small)
          + " (flat per file: near 1)")


if __name__ == "__main__":
    main()
