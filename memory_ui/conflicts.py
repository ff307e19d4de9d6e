"""When two memories say the same thing, and when they contradict each other.

Two sentences near-identical in their words may still disagree: "the staging database runs on
port 5432" and "… port 5433"; "never deploy on Fridays" and "always deploy on Fridays". Such a
pair is a conflict, never a duplicate: merging the second into the first would lose the newer
fact. The rule, on normalized text:

- a sentence's *claims* are its numbers (ports, dates, versions, amounts: "3.11", "2023",
  "5pm" counts as 5), the parity of its negations ("not", "never", "no", "n't" …) and its
  quantifiers and opposites ("always"/"never", "before"/"after", "enable"/"disable" …);
- its *frame* is what is left when those words are taken out;
- two sentences conflict when their frames have the same content words (filler such as "the",
  "now", "does" aside, inflections folded: frame_words) and their claims differ;
- they mean the same (a re-proposal to merge) when their frames and claims are both equal.

Because both need the same frame, its hash (frame_key, stored on every memory and indexed
with the project and scope) finds a proposal's duplicates and contradictions with one btree
lookup, however many memories the scope holds.

Pure functions: no database. selectors.near_memories asks them about the memories of the same
frame_key.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from memory_ui.text import marks

# a number with its inner separators ("3.11", "2026-03-01", "1,000", "10:30"), or a word
_TOKEN = re.compile(r"\d+(?:[.,:/-]\d+)*|[^\W\d_]+")
# "doesn't" → "does not", "can't" → "can not", "won't" → "will not"
_CONTRACTION = re.compile(r"\b(\w+?)n['’]t\b")
_IRREGULAR = {"ca": "can", "wo": "will", "sha": "shall"}

NEGATIONS = frozenset({"not", "no", "never", "none", "nothing", "nobody", "neither", "nor"})
# Groups of opposites, each word with its forms: two sentences disagree when they use
# different words of one group ("always" and "never", "enable" and "disabled").
OPPOSITES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"always": (), "never": (), "sometimes": (), "usually": (), "rarely": ()},
    {"before": (), "after": ()},
    {"above": (), "below": ()},
    {"more": (), "less": (), "fewer": ()},
    {"higher": (), "lower": ()},
    {"increase": ("increases", "increased"), "decrease": ("decreases", "decreased")},
    {"minimum": ("min",), "maximum": ("max",)},
    {"enable": ("enables", "enabled"), "disable": ("disables", "disabled")},
    {
        "allow": ("allows", "allowed"),
        "forbid": ("forbids", "forbidden"),
        "deny": ("denies", "denied"),
        "block": ("blocks", "blocked"),
    },
    {"true": (), "false": ()},
    {"on": (), "off": ()},
    {
        "prefer": ("prefers", "preferred"),
        "avoid": ("avoids", "avoided"),
        "dislike": ("dislikes", "disliked"),
    },
    {"like": ("likes", "liked"), "hate": ("hates", "hated")},
    {"include": ("includes", "included"), "exclude": ("excludes", "excluded")},
    {"first": (), "last": ()},
    {"earliest": (), "latest": ()},
    {"dark": (), "light": ()},
)
# a form → (its group, its word)
_LEMMA = {
    form: (i, word)
    for i, group in enumerate(OPPOSITES)
    for word, forms in group.items()
    for form in (word, *forms)
}
# "on" is mostly a preposition ("deploy on Fridays"): a claim only as the last word ("the
# cache is on", "turn it on")
_WEAK = frozenset({"on"})


# words that carry no fact of their own: a re-proposal may add or drop them and still mean
# the same ("… port 5433" and "… port 5433 now")
FILLER = frozenset(
    """a an the this that these those it its is are was were be been being am do does did
    to of in at by for with from as and or but so then than now still also just really
    currently always please here there we our us you your they their he she his her i my me
    which who whom what when where""".split()  # noqa: SIM905 (a list literal is 60 lines)
)


@dataclass(frozen=True, slots=True)
class Claims:
    """What a sentence asserts beyond its frame."""

    numbers: tuple[str, ...]
    negated: bool
    opposites: frozenset[tuple[int, str]]  # (group, word): "enabled" is (7, "enable")


@dataclass(frozen=True, slots=True)
class Reading:
    frame: str
    claims: Claims
    words: tuple[str, ...]  # the frame's content words, stemmed, in order (frame_words)


def _expand(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        stem = match.group(1)
        return f"{_IRREGULAR.get(stem, stem)} not"

    return _CONTRACTION.sub(replace, text)


@lru_cache(maxsize=4096)
def read(text: str) -> Reading:
    """A sentence's frame and claims (cached: a lookup reads the same sentences again)."""
    folded = _expand(unicodedata.normalize("NFKC", text).casefold())
    numbers: list[str] = []
    negations = 0
    opposites: set[tuple[int, str]] = set()
    frame: list[str] = []
    signs = marks(folded)  # a word's combining marks are part of it ("दिन" is not "दान")
    pattern = re.compile(rf"\d+(?:[.,:/-]\d+)*|(?:[^\W\d_]|[{signs}])+") if signs else _TOKEN
    tokens = pattern.findall(folded)
    for at, token in enumerate(tokens):
        if token[0].isdigit():
            numbers.append(_canonical(token))
        elif token in NEGATIONS:
            negations += 1
            if token == "never":  # noqa: S105 — a word of the text, not a credential
                opposites.add(_LEMMA[token])
        elif token in _LEMMA and (token not in _WEAK or at == len(tokens) - 1):
            opposites.add(_LEMMA[token])
        else:
            frame.append(token)
    # the frame without filler: "does" (from "doesn't") or an added "now" change no fact
    kept = [w for w in frame if w not in FILLER] or frame
    return Reading(
        words=tuple(_stem(w) for w in kept if w not in FILLER),
        frame=" ".join(kept),
        claims=Claims(
            numbers=tuple(sorted(numbers)),
            negated=negations % 2 == 1,
            opposites=frozenset(opposites),
        ),
    )


def _canonical(number: str) -> str:
    """ "04" is 4, and "4.0" or "3.11.0" the same as "4" and "3.11"; otherwise as written
    ("3.10" is not "3.1": it may be a version)."""
    if re.fullmatch(r"\d{1,3}(,\d{3})+", number):
        number = number.replace(",", "")
    if re.fullmatch(r"\d+(\.\d+)*", number):
        parts = number.split(".")
        parts[0] = parts[0].lstrip("0") or "0"
        while len(parts) > 1 and set(parts[-1]) == {"0"}:
            parts.pop()
        return ".".join(parts)
    return number


def _words(claims: Claims, group: int) -> set[str]:  # a group's words in the claims
    return {word for g, word in claims.opposites if g == group}


def _differences(a: Claims, b: Claims) -> list[str]:
    why = []
    if a.numbers != b.numbers:
        why.append("a number, date or version")
    # a group on one side only ("deploy on Fridays" / "always deploy on Fridays") is emphasis,
    # unless it negates, which the parity below sees
    shared = {g for g, _ in a.opposites} & {g for g, _ in b.opposites}
    differing = sorted(
        "/".join(sorted(_words(a, g) | _words(b, g)))
        for g in shared
        if _words(a, g) != _words(b, g)
    )
    if differing:
        why.append(f"{', '.join(differing)}")
    if a.negated != b.negated:
        why.append("a negation")
    return why


def _stem(word: str) -> str:
    # crude, enough for "prefer"/"prefers"/"preferred": inflections share their first five
    # letters, different words of five letters or more rarely do
    return word[:5]


def frame_words(text: str) -> tuple[str, ...]:
    """The frame's content words, stemmed, in their order ("Bob reports to Alice" is not
    "Alice reports to Bob")."""
    return read(text).words


def frame_key(text: str) -> str:
    """SHA-256 of the frame's content words: equal for two sentences that say the same or
    contradict each other, so a btree index finds both at once (Memory.frame_key). Empty for
    a sentence with no frame ("42", "never")."""
    words = frame_words(text)
    return hashlib.sha256(" ".join(words).encode()).hexdigest() if words else ""


def judge(new: str, old: str) -> str | None:
    """How `new` stands to `old`: "" when it means the same, "differs in …" when it
    contradicts it, None when their frames differ (two different things said)."""
    a, b = read(new), read(old)
    if not a.words or a.words != b.words:
        return None
    why = _differences(a.claims, b.claims)
    return f"differs in {' and '.join(why)}" if why else ""


def conflict(new: str, old: str) -> str | None:
    """Why `new` contradicts `old` (e.g. "differs in a number, date or version"), or None:
    the same frame, different claims."""
    return judge(new, old) or None


def same_meaning(new: str, old: str) -> bool:
    """True when `new` says what `old` says: the same frame (its content words, give or take
    filler and inflection) and equal claims (numbers, negations, opposites)."""
    return judge(new, old) == ""
