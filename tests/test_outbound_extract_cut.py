"""The whole-reply path read part of the way (issue 28, part 4, fourth pass), against the oracle.

When the masked copy of a reply stops being one simple run part-way, ``_lift_masked`` reads it up
to the start of the block holding the first construct it cannot read (its run of text, or past the
last blank line before it) and the run-by-run path reads the rest; an escaped ``!`` before a plain
``[...]`` (no image, in the segment parser's reading) no longer refuses it. Every output must be
the oracle's (tests/support/outbound_oracle.py).
"""

from __future__ import annotations

import random

import pytest

from talon.media import outbound
from talon.media.outbound import extract_markdown_media
from tests.support.outbound_oracle import as_old


def _as_new(text: str) -> tuple[str, list[tuple[str, str]]]:
    body, refs = extract_markdown_media(text)
    return body, [(r.alt, r.path) for r in refs]


def _cut(text: str) -> int | None:
    """Where the masked copy stops (its length: read whole), or None: refused."""
    whole = outbound._lift_masked(text, [])
    return None if whole is None else whole[-1]


TOKENS = [
    "![a](b.png)\n", "![a](b.png) x ", "\n\n", "\n", "```\n", "~~~\n", "    x\n", "`x` ", "\\]", "\\!",
    "\\![a](b.png)", "![a\\]](b.png)", "![[a](b)](c.png)", "[l](x) ", "\\\\", "![a](http://x)\n",
    "# ![h](h.png)\n", "![a", "](b)", "\t", "\r\n", "![ a  b ](c.png)", "[r]: y\n", "![![a](b.png)][r]",
]


@pytest.mark.parametrize("seed", range(3))
def test_generated_inputs_give_the_old_output(seed: int) -> None:
    rnd = random.Random(f"cut-{seed}")
    cuts = 0
    for _ in range(400):
        text = "".join(rnd.choice(TOKENS) for _ in range(rnd.randint(1, 40)))
        cut = _cut(text.replace("\r", ""))
        cuts += cut is not None and cut < len(text.replace("\r", ""))
        assert _as_new(text) == as_old(text), repr(text)
    assert cuts >= 10  # (so the soup reaches the path read part of the way)


@pytest.mark.parametrize(
    "head", ["```\n```\n![a](b.png)\n", "![a\\]](b.png)\n\n", "`x` ![a](b.png)\n\n", "~~~\n~~~\n![a](b.png) x\n"]
)
@pytest.mark.parametrize(
    "last", ["![[a](b)](c.png)", "\n\n![[a](b)](c.png) ![d](e.png)", "x\n![a](b.png) ![[c]](d.png)",
             "\n\n![![a](b.png)][r]\n\n[r]: y", "\n\n    x\n\n![[a](b)](c.png)"]
)
def test_a_reply_refused_at_its_end_is_read_part_of_the_way(head: str, last: str) -> None:
    text = head * 200 + last
    cut = _cut(text)
    assert cut is not None and 0 < cut < len(text)
    assert _as_new(text) == as_old(text)


@pytest.mark.parametrize(
    "text",
    ["![a\\]](b.png)\n\n" * 50 + "\\![a](b.png)", "x \\! \\![a b](c.png) ![d](e\\!.png)",
     "\\\\![a](b.png) \\![c](d.png)"],
)
def test_an_escaped_bang_before_a_plain_bracket_is_read_whole(text: str) -> None:
    assert _cut(text) == len(text)
    assert _as_new(text) == as_old(text)


@pytest.mark.parametrize("text", ["\\![a\\]](b.png)", "\\![[a]](b.png)", "x \\![a `b`](c.png)"])
def test_an_escaped_bang_with_its_own_reading_is_refused(text: str) -> None:
    assert _cut(text) is None
    assert _as_new(text) == as_old(text)
