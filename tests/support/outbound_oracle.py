"""The outbound extractor as it was before issue 28's rewrites (talon/media/outbound.py at 49c0a2c,
names prefixed ``Old``/``old_``, nothing else changed): the reference oracle the differential tests
compare the extractor with. Tests only; nothing in talon/ may import it.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass

from talon.render.markdown import closes_fence, code_spans, fence_of, heading_text, unescape

# ============================================================================================
# REFERENCE ORACLE: the old extractor, verbatim but for its names. Do not use outside this file.
# ============================================================================================

@dataclass(frozen=True)
class OldMarkdownMediaRef:
    """One lifted image reference: its alt text and the destination as written (unescaped)."""

    alt: str
    path: str


Range = tuple[int, int]

# --- block structure ------------------------------------------------------------------------


def _indent_width(line: str) -> int:
    width = 0
    for ch in line:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += 4 - width % 4
        else:
            break
        if width >= 4:
            break
    return width


def _inline_segments(text: str) -> list[Range]:
    """Runs of lines inside which inline markup may continue (paragraphs and headings).

    Code blocks and blank lines are left out: they are never searched, and neither code spans
    nor image references can cross them.
    """
    segments: list[Range] = []
    n = len(text)
    pos = 0
    fence: str | None = None  # the open fence
    paragraph_open = False  # an indented line right after paragraph text is a continuation
    seg_start = -1

    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl + 1
        line = text[pos : (n if nl < 0 else nl)]
        if line.endswith("\r"):
            line = line[:-1]

        if fence is not None:
            if closes_fence(line, fence):
                fence = None
            pos = end
            continue

        opener = fence_of(line)
        if not line.strip(" \t"):
            kind = "blank"
        elif opener:
            kind = "fence"
            fence = opener[0]
        elif not paragraph_open and _indent_width(line) >= 4:
            kind = "indented code"
        elif heading_text(line) is not None:
            kind = "heading"
        else:
            kind = "text"

        if kind != "text" and seg_start >= 0:
            segments.append((seg_start, pos))
            seg_start = -1
        if kind == "heading":
            segments.append((pos, end))
        elif kind == "text" and seg_start < 0:
            seg_start = pos
        paragraph_open = kind == "text"
        pos = end

    if seg_start >= 0:
        segments.append((seg_start, n))
    return segments


# --- image references -----------------------------------------------------------------------

_PUNCT = r"!-/:-@\[-`{-~"
_BRACKETS = re.compile(rf"\\[{_PUNCT}]|[\[\]]")
_BRACKETS_ONLY = re.compile(r"[\[\]]")
_WS_ONE_NEWLINE = re.compile(r"[ \t]*(?:\r?\n[ \t]*)?")
_DEST_PLAIN = re.compile(r"[^\x00-\x20()\\\x7f]+")
_DEST_ANGLE = re.compile(r"[^<>\r\n\\]+")
_TITLE_BODY = {'"': re.compile(r'[^"\\]+'), "'": re.compile(r"[^'\\]+"), "(": re.compile(r"[^()\\]+")}
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+:")
_SPACES = re.compile(r"\s+")
_BARE_CR = re.compile(r"\r(?!\n)")
_PLAIN_ALT = re.compile(r"(?:\S+(?: \S+)*)?")  # already what whitespace folding would give
# A plain destination without escapes, parentheses or title, as the full parser would read it.
_TAIL_TO_PAREN = re.compile(r"\([ \t]*(?:\r?\n[ \t]*)?[^\x00-\x20()\\\x7f<][^\x00-\x20()\\\x7f]*\(")
_TAIL_SIMPLE = re.compile(r"\([ \t]*([^\x00-\x20()\\\x7f<][^\x00-\x20()\\\x7f]*)[ \t]*\)")


def _is_remote(dest: str) -> bool:
    """True for anything with a URL scheme or a network path: those stay in the text."""
    return bool(_SCHEME.match(dest)) or dest.startswith("//")


class _Scanner:
    """Parses the ``(dest "title")`` tail after an image's closing bracket.

    Parenthesis matches are memoised across calls: a reference whose destination never closes
    must not make every later reference rescan the same stretch of text.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.paren_match: dict[int, int] = {}
        # The first ')' at or after ``_close_from`` (-1: none): every tail needs one, and calls
        # come in increasing order, so one forward pointer answers them all in linear time.
        self._close_from = 0
        self._next_close = -1 if ")" not in text else text.find(")")

    def tail(self, p: int, limit: int) -> tuple[str, int] | None:
        """Parse ``(...)`` starting at ``p``; return (raw destination, end) or None."""
        text = self.text
        if p >= limit or text[p] != "(":
            return None
        if p >= self._close_from:  # (a nested image's tail comes after its outer one's: no pointer)
            if 0 <= self._next_close < p:
                self._next_close = text.find(")", p)
            self._close_from = p
            if self._next_close < 0 or self._next_close >= limit:
                return None  # no ')' left in reach: no destination can close
        simple = _TAIL_SIMPLE.match(text, p, limit)
        if simple is not None:  # the everyday ``(path)`` / ``( path )``, in one regex step
            return simple.group(1), simple.end()
        inner = _TAIL_TO_PAREN.match(text, p, limit)
        if inner is not None and self.paren_match.get(inner.end() - 1, 0) < 0:
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

    def _close_paren(self, p: int, limit: int) -> int:
        """Index of the ')' balancing the '(' at ``p`` within one destination, or -1."""
        memo = self.paren_match
        if p in memo:
            return memo[p]
        text = self.text
        stack = [p]
        i = p + 1
        while stack:
            if i >= limit:
                break
            m = _DEST_PLAIN.match(text, i, limit)
            if m:
                i = m.end()
                continue
            ch = text[i]
            if ch == "\\":
                i += 2
            elif ch == "(":
                known = memo.get(i)
                if known is None:
                    stack.append(i)
                    i += 1
                elif known < 0:
                    break
                else:
                    i = known + 1
            elif ch == ")":
                memo[stack.pop()] = i
                i += 1
            else:
                break  # whitespace ends a destination: whatever is still open never closes
        for opened in stack:
            memo[opened] = -1
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


def _image_pairs(
    text: str, start: int, end: int, spans: list[Range], span_starts: list[int]
) -> list[Range]:
    """(index of '[', index of its ']') for every unescaped ``![`` in the segment with a match."""
    pairs: list[Range] = []
    stack: list[int] = []
    ci = bisect_left(span_starts, start)  # spans never cross a segment boundary
    if (ci >= len(spans) or spans[ci][0] >= end) and text.find("\\", start, end) < 0:
        # No code span and no backslash here (the usual case, and most floods): brackets only.
        push, pop = stack.append, stack.pop
        for m in _BRACKETS_ONLY.finditer(text, start, end):
            p = m.start()
            if text[p] == "[":
                push(p)
            elif stack:
                opener = pop()
                if opener > start and text[opener - 1] == "!":
                    pairs.append((opener, p))
        pairs.sort()
        return pairs
    escape_end = -1
    count = len(spans)
    for m in _BRACKETS.finditer(text, start, end):
        p = m.start()
        while ci < count and spans[ci][1] <= p:
            ci += 1
        if ci < count and spans[ci][0] <= p:
            continue  # inside a code span
        ch = text[p]
        if ch == "\\":
            escape_end = m.end()
        elif ch == "[":
            stack.append(p)
        elif stack:
            opener = stack.pop()
            if opener > start and text[opener - 1] == "!" and escape_end != opener:
                pairs.append((opener, p))
    pairs.sort()
    return pairs


_DEFINITION = re.compile(r"^ {0,3}\[((?:[^\[\]\\\n]|\\.){1,999})\]:[ \t]*\S", re.MULTILINE)
_LABEL_SPACE = re.compile(r"\s+")


def _normal_label(label: str) -> str:
    return _LABEL_SPACE.sub(" ", label.strip()).casefold()


def _reference_labels(text: str) -> set[str]:
    """The labels of the text's link reference definitions (``[label]: destination``)."""
    return {_normal_label(m.group(1)) for m in _DEFINITION.finditer(text)}


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


class _Rebuilder:
    """Rebuilds the text without the lifted references, closing up the gaps they leave.

    A reference inside a sentence becomes a single space; one alone on its line takes the line
    with it; blank lines do not pile up where several lines vanished; the line's indentation is
    kept when text follows the reference. Text away from a removal is copied untouched.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.out: list[str] = []
        self.line_empty = True  # the current output line has no content yet
        self.ends_blank = True  # the output ends with a blank line (or is empty)
        self.pending = False  # a reference was removed and the gap is not closed yet
        self.held_indent = ""
        self._state_before_last = (True, True)  # (line_empty, ends_blank) before out[-1]

    def copy(self, start: int, end: int) -> None:
        piece = self.text[start:end]
        if self.pending:
            piece = self._close_gap(piece)
            if self.pending:
                return
        self._emit(piece)

    def remove(self, start: int) -> None:
        """Called with the text before the reference already copied up to ``start``."""
        if self.out:
            last = self.out[-1]
            stripped = last.rstrip(" \t")
            if stripped != last:
                self.out[-1] = stripped
                gap = last[len(stripped) :]
                # re-derive the tail from the state before that piece, not by rescanning
                self.line_empty, self.ends_blank = self._state_before_last
                self._update_tail(stripped)
                if self.line_empty and not self.pending:
                    self.held_indent = gap
        self.pending = True

    def result(self) -> str:
        text = "".join(self.out)
        if self.pending and self.line_empty:
            # the last line vanished: drop the blank lines it leaves at the end
            end = len(text.rstrip())
            while end < len(text) and text[end] in " \t":
                end += 1
            text = text[:end]
        return text

    def _close_gap(self, piece: str) -> str:
        rest = piece.lstrip(" \t")
        if not rest:
            return ""
        if rest[0] in "\r\n":
            if self.line_empty:
                rest = rest[2:] if rest.startswith("\r\n") else rest[1:]
                self.held_indent = ""
                if self.ends_blank:
                    # drop whole blank lines, keep the next content line's indentation
                    content = len(rest) - len(rest.lstrip(" \t\r\n"))
                    rest = rest[rest.rfind("\n", 0, content) + 1 :]
                if not rest:
                    return ""
            self.pending = False
            return rest
        self.pending = False
        joined = self.held_indent + rest if self.line_empty else " " + rest
        self.held_indent = ""
        return joined

    def _emit(self, piece: str) -> None:
        if not piece:
            return
        self._state_before_last = (self.line_empty, self.ends_blank)
        self.out.append(piece)
        self._update_tail(piece)

    def _update_tail(self, piece: str) -> None:
        if not piece:
            return
        last_nl = piece.rfind("\n")
        if last_nl < 0:
            if piece.strip(" \t\r"):
                self.line_empty = False
                self.ends_blank = False
            return
        tail = piece[last_nl + 1 :]
        before = piece.rfind("\n", 0, last_nl)
        prev_line = piece[before + 1 : last_nl]
        prev_blank = not prev_line.strip(" \t\r") and (before >= 0 or self.line_empty)
        self.line_empty = not tail.strip(" \t\r")
        self.ends_blank = self.line_empty and prev_blank


# --- entry point ----------------------------------------------------------------------------


def old_extract_markdown_media(text: str) -> tuple[str, list[OldMarkdownMediaRef]]:
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
    segments = _inline_segments(text)
    spans: list[Range] = []
    for start, end in segments:
        if text.find("`", start, end) >= 0:
            spans.extend(code_spans(text, start, end))
    span_starts = [s for s, _ in spans]
    scanner = _Scanner(text)

    refs: list[OldMarkdownMediaRef] = []
    removals: list[Range] = []
    labels: set[str] | None = None  # reference definitions, read only if an image might use one
    for seg_start, seg_end in segments:
        if text.find("![", seg_start, seg_end) < 0:
            continue
        consumed = seg_start
        for opener, closer in _image_pairs(text, seg_start, seg_end, spans, span_starts):
            if opener - 1 < consumed:
                continue  # inside an earlier image's alt text: only alt text, never a file
            if span_starts:
                nxt = bisect_left(span_starts, closer + 1)
                limit = min(seg_end, span_starts[nxt]) if nxt < len(span_starts) else seg_end
            else:
                limit = seg_end
            parsed = scanner.tail(closer + 1, limit)
            if parsed is None:
                if text.find("![", opener + 1, closer) >= 0:
                    # ![...![x](x.png)...][label] or ![...][] / ![...]: an image by reference
                    # (which is not lifted) makes the images in its label mere alt text.
                    if labels is None:
                        labels = _reference_labels(text)
                    reference_end = _reference_image_end(text, opener, closer, limit, labels)
                    if reference_end is not None:
                        consumed = reference_end
                continue
            raw_dest, end = parsed
            consumed = end
            path = unescape(raw_dest) if "\\" in raw_dest else raw_dest
            if not path.strip() or _is_remote(path):
                continue
            alt = text[opener + 1 : closer]
            if "\\" in alt:
                alt = unescape(alt)
            if not _PLAIN_ALT.fullmatch(alt):
                alt = _SPACES.sub(" ", alt).strip()
            refs.append(OldMarkdownMediaRef(alt=alt, path=path))
            removals.append((opener - 1, end))

    if not removals:
        return original, []
    rebuilt = _Rebuilder(text)
    pos = 0
    for start, end in removals:
        rebuilt.copy(pos, start)
        rebuilt.remove(start)
        pos = end
    rebuilt.copy(pos, len(text))
    body = rebuilt.result()
    if not body.strip(" \t\n"):
        body = ""  # nothing but the blanks the references stood between
    return body, refs


# ============================================================================================
# End of the reference oracle.
# ============================================================================================


def as_old(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The oracle's output, its references as (alt, path)."""
    body, refs = old_extract_markdown_media(text)
    return body, [(r.alt, r.path) for r in refs]
