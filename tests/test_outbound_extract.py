"""extract_markdown_media: code masked first, CommonMark-shaped image refs, remote URLs untouched."""

from __future__ import annotations

import pytest

from talon.media import MarkdownMediaRef, extract_markdown_media


def paths(text: str) -> list[str]:
    return [ref.path for ref in extract_markdown_media(text)[1]]


# --- what is lifted, and its parsed destination ---------------------------------------------

LIFTED = [
    ("plain", "![chart](chart.png)", [("chart", "chart.png")]),
    ("subdir", "![c](out/plots/c.png)", [("c", "out/plots/c.png")]),
    ("absolute path", "![c](/srv/media/c.png)", [("c", "/srv/media/c.png")]),
    ("empty alt", "![](x.png)", [("", "x.png")]),
    ("angle path with spaces", "![a](<my chart.png>)", [("a", "my chart.png")]),
    ("angle path with parens", "![a](<plot (final).png>)", [("a", "plot (final).png")]),
    ("double-quoted title", '![a](x.png "The title")', [("a", "x.png")]),
    ("single-quoted title", "![a](x.png 'The title')", [("a", "x.png")]),
    ("parenthesised title", "![a](x.png (The title))", [("a", "x.png")]),
    ("title after angle path", '![a](<x y.png> "t")', [("a", "x y.png")]),
    ("title with escaped quote", r'![a](x.png "say \"hi\"")', [("a", "x.png")]),
    ("balanced parens", "![p](plot(1).png)", [("p", "plot(1).png")]),
    ("nested parens", "![p](a(b(c)).png)", [("p", "a(b(c)).png")]),
    ("escaped parens", r"![p](plot\(1.png)", [("p", "plot(1.png")]),
    ("nested brackets in alt", "![a [b] c](x.png)", [("a [b] c", "x.png")]),
    ("deep brackets in alt", "![a [b [c]] d](x.png)", [("a [b [c]] d", "x.png")]),
    ("escaped bracket in alt", r"![a \] b](x.png)", [("a ] b", "x.png")]),
    ("space inside parens", "![a](  x.png  )", [("a", "x.png")]),
    ("newline before dest", "![a](\nx.png)", [("a", "x.png")]),
    ("multi-line alt", "![a\nb](x.png)", [("a b", "x.png")]),
    ("two refs", "![a](1.png) and ![b](2.jpg)", [("a", "1.png"), ("b", "2.jpg")]),
    ("inside a link", "[![a](1.png)](https://example.com)", [("a", "1.png")]),
    ("windows-style drive is not a scheme", "![a](C:/x.png)", [("a", "C:/x.png")]),
    ("after a paragraph line", "Here it is:\n![a](x.png)", [("a", "x.png")]),
    ("even backslashes do not escape", "\\\\![a](x.png)", [("a", "x.png")]),
    ("quote glued to the path is part of it", '![a](x.png"t")', [("a", 'x.png"t"')]),
    ("dot-dot is the resolver's business", "![a](../x.png)", [("a", "../x.png")]),
]


@pytest.mark.parametrize("name, text, expected", LIFTED, ids=[c[0] for c in LIFTED])
def test_lifted(name: str, text: str, expected: list[tuple[str, str]]) -> None:
    _, refs = extract_markdown_media(text)
    assert [(r.alt, r.path) for r in refs] == expected


# --- what stays in the text exactly as written ----------------------------------------------

NOT_LIFTED = [
    ("``` fence", "```\n![a](x.png)\n```"),
    ("``` fence with info", "```markdown\n![a](x.png)\n```"),
    ("~~~ fence", "~~~\n![a](x.png)\n~~~"),
    ("4-backtick fence holding ```", "````\n```\n![a](x.png)\n```\n````"),
    ("longer closing fence", "```\n![a](x.png)\n`````"),
    ("shorter line does not close", "````\n```\n![a](x.png)"),
    ("other fence char does not close", "~~~\n```\n![a](x.png)\n~~~"),
    ("unclosed fence runs to the end", "text\n\n```\ncode\n\n![a](x.png)\n\nmore"),
    ("indented fence", "   ```\n![a](x.png)\n   ```"),
    ("indented code at start", "    ![a](x.png)"),
    ("indented code after blank", "para\n\n    ![a](x.png)"),
    ("tab-indented code", "\t![a](x.png)"),
    ("inline code", "use `![a](x.png)` to embed"),
    ("double backtick code", "use ``![a](x.png)`` to embed"),
    ("double backticks containing one", "``a ` ![a](x.png)``"),
    ("code span across lines", "`start\n![a](x.png)`"),
    ("code span hides the closer", "![a `](x.png)`"),
    ("escaped bang", r"\![not media](x.png)"),
    ("escaped bracket", r"!\[not media](x.png)"),
    ("http", "![a](http://example.com/x.png)"),
    ("https", "![a](https://example.com/x.png)"),
    ("data", "![a](data:image/png;base64,iVBORw0KGgo=)"),
    ("file url", "![a](file:///x.png)"),
    ("ftp", "![a](ftp://host/x.png)"),
    ("mailto", "![a](mailto:a@b.c)"),
    ("scheme-relative", "![a](//cdn.example.com/x.png)"),
    ("uppercase scheme", "![a](HTTPS://EXAMPLE.COM/X.PNG)"),
    ("empty destination", "![a]()"),
    ("space in plain destination", "![a](my chart.png)"),
    ("unbalanced paren", "![a](plot(1.png)"),
    ("no paren after bracket", "![a] (x.png)"),
    ("reference style", "![a][ref]"),
    ("unclosed alt", "![a (x.png)"),
    ("unclosed destination", "![a](x.png"),
    ("unclosed title", '![a](x.png "t)'),
    ("angle with newline", "![a](<x\ny.png>)"),
    ("link, not image", "[a](x.png)"),
    ("blank line inside", "![a\n\nb](x.png)"),
]


@pytest.mark.parametrize("name, text", NOT_LIFTED, ids=[c[0] for c in NOT_LIFTED])
def test_not_lifted(name: str, text: str) -> None:
    assert extract_markdown_media(text) == (text, [])


def test_code_masking_does_not_hide_refs_after_it() -> None:
    text = (
        "```py\nprint('![a](in_fence.png)')\n```\n"
        "~~~~\n![b](in_tilde.png)\n~~~~\n"
        "`![c](in_span.png)` ``![d](in_double.png)``\n\n"
        "    ![e](indented.png)\n\n"
        "Now the real one: ![f](real.png)"
    )
    new_text, refs = extract_markdown_media(text)
    assert refs == [MarkdownMediaRef(alt="f", path="real.png")]
    assert new_text == text.replace(" ![f](real.png)", "")


def test_unmatched_backtick_run_is_literal() -> None:
    # The lone ` never closes, so the ref after it is not in code.
    assert paths("a ` b ![x](x.png)") == ["x.png"]
    # ``` on a line with text after is not a fence when the info has a backtick.
    assert paths("```a`b\n![x](x.png)") == ["x.png"]


def test_escaped_backtick_does_not_open_code() -> None:
    # The escaped backtick is literal and the last one has no partner: no code span.
    assert paths(r"\`![x](x.png)`") == ["x.png"]
    # Escaping the first of two leaves a run of one, which the last backtick closes.
    assert paths(r"\``![x](x.png)`") == []


def test_indented_line_inside_paragraph_is_not_code() -> None:
    assert paths("para\n    ![a](x.png)") == ["x.png"]


def test_remote_ref_alt_is_not_searched() -> None:
    # The whole remote ref stays text; nothing inside it is lifted.
    text = "![![inner](in.png)](https://x/y.png)"
    assert extract_markdown_media(text) == (text, [])
    assert paths("![a](https://x/y.png) ![b](b.png)") == ["b.png"]


# --- the text left behind -------------------------------------------------------------------

TIDY = [
    ("inside a sentence", "Here is ![a](a.png) the chart.", "Here is the chart."),
    ("end of sentence", "Here is the chart: ![a](a.png)", "Here is the chart:"),
    ("own line", "Before\n![a](a.png)\nAfter", "Before\nAfter"),
    ("own paragraph", "Before\n\n![a](a.png)\n\nAfter", "Before\n\nAfter"),
    ("two own paragraphs", "A\n\n![a](a.png)\n\n![b](b.png)\n\nB", "A\n\nB"),
    ("two on a line", "![a](a.png) ![b](b.png)\nNext", "Next"),
    ("only refs", "![a](a.png)\n\n![b](b.png)", ""),
    ("leading", "![a](a.png)\n\nHello", "Hello"),
    ("trailing", "Hello\n\n![a](a.png)\n", "Hello"),
    ("indent kept", "- item\n  ![a](a.png) caption", "- item\n  caption"),
    ("crlf", "A\r\n![a](a.png)\r\nB", "A\r\nB"),
    ("code after", "A\n\n![a](a.png)\n\n```\nx\n\n\ny\n```", "A\n\n```\nx\n\n\ny\n```"),
    ("remote kept", "![r](https://x/r.png) ![a](a.png)", "![r](https://x/r.png)"),
]


@pytest.mark.parametrize("name, text, expected", TIDY, ids=[c[0] for c in TIDY])
def test_tidy(name: str, text: str, expected: str) -> None:
    assert extract_markdown_media(text)[0] == expected


def test_untouched_text_is_identical() -> None:
    text = "No media here.\n\n\n   Odd   spacing  \n```\n![a](x.png)\n```\n"
    assert extract_markdown_media(text) == (text, [])


# --- hostile input completes (no timing assert; see benchmarks/bench_extract.py) -------------

SIZE = 200_000
HOSTILE = {
    "bang-bracket": "![" * (SIZE // 2),
    "brackets": "![" + "[" * SIZE,
    "closers": "![a]" + "]" * SIZE,
    "backticks": "![a](x.png)" + "`" * SIZE,
    "unclosed runs": "``![a](x.png)`" * (SIZE // 14),
    "open dests": "![a](" * (SIZE // 5),
    "open titles": '![a](x "' * (SIZE // 8),
    "open angles": "![a](<" * (SIZE // 6),
    "nested": "!" + "[" * (SIZE // 2) + "]" * (SIZE // 2),
    "parens": "![a]" + "(" * SIZE,
    "backslashes": "\\" * SIZE + "![a](b.png)",
    "fences": "```\n~~~~\n" * (SIZE // 8) + "![a](b.png)",
    "many real refs": "![a](b.png) " * (SIZE // 12),
    "refs between words": "![a](b.png) x " * (SIZE // 14),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_completes(name: str) -> None:
    text, refs = extract_markdown_media(HOSTILE[name])
    assert isinstance(text, str)
    assert all(isinstance(r, MarkdownMediaRef) for r in refs)


def test_hostile_results() -> None:
    assert extract_markdown_media(HOSTILE["open dests"])[1] == []
    assert len(extract_markdown_media(HOSTILE["many real refs"])[1]) == SIZE // 12
    assert extract_markdown_media(HOSTILE["backslashes"])[1] == [MarkdownMediaRef("a", "b.png")]


# --- CommonMark corner cases -------------------------------------------------------------------


def test_bare_carriage_returns_end_lines() -> None:
    # A bare \r is a line ending: the reference's line goes, and code fenced with \r stays code.
    assert extract_markdown_media("one\r![a](x.png)\rtwo") == ("one\ntwo", [MarkdownMediaRef("a", "x.png")])
    text = "```\r![a](code.png)\r```\rafter ![b](b.png)"
    body, refs = extract_markdown_media(text)
    assert refs == [MarkdownMediaRef("b", "b.png")] and "![a](code.png)" in body


@pytest.mark.parametrize("text", ["  ![a](x.png)  ", "![a](x.png)\n\t\n  ", " ![a](x.png) ![b](y.png)\t\n"])
def test_text_left_as_only_blanks_becomes_empty(text: str) -> None:
    body, refs = extract_markdown_media(text)
    assert body == "" and refs


@pytest.mark.parametrize("text,expected", [
    ("see ![a](x.png)   \nnext", "see\nnext"),
    ("see ![a](x.png)\t\r\nnext", "see\r\nnext"),
    ("one ![a](x.png) ![b](y.png) \ntwo", "one\ntwo"),
])
def test_no_trailing_spaces_where_a_reference_was_cut_from_a_line_end(text: str, expected: str) -> None:
    assert extract_markdown_media(text)[0] == expected


def test_an_image_inside_a_reference_images_label_is_only_alt_text() -> None:
    text = "![![a](a.png)][outer]\n\n[outer]: outer.png"
    assert extract_markdown_media(text) == (text, [])
    # CommonMark: a label holds no brackets, so this is no definition, and both are images.
    shortcut = "![![a](a.png)]\n\n[![a](a.png)]: outer.png"
    assert extract_markdown_media(shortcut)[1] == [MarkdownMediaRef("a", "a.png")] * 2
    # Without the definition the outer is no image, and the inner one is a real reference.
    assert extract_markdown_media("![![a](a.png)][outer]")[1] == [MarkdownMediaRef("a", "a.png")]


def test_a_closing_paren_at_the_end_does_not_make_open_destinations_slow() -> None:
    text = "![a](" * (SIZE // 5) + ")"
    assert extract_markdown_media(text)[1] == []
