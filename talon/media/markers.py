"""Defanging text that imitates Talon's own markers (``<<<UNTRUSTED DOCUMENT ...>>>``,
``<<<END UNTRUSTED DOCUMENT>>>``, and the ``<<<MEMORY AGENTS.md`` pair).

A model reads lookalikes as the real thing, so matching runs on a *skeleton* of the text, not on
the text: HTML character references are decoded (``&lt;``, ``&#60;``), default-ignorable code
points are dropped (zero-width space and joiner, soft hyphen, word joiner, variation selectors,
Hangul fillers, tags...), the text is decomposed (NFKD: fullwidth ``＜``, ``ＥＮＤ``, mathematical
letters) and combining marks are dropped (``Ü``, ``U`` + U+0301, stacked "zalgo" marks), a
confusables table maps letters that look Latin (Cyrillic ``Т``, ``Е``, Greek ``Τ``, Cherokee and
Lisu capitals, small capitals ``ᴍ``, the digit ``0`` in ``MEM0RY``...) and bracket-like signs
(``‹ « ≪ ⟨ 〈 ❮ ❰ ⊲ ◁``) to the ASCII they imitate, and case is ignored. Anything there that
resembles a marker is broken up: an opening of angle brackets (``<<<``, ``<``, ``</``, ``< < <``,
``<!--``, ``<|``), optionally END joined to the word any way (``END UNTRUSTED``, ``END_``,
``END—``, ``ENDUNTRUSTED``), then the word, even spelled with single spaces, dots or hyphens
between its letters (``U N T R U S T E D``, ``UN-TRUSTED``); or END and the word with no opening
but a closing ``>>`` later on the line (``END UNTRUSTED GROUP CHATTER>>>``). In the original the
opening's signs become ``(`` and the word gets a hyphen after its second letter
(``UN-TRUSTED``), which neither a reader nor this matcher takes for a marker. The rest of the text
is kept as it was.

``defang_untrusted`` is THE defang of every block of outside text Talon puts before the model
(documents, group chatter and its speakers' names, quoted replies, transcripts, AGENTS.md, MCP and
web results): it breaks look-alikes of every marker Talon uses (``UNTRUSTED ...`` and ``MEMORY``),
so no block can close itself or open another, whichever block it sits in.
"""

from __future__ import annotations

import functools
import html
import re
import unicodedata
from collections.abc import Iterable

__all__ = ["MARKER_WORDS", "defang_markers", "defang_untrusted", "skeleton"]

# The words every marker of Talon's is built on: <<<UNTRUSTED DOCUMENT>>>, <<<END UNTRUSTED GROUP
# CHATTER>>>, <<<MEMORY AGENTS.md ...>>>...
MARKER_WORDS = ("UNTRUSTED", "MEMORY")

# Letters from other scripts (and a digit) that render like the Latin capitals of END, UNTRUSTED
# and MEMORY; looked up as they are and lower-cased (after NFKD, without combining marks).
_LETTERS = {
    # Cyrillic
    "а": "A", "в": "B", "е": "E", "ё": "E", "к": "K", "м": "M", "н": "H", "о": "O", "р": "P",
    "с": "C", "т": "T", "у": "Y", "х": "X", "ѕ": "S", "і": "I", "ї": "I", "ј": "J", "ԁ": "D",
    "ԛ": "Q", "ԝ": "W", "ɡ": "G", "ս": "U", "ц": "U", "п": "N", "и": "N", "д": "D", "г": "R",
    "ү": "Y", "ұ": "Y", "ꙋ": "Y", "ԍ": "G", "є": "E", "э": "E",
    # Greek (capital Upsilon looks like Y, small upsilon like u)
    "α": "A", "β": "B", "ε": "E", "ζ": "Z", "η": "H", "ι": "I", "κ": "K", "μ": "M", "ν": "N",
    "ο": "O", "ρ": "P", "τ": "T", "υ": "U", "χ": "X", "δ": "D", "Υ": "Y", "ϒ": "Y", "Ϻ": "M",
    "ϻ": "M", "σ": "O",
    # Armenian
    "օ": "O", "Օ": "O", "Տ": "S", "Ս": "U", "Մ": "U",
    # Cherokee capitals (their lower-case forms are other code points, listed here too)
    "Ꭰ": "D", "Ꭱ": "R", "Ꭲ": "T", "Ꭼ": "E", "Ꮇ": "M", "Ꮎ": "O", "Ꮢ": "R", "Ꮪ": "S",
    "Ꮥ": "S", "Ꭹ": "Y", "Ꮃ": "W", "Ꮤ": "W", "Ꮯ": "C", "Ꮐ": "G", "Ꮋ": "H", "Ꮶ": "K",
    "ꭰ": "D", "ꭱ": "R", "ꭲ": "T", "ꭼ": "E", "ꮇ": "M", "ꮎ": "O", "ꮢ": "R", "ꮪ": "S",
    "ꮥ": "S", "ꭹ": "Y",
    # Lisu
    "ꓐ": "B", "ꓑ": "P", "ꓒ": "D", "ꓓ": "D", "ꓔ": "T", "ꓕ": "T", "ꓖ": "G", "ꓗ": "K", "ꓚ": "C",
    "ꓛ": "C", "ꓜ": "Z", "ꓝ": "F", "ꓟ": "M", "ꓠ": "N", "ꓡ": "L", "ꓢ": "S", "ꓣ": "R", "ꓦ": "V",
    "ꓧ": "H", "ꓫ": "X", "ꓬ": "Y", "ꓮ": "A", "ꓰ": "E", "ꓲ": "I", "ꓳ": "O", "ꓴ": "U", "ꓵ": "U",
    # Canadian syllabics, Coptic, signs
    "ᑌ": "U", "ᑎ": "N", "ᗞ": "D", "ᗪ": "D", "ᖇ": "R", "ᗰ": "M", "ᔕ": "S", "ᕮ": "E", "᙭": "X",
    "ⲧ": "T", "Ⲧ": "T", "ⲟ": "O", "Ⲟ": "O", "ⲙ": "M", "Ⲙ": "M", "ⲉ": "E", "Ⲉ": "E", "ⲛ": "N",
    "Ⲛ": "N", "ⲣ": "P", "Ⲣ": "P", "ⲩ": "Y", "Ⲩ": "Y", "ⲅ": "R",
    "∪": "U", "⋃": "U", "⊤": "T", "⟙": "T", "∩": "N", "⋂": "N", "∈": "E", "∊": "E", "∑": "E",
    "○": "O", "◯": "O", "⭘": "O", "°": "O",
    # Latin look-alikes that NFKD keeps (small capitals beyond these: see ``_small_capital``)
    "ı": "I", "ℓ": "L", "ʀ": "R", "ɴ": "N", "ᴅ": "D", "ᴇ": "E", "ᴛ": "T", "ᴜ": "U", "ꜱ": "S",
    "ꞓ": "E", "ɛ": "E", "ǝ": "E", "ɘ": "E", "ⴹ": "E", "ɑ": "A", "ȷ": "J", "ø": "O", "ɵ": "O",
    "đ": "D", "ð": "D", "ŧ": "T", "ƭ": "T", "ʈ": "T", "ɱ": "M", "ɲ": "N", "ŋ": "N", "ʉ": "U",
    "ɍ": "R", "ɹ": "R", "ʂ": "S", "ƴ": "Y", "ɏ": "Y", "ʏ": "Y",
}
# ASCII that imitates a marker's letter: a digit zero in MEM0RY.
_ASCII = {"0": "O"}
# Signs that look like one or two opening / closing angle brackets, or a slash.
_BRACKETS = {
    "‹": "<", "«": "<<", "≪": "<<", "⋘": "<<<", "⟨": "<", "〈": "<", "〈": "<", "❮": "<", "⟪": "<<",
    "《": "<<", "﹤": "<", "ᐸ": "<", "˂": "<", "❬": "<", "⦉": "<", "⧼": "<", "❰": "<", "⊲": "<",
    "◁": "<", "◀": "<", "◅": "<", "◄": "<", "⏴": "<", "⋖": "<", "≺": "<", "⦑": "<", "⦓": "<",
    "⧀": "<", "❪": "<", "ᐊ": "<", "ᑉ": "<", "⩽": "<", "≤": "<", "≦": "<", "⪡": "<<", "⫷": "<<<",
    "›": ">", "»": ">>", "≫": ">>", "⋙": ">>>", "⟩": ">", "〉": ">", "〉": ">", "❯": ">", "⟫": ">>",
    "》": ">>", "﹥": ">", "ᐳ": ">", "˃": ">", "❭": ">", "⦊": ">", "⧽": ">", "❱": ">", "⊳": ">",
    "▷": ">", "▶": ">", "▻": ">", "►": ">", "⏵": ">", "⋗": ">", "≻": ">", "⦒": ">", "⦔": ">",
    "⧁": ">", "❫": ">", "ᐅ": ">", "ᑊ": ">", "⩾": ">", "≥": ">", "≧": ">", "⪢": ">>", "⫸": ">>>",
    "⁄": "/", "∕": "/", "⧸": "/", "／": "/", "╱": "/", "⟋": "/",
}
# Default-ignorable code points that are not format characters (Cf, dropped as a category):
# combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian variation selectors,
# variation selectors, musical format signs.
_IGNORABLE_RANGES = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
                     (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0x1D173, 0x1D17A),
                     (0xE0000, 0xE0FFF))
# HTML character references (named, decimal, hexadecimal); a page or a result may carry markers so.
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[a-zA-Z][a-zA-Z0-9]{1,31});?")


def _ignorable(ch: str) -> bool:
    """A default-ignorable code point (invisible when rendered) or a combining mark."""
    if unicodedata.category(ch) in ("Cf", "Mn", "Me"):
        return True
    code = ord(ch)
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def _small_capital(ch: str) -> str | None:
    """``ᴍ`` (LATIN LETTER SMALL CAPITAL M) -> ``M``; None for anything else."""
    code = ord(ch)
    if not (0x0250 <= code <= 0x02AF or 0x1D00 <= code <= 0x1D2B or 0xA720 <= code <= 0xA7FF):
        return None
    name = unicodedata.name(ch, "")
    for prefix in ("LATIN LETTER SMALL CAPITAL ", "LATIN SMALL CAPITAL LETTER "):
        if name.startswith(prefix) and len(name) == len(prefix) + 1:
            return name[-1]
    return None


@functools.lru_cache(maxsize=8192)
def _fold(ch: str) -> str:
    """One non-ASCII character as the ASCII it reads as; "" for an invisible one."""
    if _ignorable(ch):
        return ""
    out = []
    for piece in unicodedata.normalize("NFKD", ch):
        if _ignorable(piece):
            continue
        if piece.isascii():
            out.append(_ASCII.get(piece, piece.upper()))
            continue
        mapped = (_BRACKETS.get(piece) or _LETTERS.get(piece) or _LETTERS.get(piece.lower())
                  or _small_capital(piece))
        out.append(mapped if mapped is not None else piece.lower().upper())
    return "".join(out)


def skeleton(text: str) -> tuple[str, list[int]]:
    """The folded text matching runs on, and for each of its characters the index in ``text``."""
    out: list[str] = []
    origin: list[int] = []
    entities = {m.start(): m for m in _ENTITY.finditer(text)} if "&" in text else {}
    i = 0
    while i < len(text):
        entity = entities.get(i)
        if entity is not None:
            decoded = html.unescape(entity.group())
            if decoded != entity.group():
                for ch in decoded:
                    for folded in (_ASCII.get(ch, ch.upper()) if ch.isascii() else _fold(ch)):
                        out.append(folded)
                        origin.append(i)
                i = entity.end()
                continue
        ch = text[i]
        if ch.isascii():
            out.append(_ASCII.get(ch, ch.upper()))
            origin.append(i)
        else:
            for folded in _fold(ch):
                out.append(folded)
                origin.append(i)
        i += 1
    return "".join(out), origin


def _open_paren(opening: str) -> str:
    """An opening with every sign that is not a space or a letter (brackets and look-alikes,
    slashes, invisible characters) turned into ``(``; END's letters are kept."""
    out = []
    for ch in opening:
        folded = ch if ch.isascii() else _fold(ch)
        out.append(ch if ch.isspace() or (folded.isalpha() and folded.isascii()) else "(")
    return "".join(out)


def _spelled(word: str) -> str:
    """``word`` with at most one space, dot, hyphen or underscore between its letters."""
    return r"[\s._\-]?".join(re.escape(letter) for letter in word.upper())


def _pattern(words: Iterable[str]) -> re.Pattern[str]:
    names = "|".join(_spelled(w) for w in words)
    # An opening of angle brackets with any signs and spaces among them (a slash, "!--", "|"),
    # then optionally END joined by anything or nothing, then the marker's word; or END and the
    # word with no opening, closed by ">>" later on the line.
    return re.compile(rf"<[\W_]*(?:END[\W_]*)?({names})|\bEND[\W_]*({names})(?=[^\n<]{{0,120}}>>)")


_CACHE: dict[tuple[str, ...], re.Pattern[str]] = {}


def defang_markers(text: str, words: Iterable[str] = ("UNTRUSTED",)) -> str:
    """``text`` with everything that resembles a marker built on one of ``words`` broken up."""
    key = tuple(words)
    pattern = _CACHE.get(key)
    if pattern is None:
        pattern = _CACHE[key] = _pattern(key)
    folded, origin = skeleton(text)
    edits: list[tuple[int, int, str]] = []  # (start, end) in ``text``, replacement
    for match in pattern.finditer(folded):
        group = 1 if match.group(1) is not None else 2
        start = origin[match.start()]
        word = match.start(group)
        # The opening (brackets, slash, spaces, END...) up to the word: its signs become "(".
        opening = _open_paren(text[start:origin[word]])
        # The word itself, with a hyphen after its second letter (in the original characters).
        second = origin[word + 1] if word + 1 < len(origin) else origin[word]
        end_of_word = origin[match.end(group) - 1] + 1
        edits.append((start, end_of_word,
                       opening + text[origin[word]:second + 1] + "-" + text[second + 1:end_of_word]))
    if not edits:
        return text
    out: list[str] = []
    last = 0
    for start, end, replacement in edits:
        if start < last:
            continue
        out.append(text[last:start])
        out.append(replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def defang_untrusted(text: str) -> str:
    """Outside text made safe to place between Talon's markers (see the module docstring)."""
    return defang_markers(text, MARKER_WORDS)
