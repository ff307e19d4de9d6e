"""Memory candidates found in a conversation turn, by rules (no model, no database).

`detect(user_message, assistant_response)` splits the text into sentences and proposes the ones
worth remembering, typed as in MEMORY.md: preferences and background → `user`; corrections
and always/never rules → `feedback`; deadlines, dates and ongoing work → `project`; pointers
to docs, URLs, hosts and ports → `reference`. A person approves or rejects each one.

The write policy:
- secrets and personal data are redacted first (`memory_ui.redaction.redact`), and the kinds
  noted; a sentence whose point is a credential ("my password is …") is dropped, and a
  credential may stay (redacted) only inside a rule about credentials ("never paste API keys
  like … into chat");
- dropped: small talk, questions, one-off requests ("just this once", "for now", "this time",
  "temporarily", "for this email"), plain requests without a lasting rule, vague statements
  without a cue, and sentences that no longer say anything once cut to 150 characters;
- from the assistant's reply only explicit commitments ("Noted: …", "I'll remember that …",
  "from now on I'll …"), as `agent_inferred` and at a lower importance;
- importance (0–1) from explicitness ("remember", "always", "never", "from now on",
  "important", "note that", "make sure"), signal strength (numbers, names, hosts, dates, code)
  and first person for preferences, lowered by hedges ("maybe", "I think"). Repetition is
  the lead's hook, not modelled here: `proposals.candidate_propose` merges a re-proposed
  sentence into its memory and raises its importance by `REPETITION_BONUS` each time.

The cues (word lists and patterns) are memory_ui.cues; this module weighs and phrases them.
Everything is precompiled; cheap string tests run before the heavier regexes, which use
possessive quantifiers and bounded repeats (no catastrophic backtracking).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from memory_ui.cues import (
    AGENT_SUBJECT,
    BACKGROUND,
    CHANNEL,
    COMMITMENT,
    COMMON_FIRST,
    CONDITIONS,
    CORRECTION_CLAIM,
    CORRECTION_START,
    CORRECTION_WORDS,
    CREDENTIAL_MARKER,
    DATE,
    DATE_VERBS,
    DEADLINE_WORDS,
    DETERMINERS,
    EXAMPLE_CUE,
    EXPLICIT,
    FEEDBACK_PHRASES,
    FILLER,
    FILLER_WORDS,
    FIRST_PERSON_PREFERENCE,
    GENERAL_PHRASES,
    GENERALIZERS,
    HEDGES,
    HOST,
    IDIOM,
    IMPERATIVES,
    IP,
    LASTING,
    NAMED,
    ONE_OFF,
    ONE_OFF_THIS,
    ONGOING,
    PAST,
    PATH,
    POINTER_IS,
    POINTER_NOUNS,
    POINTER_PLACE,
    POLITE_RULE,
    PORT,
    QUESTION_START,
    RESPONSE_NOUNS,
    RULE_START,
    SMALL_TALK,
    STATED_SECRET,
    STORED,
    STRONG_DEADLINE,
    STYLE_NOUNS,
    URL,
    WORD,
    wordset,
)
from memory_ui.redaction import CREDENTIAL_KINDS, MARKER, redact
from memory_ui.text import normalize

MAX_CONTENT = 150  # models.MAX_CONTENT, repeated so this module never imports Django
MAX_EVIDENCE = 500
MAX_SCAN = 20_000  # characters of a message read: memories are not buried in pasted logs
AGENT_FACTOR = 0.75  # an assistant's "noted: …" is weaker evidence than the user saying it
THRESHOLD = 1.5  # the least cue weight that makes a sentence a candidate
THOUSANDTH = Decimal("0.001")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One proposed memory: what to remember, as what, how important, and why."""

    type: str
    content: str
    importance: Decimal
    source: str
    evidence: str
    redactions: list[str] = field(default_factory=list, hash=False)
    signals: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Sentences

_SPLIT = re.compile(r"(?<=[.!?…])\s+|\s*\n\s*")
_ABBREVIATIONS = wordset(
    "e.g. i.e. etc. vs. mr. mrs. ms. dr. approx. no. fig. inc. st. jr. sr. cf. al."
)
_BULLET = re.compile(r"^(?:[-*•>]+|\d{1,2}[.)])\s+")


def _sentences(text: str) -> list[str]:
    pieces: list[str] = []
    pending = ""
    for raw in _SPLIT.split(text):
        if not raw:
            continue
        piece = f"{pending} {raw}" if pending else raw
        last = piece.rsplit(None, 1)[-1].lower() if piece.strip() else ""
        if last in _ABBREVIATIONS:
            pending = piece
            continue
        pending = ""
        piece = _BULLET.sub("", piece.strip())
        if piece:
            pieces.append(piece)
    if pending.strip():
        pieces.append(pending.strip())
    return pieces


# --------------------------------------------------------------------------------------------
# Reading: a sentence's type, weighed from its cues (memory_ui.cues)


@dataclass(slots=True)
class _Reading:
    """What one sentence says, before it is phrased as a memory."""

    type: str
    weight: float
    signals: list[str]


def _words(low: str) -> list[str]:
    return WORD.findall(low)


def _clause_imperative(low: str, words: list[str]) -> list[str]:
    """The words from the imperative verb that starts the sentence, or its main clause after a
    leading phrase ("In every reply, include …"); empty if there is none."""
    if words and words[0] in IMPERATIVES:
        return words
    comma = low.find(", ")
    if 0 < comma < 80:
        rest = _words(low[comma + 2 : comma + 60])
        if rest and rest[0] in IMPERATIVES:
            return rest
    return []


def _generic_object(words: list[str]) -> bool:
    """An imperative whose object is a bare plural (no article, number or pronoun) is about
    every such thing: "keep PR descriptions short", "write tests for new endpoints"."""
    following = words[1:4]
    if not following or any(w in DETERMINERS or w[0].isdigit() for w in following):
        return False
    return any(
        len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")) for w in following
    )


def _is_small_talk(words: list[str]) -> bool:
    return len(words) <= 6 and all(w in SMALL_TALK for w in words)


def _read(core: str, low: str, words: list[str], correction: bool) -> _Reading | None:
    """The type a sentence (already stripped of fillers) most likely is, by weighted cues."""
    weights = {"user": 0.0, "feedback": 0.0, "project": 0.0, "reference": 0.0}
    signals: list[str] = []
    word_set = set(words)
    first = words[0] if words else ""

    # feedback: corrections, always/never rules, lasting instructions
    generalized = bool(word_set & GENERALIZERS) or any(p in low for p in GENERAL_PHRASES)
    if RULE_START.search(low):
        weights["feedback"] += 2.0
        signals.append("rule")
    elif (command := _clause_imperative(low, words)) and (
        generalized
        or ", not " in low
        or " not " in low[:60]
        or word_set & RESPONSE_NOUNS
        or _generic_object(command)
    ):
        weights["feedback"] += 2.0
        signals.append("imperative")
    for phrase, weight, signal in FEEDBACK_PHRASES:
        if phrase in low:
            if weight < THRESHOLD and (generalized or word_set & CONDITIONS):
                weight = 2.0  # "make sure the tests pass before you merge"
            weights["feedback"] = max(weights["feedback"], weight)
            signals.append(signal)
            break
    if correction:
        weights["feedback"] += 1.5
        signals.append("correction")
    if (
        weights["feedback"] == 0
        and ("always" in word_set or "never" in word_set)
        and first in ("you", "we", "please")
    ):
        weights["feedback"] += 2.0
        signals.append("rule")

    # user: preferences, role and background
    preference = FIRST_PERSON_PREFERENCE.search(low)
    if preference and not preference.group(1):
        verb = preference.group(0)
        strong = not any(v in verb for v in (" want", " need", " find", "'d like", " would like"))
        rest = set(_words(low[preference.end() :]))
        if "you to" in low[preference.end() : preference.end() + 8]:
            # "I want you to always …" is an instruction
            if generalized:
                weights["feedback"] = max(weights["feedback"], 2.0)
                signals.append("instruction")
        elif strong or rest & STYLE_NOUNS or generalized:
            weights["user"] += 2.5 if strong else 2.0
            signals.append("first_person")
    if BACKGROUND.search(low) and not ONGOING.search(low):
        weights["user"] = max(weights["user"], 2.0)
        signals.append("background")
    if weights["user"] and weights["feedback"] and first in ("i", "i'm", "i'd", "i've"):
        weights["feedback"] -= 1.0  # "I never use tabs" is about the user

    # project: deadlines, dates, ongoing work, how the project is set up
    deadline = word_set & DEADLINE_WORDS
    if "due to" in low and "due" in deadline and not word_set & STRONG_DEADLINE - {"due"}:
        deadline = deadline - {"due"}
    has_date = DATE.search(low) is not None
    if has_date:
        signals.append("date")
    if deadline:
        signals.append("deadline")
        strong = bool(deadline & STRONG_DEADLINE)
        weights["project"] += (2.0 if strong else 1.0) + (1.0 if has_date else 0.0)
    elif has_date and (word_set & DATE_VERBS):
        weights["project"] += 1.5
    elif has_date and "on" in word_set:
        weights["project"] += 1.0
    if ONGOING.search(low):
        weights["project"] += 2.0
        signals.append("ongoing")
    if weights["project"] and PAST.search(low):
        weights["project"] -= 1.5
        signals.append("past")

    # reference: URLs, hosts, ports, paths, channels and named places for docs
    place = 0.0
    if ("://" in low or "www." in low) and URL.search(core):
        place = 2.5
        signals.append("url")
    if "." in low and place < 2.5 and HOST.search(core):
        place = max(place, 1.5)
        signals.append("host")
    if any(c.isdigit() for c in low):
        if IP.search(low):
            place = max(place, 2.0)
            signals.append("ip")
        if PORT.search(core):
            place = max(place, 2.0)
            signals.append("port")
    if "/" in core and PATH.search(core):
        place = max(place, 1.5)
        signals.append("path")
    if "#" in core and CHANNEL.search(low):
        place = max(place, 2.0)
        signals.append("channel")
    pointer = word_set & POINTER_NOUNS
    if pointer:
        signals.append("pointer")
        where = POINTER_PLACE.search(low)
        if where is not None:
            named = (
                place > 0
                or len(pointer) > 1
                or where.group(0).startswith(STORED)
                or NAMED.search(core) is not None
            )
            place += 1.5 if named else 1.0
        elif POINTER_IS.search(core):
            place += 1.5
        else:
            place += 0.5
    weights["reference"] = place

    best = max(weights, key=lambda t: (weights[t], _PRIORITY[t]))
    if weights[best] < THRESHOLD:
        return None
    return _Reading(type=best, weight=weights[best], signals=signals)


_PRIORITY = {"feedback": 3, "reference": 2, "user": 1, "project": 0}


# --------------------------------------------------------------------------------------------
# Phrasing

# adverbs kept in front of the rewritten verb ("I really prefer" → "really prefers")
_REWRITE_ADVERB = (
    r"(?:really|strongly|much|generally|usually|definitely|mostly|mainly|personally|also"
    r"|always|kind of|normally|typically|often|still|just) "
)
_USER_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), replacement)
    for pattern, replacement in (
        (r"^(?:i|you)(?:'d| would) rather\b", "would rather"),
        (r"^(?:i|you)(?:'d| would) prefer\b", "would prefer"),
        (r"^(?:i|you)(?:'d| would) like\b", "would like"),
        (rf"^(?:i|you) ({_REWRITE_ADVERB})?(?:don't|do not) (\w+)", r"\1doesn't \2"),
        (r"^(?:i|you) can't stand\b", "can't stand"),
        (r"^(?:i|you) (?:can't|cannot|can not)\b", "can't"),
        (r"^(?:i(?:'m| am)|you(?:'re| are))\b", "is"),
        (r"^(?:i|you)(?:'ve| have)\b", "has"),
        (rf"^(?:i|you) ({_REWRITE_ADVERB})?(\w+)\b(?!')", ""),
        (r"^(?:my|your) ", ""),
    )
)
_FEEDBACK_REWRITE = re.compile(
    r"^(?:(?:i (?:want|need)|i(?:'d| would) like) you to |(?:you|we) (?:should|must|need to"
    r"|have to) (?=always|never|not|\w+)|(?:from now on|going forward|moving forward"
    r"|in (?:the )?future),? |(?:please|pls|kindly) )+",
    re.IGNORECASE,
)
_POLITE_TAIL = re.compile(r",? (?:please|pls|thanks|thank you)$", re.IGNORECASE)
_CONNECTOR_TAIL = re.compile(
    r"(?:[\s,;:—–(-]+(?:and|or|but|the|a|an|to|of|with|for|in|on|at|because|so|which|that"
    r"|when|if|as|by|from|than))*[\s,;:—–(-]*$",
    re.IGNORECASE,
)


def _third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return f"{verb}es"
    if verb.endswith("y") and verb[-2:-1] not in ("a", "e", "o", "u"):
        return f"{verb[:-1]}ies"
    return f"{verb}s"


def _as_user(text: str) -> str:
    for pattern, replacement in _USER_REWRITES:
        match = pattern.match(text)
        if match is None:
            continue
        if replacement == "":
            if pattern.pattern.startswith("^(?:my"):
                return text[match.end() :]
            adverb, verb = match.group(1) or "", match.group(2)
            if verb.lower() in ("is", "was", "can", "will", "should", "must", "did", "do"):
                return text
            return f"{adverb}{_third_person(verb)}{text[match.end() :]}"
        return pattern.sub(replacement, text, count=1)
    return text


def _tidy(text: str) -> str:
    text = " ".join(text.split()).strip(" ,;:—–-")
    text = _POLITE_TAIL.sub("", text.rstrip(".!"))
    first, _, rest = text.partition(" ")
    if first and first[0].isupper() and first[1:2].islower() and first.lower() in COMMON_FIRST:
        text = first[0].lower() + first[1:] + (f" {rest}" if rest else "")
    return text


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    head = text[: cut if cut > 0 else limit - 1]
    return _CONNECTOR_TAIL.sub("", head) + "…"


# --------------------------------------------------------------------------------------------
# Detection


def _importance(
    reading: _Reading, core: str, low: str, *, agent: bool
) -> tuple[Decimal, tuple[str, ...]]:
    signals = list(reading.signals)
    score = 0.3 + 0.05 * min(reading.weight - THRESHOLD, 2.0)
    explicit = [name for phrase, name in EXPLICIT if phrase in low]
    if explicit:
        score += 0.25 + 0.05 * min(len(explicit) - 1, 2)
        signals.extend(explicit)
    specific = 0
    if any(c.isdigit() for c in MARKER.sub("", core)):
        specific += 1
        signals.append("number")
    if any(s in signals for s in ("url", "host", "ip", "port", "path", "channel")):
        specific += 1
    if "date" in signals:
        specific += 1
    if any(w[:1].isupper() and w[1:2].islower() for w in core.split()[1:] if w not in ("I",)) or (
        "`" in core or "_" in core
    ):
        specific += 1
        signals.append("name")
    score += 0.05 * min(specific, 3)
    if reading.type == "user" and "first_person" in signals:
        score += 0.1
    if any(h in low for h in HEDGES):
        score -= 0.1
        signals.append("hedge")
    if agent:
        score *= AGENT_FACTOR
        signals.append("agent")
    score = min(max(score, 0.05), 0.95)
    return Decimal(f"{score:.3f}").quantize(THOUSANDTH), tuple(dict.fromkeys(signals))


def _says_enough(head: str, whole: str) -> bool:
    """A cut sentence still says something: five distinct words that carry meaning, and at
    least a third of the whole sentence's."""
    kept = {w for w in _words(head.lower()) if w not in FILLER_WORDS and w not in SMALL_TALK}
    every = {w for w in _words(whole.lower()) if w not in FILLER_WORDS and w not in SMALL_TALK}
    return len(kept) >= 5 and len(kept) * 3 >= len(every)


def _only_examples(sentence: str) -> bool:
    """Every credential in the sentence is an example ("never paste keys like …"), not one
    handed over ("here's my key …, don't store it")."""
    for marker in CREDENTIAL_MARKER.finditer(sentence):
        if not EXAMPLE_CUE.search(sentence[max(0, marker.start() - 30) : marker.start()]):
            return False
    return True


def _meaningful_words(text: str) -> int:
    return sum(1 for w in _words(MARKER.sub(" ", text).lower()) if w not in FILLER_WORDS)


def _is_bare_correction(sentence: str) -> bool:
    """A sentence that only says "no, that's not right": the correction is in the next one."""
    words = _words(sentence.lower())
    return (
        0 < len(words) <= 7
        and all(w in CORRECTION_WORDS for w in words)
        and any(w in ("no", "nope", "wrong", "incorrect", "not") for w in words)
    )


def _candidate(sentence: str, *, agent: bool, corrected: bool = False) -> Candidate | None:
    sentence = sentence.replace("’", "'").strip()
    low = sentence.lower()
    words = _words(low)
    if not words or _is_small_talk(words):
        return None
    if agent:
        commitment = COMMITMENT.match(low)
        if commitment is None:
            return None
        body = sentence[commitment.end() :]
        subject = AGENT_SUBJECT.match(body.lower())
        if subject is not None:
            body = body[subject.end() :]  # "I'll always answer in Spanish" → a rule
            if LASTING.search(low[: commitment.end()]):
                body = f"from now on, {body}"  # the rule's "from now on" was in the prefix
        if not body.strip():
            return None
        sentence_core = body
        low = body.lower()  # the assistant's "I'll remember" is not the user's explicitness
    else:
        sentence_core = sentence
    if sentence_core.rstrip().endswith("?"):
        polite = POLITE_RULE.match(sentence_core.lower())
        if polite is None:
            return None
        # "Could you always answer in Spanish from now on?" asks for a lasting rule
        sentence_core = sentence_core[polite.end() :].rstrip(" ?")
        low = sentence_core.lower()
    if any(p in low for p in ONE_OFF) or ONE_OFF_THIS.search(low):
        return None
    core_low = sentence_core.lower()
    correction = CORRECTION_START.match(core_low)
    if correction is not None:
        sentence_core = sentence_core[correction.end() :]
    corrected = corrected or correction is not None or bool(CORRECTION_CLAIM.match(core_low))
    filler = FILLER.match(sentence_core.lower())
    if filler is not None:
        sentence_core = sentence_core[filler.end() :]
    comma = sentence_core.find(", ")
    if 0 < comma < 40 and _is_small_talk(_words(sentence_core[:comma].lower())):
        # "Good catch, and yes, always pin versions": the rule follows the pleasantry
        sentence_core = sentence_core[comma + 2 :]
        filler = FILLER.match(sentence_core.lower())
        if filler is not None:
            sentence_core = sentence_core[filler.end() :]
    core_low = sentence_core.lower()
    core_words = _words(core_low)
    if not core_words or _is_small_talk(core_words) or IDIOM.match(core_low):
        return None
    if core_words[0] in QUESTION_START and sentence.rstrip().endswith("?"):
        return None
    reading = _read(sentence_core, core_low, core_words, corrected)
    if reading is None:
        return None
    kinds = sorted(set(MARKER.findall(sentence)))
    if kinds:
        credential = CREDENTIAL_KINDS.intersection(kinds)
        if credential and (reading.type != "feedback" or not _only_examples(sentence)):
            return None  # the point of the sentence is a secret, not a rule about secrets
        if STATED_SECRET.search(sentence):
            return None  # "my email is …", "… is the test Visa we use"
        if _meaningful_words(sentence_core) < 3:
            return None
    content = _phrase(sentence_core, reading.type)
    if len(content) > MAX_CONTENT:
        short = _shorten(content, MAX_CONTENT)
        head = short[:-1]
        head_low = head.lower()
        again = _read(head, head_low, _words(head_low), corrected)
        if again is None or again.type != reading.type or not _says_enough(head, content):
            return None
        content = short
    if len(content.split()) < 2:
        return None
    importance, signals = _importance(reading, sentence_core, low, agent=agent)
    return Candidate(
        type=reading.type,
        content=content,
        importance=importance,
        source="agent_inferred" if agent else "user_stated",
        evidence=_shorten(" ".join(sentence.split()), MAX_EVIDENCE),
        redactions=kinds,
        signals=signals,
    )


def _phrase(core: str, type: str) -> str:
    text = _tidy(core)
    if type == "user":
        text = _as_user(text)
    elif type == "feedback":
        text = _FEEDBACK_REWRITE.sub("", text, count=1)
    return _tidy(text)


def detect(user_message: str, assistant_response: str = "") -> list[Candidate]:
    """Memory candidates in one turn, the user's first, each sentence at most once."""
    found: list[Candidate] = []
    seen: set[str] = set()
    for text, agent in ((user_message, False), (assistant_response, True)):
        if not text or not text.strip():
            continue
        if len(text) > MAX_SCAN:
            text = text[: max(text.rfind(" ", 0, MAX_SCAN), 0) or MAX_SCAN]  # whole words only
        redacted, _ = redact(text)
        corrected = False
        for sentence in _sentences(redacted):
            candidate = _candidate(sentence, agent=agent, corrected=corrected)
            corrected = not agent and _is_bare_correction(sentence)
            if candidate is None:
                continue
            key = normalize(candidate.content)
            if key in seen:
                continue
            seen.add(key)
            found.append(candidate)
    return found


def detect_many(turns: Iterable[str | tuple[str, str]]) -> list[list[Candidate]]:
    """`detect` over many turns: each a user message, or (user message, assistant reply)."""
    results: list[list[Candidate]] = []
    for turn in turns:
        if isinstance(turn, str):
            results.append(detect(turn))
        else:
            results.append(detect(turn[0], turn[1]))
    return results
