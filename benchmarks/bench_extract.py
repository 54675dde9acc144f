"""How the outbound extractor scales on hostile input, relative to a normal reply.

Run: ``python benchmarks/bench_extract.py``. Every input is about 1 MB. The figure that matters is
the hostile/normal ratio measured in this run (absolute times depend on the machine): a linear
extractor keeps it a small constant; a backtracking one would take minutes on these inputs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talon.media.outbound import extract_markdown_media  # noqa: E402

MB = 1_000_000


def _fill(unit: str, size: int = MB) -> str:
    return unit * (size // len(unit))


def normal_reply(size: int = MB) -> str:
    """Prose with a few media references and code blocks, like a long but ordinary answer."""
    paragraph = (
        "The quarterly numbers are in. Revenue grew 12% while costs stayed flat, which is the "
        "first time that happened since 2019. See `report.csv` for the raw data and the chart "
        "below for the trend; the [methodology](https://example.com/method) is unchanged.\n\n"
    )
    code = "```python\nfor row in rows:\n    total += row['amount']  # ![not](media.png)\n```\n\n"
    media = "![Revenue by month](charts/revenue_{i}.png)\n\n"
    parts: list[str] = []
    length = 0
    i = 0
    while length < size:
        block = paragraph * 8 + code + (media.format(i=i) if i % 4 == 0 else "")
        parts.append(block)
        length += len(block)
        i += 1
    return "".join(parts)[:size]


def hostile_inputs() -> dict[str, str]:
    # Each holds at least one "![", so the early exit for media-free text never hides the cost.
    return {
        "'![' * N": _fill("!["),
        "'![' + '[' * N": "![" + _fill("["),
        "'![a]' + ']' * N": "![a]" + _fill("]"),
        "'![a](x.png)' + '`' * N": "![a](x.png)" + _fill("`"),
        "'``![a](x.png)`' * N": _fill("``![a](x.png)`"),
        "'![a](' * N": _fill("![a]("),
        "'![a](' * N + ')'": _fill("![a](", MB - 1) + ")",
        "'![a](x \"' * N": _fill('![a](x "'),
        "'![a](<' * N": _fill("![a](<"),
        "'![a](x (' * N": _fill("![a](x ("),
        "'!' + '[' * N/2 + ']' * N/2": "!" + "[" * (MB // 2) + "]" * (MB // 2 - 1),
        "'![a]' + '(' * N": "![a]" + "(" * (MB - 4),
        "'\\' * N + '![a](b.png)'": _fill("\\") + "![a](b.png)",
        "fence lines * N + ref": _fill("```\n~~~~\n") + "![a](b.png)",
        "'![a](b.png) x ' * N (all real)": _fill("![a](b.png) x "),
    }


def _time(text: str, repeat: int = 2) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        extract_markdown_media(text)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    normal = normal_reply()
    normal_s = _time(normal) / (len(normal) / MB)
    print(f"{'input':<34} {'s/MB':>8} {'x normal':>9}")
    print(f"{'normal reply':<34} {normal_s:8.3f} {1.0:9.1f}")
    worst = 0.0
    for name, text in hostile_inputs().items():
        per_mb = _time(text) / (len(text) / MB)
        ratio = per_mb / normal_s
        worst = max(worst, ratio)
        print(f"{name:<34} {per_mb:8.3f} {ratio:9.1f}")
    print(f"worst hostile/normal ratio: {worst:.1f}; worst hostile: {worst * normal_s * 1000:.0f} ms per MB")


if __name__ == "__main__":
    main()
