"""What a memory takes as input, and the refusals: each cleaner returns the value as stored or
raises MemoryInputError naming the field and the fix; NotFound is an id that is not the
project's. The write services (memory_ui/writes/), the review form and the API's schemas
share them, so a field is checked by one rule wherever it comes in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal

from memory_ui.models import MAX_CONTENT, Memory

DEFAULT_IMPORTANCE = Decimal("0.5")
# matched with fullmatch: `$` alone lets a trailing newline through ("user:a\n")
SCOPE = re.compile(r"^(project|user:[\w.@+-]{1,128})$")
MAX_TAGS = 20
MAX_TTL_DAYS = 36_500  # a hundred years
MAX_QUERY = 500  # RetrievalLog.query's length


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


# The API hands these what it parsed from JSON, as it came: each is checked at run time too,
# whatever its annotation says.


def clean_content(content: str) -> str:
    if not isinstance(content, str) or not content.strip():
        raise MemoryInputError("content", "is required: one sentence of what to remember")
    text = " ".join(content.split())  # one line: MEMORY.md has one entry per line
    if len(text) > MAX_CONTENT:
        raise MemoryInputError(
            "content", f"is {len(text)} characters; at most {MAX_CONTENT}: say it shorter"
        )
    return text


def clean_type(value: str) -> str:
    if value not in Memory.Type.values:
        raise MemoryInputError("type", f"must be one of {', '.join(Memory.Type.values)}")
    return str(value)


def clean_scope(value: str | None) -> str:
    if value is None or value == "":
        return "project"
    if not isinstance(value, str) or not SCOPE.fullmatch(value):
        raise MemoryInputError("scope", 'must be "project" or "user:<user_id>"')
    return value


def clean_importance(value: Decimal | float | str | None) -> Decimal:
    if value is None:
        return DEFAULT_IMPORTANCE
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        number = Decimal(-1)
    if isinstance(value, bool) or not number.is_finite() or not 0 <= number <= 1:
        raise MemoryInputError("importance", "must be a number from 0 to 1, e.g. 0.7")
    return number.quantize(Decimal("0.001"))


def clean_tags(value: Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise MemoryInputError("tags", 'must be a list of strings, e.g. ["billing"]')
    tags = [t.strip()[:40] for t in value if t.strip()]
    if len(tags) > MAX_TAGS:
        raise MemoryInputError("tags", f"at most {MAX_TAGS} tags")
    return tags


def clean_ttl_days(value: int | str | None) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTL_DAYS:
        raise MemoryInputError("ttl_days", "must be a whole number of days from 1 to 36500")
    return value
