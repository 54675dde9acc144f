"""Telegram HTML and WhatsApp rendering, and cutting long replies to each platform's limit."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from talon.render import (
    markdown_to_telegram_html,
    markdown_to_whatsapp,
    plain_text_fallback,
    split_for_whatsapp,
    split_markdown_for_telegram,
    utf16_len,
)

TELEGRAM_TAGS = {"b", "i", "s", "u", "code", "pre", "a", "blockquote"}


class _Balance(HTMLParser):
    """Fails on any tag Telegram does not know, or any tag closed out of order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag in TELEGRAM_TAGS, tag
        if tag == "code" and self.stack and self.stack[-1] == "pre":
            assert all(k == "class" for k, _ in attrs)
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def assert_well_formed(html: str) -> str:
    """Balanced known tags, no raw '<' or '&' outside them; returns the visible text."""
    stripped = re.sub(r"</?(?:b|i|s|u|code|pre|blockquote)>|<a href=\"[^\"<>]*\">|</a>|"
                      r'<code class="language-[\w+#.\-]+">', "", html)
    assert "<" not in stripped and ">" not in stripped, stripped
    assert not re.search(r"&(?!amp;|lt;|gt;|quot;)", stripped), stripped
    parser = _Balance()
    parser.feed(html)
    parser.close()
    assert parser.stack == []
    return "".join(parser.text)


# --- Telegram HTML --------------------------------------------------------------------------

HTML = [
    ("escaping", "a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("entity-looking text", "&amp; &lt;", "&amp;amp; &amp;lt;"),
    ("html is text", "<b>not bold</b>", "&lt;b&gt;not bold&lt;/b&gt;"),
    ("bold stars", "**bold**", "<b>bold</b>"),
    ("bold underscores", "__bold__", "<b>bold</b>"),
    ("italic star", "*it*", "<i>it</i>"),
    ("italic underscore", "_it_", "<i>it</i>"),
    ("bold italic", "***both***", "<b><i>both</i></b>"),
    ("strike", "~~gone~~", "<s>gone</s>"),
    ("single tilde literal", "~5 min", "~5 min"),
    ("nested", "**bold _and italic_ here**", "<b>bold <i>and italic</i> here</b>"),
    ("nested other way", "_it **bold** it_", "<i>it <b>bold</b> it</i>"),
    ("snake_case", "call my_func_name now", "call my_func_name now"),
    ("snake in italics", "_use snake_case here_", "<i>use snake_case here</i>"),
    ("intraword star emphasis", "un*frigging*believable", "un<i>frigging</i>believable"),
    ("lone asterisk", "5 * 3 = 15", "5 * 3 = 15"),
    ("asterisks as multiplication", "a * b * c", "a * b * c"),
    ("unbalanced bold", "**never closed", "**never closed"),
    ("unbalanced mix", "*a **b* c**", "<i>a **b</i> c**"),
    ("escaped stars", r"\*not italic\*", "*not italic*"),
    ("inline code", "`x < y`", "<code>x &lt; y</code>"),
    ("code keeps markers", "`**not bold** _x_`", "<code>**not bold** _x_</code>"),
    ("double backtick code", "``a ` b``", "<code>a ` b</code>"),
    ("unmatched backtick", "it`s fine", "it`s fine"),
    ("link", "[site](https://example.com)", '<a href="https://example.com">site</a>'),
    ("link with quotes and amp", '[q](https://x.com/?a="1"&b=2)',
     '<a href="https://x.com/?a=&quot;1&quot;&amp;b=2">q</a>'),
    ("link text styled", "[**bold** link](http://x.io)", '<a href="http://x.io"><b>bold</b> link</a>'),
    ("tg link", "[me](tg://user?id=1)", '<a href="tg://user?id=1">me</a>'),
    ("mailto link", "[mail](mailto:a@b.c)", '<a href="mailto:a@b.c">mail</a>'),
    ("javascript refused", "[x](javascript:alert(1))", "x (javascript:alert(1))"),
    ("relative refused", "[doc](report.pdf)", "doc (report.pdf)"),
    ("link with parens", "[w](https://en.wikipedia.org/wiki/A_(b))",
     '<a href="https://en.wikipedia.org/wiki/A_(b)">w</a>'),
    ("remote image becomes link", "![cat](https://x.io/cat.png)", '<a href="https://x.io/cat.png">cat</a>'),
    ("bare url untouched", "see https://x.io/_a_b_ now", "see https://x.io/_a_b_ now"),
    ("heading", "# Title", "<b>Title</b>"),
    ("heading level 3 with closing", "### Sub ###", "<b>Sub</b>"),
    ("heading with bold inside", "## A **b** c", "<b>A b c</b>"),
    ("not a heading", "#hashtag", "#hashtag"),
    ("quote", "> quoted *text*", "<blockquote>quoted <i>text</i></blockquote>"),
    ("quote run", "> one\n> two\nafter", "<blockquote>one\ntwo</blockquote>\nafter"),
    ("bullets", "- one\n* two\n+ three", "• one\n• two\n• three"),
    ("fence with language", "```py\nif a < b:\n    print('&')\n```",
     '<pre><code class="language-py">if a &lt; b:\n    print(\'&amp;\')</code></pre>'),
    ("fence without language", "```\n**raw**\n```", "<pre>**raw**</pre>"),
    ("tilde fence", "~~~js\nx => 1\n~~~", '<pre><code class="language-js">x =&gt; 1</code></pre>'),
    ("unclosed fence", "```\nopen <", "<pre>open &lt;</pre>"),
    ("hostile language", '```"><script>\nx\n```', '<pre><code class="language-script">x</code></pre>'),
    ("blank lines kept", "a\n\nb", "a\n\nb"),
]


@pytest.mark.parametrize("name, md, html", HTML, ids=[c[0] for c in HTML])
def test_telegram_html(name: str, md: str, html: str) -> None:
    out = markdown_to_telegram_html(md)
    assert out == html
    assert_well_formed(out)


FUZZ_PIECES = ["*", "**", "_", "__", "~~", "`", "``", "[", "]", "(", ")", "<", ">", "&", "\\",
               "a", " ", "\n", "# ", "> ", "```", "https://x.io/a_b", "](", "![", '"', "😀", "x_y"]


def test_never_unbalanced_on_random_markup() -> None:
    import random

    rng = random.Random(1234)
    for _ in range(1500):
        md = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(1, 40)))
        assert_well_formed(markdown_to_telegram_html(md))
        markdown_to_whatsapp(md)
        plain_text_fallback(md)


def test_plain_text_fallback() -> None:
    md = "# Title\n**bold** and [site](https://x.io) and `code`\n```py\nx = 1\n```\n> q"
    assert plain_text_fallback(md) == "Title\nbold and site (https://x.io) and code\nx = 1\n> q"


# --- WhatsApp -------------------------------------------------------------------------------

WHATSAPP = [
    ("bold", "**bold**", "*bold*"),
    ("bold underscores", "__bold__", "*bold*"),
    ("italic star", "*it*", "_it_"),
    ("italic underscore", "_it_", "_it_"),
    ("strike", "~~gone~~", "~gone~"),
    ("bold italic", "***x***", "*_x_*"),
    ("snake_case", "my_func_name", "my_func_name"),
    ("heading", "## Results **now**", "*Results now*"),
    ("link", "[site](https://x.io)", "site (https://x.io)"),
    ("link same as text", "[https://x.io](https://x.io)", "https://x.io"),
    ("inline code untouched", "`**a** _b_`", "```**a** _b_```"),
    ("fence untouched", "```py\n**a** _b_ [c](d)\n```", "```\n**a** _b_ [c](d)\n```"),
    ("tilde fence", "~~~\nx\n~~~", "```\nx\n```"),
    ("quote", "> **q**", "> *q*"),
    ("bullets", "* one\n- two", "- one\n- two"),
    ("html stays", "a < b & c", "a < b & c"),
]


@pytest.mark.parametrize("name, md, expected", WHATSAPP, ids=[c[0] for c in WHATSAPP])
def test_whatsapp(name: str, md: str, expected: str) -> None:
    assert markdown_to_whatsapp(md) == expected


# --- UTF-16 counting ------------------------------------------------------------------------


def test_utf16_len() -> None:
    assert utf16_len("abc") == 3
    assert utf16_len("é") == 1
    assert utf16_len("😀") == 2  # astral: a surrogate pair
    assert utf16_len("👩‍💻") == 5  # woman + ZWJ + laptop
    assert utf16_len("") == 0


def test_emoji_split_counts_utf16() -> None:
    md = "😀" * 3000  # 3000 characters, 6000 UTF-16 units, one word
    chunks = split_markdown_for_telegram(md, 4096)
    assert len(chunks) == 2
    assert all(utf16_len(markdown_to_telegram_html(c)) <= 4096 for c in chunks)
    assert "".join(chunks) == md


# --- chunking -------------------------------------------------------------------------------


def _long_reply() -> str:
    prose = ("Some **prose** with <angle> & ampersands, an emoji 😀 and `code`. " * 12).strip()
    code = "```python\n" + "\n".join(f"value_{i} = compute({i}) < limit  # step {i}" for i in range(60)) + "\n```"
    parts = [prose, prose, code, prose, "> a quote that *matters*", prose, code, prose]
    text = "\n\n".join(parts)
    while len(text) < 10_000:
        text += "\n\n" + prose
    return text


def _fences_balanced(chunk: str) -> bool:
    open_fence = None
    for line in chunk.split("\n"):
        m = re.match(r" {0,3}(`{3,}|~{3,})", line)
        if not m:
            continue
        if open_fence is None:
            open_fence = m.group(1)
        elif m.group(1)[0] == open_fence[0] and len(m.group(1)) >= len(open_fence):
            open_fence = None
    return open_fence is None


def test_short_text_is_one_chunk() -> None:
    assert split_markdown_for_telegram("hello *there*") == ["hello *there*"]
    assert split_markdown_for_telegram("") == []
    assert split_markdown_for_telegram("\n\n  \n") == []


def test_ten_thousand_chars_never_break_code() -> None:
    md = _long_reply()
    assert len(md) >= 10_000
    chunks = split_markdown_for_telegram(md)
    assert len(chunks) >= 3
    for chunk in chunks:
        html = markdown_to_telegram_html(chunk)
        assert utf16_len(html) <= 4096
        assert _fences_balanced(chunk)
        assert html.count("<pre") == html.count("</pre>")
        assert_well_formed(html)
    # every code line arrives whole, in order
    code_lines = [ln for ln in md.split("\n") if ln.startswith("value_")]
    sent_lines = [ln for c in chunks for ln in c.split("\n") if ln.startswith("value_")]
    assert sent_lines == code_lines


def test_paragraph_boundaries_preferred() -> None:
    para = "word " * 150  # 750 chars
    md = "\n\n".join(para.strip() for _ in range(10))
    chunks = split_markdown_for_telegram(md, 2000)
    assert all(c.startswith("word") and c.endswith("word") for c in chunks)
    assert all(utf16_len(markdown_to_telegram_html(c)) <= 2000 for c in chunks)
    assert "\n\n".join(chunks) == md


def test_long_line_cut_between_words() -> None:
    md = " ".join(f"w{i}" for i in range(3000))
    chunks = split_markdown_for_telegram(md, 1000)
    assert all(utf16_len(markdown_to_telegram_html(c)) <= 1000 for c in chunks)
    assert " ".join(chunks).split() == md.split()  # no word was cut in half


def test_single_long_code_block_closed_and_reopened() -> None:
    body = "\n".join(f"line {i:04d} <tag> & {'x' * 40}" for i in range(200))
    md = f"```py\n{body}\n```"
    assert len(md) >= 9000
    chunks = split_markdown_for_telegram(md)
    assert len(chunks) >= 3
    for chunk in chunks:
        assert chunk.startswith("```py\n") and chunk.endswith("\n```")
        html = markdown_to_telegram_html(chunk)
        assert utf16_len(html) <= 4096
        assert html.startswith('<pre><code class="language-py">') and html.endswith("</code></pre>")
    rejoined = "\n".join(c[len("```py\n") : -len("\n```")] for c in chunks)
    assert rejoined == body


def test_one_huge_code_line_is_cut_to_fit() -> None:
    md = "```\n" + "y" * 9000 + "\n```"
    chunks = split_markdown_for_telegram(md)
    assert [utf16_len(markdown_to_telegram_html(c)) <= 4096 for c in chunks] == [True] * len(chunks)
    assert "".join(c[4:-4] for c in chunks) == "y" * 9000


def test_escaping_growth_is_counted() -> None:
    md = "<&>" * 3000  # 9000 chars rendering to 4+5+4 units each
    chunks = split_markdown_for_telegram(md)
    assert all(utf16_len(markdown_to_telegram_html(c)) <= 4096 for c in chunks)
    assert "".join(chunks) == md


def test_unclosed_fence_is_closed_in_chunks() -> None:
    md = "intro\n\n```sh\n" + "\n".join(f"echo {i}" for i in range(1500))
    chunks = split_markdown_for_telegram(md, 2000)
    assert all(_fences_balanced(c) for c in chunks)


def test_quote_continuation_keeps_marker() -> None:
    md = "> " + " ".join(["quoted"] * 600)
    chunks = split_markdown_for_telegram(md, 1000)
    assert len(chunks) > 1
    for chunk in chunks:
        html = markdown_to_telegram_html(chunk)
        assert html.startswith("<blockquote>") and utf16_len(html) <= 1000


def test_whatsapp_split_counts_characters() -> None:
    md = _long_reply()
    text = markdown_to_whatsapp(md)
    chunks = split_for_whatsapp(text)
    assert len(chunks) >= 6
    for chunk in chunks:
        assert len(chunk) <= 1600
        assert _fences_balanced(chunk)
    assert split_for_whatsapp("😀" * 1600) == ["😀" * 1600]  # characters, not UTF-16 units


def test_whatsapp_long_code_block_reopened() -> None:
    text = "```\n" + "\n".join(f"row {i}" for i in range(600)) + "\n```"
    chunks = split_for_whatsapp(text, 500)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk) <= 500
        assert chunk.startswith("```\n") and chunk.endswith("\n```")


@pytest.mark.parametrize("limit", [20, 57, 100, 333])
def test_small_limits_always_hold(limit: int) -> None:
    md = _long_reply()[:3000]
    for chunk in split_markdown_for_telegram(md, limit):
        assert utf16_len(markdown_to_telegram_html(chunk)) <= limit
    for chunk in split_for_whatsapp(markdown_to_whatsapp(md), limit):
        assert len(chunk) <= limit
