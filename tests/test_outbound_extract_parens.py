"""Parentheses matched a run at a time, chains of ``![a](`` skipped, images among deep links
(issue 28, part 4, sixth pass), against the oracle (tests/support/outbound_oracle.py).

A destination's parentheses are matched for its whole stretch at once (runs of '(' against runs
of ')'), the '(' that never close kept as intervals; a chain of images whose destinations each
run into such a '(' is skipped in one regex step; a segment whose images hold no bracket in their
alt text is read by the flat regex whatever the links around them. Every output must be the
oracle's, and the new paths must really be taken. An image starting inside an earlier image's
tail but running on past it no longer hides the images in the rest of it (the regex paths missed
them; the oracle reads them).
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


TOKENS = {
    "chains": ["![a](", "![a](", "![a](", "![", "(", ")", ")", "x", "![a]", "<", "a)", "![a](x", "(x", " ",
               "](", "\n", "![a](b.png)", '"t"', "\\(", "\\"],
    "parens": ["![a](", "(", ")", "](", "![", "[", "]", "a", " ", "\n", "x.png", "<", ">", '"t"', "\\", "\\(",
               "`", "![a](b.png)", "((", "))", "!", "\n\n", "[r]: y\n", "[r]"],
    "links": ["[", "]", "![a](b.png)", "](u)", "![a](b(c).png)", "![a](", ")", "a", " ", "\n", "(", "![",
              "![a]", '![a](x "t")', "![a](<b c>)", "[![a](b.png)"],
}


@pytest.mark.parametrize("kind", list(TOKENS))
@pytest.mark.parametrize("seed", range(2))
def test_generated_inputs_give_the_old_output(kind: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed:  # every stretch by runs, however short (these inputs' stretches mostly are)
        monkeypatch.setattr(outbound, "_SHORT_STRETCH", 0)
    rnd = random.Random(f"{kind}-{seed}")
    tokens = TOKENS[kind]
    for _ in range(250):
        text = "".join(rnd.choice(tokens) for _ in range(rnd.randint(1, 60)))
        assert _as_new(text) == as_old(text), repr(text)


CASES = [
    "![a](" * 50 + ")",  # a chain, its last '(' closed
    "![a](" * 50 + "x.png)",
    "![a](" * 20 + "![b](c.png)" + "![a](" * 20 + ")",
    "![a](x![a](y![a](z(" + ")" * 3,
    "![a](<b>(![a](<c>)" + "![a](" * 5,
    "![a" + "](" * 60 + "![a](b.png)",
    "![a](x(" * 30 + ")" * 30,
    "![a](x(" * 30 + ")" * 29 + " ![b](c.png)",
    "![a](x((y)z(" + ")" * 2 + ' "t")',
    "![a](b(c)d (e)) ![f](g(h\\)i)j.png)",
    "[" * 40 + "![a](b.png)" + "](u)" * 40,
    "[![a](b.png)" * 30 + "]" * 30,
    "[[![a](b.png)](u) ![c](d(e).png)]",
    # An image that starts inside an earlier image's tail but runs on past it: the images in the
    # rest of it are read on their own (main before this pass lost them in the two-deep path).
    "![](![())![](x)]([(]",
    "![](()![)![](a)]((",
    '![e](p "![q](<") ![b](c.png) >)',
]


@pytest.mark.parametrize("text", CASES)
def test_corner_cases_give_the_old_output(text: str) -> None:
    assert _as_new(text) == as_old(text)


def test_the_new_paths_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    runs, skip = outbound._Scanner._match_runs, outbound._Lifter._past_dead_chain

    def match_runs(self: outbound._Scanner, p: int, z: int) -> None:
        taken.append("runs")
        runs(self, p, z)

    def past_dead_chain(self: outbound._Lifter, q: int, seg_end: int) -> int:
        after = skip(self, q, seg_end)
        taken.append("chain" if after > q else "no chain")
        return after

    monkeypatch.setattr(outbound._Scanner, "_match_runs", match_runs)
    monkeypatch.setattr(outbound._Lifter, "_past_dead_chain", past_dead_chain)
    text = "![a](" * 200 + ")"
    assert _as_new(text) == as_old(text)
    assert taken.count("runs") == 1 and "chain" in taken
    assert len(taken) < 10  # not a step per image
