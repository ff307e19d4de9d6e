"""A tag's value read from a `tags` JSON column in SQL, by its key, compared as text.

Django's key transforms read a key written in digits as an array index (`$[2024]` on SQLite,
`-> 2024` on PostgreSQL), and a tag key may be all digits (`[a-z0-9_.-]{1,64}`: "2024",
"0"): such a key found no value, so a filter on it kept nothing and its steps read untagged.
TagValue always reads an object's key. Built by name, not a lookup path: a key may hold "__".
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db.models.fields.json import KeyTextTransform

# a tag key as events carry one (docs/api.md, "Tags"): ingest refuses any other, so a key
# asked for elsewhere (a spend grouping, a tag budget, a report) that does not match is a typo
TAG_KEY = re.compile(r"[a-z0-9_.-]{1,64}")

# How pages, reports and CSVs name the spend of the steps without a key, and a value sent
# empty (`"team": ""`, a value like any other): never alike, never a blank (docs/pages.md).
UNTAGGED_LABEL = "(untagged)"
EMPTY_VALUE_LABEL = "(empty)"


class TagValue(KeyTextTransform):
    """The text value of tag `key` in a `tags` column (null when it has no such key)."""

    def __init__(self, key: str, column: str = "tags") -> None:
        super().__init__(key, column)

    def as_postgresql(
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        lhs, params, _ = self.preprocess_lhs(compiler, connection)
        # a text operand, never an int: jsonb ->> text is the object's key
        return f"({lhs} ->> %s::text)", (*params, self.key_name)

    def as_sqlite(
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        lhs, params, _ = self.preprocess_lhs(compiler, connection)
        # a quoted path member ($."2024"): a key; tags' values are strings, read as text
        return f"JSON_EXTRACT({lhs}, %s)", (*params, f"$.{json.dumps(self.key_name)}")
