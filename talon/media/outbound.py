"""Outbound extractor: lift local ``![alt](path)`` media references out of an agent's reply.

The agent answers in markdown. When it writes ``![chart](plots/chart.png)`` the person should get the
file, not the markup. This module finds those references and removes them from the text; the bridge
then resolves each one inside the media root and sends it.

Rules, in the order they are applied:

1. Code is masked first. Fenced blocks (``` or ~~~, three or more, indented up to three spaces; an
   unclosed fence runs to the end), indented code blocks and inline code spans of any backtick run
   length are never searched, so an example in code is never sent as a file. Fences, headings and
   indentation follow the grammar of ``talon.render.markdown`` (the renderers' own), read here by
   one regex; code spans are ``talon.render.markdown.code_spans``.
2. Outside code, ``![alt](dest)`` is parsed the CommonMark way: balanced brackets in the alt text,
   ``<...>`` destinations (may hold spaces), balanced parentheses in plain destinations, an optional
   "title"/'title'/(title), and backslash escapes (``\\![x](y)`` is not an image).
3. Only local paths are lifted. Anything with a URL scheme (http, https, data, file, mailto...) or a
   network path (``//host/x``) stays in the text exactly as written.

Hostile input is expected (a model can be made to emit anything, and a streamed reply is read again
at every update), so every pass is linear in the length of the text and does its per-line,
per-bracket and per-reference work in C where it can. When every run of text is simple once
masked, the whole reply is read at once: one copy of it in which code blocks, code spans of single
backticks and escapes are replaced by same-length marks is split by one regex into its images and
the text between them, whatever the number of runs, paragraphs or escapes (the marks undone by one
``translate``); where the copy stops being simple, it is read so up to the start of that block
(its run of text, or past the last blank line before it) and the run-by-run path below takes the
runs of text from there (all of them when the copy is refused outright). There
the block structure is one regex of
possessive quantifiers (no backtracking) that takes runs of fences, blank lines and paragraphs
whole; a run of text whose images are all plain ``![alt](path)`` (no nesting, escapes or code) is
lifted by one ``split`` (the text between the images, their alt texts and paths, as strings);
elsewhere code spans and escapes are masked (same length) so that one bracket matcher serves every
segment: brackets that never nest, or nest at most two deep, or images whose alt text holds no
bracket whatever the links around them, are paired by one regex, and there
each image and its everyday tail (``(path)``, ``(<a b.png> "title")``) are read by one regex step
(an image without a tail the full parser could read is not even a match); other brackets are
paired a run at a time, or per ``]`` (the ``[`` it closes found by a backward search in C), or,
when ``[`` or ``]`` floods, per bracket of the rarer kind, the rest skipped in C (and where the
text defines no reference, only images whose ``]`` is followed by ``(`` are kept); backtick
runs go through a "next run of this length" table; a destination's parentheses are matched
for its whole stretch at once, a step per run of '(' or ')', and remembered (those that never
close as intervals), and a chain of ``![a](`` running into them is skipped in C. The tidying is
one pass over the pieces of text between the removals (a short piece's step looked up per
distinct piece and state), and the references are built by C-level maps over their slots with
the garbage collector held off (a full collection walking the big lists every quarter of growth
made a reply with a million references O(n log n)). Figures: benchmarks/bench_extract.py and docs/media.md.
"""

from __future__ import annotations

import gc
import re
from bisect import bisect_left, bisect_right, insort
from collections import deque
from dataclasses import dataclass
from itertools import accumulate, groupby, repeat
from operator import itemgetter, sub
from typing import Any, TypeVar
from collections.abc import Sequence

from talon.render.markdown import code_spans

__all__ = ["MarkdownMediaRef", "extract_markdown_media"]


@dataclass(frozen=True, slots=True)
class MarkdownMediaRef:
    """One lifted image reference: its alt text and the destination as written (unescaped).

    Slotted: a reply can lift tens of thousands, and each without a ``__dict__`` is half the
    objects for the garbage collector to walk.
    """

    alt: str
    path: str


Range = tuple[int, int]

# --- block structure ------------------------------------------------------------------------
#
# One regex reads the block structure, line by line in C, without a Python step per line. At a
# line start it takes either a run of code (fenced blocks, indented code lines, blank lines) or a
# run of text (blank lines, ATX headings, paragraphs); a paragraph runs on until a blank line, a
# fence or a heading, and its indented lines are continuation lines, not code. Inside, every
# quantifier is possessive or a single character class, and a fence body stops at the first
# closing line; the outer repeats are greedy loops of atomic groups (CPython 3.11's possessive
# repeat of a group with a capture is broken; an atomic group also keeps the engine from saving
# a backtracking point per block, which made a 4 MB flood of fences cost twice as much per MB as a
# 1 MB one) with nothing after them that could fail. So nothing backtracks beyond one line's
# leading blanks: the scan is linear, and a flood of fences, blank lines or carriage returns
# costs a few C steps per line.

_EOL = r"(?:\n|\Z)"
_BLANKS = r"[ \t\r\n]*+\Z|[ \t\r\n]*\n"  # blank lines (a \r is only ever followed by \n here)
_FENCE_START = r" {0,3}+(?:`{3,}+(?![^`\n]*+`)|~{3,}+)"
_HEADING_START = r" {0,3}+#{1,6}+(?=[ \t]|\r?" + _EOL + ")"
_INDENT_START = r"(?: {0,3}+\t| {4})"
_BREAK = rf"(?:[ \t]*+(?:\r?\n|\Z)|{_FENCE_START}|{_HEADING_START})"  # ends a paragraph


def _fence(group: str, char: str, after: str = "") -> str:
    """A fenced block: the opening line (three or more ``char``, then ``after``), then lines up to
    a closing fence (or the end). The group holds the opening run past its first three: for the
    usual fence of three, an empty string, which a split returns without making one."""
    close = rf" {{0,3}}+{char * 3}(?P={group}){char}*+[ \t]*+\r?{_EOL}"
    return (rf" {{0,3}}+{char * 3}(?P<{group}>{char}*+){after}[^\n]*+{_EOL}"
            rf"(?:(?!{close})[^\n]*+\n)*+(?:{close}|[^\n]*+\Z)")


_FENCED = _fence("b", "`", r"(?![^`\n]*+`)") + "|" + _fence("t", "~")
_PARAGRAPH = rf"(?!{_FENCE_START}|{_INDENT_START})[^\n]*+(?:\n(?!{_BREAK})[^\n]*+)*+{_EOL}"
_BLOCKS = re.compile(
    rf"(?P<code>(?:(?>{_BLANKS}|{_FENCED}|{_INDENT_START}[^\n]*+{_EOL}))+)"
    rf"|(?:{_BLANKS}|{_HEADING_START}[^\n]*+{_EOL}|{_PARAGRAPH})++"
)
# Inside a run of text: its segments (a heading line, or a paragraph) and the blank lines between.
# A line without "![", one without "](", one without ")": a segment made only of one kind of them
# can lift nothing (every lifted image has all three) and is skipped inside the regex.
_LACKING = (r"[^!\n]*+(?:!++(?!\[)[^!\n]*+)*+", r"[^\]\n]*+(?:\]++(?!\()[^\]\n]*+)*+", r"[^)\n]*+")


_DEAD_HEAD = rf"{_HEADING_START}(?:{'|'.join(_LACKING)}){_EOL}"
_DEAD_PARA = rf"(?!{_FENCE_START}|{_INDENT_START})(?:" + "|".join(
    rf"{line}(?:\n(?!{_BREAK}){line})*+(?:\n(?={_BREAK})|\Z)" for line in _LACKING) + ")"
_SEGMENTS = re.compile(
    rf"(?P<dead>(?:{_BLANKS}|{_DEAD_HEAD}|{_DEAD_PARA})++)"
    rf"|{_HEADING_START}[^\n]*+{_EOL}|{_PARAGRAPH}"
)


def _text_runs(text: str) -> list[Range]:
    """Runs of lines outside code in which an image reference may be lifted.

    A run holds paragraphs and headings (and the blank lines between them); a run without a
    ``![`` or without a ``](`` can lift nothing and is left out.
    """
    runs: list[Range] = []
    find = text.find
    for m in _BLOCKS.finditer(text):
        start, end = m.span()
        if start == end:
            break
        if m.lastgroup is None and find("![", start, end) >= 0 and find("](", start, end) >= 0:
            runs.append((start, end))
    return runs


def _inline_segments(text: str, start: int, end: int) -> list[Range]:
    """The segments of a run of text: each paragraph (its lines together) and each heading line.

    Code spans and image references never cross a segment's ends.
    """
    segments: list[Range] = []
    for m in _SEGMENTS.finditer(text, start, end):
        s, e = m.span()
        if s == e:
            break
        if m.lastgroup is None:
            segments.append((s, e))
    return segments  # (those that cannot lift anything are left out)


# --- image references -----------------------------------------------------------------------

_PUNCT = r"!-/:-@\[-`{-~"
_BRACKETS_ONLY = re.compile(r"[\[\]]")
_FLAT_BRACKETS = re.compile(r"[^\[\]]*+(?:\[[^\[\]]*+\][^\[\]]*+)*+")
_FLAT_IMAGE = re.compile(r"!\[[^\[\]]*+\]")
_FLAT_IMAGE_TAILED = re.compile(r"!\[[^\[\]]*+\](?=\()")
_NESTED_IMAGE = re.compile(r"!\[[^\[\]]*+\[")  # an image whose alt text holds a bracket
_WS_ONE_NEWLINE = re.compile(r"[ \t]*(?:\r?\n[ \t]*)?")
_DEST_PLAIN = re.compile(r"[^\x00-\x20()\\\x7f]+")
# What a plain destination's parenthesis matching stops at: an escape (two characters, the
# second whatever it is), a parenthesis, or what ends a destination.
_DEST_SPECIAL = re.compile(r"\\[\s\S]|[()\x00-\x20\x7f]")
# A destination's stretch up to what ends it (whitespace or a control character; an escaped one
# does not), and in it the runs of '(' or of ')' (group 1 or 2) with nothing but plain characters
# between them, and escapes.
_DEST_STRETCH = re.compile(r"(?:[^\x00-\x20\x7f\\]++|\\[\s\S])*+")
_PAREN_RUN = re.compile(
    r"(\((?:[^()\\\x00-\x20\x7f]*+\()*+)|(\)(?:[^()\\\x00-\x20\x7f]*+\))*+)|\\[\s\S]"
)
# A stretch this short is matched one parenthesis at a time (the runs' set-up costs more there).
_SHORT_STRETCH = 64
_OPEN_PAREN = re.compile(r"\(")
# A chain of destinations, each running into the next '(' through an image: ``(text![alt]``
# followed by '(' (no bracket, blank, escape or '<' in the text, no bracket or blank in the alt).
_DEAD_CHAIN = re.compile(r"(?:\((?:[^\[\]()\\\x00-\x20\x7f<!]++|!(?!\[))*+!\[[^\[\]()\\\x00-\x20\x7f]*+\](?=\())*+")
_CLOSE_PAREN = re.compile(r"\)")
_START = re.Match.start
_DEST_ANGLE = re.compile(r"[^<>\r\n\\]+")
_TITLE_BODY = {'"': re.compile(r'[^"\\]+'), "'": re.compile(r"[^'\\]+"), "(": re.compile(r"[^()\\]+")}
_SPACES = re.compile(r"\s+")
_SPACE = re.compile(r"\s")
_BARE_CR = re.compile(r"\r(?!\n)")
_PLAIN_ALT = re.compile(r"(?:\S+(?: \S+)*)?")  # already what whitespace folding would give
# A whole tail without backslashes and without parentheses in its destination or title, as the
# full parser would read it: ``(path)``, ``( <a b.png> "title" )``...; the destination is group 1
# (``<...>``) or 2 (plain).
_WS = r"[ \t]*+(?:\r?\n[ \t]*+)?+"
_WS1 = r"(?:[ \t]++(?:\r?\n[ \t]*+)?+|\r?\n[ \t]*+)"
_TAIL_QUICK_BODY = (
    rf"\({_WS}(?:<([^<>\r\n\\]*+)>|(?!<)([^\x00-\x20()\\\x7f]*+))"
    rf"(?:{_WS1}(?:\"[^\"\\]*+\"|'[^'\\]*+'|\([^()\\]*+\)))?{_WS}\)"
)
_TAIL_TO_PAREN = r"\([ \t]*(?:\r?\n[ \t]*)?[^\x00-\x20()\\\x7f<][^\x00-\x20()\\\x7f]*\("
# In a segment whose brackets never nest (and without code or backslashes): an image's alt text
# (group 1), then its whole quick tail (destination in group 2 or 3), or, not consumed, a tail
# whose plain destination runs into a '(' (group 4 ends at that '('), or neither.
# Only images with a tail that may be read: in such a segment (no backslash, no code) a tail the
# quick regex cannot read whole is read by the full parser only if its plain destination runs
# into a '(' (group 4, which may be its first character); any other candidate can lift nothing
# and is skipped in C, without a Python step.
_TAIL_TO_ANY_PAREN = r"\([ \t]*(?:\r?\n[ \t]*)?(?!<)[^\x00-\x20()\\\x7f]*\("
_FLAT_CANDIDATE = re.compile(rf"!\[([^\[\]]*+)\](?:{_TAIL_QUICK_BODY}|(?=({_TAIL_TO_ANY_PAREN})))")
# Brackets nested at most two deep (an image's alt text may hold plain ``[...]``: links, or images
# with brackets-free alt text), and the candidate images there.
_ALT_ONE_DEEP = r"[^\[\]]*+(?:\[[^\[\]]*+\][^\[\]]*+)*+"
_SHALLOW_BRACKETS = re.compile(rf"[^\[\]]*+(?:\[{_ALT_ONE_DEEP}\][^\[\]]*+)*+")
_SHALLOW_CANDIDATE = re.compile(rf"!\[({_ALT_ONE_DEEP})\](?:{_TAIL_QUICK_BODY}|(?=({_TAIL_TO_ANY_PAREN})))")
# With reference definitions in the text: every candidate, tail or not (an image by reference
# makes the images in its alt text alt text).
_SHALLOW_CANDIDATE_ANY = re.compile(
    rf"!\[({_ALT_ONE_DEEP})\](?:{_TAIL_QUICK_BODY}|(?=({_TAIL_TO_ANY_PAREN})))?"
)
# Or (group 3) a plain destination that runs into a '(' (at the match's end).
_TAIL_QUICK = re.compile(
    rf"\({_WS}(?:<([^<>\r\n\\]*+)>|(?!<)([^\x00-\x20()\\\x7f]*+))"
    rf"(?:{_WS1}(?:\"[^\"\\]*+\"|'[^'\\]*+'|\([^()\\]*+\)))?{_WS}\)"
    r"|(\([ \t]*(?:\r?\n[ \t]*)?[^\x00-\x20()\\\x7f<][^\x00-\x20()\\\x7f]*\()"
)


_ESCAPED = re.compile(rf"\\([{_PUNCT}])")


def _unescape(text: str) -> str:
    """``talon.render.markdown.unescape`` in one C call: splitting at escapes keeps the escaped
    character (the group) and drops its backslash, and joining puts the pieces back."""
    return "".join(_ESCAPED.split(text))


# Anything with a URL scheme or a network path: those stay in the text.
_REMOTE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+:|//")


class _Scanner:
    """Parses the ``(dest "title")`` tail after an image's closing bracket.

    Parenthesis matches are memoised across calls: a reference whose destination never closes
    must not make every later reference rescan the same stretch of text.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.paren_match: dict[int, int] = {}
        # '(' known never to close, as intervals (every '(' in [start, end) is open for good),
        # sorted; and where each stretch read at once started (see ``_close_paren``).
        self._dead_starts: list[int] = []
        self._dead_ends: list[int] = []
        self._done_starts: list[int] = []
        # The first ')' at or after ``_close_from`` (-1: none): every tail needs one, and calls
        # come in increasing order, so one forward pointer answers them all in linear time.
        self._close_from = 0
        self._next_close = -1 if ")" not in text else text.find(")")

    def tail(self, p: int, limit: int) -> tuple[str, int] | None:
        """Parse ``(...)`` starting at ``p``; return (raw destination, end) or None."""
        text = self.text
        if p >= limit or text[p] != "(":
            return None
        quick = _TAIL_QUICK.match(text, p, limit)
        if quick is not None and quick.lastindex != 3:
            # the everyday ``(path)``, ``(<a b.png> "t")``, in one step
            return quick.group(quick.lastindex or 0), quick.end()
        return self.slow_tail(p, limit, quick)

    def slow_tail(self, p: int, limit: int, quick: re.Match[str] | None) -> tuple[str, int] | None:
        """``tail`` at a '(' that ``_TAIL_QUICK`` (its match: ``quick``) could not read whole."""
        text = self.text
        if p >= self._close_from:  # (a nested image's tail comes after its outer one's: no pointer)
            if 0 <= self._next_close < p:
                self._next_close = text.find(")", p)
            self._close_from = p
            if self._next_close < 0 or self._next_close >= limit:
                return None  # no ')' left in reach: no destination can close
        if quick is not None and (self.known(quick.end() - 1) or 0) < 0:
            return None  # the destination runs into a '(' already known never to close
        q = self._skip_ws(p + 1, limit)
        if q >= limit:
            return None
        if text[q] == "<":
            close = self._angle_end(q + 1, limit)
            if close < 0:
                return None
            dest, after = text[q + 1 : close], close + 1
        else:
            after = self._plain_end(q, limit)
            if after < 0:
                return None
            dest = text[q:after]
        z = self._skip_ws(after, limit)
        if z < limit and text[z] == ")":
            return dest, z + 1
        if z == after or z >= limit or text[z] not in _TITLE_BODY:
            return None  # a title must be separated from the destination by whitespace
        t_end = self._title_end(z, limit)
        if t_end < 0:
            return None
        z = self._skip_ws(t_end, limit)
        if z < limit and text[z] == ")":
            return dest, z + 1
        return None

    def _skip_ws(self, p: int, limit: int) -> int:
        m = _WS_ONE_NEWLINE.match(self.text, p, limit)
        return m.end() if m else p

    def _angle_end(self, p: int, limit: int) -> int:
        text = self.text
        while p < limit:
            m = _DEST_ANGLE.match(text, p, limit)
            if m:
                p = m.end()
                continue
            ch = text[p]
            if ch == ">":
                return p
            if ch == "\\":
                p += 2
                continue
            return -1  # '<' or a line break: not a valid <destination>
        return -1

    def _plain_end(self, p: int, limit: int) -> int:
        """End of a plain destination starting at ``p`` (its unmatched ')' or whitespace)."""
        text = self.text
        while p < limit:
            m = _DEST_PLAIN.match(text, p, limit)
            if m:
                p = m.end()
                continue
            ch = text[p]
            if ch == "\\":
                p += 2
            elif ch == "(":
                close = self._close_paren(p, limit)
                if close < 0:
                    return -1  # an unbalanced '(' can never be closed inside a destination
                p = close + 1
            else:
                return p  # ')' that closes the reference, whitespace or a control character
        return min(p, limit)

    def known(self, q: int) -> int | None:
        """The memoised match of the '(' at ``q`` (-1: it never closes), or None if not known."""
        found = self.paren_match.get(q)
        if found is not None:
            return found
        i = bisect_right(self._dead_starts, q) - 1
        if i >= 0 and q < self._dead_ends[i]:
            return -1
        return None

    def _close_paren(self, p: int, limit: int) -> int:
        """Index of the ')' balancing the '(' at ``p`` within one destination, or -1.

        A destination ends at whitespace or ``limit`` (a '(' open there never closes), and a '('
        closes at the first ')' after it where the parentheses between balance: a function of
        what follows it only, so every '(' of the stretch is matched at once (``_match_runs``)
        and remembered; a short stretch, or one that runs into one matched before, is read one
        parenthesis at a time. (Every answer is the exact match, so how each was found, and
        which are remembered, changes nothing but the time.)
        """
        known = self.known(p)
        if known is not None:
            return known
        stop = _DEST_STRETCH.match(self.text, p + 1, limit)
        z = stop.end() if stop is not None else p + 1
        if z - p <= _SHORT_STRETCH:
            return self._close_paren_stepwise(p, limit)  # (a few steps: cheaper than the runs)
        i = bisect_right(self._done_starts, p)
        if i < len(self._done_starts) and self._done_starts[i] < z:
            return self._close_paren_stepwise(p, limit)  # (a stretch read before starts in it)
        self._match_runs(p, z)
        insort(self._done_starts, p)
        known = self.known(p)
        return -1 if known is None else known

    def _match_runs(self, p: int, z: int) -> None:
        """Match every '(' of ``text[p:z]`` (a stretch without whitespace, from a '('): a stack of
        runs of '(' (the text between two of them holding no parenthesis, escape or blank) against
        runs of ')', one step per run; the pairs are recorded by C-level maps over their positions,
        the '(' left open as intervals (``_dead_starts``/``_dead_ends``), not one by one."""
        text = self.text
        memo = self.paren_match
        # Each open run: [start, end of its still open part, how many '(' are open there,
        # their positions (made when first needed) or None].
        stack: list[list[Any]] = []
        for m in _PAREN_RUN.finditer(text, p, z):
            kind = m.lastindex
            if kind == 1:
                s, e = m.span()
                stack.append([s, e, text.count("(", s, e), None])
                continue
            if kind != 2 or not stack:
                continue  # an escape, or ')' that close nothing
            s, e = m.span()
            count = text.count(")", s, e)
            closes: Any = range(s, e) if count == e - s else None
            used = 0
            while used < count and stack:
                top = stack[-1]
                o_start, o_end, open_count, positions = top
                take = min(open_count, count - used)
                if positions is None:
                    positions = top[3] = (range(o_start, o_end) if open_count == o_end - o_start
                                          else list(map(_START, _OPEN_PAREN.finditer(text, o_start, o_end))))
                if closes is None:
                    closes = list(map(_START, _CLOSE_PAREN.finditer(text, s, e)))
                opened = positions[open_count - take : open_count]
                memo.update(zip(reversed(opened), closes[used : used + take]))
                used += take
                if take == open_count:
                    stack.pop()
                else:
                    top[2] = open_count - take
                    top[1] = opened[0]  # (the open part now ends at the first '(' matched)
        for o_start, o_end, _, _ in stack:
            i = bisect_right(self._dead_starts, o_start)
            self._dead_starts.insert(i, o_start)
            self._dead_ends.insert(i, o_end)

    def _close_paren_stepwise(self, p: int, limit: int) -> int:
        """``_close_paren`` one step per parenthesis, escape or the character that ends the
        destination (a regex finds the next of them); parentheses already matched are stepped
        over, one known never to close ends it."""
        memo = self.paren_match
        known_at = self.known
        text = self.text
        stack = [p]
        push, pop = stack.append, stack.pop
        skip_to = p  # inside a pair already matched: nothing to do until past its ')'
        for m in _DEST_SPECIAL.finditer(text, p + 1, limit):
            i = m.start()
            if i <= skip_to:
                continue
            ch = text[i]
            if ch == "(":
                known = known_at(i)
                if known is None:
                    push(i)
                elif known < 0:
                    break
                else:
                    skip_to = known
            elif ch == ")":
                memo[pop()] = i
                if not stack:
                    break
            elif ch != "\\":
                break  # whitespace ends a destination: whatever is still open never closes
        memo.update(dict.fromkeys(stack, -1))
        return memo[p]

    def _title_end(self, p: int, limit: int) -> int:
        text = self.text
        opener = text[p]
        closer = ")" if opener == "(" else opener
        body = _TITLE_BODY[opener]
        p += 1
        while p < limit:
            m = body.match(text, p, limit)
            if m:
                p = m.end()
                continue
            ch = text[p]
            if ch == "\\":
                p += 2
            elif ch == closer:
                return p + 1
            else:
                return -1  # an unescaped '(' inside a (title)
        return -1


_CLOSER_RUN = re.compile(r"\]+")
_OPENER_RUN = re.compile(r"\[+")


def _pair_open_regions(text: str, start: int, end: int, pairs: list[Range]) -> None:
    """Bracket pairs of ``text[start:end]`` (no escapes, no code) whose '[' follows a '!'.

    The same pairs as a stack of every '[' (each ']' closes the nearest open '[' before it), for
    text with few ']': the open '[' are not listed one by one but stay in regions of text,
    searched backwards (``rfind``, in C) only when a ']' needs one, and a run of '[' is matched
    with a run of ']' in one step. Python work is per run of ']', and every character is searched
    at most once, so a flood of '[' (or of '![') costs next to nothing.
    """
    rev = text[start:end][::-1]  # the run of '[' ending at o: _OPENER_RUN on the reversed text
    last = end - 1
    # The regions, as three lists of ints (no container per region for the collector to walk):
    # text[lo:hi] holds open '['; run: the known length of the run of '[' ending at hi - 1 (0:
    # not known yet).
    los: list[int] = []
    his: list[int] = []
    runs: list[int] = []
    scanned = start
    rfind = text.rfind
    for m in _CLOSER_RUN.finditer(text, start, end):
        q, e = m.span()
        if scanned < q:
            los.append(scanned)
            his.append(q)
            runs.append(0)
        scanned = e
        while q < e and los:
            lo, hi, run = los[-1], his[-1], runs[-1]
            if run:
                o = hi - 1
            else:
                o = rfind("[", lo, hi)
                if o < 0:
                    los.pop()
                    his.pop()
                    runs.pop()
                    continue
                found = _OPENER_RUN.match(rev, last - o, last - lo + 1)
                run = found.end() - found.start() if found else 1
            take = min(run, e - q)
            if take == run:  # the whole run closes: its first '[' is the one a '!' may precede
                first = o - run + 1
                if first > start and text[first - 1] == "!":
                    pairs.append((first, q + run - 1))
                if first > lo:
                    his[-1], runs[-1] = first, 0
                else:
                    los.pop()
                    his.pop()
                    runs.pop()
            else:
                his[-1], runs[-1] = o - take + 1, run - take
            q += take


_BRACKET_RUN = re.compile(r"\[+|\]+")


def _pair_stacked_runs(text: str, start: int, end: int, pairs: list[Range]) -> None:
    """As ``_pair_open_regions``, with a stack of runs of '[' (two lists of ints): Python work per
    run of brackets, so runs of ']' against runs of '[' cost one step each."""
    starts: list[int] = []
    counts: list[int] = []
    for m in _BRACKET_RUN.finditer(text, start, end):
        q, e = m.span()
        if text[q] == "[":
            starts.append(q)
            counts.append(e - q)
            continue
        while q < e and starts:
            first, run = starts[-1], counts[-1]
            if run <= e - q:  # the whole run closes: its first '[' is the one a '!' may precede
                if first > start and text[first - 1] == "!":
                    pairs.append((first, q + run - 1))
                starts.pop()
                counts.pop()
                q += run
            else:
                counts[-1] = run - (e - q)
                q = e


def _image_pairs(
    text: str, start: int, end: int, spans: list[Range], span_starts: list[int], tailed: bool = False
) -> list[Range]:
    """(index of '[', index of its ']') for every unescaped ``![`` in the segment with a match;
    ``tailed``: only those whose ']' is followed by '(' (the others can lift nothing when the
    text defines no reference)."""
    ci = bisect_left(span_starts, start)  # spans never cross a segment boundary
    with_spans = ci < len(spans) and spans[ci][0] < end
    if not with_spans and text.find("\\", start, end) < 0:
        return _plain_pairs(text, start, end, 0, tailed)
    # Code spans and escapes: masked (same length), so the pairs are those of plain brackets.
    seg = text[start:end]
    if with_spans:
        # Brackets and backslashes are literal in a code span: read as spaces. (The whole
        # segment is translated once, in C; its spans are taken from that.)
        every = seg.translate(_CODE_MASK)
        parts: list[str] = []
        add = parts.append
        pos = 0
        for s, e in spans[ci:]:
            if s >= end:
                break
            add(seg[pos : s - start])
            add(every[s - start : e - start])
            pos = e - start
        add(seg[pos:])
        seg = "".join(parts)
    unmasked = seg
    if "\\" in seg:
        # An escaped bracket is no bracket, an escaped '!' no image's: masked, but for an
        # escaped '!' before a '[' (see below).
        seg = _ESCAPE_BUT_BANG.sub("  ", seg)
    pairs = _plain_pairs(seg, 0, len(seg), start, tailed)
    if "\\![" in seg:
        # The old parser's reading, kept: an escaped '!' makes no image unless another escape
        # comes between its '[' and ']' (only the latest escape before the ']' was looked at).
        ends = [m.end() + start for m in _ESCAPE_TOKEN.finditer(unmasked)]
        kept: list[Range] = []
        for o, c in pairs:
            if o - start >= 2 and seg[o - start - 2] == "\\":
                i = bisect_left(ends, o)
                if i < len(ends) and ends[i] == o and (i + 1 == len(ends) or ends[i + 1] > c):
                    continue
            kept.append((o, c))
        pairs = kept
    return pairs


_ESCAPE_TOKEN = re.compile(rf"\\[{_PUNCT}]")
_ESCAPE_BUT_BANG = re.compile(r"\\[\"-/:-@\[-`{-~]")  # _PUNCT without '!'


# Inside a code span, brackets and backslashes are literal: read as spaces.
_CODE_MASK = str.maketrans("[]\\", "   ")


def _plain_pairs(text: str, start: int, end: int, offset: int = 0, tailed: bool = False) -> list[Range]:
    """``_image_pairs`` for a segment without code spans or backslashes (``offset``: added to
    every index, for a masked copy of a segment)."""
    # No code span and no backslash here (the usual case, and most floods): brackets only.
    opens, closes = text.count("[", start, end), text.count("]", start, end)
    if opens == closes and _FLAT_BRACKETS.fullmatch(text, start, end):
        # Every '[' closed by the next ']', none nested: the pairs are where a '!' precedes.
        after, before = offset + 1, offset - 1
        images = _FLAT_IMAGE_TAILED if tailed else _FLAT_IMAGE
        return [(m.start() + after, m.end() + before) for m in images.finditer(text, start, end)]
    pairs: list[Range] = []
    if opens > 4 * closes:
        _pair_open_regions(text, start, end, pairs)  # few ']': work per ']' only
    elif 4 * (text.count("[[", start, end) + text.count("]]", start, end)) > opens + closes:
        _pair_stacked_runs(text, start, end, pairs)  # runs of brackets: work per run
    elif 4 * opens < closes:
        _pair_few_openers(text, start, end, pairs)  # few '[': work per '[' only
    else:
        # Single brackets: work per ']' (and the pairs without a tail left out there).
        _pair_per_closer(text, start, end, pairs, tailed)
        tailed = False
    if tailed:
        pairs = [(o, c) for o, c in pairs if text.startswith("(", c + 1, end)]
    pairs.sort()
    return [(o + offset, c + offset) for o, c in pairs] if offset else pairs


def _pair_per_closer(text: str, start: int, end: int, pairs: list[Range], tailed: bool) -> None:
    """As a stack of every '[', one step per ']' (found by ``find``, in C): the '[' it closes is
    the last one between it and the ']' before it, if any; else the last one still open before
    that, kept as regions of text that hold only open '[' (the stretch before a ']' up to the
    '[' it closes), searched backwards by ``rfind``. Where a ']' has no '[' of its own, the next
    '[' is looked for once, and the ']' before it go straight to the regions (deep nesting: a
    search per ']', not two). Each character is searched at most three times (forwards for ']',
    for '[', and backwards). ``tailed``: only the pairs whose ']' is followed by '('."""
    los: list[int] = []  # the regions below the last one: text[lo:hi] holds no '[' but open ones
    his: list[int] = []
    push_lo, push_hi, pop_lo, pop_hi = los.append, his.append, los.pop, his.pop
    add = pairs.append
    find, rfind = text.find, text.rfind
    pos = lo = hi = start  # text[lo:hi]: the last region (empty at first)
    bare_until = start  # no '[' from ``pos`` up to there
    while True:
        closer = find("]", pos, end)
        if closer < 0:
            return
        opener = -1 if closer < bare_until else rfind("[", pos, closer)
        if opener >= 0:
            if opener > pos:
                push_lo(lo)
                push_hi(hi)
                lo, hi = pos, opener
        else:
            if closer >= bare_until:
                bare_until = find("[", closer, end)
                if bare_until < 0:
                    bare_until = end
            opener = rfind("[", lo, hi)
            while opener < 0 and los:
                lo, hi = pop_lo(), pop_hi()
                opener = rfind("[", lo, hi)
            hi = opener if opener >= 0 else lo
        pos = closer + 1
        if opener > start and text[opener - 1] == "!" and (not tailed or pos < end and text[pos] == "("):
            add((opener, closer))


def _pair_few_openers(text: str, start: int, end: int, pairs: list[Range]) -> None:
    """As a stack of every '[', for text with few '[': while none is open, the ']' before the
    next '[' close nothing and are stepped over by one search (in C)."""
    stack: list[int] = []
    push, pop, add = stack.append, stack.pop, pairs.append
    search, find = _BRACKETS_ONLY.search, text.find
    pos = start
    while True:
        if not stack:
            p = find("[", pos, end)
            if p < 0:
                return
            push(p)
            pos = p + 1
            continue
        m = search(text, pos, end)
        if m is None:
            return
        p = m.start()
        pos = p + 1
        if text[p] == "[":
            push(p)
        else:
            opener = pop()
            if opener > start and text[opener - 1] == "!":
                add((opener, p))


_DEFINITION = re.compile(r"^ {0,3}\[((?:[^\[\]\\\n]|\\.){1,999})\]:[ \t]*\S", re.MULTILINE)
_LABEL_SPACE = re.compile(r"\s+")


def _normal_label(label: str) -> str:
    return _LABEL_SPACE.sub(" ", label.strip()).casefold()


def _reference_labels(text: str) -> set[str]:
    """The labels of the text's link reference definitions (``[label]: destination``), folded as
    ``_normal_label`` folds one, all at once (labels hold no line break: joined by one, the
    whitespace folding and the case folding run once over all of them, in C)."""
    if "]:" not in text:
        return set()  # (every definition holds one: no regex over the whole text)
    labels = _DEFINITION.findall(text)
    if not labels:
        return set()
    joined = _LABEL_EDGE.sub("", _LABEL_INNER_SPACE.sub(" ", "\n".join(set(labels))))
    return set(joined.casefold().split("\n"))


_LABEL_INNER_SPACE = re.compile(r"[^\S\n]+")  # whitespace but the joining line breaks
_LABEL_EDGE = re.compile(r"^ | $", re.MULTILINE)


def _reference_image_end(text: str, opener: int, closer: int, limit: int, labels: set[str]) -> int | None:
    """End of a reference image (full, collapsed or shortcut) at ``opener``, if its label is defined."""
    after = closer + 1
    if after < limit and text[after] == "[":
        close = text.find("]", after + 1, limit)
        if close < 0:
            return None
        label = text[after + 1 : close] or text[opener + 1 : closer]
        return close + 1 if _normal_label(label) in labels else None
    return after if _normal_label(text[opener + 1 : closer]) in labels else None


# --- removal and tidying --------------------------------------------------------------------


def _tail_state(piece: str, line_empty: bool, ends_blank: bool) -> tuple[bool, bool]:
    """(line_empty, ends_blank) after ``piece`` is appended to output in that state.

    line_empty: the output's last line has no content yet; ends_blank: the output ends with a
    blank line (or is empty).
    """
    last_nl = piece.rfind("\n")
    if last_nl < 0:
        if piece.strip(" \t\r"):
            return False, False
        return line_empty, ends_blank
    if piece[last_nl + 1 :].strip(" \t\r"):
        return False, False  # the last line has content
    before = piece.rfind("\n", 0, last_nl)
    prev_blank = not piece[before + 1 : last_nl].strip(" \t\r") and (before >= 0 or line_empty)
    return True, prev_blank


_Step = tuple[str, bool, bool, str]


def _gap_step(piece: str, line_empty: bool, ends_blank: bool, held_indent: str) -> _Step:
    """One piece after a removal (not the last one): what is appended, then the state after it
    (line_empty, ends_blank, held_indent). A function of its arguments only (see ``_rebuild``)."""
    if not piece:
        return "", line_empty, ends_blank, held_indent  # (the gap is still open)
    rest = piece.lstrip(" \t")
    if not rest:
        return "", line_empty, ends_blank, held_indent
    if rest[0] in "\r\n":
        if line_empty:
            rest = rest[2:] if rest.startswith("\r\n") else rest[1:]
            held_indent = ""
            if ends_blank:
                # drop whole blank lines, keep the next content line's indentation
                content = len(rest) - len(rest.lstrip(" \t\r\n"))
                rest = rest[rest.rfind("\n", 0, content) + 1 :]
            if not rest:
                return "", line_empty, ends_blank, held_indent
        piece = rest
    else:
        piece = held_indent + rest if line_empty else " " + rest
        held_indent = ""
    # a reference follows: so do the blanks before it on its line
    stripped = piece.rstrip(" \t")
    if "\n" in stripped:
        line_empty, ends_blank = _tail_state(stripped, line_empty, ends_blank)
    elif line_empty and stripped.strip(" \t\r"):
        line_empty = ends_blank = False  # (not line_empty implies not ends_blank)
    if line_empty:
        held_indent = piece[len(stripped) :]
    return stripped, line_empty, ends_blank, held_indent


def _rebuild(pieces: list[str]) -> str:
    """The text without the lifted references, closing up the gaps they leave.

    A reference inside a sentence becomes a single space; one alone on its line takes the line
    with it; blank lines do not pile up where several lines vanished; the line's indentation is
    kept when text follows the reference. Text away from a removal is copied untouched.
    ``pieces``: the text before the first removal, between each two, and after the last. One
    pass over them, each looked at once (at its ends), an empty one (references side by side)
    at the cost of a comparison. A short piece's step depends on nothing but the piece and the
    state before it, so it is worked out once per distinct (piece, state) and looked up after:
    a flood of references between the same few pieces costs a dictionary look-up each.
    """
    out: list[str] = []
    add = out.append
    # After the first piece (nothing removed before it): its blanks before the reference go.
    first = pieces[0]
    if len(pieces) == 1:
        return first
    stripped = first.rstrip(" \t")
    line_empty, ends_blank = _tail_state(stripped, True, True) if "\n" in stripped else (
        (False, False) if stripped.strip(" \t\r") else (True, True))
    held_indent = first[len(stripped) :] if line_empty else ""
    add(stripped)
    memo: dict[tuple[str, bool, bool, str], _Step] = {}
    get = memo.get
    # Equal pieces side by side (a flood of references between the same text) come as one group
    # (``groupby`` compares them in C): once a step leaves the state as it found it, every later
    # piece of the group appends the same text, added at once.
    for piece, group in groupby(pieces[1:-1]):
        if not piece or piece == " ":
            continue  # (references side by side, or a space apart: the gap is still open)
        count = len(list(group))
        while count:
            key = (piece, line_empty, ends_blank, held_indent)
            known = get(key) if len(piece) <= 256 else None  # (a long piece costs more to hash)
            if known is None:
                known = _gap_step(piece, line_empty, ends_blank, held_indent)
                if len(piece) <= 256:
                    memo[key] = known
            count -= 1
            if known[1:] == key[1:]:  # (a fixed point: the rest of the group is the same step)
                if known[0]:
                    out += repeat(known[0], count + 1)
                break
            appended, line_empty, ends_blank, held_indent = known
            if appended:
                add(appended)
    # The last piece: the gap before it is closed, nothing to tidy at its end.
    piece = pieces[-1]
    rest = piece.lstrip(" \t")
    if rest:
        if rest[0] in "\r\n":
            if line_empty:
                rest = rest[2:] if rest.startswith("\r\n") else rest[1:]
                if ends_blank:
                    content = len(rest) - len(rest.lstrip(" \t\r\n"))
                    rest = rest[rest.rfind("\n", 0, content) + 1 :]
            if rest:
                add(rest)
                return "".join(out)
        else:
            add(held_indent + rest if line_empty else " " + rest)
            return "".join(out)
    body = "".join(out)
    if line_empty:
        # the last line vanished: drop the blank lines it leaves at the end
        cut = len(body.rstrip())
        while cut < len(body) and body[cut] in " \t":
            cut += 1
        body = body[:cut]
    return body


_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


# --- lifting ---------------------------------------------------------------------------------

# A run of text whose every bracket is in a one-line ``[...]`` without backslashes or backticks,
# whose every ``![alt](`` goes on as a plain ``(path)`` and has no brackets in its alt text, and
# whose other ``[...]`` (links) hold nothing but text and such images. Its images cannot nest in
# one another or hide in code, so one regex step finds each, with no bracket matching at all.
_SIMPLE_DEST = r"[^\x00-\x20()\\\x7f<\[\]][^\x00-\x20()\\\x7f\[\]]*+"
_SIMPLE_IMAGE = rf"!\[[^\[\]\\`\n]*+\](?:\([ \t]*+{_SIMPLE_DEST}[ \t]*+\)|(?!\())"
_SIMPLE_RUN = re.compile(
    rf"(?:[^\[\]\\`!]++|!(?!\[)|{_SIMPLE_IMAGE}|\[(?:[^\[\]\\`\n!]++|!(?!\[)|{_SIMPLE_IMAGE})*+\])*+"
)
# In such a run, an image with a local destination (no URL scheme, no network path): its alt
# text already folded (group 1) or not (group 2), and its path (group 3).
_SIMPLE_LOCAL = re.compile(
    r"!\[(?:((?:[^\s\[\]\\`]++(?: [^\s\[\]\\`]++)*+)?)\]|([^\[\]\\`\n]*+)\])"
    rf"\([ \t]*+(?![A-Za-z][A-Za-z0-9+.\-]+:|//)({_SIMPLE_DEST})[ \t]*+\)"
)
# MarkdownMediaRef's slots, set directly (a frozen dataclass's __init__ is a Python call per
# object; these are C calls, mapped over all the references at once).
_SET_ALT = vars(MarkdownMediaRef)["alt"].__set__
_SET_PATH = vars(MarkdownMediaRef)["path"].__set__


def _make_refs(alts: list[str], paths: list[str]) -> list[MarkdownMediaRef]:
    """``[MarkdownMediaRef(a, p) for a, p in zip(alts, paths)]``, built without a Python step each.

    The garbage collector is held off while they are made: a full collection walks every list
    alive (the text's pieces, the alt texts and paths), and one every time the new objects grow
    by a quarter made a reply with a million references cost O(n log n). Nothing but C runs in
    between (no Python code, so no other thread either), and whoever turned it off keeps it off.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        refs: list[MarkdownMediaRef] = list(map(object.__new__, repeat(MarkdownMediaRef, len(alts))))
        deque(map(_SET_ALT, refs, alts), 0)
        deque(map(_SET_PATH, refs, paths), 0)
    finally:
        if enabled:
            gc.enable()
    return refs


class _Lifter:
    """The general case, one segment at a time: code spans, bracket pairs, then each tail."""

    def __init__(self, text: str, alts: list[str], paths: list[str], removals: list[Range]) -> None:
        self.text = text
        self.alts = alts
        self.paths = paths
        self.removals = removals
        self.scanner = _Scanner(text)
        self.labels: set[str] | None = None  # reference definitions, read only if an image might use one
        # Whether the text may define a reference (each definition holds "]:"), looked for once, at
        # the first segment (a search for ':' alone is a memchr: most replies are answered by it).
        self.defines: bool | None = None

    def segment(self, seg_start: int, seg_end: int) -> None:
        text = self.text
        if text.find("![", seg_start, seg_end) < 0 or text.find("](", seg_start, seg_end) < 0:
            return
        plain = text.find("`", seg_start, seg_end) < 0 and text.find("\\", seg_start, seg_end) < 0
        if plain and _NESTED_IMAGE.search(text, seg_start, seg_end) is None:
            # No image's alt text holds a bracket (links around them may nest to any depth): each
            # ``![alt]`` is a pair whatever surrounds it (nothing between its brackets) and holds
            # no image, so the image pairs are the flat ones, read as in a flat segment.
            self._flat_segment(seg_start, seg_end, _FLAT_CANDIDATE)
            return
        if (plain and text.count("[", seg_start, seg_end) == text.count("]", seg_start, seg_end)
                and _SHALLOW_BRACKETS.fullmatch(text, seg_start, seg_end)):
            if self.labels is None:
                self.labels = _reference_labels(text)
            shallow = _SHALLOW_CANDIDATE_ANY if self.labels else _SHALLOW_CANDIDATE
            self._flat_segment(seg_start, seg_end, shallow)
            return
        spans = code_spans(text, seg_start, seg_end) if text.find("`", seg_start, seg_end) >= 0 else []
        span_starts = [s for s, _ in spans]
        consumed = seg_start
        quick_tail, slow_tail = _TAIL_QUICK.match, self.scanner.slow_tail
        add_alt, add_path, add_removal = self.alts.append, self.paths.append, self.removals.append
        find = text.find
        limit = seg_end
        if self.defines is None:
            self.defines = ":" in text and "]:" in text
        tailed = not self.defines or self.labels is not None and not self.labels  # (see _reference)
        for opener, closer in _image_pairs(text, seg_start, seg_end, spans, span_starts, tailed):
            if opener - 1 < consumed:
                continue  # inside an earlier image's alt text: only alt text, never a file
            if span_starts:
                nxt = bisect_left(span_starts, closer + 1)
                limit = min(seg_end, span_starts[nxt]) if nxt < len(span_starts) else seg_end
            p = closer + 1
            if p < limit and text[p] == "(":
                quick = quick_tail(text, p, limit)
                if quick is not None and quick.lastindex != 3:
                    path, end = quick.group(quick.lastindex or 0), quick.end()
                else:
                    parsed = slow_tail(p, limit, quick)
                    if parsed is None:
                        if find("![", opener + 1, closer) >= 0:
                            consumed = self._reference(opener, closer, limit, consumed)
                        continue
                    path, end = parsed
            else:
                if find("![", opener + 1, closer) >= 0:
                    consumed = self._reference(opener, closer, limit, consumed)
                continue
            consumed = end
            # (as written: unescaped, folded and checked for the run at once, by _finish)
            add_alt(text[p - (closer - opener) : closer])  # (p - (closer - opener) == opener + 1)
            add_path(path)
            add_removal((opener - 1, end))

    def _reference(self, opener: int, closer: int, limit: int, consumed: int) -> int:
        """``consumed`` past an image by reference at ``opener`` whose alt text holds an image
        (``![...![x](x.png)...][label]``, ``![...][]``, ``![...]``: an image by reference, which
        is not lifted, makes the images in its label mere alt text)."""
        if self.labels is None:
            self.labels = _reference_labels(self.text)
        if not self.labels:
            return consumed  # (no definitions: no image by reference)
        end = _reference_image_end(self.text, opener, closer, limit, self.labels)
        return consumed if end is None else end

    def _flat_segment(self, seg_start: int, seg_end: int, candidates: re.Pattern[str]) -> None:
        """``segment`` for brackets nested at most two deep (``candidates``: _SHALLOW_CANDIDATE)
        or never (_FLAT_CANDIDATE), without code or backslashes: each image and its everyday
        tail in one regex step, candidates without a tail the full parser could read skipped in
        the regex; a tail that runs into a '(' known never to close is dismissed at once; the
        full parser reads the rest. An image whose tail fails has the images in its alt text
        read after it, as the bracket pairs' order has them, unless it is an image by reference
        (``_SHALLOW_CANDIDATE_ANY``, for a text with reference definitions)."""
        text = self.text
        tail = self.scanner.tail
        known = self.scanner.known
        alts, paths, removals = self.alts, self.paths, self.removals
        nested = candidates is not _FLAT_CANDIDATE  # (a flat alt text holds no image)
        consumed = seg_start
        matches: Any = candidates.finditer(text, seg_start, seg_end)
        while matches is not None:
            current, matches = matches, None
            for m in current:
                bang = m.start()
                if bang < consumed:
                    if m.end() > consumed:
                        # It starts inside an earlier image's tail but runs on past it: the
                        # images in the rest of it (its alt text, its tail) are read on their own.
                        matches = candidates.finditer(text, consumed, seg_end)
                        break
                    continue  # inside an earlier image's tail
                group = m.lastindex
                if group == 2 or group == 3:
                    raw_dest, end = m.group(group), m.end()
                else:
                    if group == 4 and (known(m.end(4) - 1) or 0) < 0:
                        # the destination runs into a '(' already known never to close
                        if nested:
                            consumed = self._after_failed(m, seg_end, consumed)
                        else:
                            after = self._past_dead_chain(m.end(4) - 1, seg_end)
                            if after > m.end():
                                matches = candidates.finditer(text, after, seg_end)
                                break  # (the while loop goes on from ``after``)
                        continue
                    parsed = tail(m.end(), seg_end)
                    if parsed is None:
                        if nested:
                            consumed = self._after_failed(m, seg_end, consumed)
                        continue
                    raw_dest, end = parsed
                consumed = end
                alts.append(m.group(1))  # (as written: see _finish)
                paths.append(raw_dest)
                removals.append((bang, end))

    def _past_dead_chain(self, q: int, seg_end: int) -> int:
        """Where to look for the next candidate that may lift something, after one whose
        destination runs into the '(' at ``q``, known never to close: past a chain of
        ``(![alt]`` (a destination's text then an image, then the next '('), each image's
        destination running into the next '(', all known never to close (``![a](`` repeated).
        Those images cannot be lifted; the last one, whose destination runs on past the chain, is
        where to look again. -1: no such chain."""
        scanner = self.scanner
        i = bisect_right(scanner._dead_starts, q) - 1
        if i < 0 or q >= scanner._dead_ends[i]:
            return -1
        chain = _DEAD_CHAIN.match(self.text, q, min(seg_end, scanner._dead_ends[i]))
        if chain is None or chain.end() == q:
            return -1
        return self.text.rfind("![", q, chain.end())

    def _after_failed(self, m: re.Match[str], seg_end: int, consumed: int) -> int:
        """``consumed`` after an image (match ``m``) whose tail failed: past an image by reference
        holding images (which stay alt text), or past the images of its alt text, lifted."""
        alt_start, alt_end = m.span(1)
        if self.text.find("![", alt_start, alt_end) < 0:
            return consumed
        if self.labels:  # (an image by reference: its alt text's images stay)
            after = self._reference(alt_start - 1, alt_end, seg_end, consumed)
            if after != consumed:
                return after
        return self._inner_images(alt_start, alt_end, seg_end, consumed)

    def _inner_images(self, alt_start: int, alt_end: int, seg_end: int, consumed: int) -> int:
        """The images in the alt text ``text[alt_start:alt_end]`` of an image whose tail failed
        (their alt texts hold no brackets; a tail may run on past ``alt_end``); returns
        ``consumed`` past the last one lifted."""
        text = self.text
        tail = self.scanner.tail
        known = self.scanner.known
        for m in _FLAT_CANDIDATE.finditer(text, alt_start, seg_end):
            bang = m.start()
            if bang >= alt_end:
                break
            if bang < consumed:
                continue
            group = m.lastindex
            if group == 2 or group == 3:
                raw_dest, end = m.group(group), m.end()
            else:
                if group == 4 and (known(m.end(4) - 1) or 0) < 0:
                    continue
                parsed = tail(m.end(), seg_end)
                if parsed is None:
                    continue
                raw_dest, end = parsed
            consumed = end
            self.alts.append(m.group(1))
            self.paths.append(raw_dest)
            self.removals.append((bang, end))
        return consumed


# The general case's alt texts and destinations, as written, are unescaped, folded and checked a
# run at a time: joined by a character the text does not hold, one C call each does all of them.
_SEPARATORS = ("\x00", "\ue000", "\ue001", "\uffff")
_SEPARATOR_SPACE = {sep: re.compile(f" ?{sep} ?") for sep in _SEPARATORS}
# A path that is dropped: empty or blank, or remote (``_REMOTE``), among paths joined by ``sep``,
# each after a ``sep`` (searched for in ``sep + joined``: the engine skips from one to the next in C,
# where a pattern starting with ``\A`` or a lookbehind was tried at every character).
_DROPPED = {
    sep: re.compile(rf"{sep}(?:[A-Za-z][A-Za-z0-9+.\-]++:|//|\s*+(?:{sep}|\Z))")
    for sep in _SEPARATORS
}


def _separator(text: str) -> str | None:
    """A character of ``_SEPARATORS`` that ``text`` does not hold (None: it holds them all)."""
    return next((sep for sep in _SEPARATORS if sep not in text), None)


_Removal = TypeVar("_Removal")


def _finish(
    sep: str | None, alts: list[str], paths: list[str], removals: Sequence[_Removal], first: int,
    escaped: bool = True,
) -> Sequence[_Removal]:
    """Turn ``alts[first:]`` and ``paths[first:]`` (as written) into what is lifted: paths
    unescaped, those empty or remote dropped (with their removal), alt texts unescaped and their
    whitespace folded, joined by ``sep`` (``_separator`` of the text; None: one at a time).
    Returns the removals kept. ``escaped``: False when they are already unescaped."""
    raw_alts, raw_paths = alts[first:], paths[first:]
    del alts[first:], paths[first:]
    if sep is None or len(raw_paths) < 8:
        kept: list[_Removal] = []
        for alt, path, removal in zip(raw_alts, raw_paths, removals):
            if escaped and "\\" in path:
                path = _unescape(path)
            if not path.strip() or _REMOTE.match(path) is not None:
                continue
            if escaped and "\\" in alt:
                alt = _unescape(alt)
            if not _PLAIN_ALT.fullmatch(alt):
                alt = _SPACES.sub(" ", alt).strip()
            alts.append(alt)
            paths.append(path)
            kept.append(removal)
        return kept
    joined = sep.join(raw_paths)
    if escaped and "\\" in joined:
        joined = _unescape(joined)
        unescaped = joined.split(sep)
    else:
        unescaped = raw_paths
    if _DROPPED[sep].search(sep + joined) is not None:  # (one search finds whether any is dropped)
        remote = _REMOTE.match
        keep = [i for i, path in enumerate(unescaped) if path.strip() and remote(path) is None]
        unescaped = [unescaped[i] for i in keep]
        raw_alts = [raw_alts[i] for i in keep]
        removals = [removals[i] for i in keep]
    joined = sep.join(raw_alts)
    if escaped and "\\" in joined:
        joined = _unescape(joined)  # (an escape never takes the separator: it is no punctuation)
    elif _SPACE.search(joined) is None:
        alts += raw_alts  # (nothing to unescape or fold)
        paths += unescaped
        return removals
    joined = _SPACES.sub(" ", joined)
    if " " in joined:  # (else no separator has a space to lose: no step per separator)
        joined = _SEPARATOR_SPACE[sep].sub(sep, joined)
    joined = joined.strip(" ")
    alts += joined.split(sep) if raw_alts else []
    paths += unescaped
    return removals


# --- the whole reply at once ---------------------------------------------------------------
#
# When every run of text is a "simple run" (see _SIMPLE_RUN) once its code is masked, the reply's
# images are found by one regex over one masked copy of the whole reply, whatever the number of
# runs, paragraphs, escapes or code spans: no Python step per run or per candidate. The copy has
# the same length (so offsets hold): in code blocks, what could make or hide an image becomes a
# stand-in, \x02 to \x06 (code blocks are whole lines, and a simple image never spans a line
# break), each code span (only single backticks, paired on one line: what the renderer's rule
# gives then) becomes \x01 (which, like the stand-ins, no destination and no blank between '('
# and a destination may hold, so a tail stops at a span as the segment parser's limit makes it),
# and each escape but ``\!`` becomes two \ue100 (no bracket, no blank, no letter: a destination
# goes on through it as through an escape, and no scheme is seen in it). Alt texts and paths are
# then taken from the copy, their marks undone, and unescaped, folded and checked for schemes as
# the general case does (``_finish``); the text between the images likewise, every mark put back
# as the reply wrote it (or, where the reply holds a mark itself or an image is dropped, cut from
# the reply by offset).

_MASK = "\x01"
# Masked escapes: "\ue100" then the character, or for a character the simple regexes read, its
# stand-in (\ue100 + the character's code: no bracket, parenthesis, blank or letter).
_ESC = "\ue100"
_NOT_AN_ESCAPE = re.compile(r"\\(?![!-/:-@\[-`{-~])")
_ESCAPE_STANDINS = {ch: chr(0xE100 + ord(ch)) for ch in "[]()\\`!"}
# An escaped '!' whose '[' is closed by the next ']' with no escape (nor bracket) before it: in
# the segment parser's reading no image (it would be one with an escape in its alt text).
_ESCAPED_BANG_NO_IMAGE = re.compile("\\\\!(?=\\[[^\\[\\]\\\\`\n\ue100]*+\\])")
_UNMASK = str.maketrans({_MASK: "`"})
_UNESCAPE = str.maketrans({_ESC: None, **{v: k for k, v in _ESCAPE_STANDINS.items()}})
# The same as replacements, one after another (no replacement makes another's key): a str.replace
# scans in C at memory speed, where a translate by a table holding non-ASCII keys is a dictionary
# look-up per character.
_UNMASK_PAIRS = ((_MASK, "`"),)
_UNESCAPE_PAIRS = ((_ESC, ""), *((v, k) for k, v in _ESCAPE_STANDINS.items()))
_OWN_MARKS = re.compile("[\x01\ue100-\ue1ff]")
# In a run of code, whatever could make or hide an image, open a code span or escape: a stand-in
# (a control character: nothing the simple regexes read goes on through it, as through \x01).
_CODE_STANDINS = dict(zip("[]!`\\", "\x02\x03\x04\x05\x06"))
_CODE_MASK_ALL = str.maketrans(_CODE_STANDINS)
_ASCII_MARKS = (_MASK, *_CODE_STANDINS.values())
# The marks of the copy as the reply wrote them: the code's stand-ins, a code span's backticks
# (_UNMASK_PAIRS), an escape's marks. One replacement after another: none makes another's key.
_RESTORE_CODE_PAIRS = tuple((v, k) for k, v in _CODE_STANDINS.items())
_RESTORE_ESCAPE_PAIRS = ((_ESC, "\\"), *((v, k) for k, v in _ESCAPE_STANDINS.items()))
# A code span of single backticks on one line holding no bracket (the renderer's rule gives the
# same spans when every backtick of the run of text is in one of them).
_LONE_SPAN = re.compile(r"(?<!`)`[^`\n\[\]]++`(?!`)")
_MASKED_LOCAL = re.compile(
    rf"(!\[([^\[\]\\`\n]*+)\]\([ \t]*+(?![A-Za-z][A-Za-z0-9+.\-]+:|//)({_SIMPLE_DEST})[ \t]*+\))"
)


# A run of text (group 1), then a run of code (group "code"; none at the end): the
# block structure as ``_BLOCKS`` reads it, one match per run of code, matched at line starts only.
# Each alternative is guarded by a lookahead for the characters it can start with (a blank, a
# space, '#', a fence character; or the end), so that at most lines the engine tries one or two of
# them, not all: the same matches, fewer steps per line.
_G_BLANKS = rf"(?=[ \t\r\n]|\Z)(?:{_BLANKS})"
_G_BREAK = rf"(?=[ \t\r\n`~#]|\Z)(?:[ \t]*+(?:\r?\n|\Z)|{_FENCE_START}|{_HEADING_START})"
_G_PARAGRAPH = (rf"(?!(?=[ `~\t])(?:{_FENCE_START}|{_INDENT_START}))[^\n]*+(?:\n(?!{_G_BREAK})[^\n]*+)*+"
                rf"{_EOL}")
_CODE_RUN = re.compile(
    rf"((?:{_G_BLANKS}|(?=[ #])(?:{_HEADING_START})[^\n]*+{_EOL}|{_G_PARAGRAPH})*+)"
    rf"(?P<code>(?:(?>{_G_BLANKS}|(?=[ `~])(?:{_FENCED})|(?=[ \t])(?:{_INDENT_START})[^\n]*+{_EOL}))+)?"
)


@dataclass(slots=True)
class _Runs:
    """A reply as ``_mask_code_runs`` split it: its runs of text, each followed by its run of code
    (empty at the end). Where each run of text ends is summed only if asked for: the whole-reply
    path seldom needs it."""

    texts: list[str]
    codes: list[str]
    ends: list[int] | None = None

    def text_ends(self) -> list[int]:
        if self.ends is None:
            chunks: list[str] = [""] * (2 * len(self.codes))
            chunks[0::2] = self.texts
            chunks[1::2] = self.codes
            self.ends = list(accumulate(map(len, chunks)))[0::2]
        return self.ends


_Blocks = list[_Runs]


def _mask_code_runs(text: str, blocks: _Blocks) -> str | None:
    """``text`` with its code blocks' brackets, bangs, backticks and backslashes as stand-ins;
    ``blocks`` gets its runs of text and of code, for ``_runs_from_blocks``."""
    # [text, code or None, (the fence groups: 2), text, ...], in C (only the matches at the end
    # have no code).
    split = _CODE_RUN.split(text)
    stride = _CODE_RUN.groups + 1
    texts, codes = split[1::stride], split[2::stride]
    i = len(codes) - 1
    while i >= 0 and codes[i] is None:
        codes[i] = ""
        i -= 1
    if None in codes:
        return None  # (cannot happen: every match but those at the end ends with code)
    chunks: list[str] = [""] * (2 * len(codes))
    chunks[0::2] = texts
    # The code translated in C, each distinct run once (a reply's runs of code often repeat).
    masks = {code: code.translate(_CODE_MASK_ALL) for code in set(codes)}
    chunks[1::2] = map(masks.__getitem__, codes)
    masked = "".join(chunks)
    if len(masked) != len(text):
        return None  # (cannot happen: the runs cover the text)
    blocks.append(_Runs(texts, codes))
    return masked


def _runs_from_blocks(blocks: _Blocks, cut: int = 0) -> list[Range]:
    """What ``_text_runs`` gives, from what ``_mask_code_runs`` found (no second scan); only the
    runs ending after ``cut`` (those before it are not looked at)."""
    run_ends, texts = blocks[0].text_ends(), blocks[0].texts
    first = bisect_left(run_ends, cut + 1)
    if first:
        run_ends, texts = run_ends[first:], texts[first:]
    return [(start, end) for start, end, run in zip(map(sub, run_ends, map(len, texts)), run_ends, texts)
            if "![" in run and "](" in run]


def _lift_masked(text: str, blocks: _Blocks) -> tuple[list[str], list[str], list[str], int, int] | None:
    """The reply's images lifted from one masked copy (see above): (their alt texts and paths, the
    reply's text before each of them (since the one before), where the last one ends (0: none),
    and where the copy stops: the rest is the run-by-run path's); None when some run is not
    simple once masked (the run-by-run path then). ``blocks`` gets the runs of text if they were
    found on the way, and keeps them only where that path is to read some of them."""
    # (without a fence or an indented line, a reply holds no code block)
    no_code = "```" not in text and "~~~" not in text and "    " not in text and "\t" not in text
    masked = text if no_code else _mask_code_runs(text, blocks)
    if masked is None:
        return None
    ticks, escapes = "`" in masked, "\\" in masked
    if no_code and not (ticks or escapes):
        return None  # (the run-by-run path reads such a reply as one run, in one split: faster)
    if ticks and escapes:
        return None  # (which escape or span comes first is the segment parser's to say)
    if (ticks or escapes) and ("\x01" in text or not text.isascii() and _OWN_MARKS.search(text)):
        return None  # (the reply holds the marks: they could not be told from its own text)
    if escapes:
        # Escapes in C: escaped backslashes first (pairs from the left, as a left-to-right reading
        # takes them), then the characters the simple regexes read, then the rest.
        masked = masked.replace("\\\\", _ESC + _ESCAPE_STANDINS["\\"])
        for ch in "[]()`":
            masked = masked.replace("\\" + ch, _ESC + _ESCAPE_STANDINS[ch])
        if "\\!" in masked:
            # An escaped '!' before '[' has a reading of its own (see _image_pairs): no image when
            # no other escape comes before the ']' (the only reading taken here, the '!' masked by
            # a stand-in, so its '[...]' is a plain link); otherwise refused.
            masked = _ESCAPED_BANG_NO_IMAGE.sub(_ESC + _ESCAPE_STANDINS["!"], masked)
            if "\\![" in masked:
                return None
        if _NOT_AN_ESCAPE.search(masked) is not None:
            return None  # a backslash that escapes nothing
        masked = masked.replace("\\", _ESC)
    elif ticks:
        if "`" in _LONE_SPAN.sub("", masked):
            return None
        masked = masked.replace("`", _MASK)  # (a span's ends: no destination or blank goes on through them)
    cut = len(masked)
    simple = _SIMPLE_RUN.match(masked)
    if simple is None or simple.end() < cut:
        # Not simple from the first construct that is not (``fail``): the copy is read up to the
        # start of its run of text, or past the last blank line before it if later (a boundary
        # of blocks: the run-by-run path reads the rest as the whole reply's runs from there).
        fail = 0 if simple is None else simple.end()
        cut = masked.rfind("\n\n", 0, fail) + 2
        if blocks:
            run_ends, texts = blocks[0].text_ends(), blocks[0].texts
            i = bisect_left(run_ends, fail + 1)  # (the run of text or of code holding ``fail``)
            if i < len(run_ends):
                cut = max(cut, run_ends[i] - len(texts[i]))
        if cut <= 1:
            return None
        # The copy was matched up to ``fail``, so up to a line start before it, it matches whole
        # (only plain text runs on through a line break): matched again only if cut elsewhere.
        if (cut > fail or masked[cut - 1] != "\n") and not _SIMPLE_RUN.fullmatch(masked, 0, cut):
            return None
        masked = masked[:cut]
    else:
        blocks.clear()  # (read whole: their strings are freed, for what follows to reuse)
    parts = _MASKED_LOCAL.split(masked)
    del masked
    # [text, image, alt, path, text, ...]: the images kept as their lengths only (likewise)
    alts, paths, between = parts[2::4], parts[3::4], parts[0::4]
    lengths: list[int] = [0] * (2 * len(paths) + 1)
    lengths[1::2] = map(len, parts[1::4])
    del parts
    if escapes:  # unescaped at once: the marks dropped, the stand-ins put back (in C)
        alts = _translated(alts, _UNESCAPE, _UNESCAPE_PAIRS, text)
        paths = _translated(paths, _UNESCAPE, _UNESCAPE_PAIRS, text)
    elif ticks:  # as written: the spans' backticks put back
        alts = _translated(alts, _UNMASK, _UNMASK_PAIRS, text)
    # (the removals as indices: no tuple per image, so nothing for the collector to count)
    n = len(paths)
    kept = _finish(_separator(text), alts, paths, range(n), 0, not escapes)
    if not kept:
        return alts, paths, [], 0, cut
    if len(kept) == n and cut <= 128 * n:
        # None dropped, and images close together: the text between them is the copy's, its
        # marks put back (a few scans in C over all of it; images far apart are cut cheaper).
        marks = _RESTORE_ESCAPE_PAIRS if escapes else _UNMASK_PAIRS if ticks else ()
        restored = _restored(between, text, marks if no_code else _RESTORE_CODE_PAIRS + marks)
        if restored is not None:
            return alts, paths, restored[:-1], cut - len(restored[-1]), cut
    # Else cut from the reply: the offsets from the lengths, summed in C.
    lengths[0::2] = map(len, between)
    ends = list(accumulate(lengths))
    starts, stops = ends[0:-1:2], ends[1::2]
    if len(kept) < len(starts):  # some were dropped (remote, or empty once unescaped)
        starts, stops = [starts[i] for i in kept], [stops[i] for i in kept]
    pieces = [text[: starts[0]]]
    pieces += map(text.__getitem__, map(slice, stops[:-1], starts[1:]))
    return alts, paths, pieces, stops[-1], cut


def _restored(pieces: list[str], text: str, marks: tuple[tuple[str, str], ...]) -> list[str] | None:
    """``pieces`` of the masked copy as ``text`` has them, the ``marks`` put back: joined by a
    separator, a replacement per mark, split again (a few scans in C, not an offset and a slice
    of the reply per piece). None if the reply holds a mark itself (it could not be told from
    one) or every separator."""
    sep = _separator(text)
    if (sep is None or any(mark in text for mark in _ASCII_MARKS)
            or not text.isascii() and _OWN_MARKS.search(text) is not None):
        return None
    joined = sep.join(pieces)
    for key, value in marks:
        joined = joined.replace(key, value)
    return joined.split(sep)


def _translated(
    strings: list[str], table: dict[int, Any], pairs: tuple[tuple[str, str], ...], text: str
) -> list[str]:
    """``[s.translate(table) for s in strings]``: joined by a separator ``text`` does not hold,
    the ``pairs`` (the same mapping) replaced in turn, each one C scan; else one at a time."""
    sep = _separator(text)
    if sep is None or len(strings) < 2:
        return list(map(str.translate, strings, repeat(table)))
    joined = undone = sep.join(strings)
    for key, value in pairs:
        undone = undone.replace(key, value)
    return strings if undone is joined else undone.split(sep)  # (replace returns what it did not change)


# --- entry point ----------------------------------------------------------------------------


def extract_markdown_media(text: str) -> tuple[str, list[MarkdownMediaRef]]:
    """Lift local image references out of ``text``.

    Returns the text without them (tidied) and the references in order. Text with nothing to lift
    is returned unchanged.
    """
    if "![" not in text:
        return text, []
    original = text
    if "\r" in text:
        # CommonMark ends a line at \n, \r\n or a bare \r; the scanners below know \n and
        # \r\n, so a bare \r is read (and, if anything is lifted, returned) as \n.
        text = _BARE_CR.sub("\n", text)
    alts: list[str] = []
    paths: list[str] = []
    removals: list[Range] = []  # the general case's, one run at a time
    pieces: list[str] = []  # the text between removals, up to ``pos``; then ``carry`` and the rest
    pos = 0
    carry = ""
    lifter = _Lifter(text, alts, paths, removals)
    fold = _SPACES.sub
    separator: str | None = ""  # (not looked for yet)
    runs: list[Range] = []
    blocks: _Blocks = []
    whole = _lift_masked(text, blocks)
    if whole is not None:
        alts, paths, pieces, pos, cut = whole
        if cut < len(text):  # the rest, from a boundary of blocks, the run-by-run way
            lifter.alts, lifter.paths = alts, paths
            after = _runs_from_blocks(blocks, cut) if blocks else _text_runs(text)
            runs = [(max(start, cut), end) for start, end in after if end > cut]
    else:
        runs = _runs_from_blocks(blocks) if blocks else _text_runs(text)
    for run_start, run_end in runs:
        if (text.find("`", run_start, run_end) < 0 and text.find("\\", run_start, run_end) < 0
                and _SIMPLE_RUN.fullmatch(text, run_start, run_end)):
            # Its images, and the text between them, in one C call: [text, alt folded, alt, path,
            # text, ...] (strings only: nothing for the garbage collector to walk).
            parts = _SIMPLE_LOCAL.split(text[run_start:run_end])
            if len(parts) == 1:
                continue
            pieces.append(carry + text[pos:run_start] + parts[0])
            pieces += parts[4:-1:4]
            carry, pos = parts[-1], run_end
            alts += [alt if alt is not None else fold(" ", other).strip()
                     for alt, other in zip(parts[1::4], parts[2::4])]
            paths += parts[3::4]
            continue
        for seg_start, seg_end in _inline_segments(text, run_start, run_end):
            lifter.segment(seg_start, seg_end)
        if removals:
            if separator == "":
                separator = _separator(text)  # (looked for once: the text is read whole)
            removals[:] = _finish(separator, alts, paths, removals, len(alts) - len(removals))
        if removals:
            pieces.append(carry + text[pos : removals[0][0]])
            pieces += map(text.__getitem__, map(slice, map(_SECOND, removals[:-1]), map(_FIRST, removals[1:])))
            carry, pos = "", removals[-1][1]
            removals.clear()
    if not alts:
        return original, []
    pieces.append(carry + text[pos:])
    body = _rebuild(pieces)
    if not body.strip(" \t\n"):
        body = ""  # nothing but the blanks the references stood between
    return body, _make_refs(alts, paths)
