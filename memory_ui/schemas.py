"""Pydantic models of the memory API (docs/api.md, "Memory"): the API's parsing of every body and
query, and the shape of every answer, with the limits of memory_ui.cleaners (whose `clean_*`
checks stay behind them, as a second line).

Messages say what to send instead; the error mapper (costboard/api/boundary.py) names the
field. Text is refused with NUL or unpaired surrogates (docs/api.md, "Limits").
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from costboard.api.schemas import Answer
from costboard.ingest.schemas import text_fault
from costboard.json_types import IsoTime
from memory_ui import models
from memory_ui.cleaners import MAX_QUERY, MAX_TAGS, MAX_TTL_DAYS, SCOPE
from memory_ui.models import MAX_CONTENT
from memory_ui.ranking import MAX_K

DEFAULT_K = 5
MAX_ID = 2**63 - 1
MEMORY_TYPES = list(models.Memory.Type.values)


def _refuse(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, message)


def _text(value: str, kind: str) -> str:
    fault = text_fault(value)
    if fault is not None:
        raise _refuse(kind, fault)
    return value


def _content(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _refuse("content", "is required: one sentence of what to remember")
    text = " ".join(_text(value, "content").split())  # one line: MEMORY.md has one per line
    if len(text) > MAX_CONTENT:
        raise _refuse(
            "content", f"is {len(text)} characters; at most {MAX_CONTENT}: say it shorter"
        )
    return text


def _type(value: Any) -> str:
    if value not in MEMORY_TYPES:
        raise _refuse("type", f"must be one of {', '.join(MEMORY_TYPES)}")
    return str(value)


def _scope(value: Any) -> str:
    if value is None or value == "":
        return "project"
    if not isinstance(value, str) or not SCOPE.fullmatch(value):
        raise _refuse("scope", 'must be "project" or "user:<user_id>"')
    return value


def _importance(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        number = Decimal(str(value).strip())
    except (ArithmeticError, TypeError, ValueError):
        number = Decimal(-1)
    if isinstance(value, bool) or not number.is_finite() or not 0 <= number <= 1:
        raise _refuse("importance", "must be a number from 0 to 1, e.g. 0.7")
    return number


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise _refuse("tags", 'must be a list of strings, e.g. ["billing"]')
    tags = [_text(t, "tags").strip() for t in value if t.strip()]
    if len(tags) > MAX_TAGS:
        raise _refuse("tags", f"at most {MAX_TAGS} tags")
    return tags


def _ttl_days(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTL_DAYS:
        raise _refuse("ttl_days", f"must be a whole number of days from 1 to {MAX_TTL_DAYS}")
    return value


def _session_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _refuse("session_id", "must be a string: the session_id your events use")
    return _text(value, "session_id")


def _id(what: str, *, required: bool) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ID:
            raise _refuse("id", f"must be the id of {what} (a whole number); got {value!r}")
        return value

    return check


def _useful(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse("useful", "is required: true if the memory helped, else false")
    return value


def _query(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _refuse("q", "is required: what to look for, e.g. ?q=deploy+staging")
    if len(value) > MAX_QUERY:
        raise _refuse("q", f"is {len(value)} characters; at most {MAX_QUERY}")
    return " ".join(_text(value, "q").split())


def _k(value: Any) -> int:
    if value is None or value == "":
        return DEFAULT_K
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= MAX_K:
        raise _refuse("k", f"must be a whole number from 1 to {MAX_K}; got {value!r}")
    return int(text)


_SCOPE_SCHEMA = {
    "type": "string",
    "pattern": SCOPE.pattern.replace("^(", "^(|", 1),
    "default": "project",
    "description": '"project" or "user:<user_id>"; empty: project',
}
Scope = Annotated[str, BeforeValidator(_scope), WithJsonSchema(_SCOPE_SCHEMA)]
# in a body, null is the default scope too
BodyScope = Annotated[
    str,
    BeforeValidator(_scope),
    WithJsonSchema({"anyOf": [_SCOPE_SCHEMA, {"type": "null"}], "default": "project"}),
]


def _fill_absent(data: Any, *names: str) -> Any:
    """Absent required fields as None, so their validator's message (which says what to
    send) answers rather than pydantic's "Field required"."""
    if isinstance(data, dict):
        return {**{name: None for name in names}, **data}
    return data


# --- requests ---------------------------------------------------------------------------------


class MemoryCandidate(BaseModel):
    """A memory proposed by an agent: pending until a person approves it."""

    model_config = ConfigDict(extra="ignore")

    content: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_CONTENT,
            description="one sentence; spaces and newlines are made single spaces first",
        ),
        BeforeValidator(_content),
    ]
    type: Annotated[
        str, BeforeValidator(_type), WithJsonSchema({"type": "string", "enum": MEMORY_TYPES})
    ]
    scope: BodyScope = "project"
    session_id: Annotated[
        Annotated[str, Field(max_length=128)] | None,
        Field(description="a session of this project (its session_id); empty or null: none"),
        BeforeValidator(_session_id),
    ] = None
    importance: Annotated[
        Annotated[Decimal, Field(ge=0, le=1, allow_inf_nan=False)] | None,
        BeforeValidator(_importance),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "number", "minimum": 0, "maximum": 1},
                    {"type": "string", "pattern": r"^\s*(0(\.[0-9]*)?|1(\.0*)?|\.[0-9]+)\s*$"},
                    {"type": "null"},
                ],
                "description": "0 to 1, a number or a decimal string; absent or null: 0.5",
            }
        ),
    ] = None
    tags: Annotated[
        list[str] | None,
        BeforeValidator(_tags),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "array", "maxItems": MAX_TAGS, "items": {"type": "string"}},
                    {"type": "null"},
                ],
                "description": f"at most {MAX_TAGS}, blank ones dropped, each cut at 40 "
                "characters; null or absent: no tags",
            }
        ),
    ] = None
    ttl_days: Annotated[
        Annotated[int, Field(ge=1, le=MAX_TTL_DAYS)] | None,
        Field(description="days an approved memory lives; null: forever"),
        BeforeValidator(_ttl_days),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _required(cls, data: Any) -> Any:
        return _fill_absent(data, "content", "type")

    @classmethod
    def example(cls) -> str:
        return '{"content": "Always use ruff", "type": "feedback"}'


class MemoryFeedback(BaseModel):
    """Was a retrieved memory useful?"""

    model_config = ConfigDict(extra="ignore")

    memory_id: Annotated[
        int,
        Field(ge=1, le=MAX_ID, description="a memory of this project"),
        BeforeValidator(_id("the memory", required=True)),
    ]
    useful: Annotated[bool, BeforeValidator(_useful)]
    retrieval_id: Annotated[
        Annotated[int, Field(ge=1, le=MAX_ID)] | None,
        Field(description="the search that returned it (its retrieval_id)"),
        BeforeValidator(_id("the search (its retrieval_id)", required=False)),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _required(cls, data: Any) -> Any:
        return _fill_absent(data, "memory_id", "useful")

    @classmethod
    def example(cls) -> str:
        return '{"memory_id": 12, "useful": true, "retrieval_id": 34}'


class MemoryMdQuery(BaseModel):
    scope: Scope = "project"


class SearchQuery(BaseModel):
    q: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_QUERY,
            pattern=r"\S",
            description="words to look for (web-search syntax: quotes, or, -word)",
        ),
        BeforeValidator(_query),
    ]
    scope: Scope = "project"
    k: Annotated[
        int,
        Field(ge=1, le=MAX_K),
        BeforeValidator(_k),
        # `k=` (a form's empty field) means the default: documented, so it is not "invalid"
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "integer", "minimum": 1, "maximum": MAX_K},
                    {"type": "string", "maxLength": 0},
                ],
                "description": f"how many results at most; empty or absent: {DEFAULT_K}",
            }
        ),
    ] = DEFAULT_K

    @model_validator(mode="before")
    @classmethod
    def _required(cls, data: Any) -> Any:
        return _fill_absent(data, "q")


# --- answers ----------------------------------------------------------------------------------


class Memory(Answer):
    id: int
    type: Annotated[str, WithJsonSchema({"type": "string", "enum": MEMORY_TYPES})]
    content: Annotated[str, Field(max_length=MAX_CONTENT)]
    scope: str = Field(description='"project" or "user:<user_id>"')
    status: Annotated[
        str, WithJsonSchema({"type": "string", "enum": list(models.Memory.Status.values)})
    ] = Field(description="a new candidate is pending; a person approves it")
    importance: float = Field(ge=0, le=1)
    source: Annotated[
        str, WithJsonSchema({"type": "string", "enum": list(models.Memory.Source.values)})
    ]
    tags: list[str]
    ttl_days: int | None
    times_proposed: int = Field(ge=1)
    created_at: IsoTime
    merged: bool = Field(
        description="true: the sentence (or a near duplicate) was already pending or approved "
        "in the scope; this is that memory, proposed once more"
    )
    conflicts_with: list[int] = Field(
        description="ids of the live memories this candidate contradicts (the same sentence "
        "but for a number, date, version, negation or always/never): it is a new pending "
        "candidate, never merged; approving it supersedes them unless the reviewer keeps both"
    )

    @classmethod
    def of(cls, memory: models.Memory, *, merged: bool = False) -> Memory:
        return cls(
            id=memory.pk,
            type=memory.type,
            content=memory.content,
            scope=memory.scope,
            status=memory.status,
            importance=float(memory.importance),
            source=memory.source,
            tags=list(memory.tags),
            ttl_days=memory.ttl_days,
            times_proposed=memory.times_proposed,
            created_at=memory.created_at.isoformat(),
            merged=merged,
            conflicts_with=sorted(m.pk for m in memory.conflicts_with.all()),
        )


Unit = Annotated[float, Field(ge=0, le=1)]


class ScoreComponents(Answer):
    relevance: Unit = Field(
        description="full-text rank over the best match's (1 = the best); trigram word "
        "similarity when no word matches"
    )
    importance: Unit
    freshness: Unit = Field(description="0.5^(days since approval / half-life)")
    credibility: Unit = Field(
        description="stated by the user 1, inferred by the agent 0.6, tool output 0.3"
    )


class SearchResult(Answer):
    id: int
    type: Annotated[str, WithJsonSchema({"type": "string", "enum": MEMORY_TYPES})]
    content: str
    score: float = Field(
        description="Σ weight × component (COSTBOARD_MEMORY_WEIGHTS; by default 0.5 relevance, "
        "0.2 importance, 0.15 freshness, 0.15 credibility), 4 decimal places"
    )
    components: ScoreComponents


class MemorySearch(Answer):
    retrieval_id: int = Field(description="this search in the retrieval log: send it with feedback")
    query: str
    scope: str
    k: int
    results: list[SearchResult] = Field(description="best first")


class FeedbackStored(Answer):
    id: int
    memory_id: int
    retrieval_id: int | None
    useful: bool
    created_at: IsoTime
