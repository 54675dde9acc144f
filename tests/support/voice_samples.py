"""The project's multilingual voice-note samples and the word error rate of a transcription.

The samples and their reference transcripts are listed in tests/fixtures/voice_samples.json
(made by benchmarks/make_voice_samples.py). Word error rate is jiwer's, after a small
normalization of both sides: lowercase, apostrophes dropped (``it's`` is ``its``), other punctuation and symbols
turned into spaces (``est-ce`` is two words), whitespace collapsed.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass(frozen=True)
class VoiceSample:
    path: Path
    language: str
    text: str


def voice_samples() -> list[VoiceSample]:
    listing = json.loads((FIXTURES / "voice_samples.json").read_text(encoding="utf-8"))
    return [VoiceSample(FIXTURES / s["file"], s["language"], s["text"]) for s in listing["samples"]]


def normalize(text: str) -> str:
    """Lowercase words without punctuation: what the word error rate compares."""
    text = unicodedata.normalize("NFC", text).lower().replace("'", "").replace("\u2019", "")
    text = "".join(" " if unicodedata.category(ch).startswith(("P", "S")) else ch for ch in text)
    return re.sub(r"\s+", " ", text).strip()


def word_error_rate(references: Iterable[str], hypotheses: Iterable[str]) -> float:
    """Word error rate over all pairs together (errors / reference words), both normalized."""
    import jiwer

    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    if any(not r for r in refs):
        raise ValueError("a reference transcript is empty after normalization")
    return float(jiwer.wer(refs, hyps))


def wer_by_language(results: Mapping[VoiceSample, str]) -> dict[str, float]:
    """Word error rate per language (its samples together), and ``all`` of them together."""
    refs: dict[str, list[str]] = defaultdict(list)
    hyps: dict[str, list[str]] = defaultdict(list)
    for sample, hypothesis in results.items():
        for key in (sample.language, "all"):
            refs[key].append(sample.text)
            hyps[key].append(hypothesis)
    return {key: word_error_rate(refs[key], hyps[key]) for key in refs}
