"""Ranked memory search (docs/memory.md, "Ranking"; `GET /api/v1/memory/search`).

score = w_r·relevance + w_i·importance + w_f·freshness + w_c·credibility, each component in
[0, 1] and returned beside the score, the weights from `COSTBOARD_MEMORY_WEIGHTS`. Only the
scope's live memories (memory_file.live_memories) are searched. Candidates are picked in SQL
(relevance > 0); their components and score are computed here. On PostgreSQL the database
also orders the matches by the same score and returns only the best k + TOP_MARGIN, so a
common word matching thousands of memories does not ship them all to Python.

relevance, PostgreSQL — three tries, each only when the one before matched nothing:
  1. full text, every word: `to_tsvector('english', content) @@ websearch_to_tsquery('english',
     q)` (the expression of the GIN index memory_content_fts, so the index is used; quotes, `or`
     and `-word` work as in a web search; English stemming: "deploying" finds "deploys");
  2. full text, any word: the tsquery's words joined by `|` (skipped for one word);
  3. trigrams: `lower(content) %> lower(q)` (the trigram index memory_content_trgm; true when
     word_similarity ≥ pg_trgm.word_similarity_threshold, 0.6 by default), so a typo, a part
     of a word ("ruf") or a query of stop words only still finds a memory.
  A `-word` keeps the memories that have it out of the second and third tries, as out of
  the first.
  Full-text relevance is `ts_rank_cd` over the best `ts_rank_cd` of the matches: the query's
  best match is 1 and the others are relative to it (ts_rank_cd of a one-line memory is about
  0.1 a matched word, so rank/(rank+1) would leave relevance too small to count against
  importance). Trigram relevance is `word_similarity(lower(q), lower(content))` as it is.
relevance, elsewhere (SQLite) — the same three tries, portable: the share of the query's terms
  the memory has, |Q ∩ M| / |Q| (terms: text.normalize's words without English stop words, a
  plural "s" dropped; candidates picked in SQL by `content LIKE %term%`), first needing every
  term, then any; then the share of the query's trigrams found in the memory (≥ 0.6, like
  word_similarity) over the scope's newest PORTABLE_SCAN memories. A `-word` is a term no
  memory found may have.
importance = the stored importance. freshness = 0.5^(age in days / half-life), the half-life
  COSTBOARD_MEMORY_HALF_LIFE_DAYS, the age from decided_at (else created_at), never above 1.
  credibility by source: stated by the user 1.0, inferred by the agent 0.6, tool output 0.3.

Reads only: a search is logged, and feedback on it stored, by the write services
(memory_ui/writes/retrievals.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import reduce
from operator import or_
from typing import Any, TypedDict

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import BooleanField, F, FloatField, Func, Q, QuerySet, TextField, Value
from django.db.models.functions import Lower
from django.utils import timezone

from costboard.models import Project
from memory_ui.cleaners import Search
from memory_ui.memory_file import live_memories
from memory_ui.models import Memory
from memory_ui.text import normalize, trigrams

COMPONENTS = ("relevance", "importance", "freshness", "credibility")
DEFAULT_WEIGHTS = {"relevance": 0.5, "importance": 0.2, "freshness": 0.15, "credibility": 0.15}
DEFAULT_HALF_LIFE_DAYS = 30.0
CREDIBILITY: dict[str, float] = {
    Memory.Source.USER_STATED.value: 1.0,
    Memory.Source.AGENT_INFERRED.value: 0.6,
    Memory.Source.TOOL_OUTPUT.value: 0.3,
}
PORTABLE_SCAN = 2000  # without pg_trgm: how many of a scope's memories are compared
TRIGRAM_MATCH = 0.6  # the portable path's word similarity threshold, pg_trgm's default
SECONDS_PER_DAY = 86_400.0

# English stop words of the portable path (PostgreSQL's 'english' configuration has its own).
STOP_WORDS = frozenset(
    """a about after again all am an and any are as at be been before being but by can could did
    do does doing for from had has have having he her here hers him his how i if in into is
    it its itself me more most my no nor not of on once only or other our ours out over own
    same she should so some such than that the their theirs them then there these they this
    those through to too under until up very was we were what when where which while who whom
    why will with would you your yours""".split()  # noqa: SIM905
)


# --- weights and components -------------------------------------------------------------------


def ranking_weights() -> dict[str, float]:
    """COSTBOARD_MEMORY_WEIGHTS over the defaults; a bad setting stops with its fix."""
    configured: Mapping[str, Any] = getattr(settings, "COSTBOARD_MEMORY_WEIGHTS", {}) or {}
    unknown = sorted(set(configured) - set(COMPONENTS))
    if unknown:
        raise ImproperlyConfigured(
            f"COSTBOARD_MEMORY_WEIGHTS has {unknown[0]!r}; its keys are {', '.join(COMPONENTS)}"
        )
    weights = dict(DEFAULT_WEIGHTS)
    for name, value in configured.items():
        if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
            raise ImproperlyConfigured(f"COSTBOARD_MEMORY_WEIGHTS[{name!r}] must be a number")
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ImproperlyConfigured(
                f"COSTBOARD_MEMORY_WEIGHTS[{name!r}] must be 0 or more; got {value}"
            )
        weights[name] = float(value)
    return weights


def half_life_days() -> float:
    value = getattr(settings, "COSTBOARD_MEMORY_HALF_LIFE_DAYS", DEFAULT_HALF_LIFE_DAYS)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ImproperlyConfigured(
            f"COSTBOARD_MEMORY_HALF_LIFE_DAYS must be a number of days above 0; got {value!r}"
        )
    return float(value)


def freshness(
    decided_at: datetime | None, created_at: datetime, *, now: datetime, half_life: float
) -> float:
    """0.5^(age / half-life): 1 when just decided, 0.5 one half-life later; never above 1."""
    age_days = max(0.0, (now - (decided_at or created_at)).total_seconds() / SECONDS_PER_DAY)
    decay: float = 0.5 ** (age_days / half_life)  # float ** float is Any in typeshed
    return decay


def credibility(source: str) -> float:
    return CREDIBILITY.get(source, CREDIBILITY[Memory.Source.AGENT_INFERRED.value])


class Components(TypedDict):
    relevance: float
    importance: float
    freshness: float
    credibility: float


class SearchResult(TypedDict):
    id: int
    type: str
    content: str
    score: float
    components: Components


@dataclass(frozen=True, slots=True)
class Ranked:
    memory_id: int
    type: str
    content: str
    score: float
    components: Components

    def to_dict(self, places: int = 4) -> SearchResult:
        parts = self.components
        return {
            "id": self.memory_id,
            "type": self.type,
            "content": self.content,
            "score": round(self.score, places),
            "components": {
                "relevance": round(parts["relevance"], places),
                "importance": round(parts["importance"], places),
                "freshness": round(parts["freshness"], places),
                "credibility": round(parts["credibility"], places),
            },
        }


@dataclass(frozen=True, slots=True)
class _Candidate:
    memory_id: int
    type: str
    content: str
    importance: Decimal
    source: str
    decided_at: datetime | None
    created_at: datetime
    relevance: float


_FIELDS = ("id", "type", "content", "importance", "source", "decided_at", "created_at")


# --- the search ---------------------------------------------------------------------------------


def memories_search(
    *,
    project: Project,
    search: Search,
    now: datetime | None = None,
    weights: Mapping[str, float] | None = None,
) -> list[Ranked]:
    """The k best live memories of the scope for the query, best first (ties: older id
    first); an empty list when nothing is relevant. `search` was checked where it came in
    (Search.of, or the API's SearchQuery)."""
    query, scope, k = search.query, search.scope, search.k
    now = now or timezone.now()
    chosen = dict(weights) if weights is not None else ranking_weights()
    half_life = half_life_days()
    live = live_memories(project, scope, now)
    if connection.vendor == "postgresql":
        scoring = _SqlScoring(now=now, weights=chosen, half_life=half_life, limit=k + TOP_MARGIN)
        candidates = _candidates_postgresql(live, query, scoring)
    else:
        candidates = _candidates_portable(live, query)
    ranked = [_rank(c, now=now, weights=chosen, half_life=half_life) for c in candidates]
    ranked.sort(key=lambda r: (-r.score, r.memory_id))
    return ranked[:k]


def _rank(
    candidate: _Candidate, *, now: datetime, weights: Mapping[str, float], half_life: float
) -> Ranked:
    components: Components = {
        "relevance": min(1.0, max(0.0, candidate.relevance)),
        "importance": float(candidate.importance),
        "freshness": freshness(
            candidate.decided_at, candidate.created_at, now=now, half_life=half_life
        ),
        "credibility": credibility(candidate.source),
    }
    score = (
        weights.get("relevance", 0.0) * components["relevance"]
        + weights.get("importance", 0.0) * components["importance"]
        + weights.get("freshness", 0.0) * components["freshness"]
        + weights.get("credibility", 0.0) * components["credibility"]
    )
    return Ranked(
        memory_id=candidate.memory_id,
        type=candidate.type,
        content=candidate.content,
        score=score,
        components=components,
    )


def _candidate(row: tuple[Any, ...], relevance: float) -> _Candidate:
    pk, type_, content, importance, source, decided_at, created_at = row[:7]
    return _Candidate(pk, type_, content, importance, source, decided_at, created_at, relevance)


# --- PostgreSQL: full text, then trigrams -----------------------------------------------------


class _EnglishVector(Func):
    """to_tsvector('english', content): the expression of the index memory_content_fts."""

    template = "to_tsvector('english', %(expressions)s)"
    output_field = TextField()


class _TsQuery(Func):
    """A tsquery given as its text (as websearch_to_tsquery printed it)."""

    template = "%(expressions)s::tsquery"
    output_field = TextField()


class _Matches(Func):
    arg_joiner = " @@ "
    template = "(%(expressions)s)"
    output_field = BooleanField()


class _RankCd(Func):
    function = "ts_rank_cd"
    output_field = FloatField()


class _WordSimilar(Func):
    # lower(content) %> lower(q): q has a word-similar extent in content (the trigram index)
    arg_joiner = " %%> "
    template = "(%(expressions)s)"
    output_field = BooleanField()


class _WordSimilarity(Func):
    function = "word_similarity"
    output_field = FloatField()


# The trigram operators cost about 100 times a plain comparison, which the planner does not
# know: it would filter every row of the scope rather than use the trigram index. For this
# one query, operators are priced 10 times higher (set_config(…, true): this transaction
# only, and put back right after).
TRIGRAM_OPERATOR_COST = "0.025"
# The database orders the matches by the same score and returns this many more than k; the
# exact scores and the final order are computed here (float rounding cannot drop one).
TOP_MARGIN = 10


@dataclass(frozen=True, slots=True)
class _SqlScoring:
    now: datetime
    weights: Mapping[str, float]
    half_life: float
    limit: int

    def top(self, matches: QuerySet[Any], relevance: str) -> list[_Candidate]:
        """The best `limit` of `matches` (values of _FIELDS + "raw") by the score, with
        `relevance` an SQL expression of the column raw (and best, its maximum). Freshness's
        exponent stops at 1000 half-lives (0.5^1000 ≈ 1e-301; PostgreSQL's power() refuses to
        underflow to 0), which orders the same."""
        inner, inner_params = matches.query.sql_with_params()
        credibility = " ".join(f"WHEN '{name}' THEN {value}" for name, value in CREDIBILITY.items())
        default = CREDIBILITY[Memory.Source.AGENT_INFERRED.value]
        sql = f"""
            SELECT id, type, content, importance, source, decided_at, created_at, relevance
            FROM (
                SELECT m.*, {relevance} AS relevance
                FROM (SELECT i.*, max(i.raw) OVER () AS best FROM ({inner}) i) m
            ) r
            WHERE relevance > 0
            ORDER BY
                %s * relevance
                + %s * importance::float8
                + %s * power(0.5, least(1000, greatest(0, extract(epoch FROM
                    %s - coalesce(decided_at, created_at))::float8 / 86400) / %s))
                + %s * (CASE source {credibility} ELSE {default} END)
                DESC,
                id
            LIMIT %s
        """  # noqa: S608 — the ORM's own query, code's expressions; values bound below
        w = self.weights
        params = [
            *inner_params,
            w.get("relevance", 0.0),
            w.get("importance", 0.0),
            w.get("freshness", 0.0),
            self.now,
            self.half_life,
            w.get("credibility", 0.0),
            self.limit,
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [_candidate(row, float(row[-1])) for row in cursor.fetchall()]


def _operands(tsquery: str) -> tuple[list[str], list[str]]:
    """The operands of a tsquery's text (as websearch_to_tsquery prints it: `'deploy' &
    !'stage' | ( 'run' <-> 'on' )`) split at its top-level `&` and `|`: those wanted, and
    those refused (`-word`, printed `!'word'`), without their `!`. Quoted lexemes and
    parenthesized phrases are one operand each; a double negation is neither."""
    parts, start, depth, quoted = [], 0, 0, False
    for at, char in enumerate(tsquery):
        if char == "'":
            quoted = not quoted  # a quote inside a lexeme is doubled: toggled twice
        elif quoted:
            continue
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif depth == 0 and tsquery[at - 1 : at + 2] in (" & ", " | "):
            parts.append(tsquery[start : at - 1])
            start = at + 2
    parts.append(tsquery[start:])
    parts = [part.strip() for part in parts if part.strip()]
    wanted = [part for part in parts if not part.startswith("!")]
    refused = [part[1:] for part in parts if part.startswith("!") and part[1:2] != "!"]
    return wanted, refused


def _candidates_postgresql(
    live: QuerySet[Memory], query: str, scoring: _SqlScoring
) -> list[_Candidate]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT websearch_to_tsquery('english', %s)::text", [query])
        every_word = cursor.fetchone()[0]
    wanted, refused = _operands(every_word)
    # the tries after the first: any word wanted, and none of the memories a `-word` refuses
    fallback = live
    if refused:
        unwanted = _TsQuery(Value(" | ".join(refused)))
        fallback = live.exclude(_Matches(_EnglishVector(F("content")), unwanted))
    tries = [(live, every_word)] if every_word else []  # empty: only stop words
    if len(wanted) > 1 or (wanted and refused):
        tries.append((fallback, " | ".join(wanted)))
    for memories, tsquery in tries:
        matches = (
            memories.filter(_Matches(_EnglishVector(F("content")), _TsQuery(Value(tsquery))))
            .annotate(raw=_RankCd(_EnglishVector(F("content")), _TsQuery(Value(tsquery))))
            .values_list(*_FIELDS, "raw")
        )
        found = scoring.top(matches, "CASE WHEN m.best > 0 THEN m.raw / m.best ELSE 0 END")
        if found:
            return found
    lowered = Lower(Value(query, output_field=TextField()))
    similar = (
        fallback.filter(_WordSimilar(Lower(F("content")), lowered))
        .annotate(raw=_WordSimilarity(lowered, Lower(F("content"))))
        .values_list(*_FIELDS, "raw")
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('cpu_operator_cost'), set_config('cpu_operator_cost', %s, "
            "true)",
            [TRIGRAM_OPERATOR_COST],
        )
        previous = cursor.fetchone()[0]
        found = scoring.top(similar, "m.raw")
        cursor.execute("SELECT set_config('cpu_operator_cost', %s, true)", [previous])
    return found


# --- elsewhere: token overlap, then trigrams --------------------------------------------------


def terms(text: str) -> set[str]:
    """The words that count for relevance: normalized, no stop words, a plural "s" dropped."""
    words = set()
    for word in normalize(text).split():
        if word in STOP_WORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        words.add(word)
    return words


def _candidates_portable(live: QuerySet[Memory], query: str) -> list[_Candidate]:
    words = query.split()
    # a `-word` refuses the memories that have it, as websearch_to_tsquery's does
    refused = terms(" ".join(w[1:] for w in words if w.startswith("-") and len(w) > 1))
    asked = " ".join(w for w in words if not w.startswith("-"))
    wanted = terms(asked)
    if wanted:
        # every term is a substring of a word it matches, so icontains never misses one
        matching = live.filter(reduce(or_, (Q(content__icontains=t) for t in wanted)))
        scored = []
        for row in matching.values_list(*_FIELDS):
            has = terms(row[2])
            found = len(wanted & has)
            if found and not refused & has:
                scored.append((row, found / len(wanted)))
        for needed in (len(wanted), 1):
            chosen = [
                _candidate(row, share) for row, share in scored if share * len(wanted) >= needed
            ]
            if chosen:
                return chosen
    query_grams = trigrams(asked)
    if not query_grams:
        return []
    newest = live.order_by("-updated_at", "-pk").values_list(*_FIELDS)[:PORTABLE_SCAN]
    result = []
    for row in newest:
        share = len(query_grams & trigrams(row[2])) / len(query_grams)
        if share >= TRIGRAM_MATCH and not refused & terms(row[2]):
            result.append(_candidate(row, share))
    return result
