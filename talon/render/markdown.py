"""The small markdown dialect agents write, parsed once for every output format.

Blocks: fenced code (``` or ~~~), ``>`` quote runs, and single lines (headings, bullets, text).
Inline: code spans, links and images, bare URLs, backslash escapes, and emphasis delimiters paired
with a stack, so every opened style is closed in the right order and no emitter can produce
unbalanced markup. Emphasis never crosses a line break: rendering is line-local, which keeps the
rendered length of a chunk equal to the sum of its lines (the chunker relies on it) and keeps a
stray ``*`` from restyling the rest of a reply.

Everything is linear in the input: backtick runs are matched through a "next run of this length"
table, brackets with a stack, emphasis with per-kind opener stacks.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# --- blocks ---------------------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)")
_FENCE_CLOSE = re.compile(r" {0,3}(`+|~+)[ \t]*")
_QUOTE = re.compile(r" {0,3}> ?")
_HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+|$)")
_BULLET = re.compile(r"([ \t]*)[-*+][ \t]+(?=\S)")


@dataclass
class CodeBlock:
    """A fenced block. ``opening``/``closing`` are the source fence lines (closing None when the
    fence was never closed)."""

    opening: str
    body: list[str]
    closing: str | None
    fence: str
    info: str

    @property
    def language(self) -> str:
        word = self.info.split()[0] if self.info.split() else ""
        return re.sub(r"[^A-Za-z0-9_+#.\-]", "", word)[:32]

    def source(self) -> str:
        lines = [self.opening, *self.body]
        if self.closing is not None:
            lines.append(self.closing)
        return "\n".join(lines)


@dataclass
class QuoteBlock:
    """Consecutive ``>`` lines, markers stripped."""

    lines: list[str]


@dataclass
class Line:
    text: str


Block = CodeBlock | QuoteBlock | Line


def fence_of(line: str) -> tuple[str, str] | None:
    """(fence, info) when ``line`` opens a fenced code block."""
    m = _FENCE_OPEN.fullmatch(line)
    if not m:
        return None
    fence, info = m.group(2), m.group(3)
    if fence[0] == "`" and "`" in info:
        return None  # CommonMark: a backtick fence's info string has no backticks
    return fence, info.strip()


def closes_fence(line: str, fence: str) -> bool:
    m = _FENCE_CLOSE.fullmatch(line)
    return m is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)


def iter_blocks(md: str) -> Iterator[Block]:
    """Blocks in order; joining their renderings with "\\n" mirrors the source lines."""
    lines = md.replace("\r\n", "\n").split("\n")
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        opened = fence_of(line)
        if opened:
            fence, info = opened
            j = i + 1
            while j < n and not closes_fence(lines[j], fence):
                j += 1
            closing = lines[j] if j < n else None
            yield CodeBlock(line, lines[i + 1 : j], closing, fence, info)
            i = j + 1
            continue
        if _QUOTE.match(line):
            quoted: list[str] = []
            while i < n and (m := _QUOTE.match(lines[i])):
                quoted.append(lines[i][m.end() :])
                i += 1
            yield QuoteBlock(quoted)
            continue
        yield Line(line)
        i += 1


def quoted(lines: list[str]) -> str:
    """Rendered lines as a plain-text quote, each behind "> "."""
    return "\n".join("> " + text for text in lines)


def render_blocks(md: str, *, code: Callable[[CodeBlock], str], line: Callable[[str], str],
                  quote: Callable[[list[str]], str] = quoted) -> str:
    """Render ``md`` block by block: ``code`` for a fenced block, ``line`` for every other line
    (quoted lines too, then wrapped by ``quote``). Joined by newlines, the renderings mirror the
    source lines, which keeps the rendered length of a chunk the sum of its lines'."""
    out: list[str] = []
    for block in iter_blocks(md):
        if isinstance(block, CodeBlock):
            out.append(code(block))
        elif isinstance(block, QuoteBlock):
            out.append(quote([line(text) for text in block.lines]))
        else:
            out.append(line(block.text))
    return "\n".join(out)


def heading_text(line: str) -> str | None:
    """The text of an ATX heading line (closing #s removed), or None."""
    m = _HEADING.match(line)
    if not m:
        return None
    text = line[m.end() :].rstrip()
    stripped = text.rstrip("#")
    if stripped != text and (not stripped or stripped[-1] in " \t"):
        text = stripped.rstrip()
    return text


def bullet_split(line: str) -> tuple[str, str] | None:
    """(indentation, item text) for a ``-``/``*``/``+`` bullet line."""
    m = _BULLET.match(line)
    if not m:
        return None
    return m.group(1), line[m.end() :]


# --- inline tokens --------------------------------------------------------------------------


@dataclass
class Text:
    text: str


@dataclass
class Code:
    text: str


@dataclass
class Url:
    """A bare URL: kept verbatim, never restyled by emphasis inside it."""

    text: str


@dataclass
class Link:
    url: str
    children: list[Token]
    image: bool = False

    def plain(self) -> str:
        return "".join(plain_of(t) for t in self.children)

    def with_url(self, shown: str | None = None) -> str:
        """The link for a medium without links: "text (url)", or the URL alone when the text is
        empty or is the URL. ``shown`` is the text as rendered (default: its plain text)."""
        plain = self.plain()
        if not plain or plain == self.url:
            return self.url
        return f"{plain if shown is None else shown} ({self.url})"


@dataclass
class Delim:
    char: str
    count: int
    can_open: bool
    can_close: bool
    role: str = ""  # "open", "close" or "" (literal)
    tags: tuple[str, ...] = field(default=())


Token = Text | Code | Url | Link | Delim

_PUNCT = r"!-/:-@\[-`{-~"
_ESCAPE = re.compile(rf"\\([{_PUNCT}])")
_TICKS = re.compile(r"`+")
_BRACKETS = re.compile(rf"\\[{_PUNCT}]|[\[\]]")
# After "](": <dest> or a destination with one level of balanced parentheses, optional title.
# Each alternative starts with a different character, so the regex cannot backtrack wildly.
_LINK_TAIL = re.compile(
    r"""\(\s*(?:<([^<>\n]*)>|((?:[^\s()\\]|\\.|\((?:[^\s()\\]|\\.)*\))*))"""
    r"""(?:\s+(?:"[^"\n]*"|'[^'\n]*'))?\s*\)"""
)
_BARE_URL = re.compile(r"(?:https?|tg)://[^\s<>`]+", re.IGNORECASE)
_INLINE = re.compile(rf"\\[{_PUNCT}]|\*+|_+|~+")
_URL_TRAIL = ".,;:!?'\"*_~"


def unescape(text: str) -> str:
    return _ESCAPE.sub(r"\1", text)


def code_spans(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """The code spans in ``text[start:end]``, as (start, end) ranges including the backticks.

    A run of N backticks opens a span closed by the next run of exactly N; an unmatched run is
    literal, and a backslash before the first backtick takes that one backtick out of the run.
    "Next run of length N" is precomputed right to left, so matching is linear.
    """
    runs = [(m.start(), m.end()) for m in _TICKS.finditer(text, start, len(text) if end is None else end)]
    count = len(runs)
    spans: list[tuple[int, int]] = []
    if count < 2:
        return spans
    next_same = [-1] * count
    next_shorter = [-1] * count  # for an opener whose first backtick is backslash-escaped
    last: dict[int, int] = {}
    for i in range(count - 1, -1, -1):
        length = runs[i][1] - runs[i][0]
        next_same[i] = last.get(length, -1)
        next_shorter[i] = last.get(length - 1, -1)
        last[length] = i
    floor = start  # backslashes inside an earlier span are literal, so never count past one
    i = 0
    while i < count:
        s, e = runs[i]
        b = s
        while b > floor and text[b - 1] == "\\":
            b -= 1
        j = next_same[i]
        if (s - b) % 2:
            s += 1
            j = next_shorter[i] if e > s else -1
        if j < 0:
            i += 1
            continue
        spans.append((s, runs[j][1]))
        floor = runs[j][1]
        i = j + 1
    return spans


def _code_text(line: str, start: int, end: int) -> str:
    raw = line[start:end]
    ticks = len(raw) - len(raw.lstrip("`"))
    inner = raw[ticks : len(raw) - ticks]
    if len(inner) >= 2 and inner[0] == " " and inner[-1] == " " and inner.strip(" "):
        inner = inner[1:-1]  # CommonMark: one padding space each side is not content
    return inner


def _links(line: str, start: int, end: int, spans: list[tuple[int, int]]) -> list[tuple[int, int, int, Link]]:
    """Outermost links/images: (start, end, text_end, link) with text from start+1 (+2 for images)."""
    pairs: list[tuple[int, int]] = []
    stack: list[int] = []
    si = bisect_left(spans, (start, -1))
    for m in _BRACKETS.finditer(line, start, end):
        p = m.start()
        while si < len(spans) and spans[si][1] <= p:
            si += 1
        if si < len(spans) and spans[si][0] <= p:
            continue
        ch = line[p]
        if ch == "[":
            stack.append(p)
        elif ch == "]" and stack:
            pairs.append((stack.pop(), p))
    pairs.sort()
    found: list[tuple[int, int, int, Link]] = []
    taken_until = start
    for o, c in pairs:
        image = o > start and line[o - 1] == "!" and not _escaped(line, o - 1, start)
        first = o - 1 if image else o
        if first < taken_until:
            continue
        tail = _LINK_TAIL.match(line, c + 1, end)
        if not tail:
            continue
        dest = tail.group(1) if tail.group(1) is not None else tail.group(2) or ""
        found.append((first, tail.end(), c, Link(url=unescape(dest), children=[], image=image)))
        taken_until = tail.end()
    return found


def _escaped(line: str, p: int, floor: int) -> bool:
    b = p
    while b > floor and line[b - 1] == "\\":
        b -= 1
    return (p - b) % 2 == 1


def _is_space(ch: str) -> bool:
    return ch.isspace()


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


def _delim(line: str, s: int, e: int) -> Delim:
    char = line[s]
    before = line[s - 1] if s > 0 else " "
    after = line[e] if e < len(line) else " "
    left = not _is_space(after) and (
        not _is_punct(after) or _is_space(before) or _is_punct(before)
    )
    right = not _is_space(before) and (
        not _is_punct(before) or _is_space(after) or _is_punct(after)
    )
    if char == "_":
        # Intraword underscores (snake_case) neither open nor close.
        can_open = left and (not right or _is_punct(before))
        can_close = right and (not left or _is_punct(after))
    else:
        can_open, can_close = left, right
    return Delim(char=char, count=e - s, can_open=can_open, can_close=can_close)


def _plain_tokens(line: str, start: int, end: int, out: list[Token]) -> None:
    pos = start
    for m in _INLINE.finditer(line, start, end):
        if m.start() > pos:
            out.append(Text(line[pos : m.start()]))
        piece = m.group()
        if piece[0] == "\\":
            out.append(Text(piece[1]))
        else:
            out.append(_delim(line, m.start(), m.end()))
        pos = m.end()
    if pos < end:
        out.append(Text(line[pos:end]))


def _text_tokens(line: str, start: int, end: int, out: list[Token]) -> None:
    """Plain stretch: bare URLs verbatim, the rest split into text and delimiters."""
    pos = start
    for m in _BARE_URL.finditer(line, start, end):
        url_end = m.end()
        while url_end > m.start() and line[url_end - 1] in _URL_TRAIL:
            url_end -= 1
        # a closing parenthesis belongs to the URL only if the URL opened one
        if line[url_end - 1] == ")" and line.count("(", m.start(), url_end) < line.count(
            ")", m.start(), url_end
        ):
            url_end -= 1
        _plain_tokens(line, pos, m.start(), out)
        out.append(Url(line[m.start() : url_end]))
        pos = url_end
    _plain_tokens(line, pos, end, out)


def _tokens(line: str, start: int, end: int, spans: list[tuple[int, int]], links: bool) -> list[Token]:
    out: list[Token] = []
    protected: list[tuple[int, int, Token | tuple[int, int, int, Link]]] = []
    si = bisect_left(spans, (start, -1))
    while si < len(spans) and spans[si][1] <= end:
        s, e = spans[si]
        protected.append((s, e, Code(_code_text(line, s, e))))
        si += 1
    if links:
        for first, link_end, text_end, link in _links(line, start, end, spans):
            protected.append((first, link_end, (first, link_end, text_end, link)))
        protected.sort(key=lambda item: item[0])
    pos = start
    for s, e, item in protected:
        if s < pos:
            continue  # a code span inside a link's text: handled by the recursion
        _text_tokens(line, pos, s, out)
        if isinstance(item, tuple):
            first, _, text_end, link = item
            text_start = first + (2 if link.image else 1)
            link.children = _tokens(line, text_start, text_end, spans, links=False)
            _pair(link.children)
            out.append(link)
        else:
            out.append(item)
        pos = e
    _text_tokens(line, pos, end, out)
    return out


_TAGS = {("*", 1): ("i",), ("_", 1): ("i",), ("*", 2): ("b",), ("_", 2): ("b",),
         ("*", 3): ("b", "i"), ("_", 3): ("b", "i"), ("~", 2): ("s",)}


def _pair(tokens: list[Token]) -> None:
    """Pair emphasis delimiters in place; unpaired ones stay literal.

    An opener pairs with the nearest later closer of the same character and run length; openers
    left between them become literal, so pairs nest properly. Each kind keeps its own stack of
    opener positions so finding the partner is O(1) and the whole pass is linear.
    """
    stack: list[int] = []  # token indices of live openers
    by_kind: dict[tuple[str, int], list[int]] = {}  # kind -> positions in `stack`
    for i, tok in enumerate(tokens):
        if not isinstance(tok, Delim):
            continue
        kind = (tok.char, tok.count)
        if kind not in _TAGS:
            continue
        if tok.can_close:
            positions = by_kind.get(kind)
            if positions:
                at = positions[-1]
                opener = tokens[stack[at]]
                assert isinstance(opener, Delim)
                # everything opened after the partner can no longer close: literal
                for dropped in stack[at + 1 :]:
                    dropped_tok = tokens[dropped]
                    assert isinstance(dropped_tok, Delim)
                    by_kind[(dropped_tok.char, dropped_tok.count)].pop()
                del stack[at:]
                positions.pop()
                opener.role, tok.role = "open", "close"
                opener.tags = tok.tags = _TAGS[kind]
                continue
        if tok.can_open:
            by_kind.setdefault(kind, []).append(len(stack))
            stack.append(i)


def parse_inline(line: str) -> list[Token]:
    """Tokens of one line with emphasis paired."""
    spans = code_spans(line) if "`" in line else []
    tokens = _tokens(line, 0, len(line), spans, links=True)
    _pair(tokens)
    return tokens


def plain_text(line: str) -> str:
    """A line as plain text: the text of its code spans, links and URLs, emphasis markers gone."""
    return "".join(plain_of(t) for t in parse_inline(line))


def plain_of(token: Token) -> str:
    if isinstance(token, (Text, Code, Url)):
        return token.text
    if isinstance(token, Link):
        return token.plain()
    return "" if token.role else token.char * token.count
