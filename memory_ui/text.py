"""Normalizing a memory's text: what makes two sentences "the same" (a fingerprint) and
near-duplicates (a portable similarity, where PostgreSQL's trigram similarity is not there)."""

from __future__ import annotations

import hashlib
import re
import unicodedata

_NOT_WORD = re.compile(r"[^\w]+", re.UNICODE)


def marks(text: str) -> str:
    """The combining marks in `text` (a Devanagari vowel sign, an Arabic vowel point, a
    Thai tone mark), escaped for a regex character class: `\\w` matches none of them, yet
    "दिन" and "दान" differ only in theirs. Empty for most texts."""
    if text.isascii():
        return ""
    found = {ch for ch in text if unicodedata.category(ch).startswith("M")}
    return re.escape("".join(sorted(found)))


def normalize(text: str) -> str:
    """Lower case, compatibility forms folded, punctuation and runs of space made one space;
    a word's combining marks are kept with it."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = marks(folded)
    not_word = re.compile(rf"[^\w{kept}]+") if kept else _NOT_WORD
    return not_word.sub(" ", folded).strip()


def fingerprint(text: str) -> str:
    """SHA-256 of the normalized text: equal for sentences differing only in case, spacing
    and punctuation. A text with no letter or digit ("🚀", "!!!") is its folded characters
    themselves, so two of them are not one sentence."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    key = normalize(text) or " ".join(folded.split())
    return hashlib.sha256(key.encode()).hexdigest()


def trigrams(text: str) -> set[str]:
    """PostgreSQL pg_trgm's trigrams of a text: each word padded with two spaces in front and
    one behind, lower-cased (so `similarity` below matches pg_trgm's closely)."""
    grams: set[str] = set()
    for word in normalize(text).split():
        padded = f"  {word} "
        grams.update(padded[i : i + 3] for i in range(len(padded) - 2))
    return grams


def similarity(a: str, b: str) -> float:
    """pg_trgm's `similarity`: shared trigrams over all trigrams of either (0 to 1)."""
    left, right = trigrams(a), trigrams(b)
    if not left or not right:
        return 0.0
    return len(left & right) / len(left | right)
