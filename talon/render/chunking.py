"""Cut a long markdown reply into pieces that each fit a platform's message limit once rendered.

The cut happens on the markdown, before rendering, so every piece is valid markup of its own.
Preference order: between paragraphs, then between lines, then between words, and only as a last
resort inside a word. A fenced code block is never split by a paragraph or line cut; when one
block alone is too long it is cut between its lines and each piece is closed and reopened with the
same fence and language, so every message shows a complete code block.

Sizes come from ``measure`` (the rendered length in the platform's unit). Rendering is line-local
(see ``talon.render.markdown``), so a chunk's size is the sum of its pieces plus the newlines
between them, or less; every chunk is measured once more at the end and re-cut if it is still
over, so the limit holds even where that estimate is off.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from talon.render.markdown import closes_fence, fence_of

Measure = Callable[[str], int]

_QUOTE_PREFIX = re.compile(r" {0,3}>[ >]*")
_WORD_GAP = re.compile(r"\s+")
_MIN_CODE_ROOM = 8  # below this a code block is cut as plain lines without its fences
_MAX_REFITS = 6


@dataclass
class _Unit:
    sep: str  # the newlines that preceded this unit in the source
    lines: list[str]
    code: tuple[str, str, str] | None = None  # (opening, closing, indentation) for a fenced block


def split_markdown(md: str, limit: int, measure: Measure) -> list[str]:
    """Pieces of ``md`` whose ``measure`` is each at most ``limit``; empty text gives []."""
    if limit < 1:
        raise ValueError("limit must be positive")
    md = md.replace("\r\n", "\n").strip("\n")
    if not md.strip():
        return []
    if measure(md) <= limit:
        return [md]
    return _fit(md, limit, limit, measure, 0)


def _fit(text: str, limit: int, budget: int, measure: Measure, depth: int) -> list[str]:
    out: list[str] = []
    for chunk in _split(text, budget, measure):
        size = measure(chunk)
        if size <= limit:
            out.append(chunk)
        elif depth >= _MAX_REFITS or budget - (size - limit) < 1:
            out.extend(_hard_cut(chunk, limit, measure))
        else:
            out.extend(_fit(chunk, limit, budget - (size - limit), measure, depth + 1))
    return out


def _units(text: str) -> list[_Unit]:
    """Paragraphs and fenced code blocks, with the blank lines that separated them."""
    lines = text.split("\n")
    units: list[_Unit] = []
    sep = ""
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            sep += "\n"
            i += 1
            continue
        unit_sep = (sep + "\n") if units else ""
        sep = ""
        opened = fence_of(line)
        if opened:
            fence = opened[0]
            indent = line[: len(line) - len(line.lstrip(" "))]
            j = i + 1
            while j < n and not closes_fence(lines[j], fence):
                j += 1
            closing = lines[j] if j < n else indent + fence
            units.append(_Unit(unit_sep, lines[i + 1 : j], (line, closing, indent)))
            i = j + 1
            continue
        j = i
        while j < n and lines[j].strip() and not fence_of(lines[j]):
            j += 1
        units.append(_Unit(unit_sep, lines[i:j]))
        i = j
    return units


def _source(unit: _Unit) -> str:
    if unit.code is None:
        return "\n".join(unit.lines)
    opening, closing, _ = unit.code
    return "\n".join([opening, *unit.lines, closing])


def _split(text: str, budget: int, measure: Measure) -> list[str]:
    pieces: list[tuple[str, str, int]] = []  # (separator before, markdown, measured size)
    for unit in _units(text):
        source = _source(unit)
        size = measure(source)
        if size <= budget:
            pieces.append((unit.sep, source, size))
            continue
        cut = _cut_code(unit, budget, measure) if unit.code else _cut_lines(unit.lines, budget, measure)
        for k, (piece, piece_size) in enumerate(cut):
            pieces.append((unit.sep if k == 0 else "\n", piece, piece_size))
    return _pack(pieces, budget)


def _pack(pieces: list[tuple[str, str, int]], budget: int) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for sep, piece, piece_size in pieces:
        if current and size + len(sep) + piece_size <= budget:
            current.append(sep)
            current.append(piece)
            size += len(sep) + piece_size
            continue
        if current:
            chunks.append("".join(current))
        current = [piece]
        size = piece_size
    if current:
        chunks.append("".join(current))
    return chunks


def _cut_lines(lines: list[str], budget: int, measure: Measure) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for line in lines:
        size = measure(line)
        if size <= budget:
            out.append((line, size))
        else:
            out.extend((piece, measure(piece)) for piece in _cut_line(line, budget, measure))
    return out


def _cut_line(line: str, budget: int, measure: Measure) -> list[str]:
    """Cut one long line between words (inside a word only when one word is too long)."""
    m = _QUOTE_PREFIX.match(line)
    prefix = m.group() if m else ""
    if prefix and measure(prefix + "x") * 4 > budget:
        prefix = ""  # the marker would crowd out the text
    pieces: list[str] = []
    rest = line
    while not _fits(rest, budget, measure):
        marker = _QUOTE_PREFIX.match(rest)
        floor = marker.end() if marker else 0  # never cut a piece down to its bare '>'
        cut = _word_cut(rest, budget, measure, floor)
        if cut <= floor:
            cut = _char_cut(rest, budget, measure)
        head = rest[:cut].rstrip()
        tail = rest[cut:].lstrip()
        if not tail:
            break
        pieces.append(head)
        rest = prefix + tail
    pieces.append(rest)
    return pieces


def _search_bound(text: str, budget: int) -> int:
    return min(len(text), _longest_fitting(budget))


def _longest_fitting(budget: int) -> int:
    # Rendering never shrinks text below about half its source length (a backslash escape is
    # the worst case), so no source much longer than twice the budget can fit.
    return 2 * budget + 8


def _fits(text: str, budget: int, measure: Measure) -> bool:
    # Measuring the whole remainder of a huge line on every cut would be quadratic; past the
    # bound it cannot fit anyway.
    return len(text) <= _longest_fitting(budget) and measure(text) <= budget


def _word_cut(text: str, budget: int, measure: Measure, floor: int) -> int:
    """Largest index just before a whitespace gap whose prefix fits, or 0."""
    bound = _search_bound(text, budget)
    cuts = [g.start() for g in _WORD_GAP.finditer(text, 0, bound + 1) if g.start() > floor]
    lo, hi, best = 0, len(cuts) - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if measure(text[: cuts[mid]]) <= budget:
            best = cuts[mid]
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def _char_cut(text: str, budget: int, measure: Measure) -> int:
    """Largest prefix length that fits (at least 1, so cutting always progresses)."""
    lo, hi, best = 1, _search_bound(text, budget), 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if measure(text[:mid]) <= budget:
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def _hard_cut(text: str, limit: int, measure: Measure) -> list[str]:
    """Last resort: plain prefix cuts that fit, whatever markup they cross."""
    pieces: list[str] = []
    rest = text
    while rest and not _fits(rest, limit, measure):
        cut = _char_cut(rest, limit, measure)
        pieces.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        pieces.append(rest)
    return pieces


def _cut_code(unit: _Unit, budget: int, measure: Measure) -> list[tuple[str, int]]:
    """Cut a fenced block between its lines, closing and reopening the fence in every piece."""
    assert unit.code is not None
    opening, closing, _ = unit.code
    overhead = measure(opening + "\n" + closing)
    room = budget - overhead
    if room < _MIN_CODE_ROOM:
        return _cut_lines(unit.lines, budget, measure)

    def wrapped(lines: list[str]) -> str:
        return "\n".join([opening, *lines, closing])

    sized: list[tuple[str, int]] = []
    for line in unit.lines:
        size = measure(wrapped([line])) - overhead
        if size <= room:
            sized.append((line, size))
            continue
        rest = line  # one code line longer than a message: cut it where it must be cut
        while rest:
            lo, hi, best = 1, min(len(rest), _search_bound(rest, room)), 1
            while lo <= hi:
                mid = (lo + hi) // 2
                if measure(wrapped([rest[:mid]])) - overhead <= room:
                    best = mid
                    lo = mid + 1
                else:
                    hi = mid - 1
            part = rest[:best]
            sized.append((part, measure(wrapped([part])) - overhead))
            rest = rest[best:]

    out: list[tuple[str, int]] = []
    group: list[str] = []
    used = 0
    for line, size in sized:
        extra = size + (1 if group else 0)
        if group and used + extra > room:
            text = wrapped(group)
            out.append((text, measure(text)))
            group, used = [], 0
            extra = size
        group.append(line)
        used += extra
    if group or not out:
        text = wrapped(group)
        out.append((text, measure(text)))
    return out
