"""Issue 28, part 4 (third pass): the whole reply read at once, from one masked copy, gives exactly
the old output.

When every run of text is simple once its code is masked, ``talon.media.outbound._lift_masked``
finds all the images with one split over a copy of the reply in which code blocks, code spans of
single backticks and escapes are replaced by same-length marks, and takes the alt texts and paths
back by offset and by undoing the marks. These soups aim at what that can get wrong: runs of text
between code blocks, escapes in alt texts, paths and around brackets, code spans next to and inside
images, the marks themselves written by the reply, schemes hidden behind escapes. The oracle is
the extractor before issue 28 (tests/support/outbound_oracle.py).
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


SOUPS: dict[str, list[str]] = {
    # runs of text between code blocks of every kind
    "runs between code": [
        "```\n", "~~~\n", "````\n", "```x\n", "    code ![c](c.png)\n", "\t![t](t.png)\n", "\n", "\n\n",
        "![a](b.png)\n", "![a](b.png) ", "text ", "# ![h](h.png)\n", "[l](x) ", "`", "![a\\]](b.png)\n",
    ],
    # escapes everywhere an image can hold one, and around it
    "escapes": [
        "![a\\]](b.png)", "![a](b\\).png)", "![a](b\\(.png)", "![\\[a](b.png)", "\\[", "\\]", "\\(", "\\)",
        "\\\\", "\\!", "\\*", "\\`", "\\", "![a](ht\\:x)", "![a](\\//h/x)", "![a](\\:x)", "![a](ab\\:x)",
        "![a](x\\ y)", "![", "](", "a", " ", "\n", "\n\n", "![a](b.png)", "\\\\![a](b.png)",
    ],
    # code spans next to, around and inside images
    "code spans": [
        "`x` ", "`![a](b.png)`", "![a `x` b](c.png)", "![a](b`x`)", "![a](b `x`)", "`(`", "`)`", "`[`",
        "``", "` `", "`", "![a](b.png)", " ", "\n", "\n\n", "x", "![", "](", "[", "]", "!`x`[a](b.png)",
    ],
    # the marks the masked copy uses, written by the reply itself
    "marks": [
        "\x01", "\ue100", "\ue15b", "\ue15d", "\ue128", "\ue129", "\ue15c", "\ue160", "\ue1ff", "\\]", "`x`",
        "![a\\]](b.png)", "![a\ue100](b.png)", "![\x01](b.png)", "```\n", "\n", " ", "![a](b.png)",
    ],
}


@pytest.mark.parametrize("soup", list(SOUPS))
@pytest.mark.parametrize("seed", range(3))
def test_generated_inputs_give_the_old_output(soup: str, seed: int) -> None:
    rnd = random.Random(f"masked-{soup}-{seed}")
    tokens = SOUPS[soup]
    for _ in range(300):
        text = "".join(rnd.choice(tokens) for _ in range(rnd.randint(0, 30)))
        assert _as_new(text) == as_old(text), repr(text)


def test_long_generated_inputs_give_the_old_output() -> None:
    rnd = random.Random("masked-long")
    for tokens in SOUPS.values():
        for _ in range(4):
            text = "".join(rnd.choice(tokens) for _ in range(rnd.randint(200, 1200)))
            assert _as_new(text) == as_old(text), text[:200]


# The benchmark's patterns this path serves, and their near misses, at a few KB.
PATTERNS = [
    "```\n```\n![a](b.png)\n", "```\n```\n![a\\]](b.png)\n", "![a\\]](b.png)\n\n", "`x` ![a](b.png)\n\n",
    "![a\\]](b.png) ", "```\n```\n![a](http://h/b.png)\n", "`x` ![a](b`c`)\n\n", "![a\\]](h\\ttp://x)\n\n",
    "~~~\n![c](c.png)\n~~~\n![a](b.png)\n", "    ![c](c.png)\n\n![a](b.png)\n\n",
]
# Refused at the very end: the run-by-run path then takes the runs of text the masked one found.
LATE = ["![[a](b)](c.png)", "\\![a](b.png)", "`a\\`", "![a](b.png)\n\n    x\n\n![c](d.png)"]


@pytest.mark.parametrize("unit", PATTERNS[:5])
@pytest.mark.parametrize("last", LATE)
def test_a_pattern_refused_at_its_end_gives_the_old_output(unit: str, last: str) -> None:
    text = unit * (3000 // len(unit)) + last
    assert _as_new(text) == as_old(text)


@pytest.mark.parametrize("unit", PATTERNS)
def test_repeated_patterns_give_the_old_output(unit: str) -> None:
    text = unit * (4000 // len(unit))
    assert _as_new(text) == as_old(text)


@pytest.mark.parametrize(
    "text",
    ["```\n```\n![a](b.png)\n" * 3, "![a\\]](b.png)\n\n" * 3, "`x` ![a](b.png)\n\n" * 3,
     "![a\\]](b.png)\n\n" * 3 + "\\![a](b.png)", "x \\! \\![a b](c.png) ![d](e\\!.png)"],
)
def test_these_replies_take_the_masked_path(text: str) -> None:
    # (so the tests above exercise it: a reply it refuses goes the run-by-run way)
    assert outbound._lift_masked(text, []) is not None


@pytest.mark.parametrize(
    "text", ["\\![a\\]](b.png)", "\\![[a]](b.png)", "`a\\` ![a](b.png)", "![a](b.png) ``x``", "![[a](b)](c.png)", "![a](b.png)\ue100\\]"]
)
def test_these_replies_go_the_run_by_run_way(text: str) -> None:
    assert outbound._lift_masked(text, []) is None
    assert _as_new(text) == as_old(text)
