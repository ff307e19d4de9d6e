"""What a memory takes as input, checked once where it comes in: each rule below is the one
definition of a field's check (its limits, its allowed values, its text cleaning) and returns
the value as stored, or raises MemoryInputError naming the field and the fix. The API's models
(memory_ui/schemas.py) call them as their validators; the review form, the detector's task,
the lifecycle and imports build the typed values here (`MemoryFields.of`, `MemoryImport.of`,
`Feedback.of`, `Search.of`) with them. The write services and the search take those typed
values and check no field again: they refuse only what the database decides (an id that is
not the project's: NotFound; a memory decided meanwhile).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from costboard.input_limits import amount_fault, digit_count, text_fault
from memory_ui.models import MAX_CONTENT, Memory
from memory_ui.redaction import redact

DEFAULT_IMPORTANCE = Decimal("0.5")
# `user:` and any user_id events take (1 to 128 characters) but a control character: an
# Auth0 `auth0|5f1a…`, a `tenant:42`, a `Jane Doe`. Matched with fullmatch: `$` alone lets a
# trailing newline through ("user:a\n").
SCOPE = re.compile(r"^(project|user:[^\x00-\x1f\x7f]{1,128})$")
MAX_TAGS = 20
MAX_TAG = 40  # a tag's characters: a longer one is cut
MAX_TTL_DAYS = 36_500  # a hundred years
MAX_QUERY = 500  # RetrievalLog.query's length
MAX_K = 50  # a search's results at most
DEFAULT_K = 5
MAX_ID = 2**63 - 1  # a bigint primary key


class MemoryInputError(ValueError):
    """Bad input for a memory: which field, and how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(LookupError):
    """An id that is not the project's: which field, and what was asked."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --- the rules: each takes a value as it came (parsed JSON, a form's text) -----------------


def clean_text(field: str, value: str) -> str:
    """Text PostgreSQL can hold: no NUL, no unpaired surrogate (docs/api.md, "Limits")."""
    fault = text_fault(value)
    if fault is not None:
        raise MemoryInputError(field, fault)
    return value


def clean_content(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MemoryInputError("content", "is required: one sentence of what to remember")
    # one line: MEMORY.md has one entry per line
    text = " ".join(clean_text("content", value).split())
    if len(text) > MAX_CONTENT:
        raise MemoryInputError(
            "content", f"is {len(text)} characters; at most {MAX_CONTENT}: say it shorter"
        )
    return text


def clean_type(value: object) -> str:
    if value not in Memory.Type.values:
        raise MemoryInputError("type", f"must be one of {', '.join(Memory.Type.values)}")
    return str(value)


def clean_scope(value: object) -> str:
    if value is None or value == "":
        return "project"
    if not isinstance(value, str) or not SCOPE.fullmatch(clean_text("scope", value)):
        raise MemoryInputError(
            "scope",
            'must be "project" or "user:<user_id>" (a user_id of 1 to 128 characters, '
            "no control character)",
        )
    return value


def clean_importance(value: object) -> Decimal:
    if value is None:
        return DEFAULT_IMPORTANCE
    if isinstance(value, str) and amount_fault(value) is not None:  # Decimal() reads "٠.٧"
        raise MemoryInputError("importance", "must be a number from 0 to 1, e.g. 0.7")
    try:
        number = Decimal(str(value).strip())
    except (ArithmeticError, TypeError, ValueError):
        number = Decimal(-1)
    if isinstance(value, bool) or not number.is_finite() or not 0 <= number <= 1:
        raise MemoryInputError("importance", "must be a number from 0 to 1, e.g. 0.7")
    return number.quantize(Decimal("0.001"))


def clean_tags(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise MemoryInputError("tags", 'must be a list of strings, e.g. ["billing"]')
    tags = tuple(clean_text("tags", t).strip()[:MAX_TAG] for t in value if t.strip())
    if len(tags) > MAX_TAGS:
        raise MemoryInputError("tags", f"at most {MAX_TAGS} tags")
    return tags


def clean_ttl_days(value: object) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTL_DAYS:
        raise MemoryInputError(
            "ttl_days", f"must be a whole number of days from 1 to {MAX_TTL_DAYS}"
        )
    return value


def clean_id(field: str, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ID:
        raise MemoryInputError(field, f"must be the id of {what} (a whole number); got {value!r}")
    return value


def clean_useful(value: object) -> bool:
    if not isinstance(value, bool):
        raise MemoryInputError("useful", "is required: true if the memory helped, else false")
    return value


def clean_query(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MemoryInputError("q", "is required: what to look for, e.g. ?q=deploy+staging")
    if len(value) > MAX_QUERY:
        raise MemoryInputError("q", f"is {len(value)} characters; at most {MAX_QUERY}")
    return " ".join(clean_text("q", value).split())


def clean_k(value: object) -> int:
    if value is None or value == "":
        return DEFAULT_K
    number = None if isinstance(value, bool) else digit_count(str(value).strip(), MAX_K)
    if number is None or number < 1:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise MemoryInputError("k", f"must be a whole number from 1 to {MAX_K}; got {shown}")
    return number


# --- the typed values the services take -----------------------------------------------------


def redacted_text(content: str, tags: tuple[str, ...]) -> tuple[str, tuple[str, ...], list[str]]:
    """Content and tags with their secrets and personal data redacted (docs/memory.md,
    "Redaction"), and the kinds found; MemoryInputError on content when the markers make it
    longer than a memory holds. A marker already there stays as it is."""
    text, kinds = redact(content)
    if len(text) > MAX_CONTENT:
        raise MemoryInputError(
            "content",
            f"is {len(text)} characters once its secrets are redacted ({', '.join(kinds)}); "
            f"at most {MAX_CONTENT}: say it shorter",
        )
    cut_tags = []
    for tag in tags:
        redacted = redact(tag)
        cut_tags.append(redacted.text[:MAX_TAG])
        kinds += redacted.kinds
    return text, tuple(cut_tags), sorted(set(kinds))


@dataclass(frozen=True, slots=True)
class MemoryFields:
    """A memory's own fields, each checked by its rule above: what a proposal, an edit and an
    import write as they are. However they are made, their content and tags are redacted
    here, and `redactions` says what was taken out: no path writes a secret."""

    content: str
    type: str
    scope: str = "project"
    importance: Decimal = DEFAULT_IMPORTANCE
    tags: tuple[str, ...] = ()
    ttl_days: int | None = None
    redactions: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        content, tags, kinds = redacted_text(self.content, tuple(self.tags))
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "tags", tags)
        object.__setattr__(self, "redactions", tuple(kinds))

    @classmethod
    def of(
        cls,
        *,
        content: object,
        type: object,
        scope: object = None,
        importance: object = None,
        tags: object = None,
        ttl_days: object = None,
    ) -> MemoryFields:
        """The fields from values as they came; MemoryInputError on the first one refused."""
        return cls(
            content=clean_content(content),
            type=clean_type(type),
            scope=clean_scope(scope),
            importance=clean_importance(importance),
            tags=clean_tags(tags),
            ttl_days=clean_ttl_days(ttl_days),
        )


@dataclass(frozen=True, slots=True)
class MemoryImport:
    """One approved memory to import, with when it was proposed and decided."""

    fields: MemoryFields
    source: str = Memory.Source.AGENT_INFERRED
    proposed_at: datetime | None = None  # default: decided_at
    decided_at: datetime | None = None  # default: now

    @classmethod
    def of(
        cls,
        *,
        content: object,
        type: object,
        scope: object = None,
        importance: object = None,
        tags: object = None,
        ttl_days: object = None,
        source: str = Memory.Source.AGENT_INFERRED,
        proposed_at: datetime | None = None,
        decided_at: datetime | None = None,
    ) -> MemoryImport:
        fields = MemoryFields.of(
            content=content,
            type=type,
            scope=scope,
            importance=importance,
            tags=tags,
            ttl_days=ttl_days,
        )
        return cls(fields, source=source, proposed_at=proposed_at, decided_at=decided_at)


@dataclass(frozen=True, slots=True)
class Feedback:
    """Was a retrieved memory useful: the memory, and the search that returned it."""

    memory_id: int
    useful: bool
    retrieval_id: int | None = None

    @classmethod
    def of(cls, *, memory_id: object, useful: object, retrieval_id: object = None) -> Feedback:
        return cls(
            memory_id=clean_id("memory_id", memory_id, "the memory"),
            useful=clean_useful(useful),
            retrieval_id=None
            if retrieval_id is None
            else clean_id("retrieval_id", retrieval_id, "the search (its retrieval_id)"),
        )


@dataclass(frozen=True, slots=True)
class Search:
    """What to look for, in which scope, how many results at most."""

    query: str
    scope: str = "project"
    k: int = DEFAULT_K

    @classmethod
    def of(cls, *, query: object, scope: object = None, k: object = None) -> Search:
        return cls(query=clean_query(query), scope=clean_scope(scope), k=clean_k(k))
