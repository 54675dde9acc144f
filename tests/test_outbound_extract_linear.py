"""Issue 28, part 4: the extractor's fast paths give exactly the old output, and its work per MB
does not grow with the size of a hostile reply.

The oracle is the extractor before issue 28's rewrites (tests/support/outbound_oracle.py). The
soups here aim at what the latest rewrite changed: code spans and escapes masked before bracket
matching (with the old reading of an escaped ``!``), tails with angle destinations, titles and
parentheses read by one regex, reference labels folded all at once, escapes removed by one split,
and references built without calling their class. Times are in benchmarks/bench_extract.py only
(1 MB and 4 MB for every hostile input); that the work grows linearly is counted, not timed, in
tests/test_outbound_extract_hardening.py.
"""

from __future__ import annotations

import gc
import random

import pytest

from talon.media import outbound
from talon.media.outbound import MarkdownMediaRef, extract_markdown_media
from talon.render.markdown import unescape
from tests.support.outbound_oracle import as_old


def _as_new(text: str) -> tuple[str, list[tuple[str, str]]]:
    body, refs = extract_markdown_media(text)
    return body, [(r.alt, r.path) for r in refs]


SOUPS: dict[str, list[str]] = {
    # escapes, bangs, brackets and code spans together (the masking before bracket matching)
    "escapes and code": [
        "\\", "\\\\", "\\!", "\\[", "\\]", "\\`", "!", "![", "[", "]", "](x.png)", "`", "``", "a", " ",
        "\n", "![a](b.png)", "![a\\]b](c.png)", "\\![a](b.png)", "`![a](b.png)`", "(", ")", "\\(",
    ],
    # tails: angle destinations, titles of three kinds, line breaks, parentheses, schemes
    "tails": [
        "![a](", "![b]", "(", ")", "<", ">", "<a b.png>", '"t"', "'t'", "(t)", " ", "\t", "\n", "\r\n",
        "x.png", "p(1).png", "http://h/x.png", "//h/x", '"', "'", "\\)", "\\\"", "a", "![c](d.png)",
    ],
    # reference images and definitions: case, whitespace, unicode folding of labels
    "references": [
        "![![a](a.png)][r]", "![x![a](a.png)][R ]", "![![a](a.png)][]", "![![a](a.png)]", "[r]: y\n",
        "[ R ]: y\n", "[Straße]: y\n", "[STRASSE]", "[Σ  x]: y\n", "[σ x]", "\n", "\n\n", " ", "\u00a0",
        "[\u2028r]: y\n", "![b](c.png)", "[", "]", "a",
    ],
    # ordinary replies: prose, lists, headings, code blocks, links and images
    "replies": [
        "Here is the chart:\n\n", "![Revenue](charts/rev.png)\n", "- item ", "1. step\n", "# Title\n",
        "```python\nprint('![x](y.png)')\n```\n", "See [docs](https://example.com). ", "**bold** ",
        "_it_ ", "`code` ", "![diagram](<my plots/d.png> \"Diagram\")", "\n\n", "text ", "> quote\n",
        "    indented ![i](i.png)\n", "![remote](https://x/y.png) ",
    ],
}


# Many references whose alt texts and paths are unescaped and folded a run at a time, joined by a
# character the text does not hold: with and without the candidates for it in the text.
BULK_TOKENS = [
    "![a\\]b](x\\(.png)", "![ c\t d ](y.png)", "![\u00a0e\u2028](z.png)", "![](w.png)", "![f](http://h/f)",
    "![g]( )", "![h\\*](p\\ q)", "![i](<j k.png>)", "\\", " ", "\n", "x", "[", "]",
]


@pytest.mark.parametrize("extra", ["", "\x00", "\x00\ue000", "\x00\ue000\ue001\uffff"])
def test_references_unescaped_and_folded_together_give_the_old_output(extra: str) -> None:
    rnd = random.Random(f"bulk-{extra!r}")
    for _ in range(60):
        tokens = BULK_TOKENS + list(extra)
        text = extra + "".join(rnd.choice(tokens) for _ in range(rnd.randint(10, 120)))
        assert _as_new(text) == as_old(text), repr(text)


@pytest.mark.parametrize("soup", list(SOUPS))
@pytest.mark.parametrize("seed", range(3))
def test_generated_inputs_give_the_old_output(soup: str, seed: int) -> None:
    rnd = random.Random(f"linear-{soup}-{seed}")
    tokens = SOUPS[soup]
    for _ in range(300):
        text = "".join(rnd.choice(tokens) for _ in range(rnd.randint(0, 30)))
        assert _as_new(text) == as_old(text), repr(text)


def test_long_generated_inputs_give_the_old_output() -> None:
    rnd = random.Random("linear-long")
    for tokens in SOUPS.values():
        for _ in range(4):
            text = "".join(rnd.choice(tokens) for _ in range(rnd.randint(200, 1200)))
            assert _as_new(text) == as_old(text), text[:200]


QUIRKS = [
    # An escaped '!' makes no image, unless another escape comes between its '[' and ']' (the old
    # parser looked only at the latest escape before the ']'): kept, with code spans in between.
    r"\![a](x.png)", r"\![a\]b](x.png)", r"\![a`\]`b](x.png)", r"\\![a](x.png)", r"\\\![a](x.png)",
    r"`\`![a](x.png)", r"\![a](x.png) \![b\!](y.png)", r"![a\![b](c.png)](d.png)",
    # tails the one-regex reader takes, and their near misses the full parser reads
    '![a](<b c.png> "t")', "![a](<b c.png>'t')", "![a](<b>c)", "![a](x\n\"t\"\n)", "![a](x\n\n\"t\")",
    "![a]( <b> (t) )", "![a](x (t(u)))", "![a](x(y) \"t\")", "![a](<b\\>c.png>)", "![a]()", "![a](<>)",
]


@pytest.mark.parametrize("text", QUIRKS)
def test_corner_cases_give_the_old_output(text: str) -> None:
    assert _as_new(text) == as_old(text)


def test_reference_labels_are_folded_as_one_label_at_a_time() -> None:
    rnd = random.Random("labels")
    pieces = ["a", "B", "ß", "Σ", "ς", " ", "  ", "\t", "\u00a0", "\u2028", "\x85", "\r", "İ", "ﬃ", "1"]
    for _ in range(200):
        labels = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 8))) for _ in range(5)]
        text = "".join(f"[{label}]: y\n" for label in labels)
        expected = {outbound._normal_label(m.group(1)) for m in outbound._DEFINITION.finditer(text)}
        assert outbound._reference_labels(text) == expected, labels
    assert outbound._reference_labels("no definitions") == set()


def test_escapes_are_removed_as_the_renderer_removes_them() -> None:
    rnd = random.Random("unescape")
    pieces = ["\\", "\\\\", "a", "!", "[", "]", "(", ")", "`", "~", "é", " ", "\n", "\\a", "\\é"]
    for _ in range(500):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 20)))
        assert outbound._unescape(text) == unescape(text), repr(text)


@pytest.mark.parametrize("enabled", [True, False])
def test_references_are_the_dataclass_and_the_collector_is_left_as_found(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        refs = outbound._make_refs(["a", "", "c d"], ["x.png", "y.png", "z.png"])
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert refs == [MarkdownMediaRef("a", "x.png"), MarkdownMediaRef("", "y.png"),
                    MarkdownMediaRef("c d", "z.png")]
    assert all(type(ref) is MarkdownMediaRef for ref in refs)
    assert hash(refs[0]) == hash(MarkdownMediaRef("a", "x.png"))
    with pytest.raises(AttributeError):  # still frozen
        refs[0].alt = "changed"  # type: ignore[misc]


@pytest.mark.parametrize("unit", ["![](b)", "![a](b.png) x ", "[![a](b.png)]", "# ![a](b.png)\n"])
def test_lifting_twenty_thousand_references_starts_no_garbage_collection(unit: str) -> None:
    # A full collection walks every big list alive; one per quarter of growth made a reply of a
    # million references cost O(n log n) (the old extractor started 190-430 collections per MB of
    # such replies). The references are now built with the collector held off.
    text = unit * 20_000
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect(0)
    gc.callbacks.append(count)
    try:
        _, refs = extract_markdown_media(text)
    finally:
        gc.callbacks.remove(count)
    assert len(refs) == 20_000
    # (one collection may come when the collector is back on: the old way started about 50)
    assert len(started) <= 1, started
