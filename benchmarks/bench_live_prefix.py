"""What the live view's cut costs over a long streamed answer: scanning the whole text again at
every update against the stream's own scanner (``channels.live_text.PrefixScanner``).

Run: ``python benchmarks/bench_live_prefix.py``. An answer of SIZE characters of ordinary
Markdown (bold, inline code, links, snake_case, paragraphs) is shown UPDATES times as it grows
(one update per second of a model writing it). CPU seconds (``time.process_time``) for each way,
and their ratio, measured in this run; both give the same cut at every length (tests/
test_live_units.py checks that on random texts). The updates run on the event loop, so a second
of CPU per update is a second in which nothing else in Talon moves.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.live_text import PrefixScanner, safe_prefix  # noqa: E402

PARAGRAPH = "Some **bold** text with `code`, a [link](https://example.com) and snake_case words.\n\n"


def main() -> None:
    for size, updates in ((250_000, 30), (1_000_000, 30), (1_000_000, 120)):
        text = PARAGRAPH * (size // len(PARAGRAPH))
        cuts = [len(text) * k // updates for k in range(1, updates + 1)]
        started = time.process_time()
        whole = [safe_prefix(text[:cut]) for cut in cuts]
        again = time.process_time() - started
        scanner = PrefixScanner()
        started = time.process_time()
        streamed = [scanner.prefix(text[:cut]) for cut in cuts]
        once = time.process_time() - started
        assert whole == streamed
        print(f"{len(text):>9,} characters, {updates:>3} updates: whole text each time {again:6.2f} s, "
              f"the stream's scanner {once:5.2f} s ({again / once:4.0f}x)")


if __name__ == "__main__":
    main()
