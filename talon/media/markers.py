"""Defanging text that imitates Talon's own markers (``<<<UNTRUSTED DOCUMENT ...>>>``,
``<<<END UNTRUSTED DOCUMENT>>>``, and the ``<<<MEMORY AGENTS.md`` pair).

A model reads lookalikes as the real thing, so matching runs on a *skeleton* of the text, not on
the text: invisible format characters (zero-width space, word joiner...) are dropped, NFKC folds
compatibility forms (fullwidth ``＜``, ``ＥＮＤ``), a confusables table maps letters that look Latin
(Cyrillic ``Т``, ``Е``, Greek ``Τ``...) and bracket-like signs (``‹ « ≪ ⟨ 〈 ❮``) to the ASCII they
imitate, and case is ignored. Anything there that resembles either marker, however it opens
(``<<<``, ``<``, ``</``, ``«``) and however END is joined to the word (``END UNTRUSTED``,
``END_UNTRUSTED``, ``ENDUNTRUSTED``, ``END-UNTRUSTED``), is broken up at the same place in the
original: the brackets become ``(`` and the word gets a hyphen (``UN-TRUSTED``), which neither a
reader nor this matcher takes for a marker. The rest of the text is kept as it was.

``defang_untrusted`` is THE defang of every block of outside text Talon puts before the model
(documents, group chatter and its speakers' names, quoted replies, transcripts, AGENTS.md, tool
results from outside): it breaks look-alikes of every marker Talon uses (``UNTRUSTED ...`` and
``MEMORY``), so no block can close itself or open another, whichever block it sits in.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["MARKER_WORDS", "defang_markers", "defang_untrusted", "skeleton"]

# The words every marker of Talon's is built on: <<<UNTRUSTED DOCUMENT>>>, <<<END UNTRUSTED GROUP
# CHATTER>>>, <<<MEMORY AGENTS.md ...>>>...
MARKER_WORDS = ("UNTRUSTED", "MEMORY")

# Letters from other scripts that render like Latin capitals (lower case is folded first).
_LETTERS = {
    # Cyrillic
    "а": "A", "в": "B", "е": "E", "ё": "E", "к": "K", "м": "M", "н": "H", "о": "O", "р": "P",
    "с": "C", "т": "T", "у": "Y", "х": "X", "ѕ": "S", "і": "I", "ї": "I", "ј": "J", "ԁ": "D",
    "ԛ": "Q", "ԝ": "W", "ɡ": "G", "ս": "U", "ц": "U", "п": "N", "и": "N", "д": "D", "г": "R",
    # Greek
    "α": "A", "β": "B", "ε": "E", "ζ": "Z", "η": "H", "ι": "I", "κ": "K", "μ": "M", "ν": "N",
    "ο": "O", "ρ": "P", "τ": "T", "υ": "U", "χ": "X", "δ": "D",
    # Latin look-alikes that NFKC keeps
    "ı": "I", "ℓ": "L", "ʀ": "R", "ɴ": "N", "ᴅ": "D", "ᴇ": "E", "ᴛ": "T", "ᴜ": "U", "ꜱ": "S",
}
# Signs that look like one or two opening / closing angle brackets, or a slash.
_BRACKETS = {
    "‹": "<", "«": "<<", "≪": "<<", "⋘": "<<<", "⟨": "<", "〈": "<", "〈": "<", "❮": "<", "⟪": "<<",
    "《": "<<", "﹤": "<", "ᐸ": "<", "˂": "<", "❬": "<", "⦉": "<", "⧼": "<",
    "›": ">", "»": ">>", "≫": ">>", "⋙": ">>>", "⟩": ">", "〉": ">", "〉": ">", "❯": ">", "⟫": ">>",
    "》": ">>", "﹥": ">", "ᐳ": ">", "˃": ">", "❭": ">", "⦊": ">", "⧽": ">",
    "⁄": "/", "∕": "/", "⧸": "/", "／": "/",
}


def skeleton(text: str) -> tuple[str, list[int]]:
    """The folded text matching runs on, and for each of its characters the index in ``text``."""
    out: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(text):
        if ch.isascii():
            out.append(ch.upper())
            origin.append(i)
            continue
        if unicodedata.category(ch) == "Cf":
            continue
        for piece in unicodedata.normalize("NFKC", ch):
            mapped = _BRACKETS.get(piece)
            if mapped is None:
                low = piece.lower()
                mapped = _LETTERS.get(low) or (piece.upper() if piece.isascii() else low.upper())
            for folded in mapped:
                out.append(folded)
                origin.append(i)
    return "".join(out), origin


def _pattern(words: Iterable[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(w.upper()) for w in words)
    # An opening of brackets and/or a slash, then optionally END (joined by anything or
    # nothing), then the marker's word.
    return re.compile(rf"<[\s<]*/?\s*(?:END[\s_\-.:]*)?({names})")


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
        start = origin[match.start()]
        word = match.start(1)
        # The opening (brackets, slash, spaces, END...) up to the word: brackets become "(".
        opening = text[start:origin[word]]
        opening = re.sub(r"[<>/]|[^\w\s]", "(", opening) if opening else ""
        # The word itself, with a hyphen after its second letter (in the original characters).
        second = origin[word + 1] if word + 1 < len(origin) else origin[word]
        end_of_word = origin[match.end(1) - 1] + 1
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
