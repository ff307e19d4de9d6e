"""Pydantic models of the memory API (docs/api.md, "Memory"): the API's parsing of every body and
query, and the shape of every answer. Each field is checked by its rule in memory_ui.cleaners
(the one definition the form, the task and imports use too), and a parsed body becomes the
typed value the services take (`MemoryCandidate.fields`, `MemoryFeedback.feedback`,
`SearchQuery.search`), which they do not check again.

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
from costboard.json_types import IsoTime
from memory_ui import cleaners, models
from memory_ui.cleaners import (
    DEFAULT_K,
    MAX_ID,
    MAX_K,
    MAX_QUERY,
    MAX_TAG,
    MAX_TAGS,
    MAX_TTL_DAYS,
    SCOPE,
    Feedback,
    MemoryFields,
    MemoryInputError,
    Search,
)
from memory_ui.models import MAX_CONTENT

MEMORY_TYPES = list(models.Memory.Type.values)


def _rule(clean: Callable[[Any], Any]) -> BeforeValidator:
    """A field checked by its rule in memory_ui.cleaners, its refusal said as pydantic's."""

    def check(value: Any) -> Any:
        try:
            return clean(value)
        except MemoryInputError as exc:
            raise PydanticCustomError(exc.field, exc.message) from None

    return BeforeValidator(check)


def _session_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MemoryInputError("session_id", "must be a string: the session_id your events use")
    return cleaners.clean_text("session_id", value)


def _id(field: str, what: str, *, required: bool) -> BeforeValidator:
    def check(value: Any) -> Any:
        if value is None and not required:
            return None
        return cleaners.clean_id(field, value, what)

    return _rule(check)


_SCOPE_SCHEMA = {
    "type": "string",
    "pattern": SCOPE.pattern.replace("^(", "^(|", 1),
    "default": "project",
    "description": '"project" or "user:<user_id>"; empty: project',
}
Scope = Annotated[str, _rule(cleaners.clean_scope), WithJsonSchema(_SCOPE_SCHEMA)]
# in a body, null is the default scope too
BodyScope = Annotated[
    str,
    _rule(cleaners.clean_scope),
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
        _rule(cleaners.clean_content),
    ]
    type: Annotated[
        str, _rule(cleaners.clean_type), WithJsonSchema({"type": "string", "enum": MEMORY_TYPES})
    ]
    scope: BodyScope = "project"
    session_id: Annotated[
        Annotated[str, Field(max_length=128)] | None,
        Field(description="a session of this project (its session_id); empty or null: none"),
        _rule(_session_id),
    ] = None
    importance: Annotated[
        Annotated[Decimal, Field(ge=0, le=1, allow_inf_nan=False)] | None,
        _rule(cleaners.clean_importance),
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
        tuple[str, ...] | None,
        _rule(cleaners.clean_tags),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "array", "maxItems": MAX_TAGS, "items": {"type": "string"}},
                    {"type": "null"},
                ],
                "description": f"at most {MAX_TAGS}, blank ones dropped, each cut at {MAX_TAG} "
                "characters; null or absent: no tags",
            }
        ),
    ] = None
    ttl_days: Annotated[
        Annotated[int, Field(ge=1, le=MAX_TTL_DAYS)] | None,
        Field(description="days an approved memory lives; null: forever"),
        _rule(cleaners.clean_ttl_days),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _required(cls, data: Any) -> Any:
        return _fill_absent(data, "content", "type")

    @classmethod
    def example(cls) -> str:
        return '{"content": "Always use ruff", "type": "feedback"}'

    def fields(self) -> MemoryFields:
        """The memory's fields, as the rules made them; those absent (or null) take
        MemoryFields' defaults: importance 0.5, no tags, no TTL."""
        given = self.model_dump(exclude={"session_id"}, exclude_none=True)
        return MemoryFields(**given)


class MemoryFeedback(BaseModel):
    """Was a retrieved memory useful?"""

    model_config = ConfigDict(extra="ignore")

    memory_id: Annotated[
        int,
        Field(ge=1, le=MAX_ID, description="a memory of this project"),
        _id("memory_id", "the memory", required=True),
    ]
    useful: Annotated[bool, _rule(cleaners.clean_useful)]
    retrieval_id: Annotated[
        Annotated[int, Field(ge=1, le=MAX_ID)] | None,
        Field(description="the search that returned it (its retrieval_id)"),
        _id("retrieval_id", "the search (its retrieval_id)", required=False),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _required(cls, data: Any) -> Any:
        return _fill_absent(data, "memory_id", "useful")

    @classmethod
    def example(cls) -> str:
        return '{"memory_id": 12, "useful": true, "retrieval_id": 34}'

    def feedback(self) -> Feedback:
        return Feedback(
            memory_id=self.memory_id, useful=self.useful, retrieval_id=self.retrieval_id
        )


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
        _rule(cleaners.clean_query),
    ]
    scope: Scope = "project"
    k: Annotated[
        int,
        Field(ge=1, le=MAX_K),
        _rule(cleaners.clean_k),
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

    def search(self) -> Search:
        return Search(query=self.q, scope=self.scope, k=self.k)


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
