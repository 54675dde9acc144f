"""How the outbound extractor scales on hostile input: ms per MB at 1 MB and 4 MB, and their ratio.

Run: ``python benchmarks/bench_extract.py`` (``--quick``: 1 MB only; ``--only WORD``, repeatable:
only the inputs whose name holds one of the words, case-insensitive). For each input it prints the
CPU time per MB (the best of a few runs, measured with ``time.process_time`` so that other
processes on the machine do not count) at 1 MB and at 4 MB, and ``4MB/1MB``, the ratio of the two
per-MB figures measured in this run: a linear extractor keeps it near 1.0 (a quadratic one would
show 4). The bound (issue 28) is 150 ms per MB for every hostile input; the last lines print the
worst input and the worst ratio.

``hostile_inputs(size)`` is also what tests/test_outbound_extract_hardening.py feeds the extractor
(at a few KB) to count its work at one size and at four times that size.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talon.media.outbound import extract_markdown_media  # noqa: E402

MB = 1_000_000
BOUND_MS_PER_MB = 150


def _fill(unit: str, size: int) -> str:
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


def _cycle(size: int, part: Callable[[int], str]) -> str:
    parts: list[str] = []
    length = 0
    k = 0
    while length < size:
        piece = part(k)
        parts.append(piece)
        length += len(piece)
        k += 1
    return "".join(parts)[:size]


def _soup(size: int, seed: int, tokens: list[str]) -> str:
    rnd = random.Random(seed)
    return _cycle(size, lambda _: rnd.choice(tokens))


_HOSTILE_TOKENS = [
    "![", "[", "]", "(", ")", "`", "``", "```\n", "~~~\n", "\\", "<", ">", '"', "'", " ", "\n", "\n\n",
    "a", "x.png", "*", "_", "    ", "# ", "[r]: y\n", "\r", "![a](b.png)", "](",
]


def hostile_inputs(size: int = MB) -> dict[str, str]:
    """About ``size`` characters of each hostile pattern. Each holds at least one ``![`` and one
    ``](``, so the early exits for text that can lift nothing never hide the cost."""
    fill = lambda unit: _fill(unit, size)  # noqa: E731
    deep = max(2, min(1000, size // 100))  # (1000 at the benchmark's sizes, less in the tests' few KB)
    return {
        # brackets and bangs
        "'![' * N": fill("![") + "](",
        "'![' + '[' * N": "![" + fill("[") + "](",
        "'![a]' + ']' * N": "![a](" + fill("]"),
        "'![a]' + '(' * N": "![a]" + fill("("),
        "'!' + '[' * N/2 + ']' * N/2": "!" + "[" * (size // 2) + "](" + "]" * (size // 2),
        "'[]' * N + ref": fill("[]") + "![a](b.png)",
        "'![]' * N + ref": fill("![]") + "![a](b.png)",
        "'![](' * N": fill("![]("),
        "'[![a](b.png)]' * N": fill("[![a](b.png)]"),
        "'![[a](b)](c.png)' * N (nested)": fill("![[a](b)](c.png)"),
        # backticks (code spans) of one and of varying lengths
        "'![a](x.png)' + '`' * N": "![a](x.png)" + fill("`"),
        "'``![a](x.png)`' * N": fill("``![a](x.png)`"),
        "'`![a](x.png)`' * N (all code)": fill("`![a](x.png)` "),
        "backtick runs 1..64 + ref": _cycle(size, lambda k: "`" * (k % 64 + 1) + "![a](x.png)"),
        "backtick runs growing": "![a](x.png)" + _cycle(size, lambda k: "`" * (k + 1) + " "),
        # unclosed destinations, titles, angles and parentheses
        "'![a](' * N": fill("![a]("),
        "'![a](' * N + ')'": _fill("![a](", size - 1) + ")",
        "'![a](x \"' * N": fill('![a](x "'),
        "'![a](<' * N": fill("![a](<"),
        "'![a](x (' * N": fill("![a](x ("),
        "'![a](x.png ' * N (unclosed)": fill("![a](x.png "),
        "'![a](b(' * N": fill("![a](b("),
        "'\\' * N + ref": fill("\\") + "![a](b.png)",
        # fences and other code blocks
        "'```\\n~~~~\\n' * N + ref": fill("```\n~~~~\n") + "![a](b.png)",
        "'```\\n' * N + ref": fill("```\n") + "![a](b.png)",
        "'~~~\\n' * N + ref": fill("~~~\n") + "![a](b.png)",
        "fences of lengths 3..40": _cycle(size, lambda k: ("`" if k % 2 else "~") * (k % 38 + 3) + "\n![a](x.png)\n"),
        "'```\\n![a](b.png)\\n' * N (unclosed)": "```\n" + fill("![a](b.png)\n"),
        "'```x\\n![a](b.png)\\n```\\n' * N": fill("```x\n![a](b.png)\n```\n"),
        "'    ![a](b.png)\\n\\n' * N": fill("    ![a](b.png)\n\n"),
        # emphasis, headings, definitions
        "'*_' * N + ref": fill("*_") + "![a](b.png)",
        "'**![a](b.png)' * N": fill("**![a](b.png)"),
        "'*_**__' nested * N + ref": fill("*_**__") + "![a](b.png)" + fill("__**_*"),
        "'# ![a](b.png)\\n' * N": fill("# ![a](b.png)\n"),
        "'![![a](a.png)][r]' * N + def": fill("![![a](a.png)][r]") + "\n\n[r]: y",
        "'[r]: y\\n' * N + ref": fill("[r]: y\n") + "\n![![a](a.png)][r]",
        # line structure
        "'\\n' * N + ref": fill("\n") + "![a](b.png)",
        "'\\r' * N + ref": fill("\r") + "![a](b.png)",
        "'\\r\\n' * N + ref": fill("\r\n") + "![a](b.png)",
        "'![](\\n\\n' * N": fill("![](\n\n"),
        "long line 'word ' * N + ref": fill("word ") + "![a](b.png)",
        # every reference real
        "'![a](b.png)\\n' * N (all real)": fill("![a](b.png)\n"),
        "'![a](b.png) x ' * N (all real)": fill("![a](b.png) x "),
        # more an attacker could think of (issue 28, part 4)
        "'![a' + '](' * N + ref": "![a" + fill("](") + "![a](b.png)",
        "'<' * N + ref": fill("<") + "![a](b.png)",
        "'[a' * N/2 + ']a' * N/2 + ref (deep)": "!" + _fill("[a", size // 2) + _fill("]a", size // 2) + "![a](b.png)",
        "'![a' * N/2 + '](x)' * N/2": _fill("![a", size // 2) + _fill("](x)", size // 2),
        "'[![a](b.png)' * N + ']' * N (deep)": _fill("[![a](b.png)", size * 12 // 13) + _fill("]", size // 13),
        "'<!-- ![a](b.png) -->\\n' * N": fill("<!-- ![a](b.png) -->\n"),
        "'<!--' * N + ref": fill("<!--") + "![a](b.png)",
        "'![a][r] ' * N + ref + def": fill("![a][r] ") + "![b](c.png)\n\n[r]: x.png\n",
        "'[r]: x\\n![a][r]\\n' * N + ref": fill("[r]: x\n![a][r]\n") + "![b](c.png)",
        "'[rN]: y\\n' * N + ref (many labels)": _cycle(size, lambda k: f"[r{k}]: y\n") + "\n\n![![a](a.png)][r1]",
        "'![a](b.png)' * N (no gap, all real)": fill("![a](b.png)"),
        "'![](b)' * N (tiny, all real)": fill("![](b)"),
        "'*a _b ![a](b.png) ' * N": fill("*a _b ![a](b.png) "),
        "mixed fences and refs": fill("```\n~~~\n![a](b.png)\n````\n"),
        "'\\t![a](b.png)\\n' * N": fill("\t![a](b.png)\n"),
        "'![a](<b c.png> \"t\") ' * N": fill('![a](<b c.png> "t") '),
        "'![a\\\\]](b.png) ' * N (escapes)": fill("![a\\]](b.png) "),
        "backtick runs 1..8 + '![a](x)'": _cycle(size, lambda k: "`" * (k % 8 + 1) + "![a](x)"),
        "'![a](x(' * N + ')' * N": _fill("![a](x(", size // 2) + _fill(")", size // 2),
        # many short runs of text, each between code blocks or its own paragraph
        "'```\\n```\\n![a](b.png)\\n' * N (runs)": fill("```\n```\n![a](b.png)\n"),
        "'```\\n```\\n![a\\\\]](b.png)\\n' * N (runs)": fill("```\n```\n![a\\]](b.png)\n"),
        "'![a\\\\]](b.png)\\n\\n' * N (paragraphs)": fill("![a\\]](b.png)\n\n"),
        "'`x` ![a](b.png)\\n\\n' * N (paragraphs)": fill("`x` ![a](b.png)\n\n"),
        # the whole-reply path refused at the very end (issue 28, part 4, third pass)
        "runs, then one nested image (refused late)": fill("```\n```\n![a](b.png)\n") + "![[a](b)](c.png)",
        "escapes in paragraphs, then one escaped '!'": fill("![a\\]](b.png)\n\n") + "\\![a](b.png)",
        # fifth pass: deep nesting, unterminated everything, one huge line (issue 28, part 4)
        "'![](\\n\\n' * N + ref": fill("![](\n\n") + "![a](b.png)",
        "nested alt 1000 deep, repeated": _cycle(
            size, lambda k: "![" * deep + "a" + "](b.png)" * deep + "\n\n"),
        "links 1000 deep around an image, repeated": _cycle(
            size, lambda k: "[" * deep + "![a](b.png)" + "](u)" * deep + "\n"),
        "unterminated fences, images, angles": fill("```\n![a](<b.png\n~~~~\n![[a]("),
        "one line of unterminated everything": fill("![a](<x ![[b](c `d \\( \"e ") + "![a](b.png)",
        # mixes
        "mix of hostile tokens": _soup(size, 28, _HOSTILE_TOKENS),
        "mix of brackets and bangs": _soup(size, 29, ["![", "[", "]", "(", ")", "a", " "]),
    }


def _cpu_ms_per_mb(text: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        extract_markdown_media(text)
        best = min(best, time.process_time() - start)
    return best * 1000 / (len(text) / MB)


def main() -> None:
    quick = "--quick" in sys.argv
    args = sys.argv[1:]
    only = [args[i + 1].lower() for i, arg in enumerate(args[:-1]) if arg == "--only"]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average {load} on {os.cpu_count()} cores (CPU time is measured: other processes"
          " only slow it through shared caches)")
    normal = normal_reply()
    print(f"{'input':<40} {'1 MB':>8} {'4 MB':>8} {'4MB/1MB':>8}   (CPU ms per MB)")
    print(f"{'normal reply':<40} {_cpu_ms_per_mb(normal, 3):8.1f}")
    one, four = hostile_inputs(MB), ({} if quick else hostile_inputs(4 * MB))
    if only:
        one = {name: text for name, text in one.items() if any(word in name.lower() for word in only)}
    worst_name, worst, worst_ratio = "", 0.0, 0.0
    for name, text in one.items():
        small = _cpu_ms_per_mb(text, 3)
        line = f"{name:<40} {small:8.1f}"
        measured = small
        if not quick:
            big = _cpu_ms_per_mb(four[name], 2)
            ratio = big / small if small > 0 else 1.0
            worst_ratio = max(worst_ratio, ratio) if small >= 5 else worst_ratio  # tiny times are noise
            measured = max(small, big)
            line += f" {big:8.1f} {ratio:8.2f}"
        print(line, flush=True)
        if measured > worst:
            worst_name, worst = name, measured
    verdict = "within" if worst <= BOUND_MS_PER_MB else "ABOVE"
    print(f"worst: {worst:.0f} ms per MB ({worst_name}), {verdict} the bound of {BOUND_MS_PER_MB} ms per MB")
    if not quick:
        print(f"worst 4MB/1MB ratio (inputs over 5 ms per MB): {worst_ratio:.2f}")


if __name__ == "__main__":
    main()
