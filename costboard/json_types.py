"""How the API writes a USD amount, a time and a count in JSON, as pydantic documents them.

A leaf: the API's answer models (costboard/api/schemas.py) and the budget answer the budgets
build (costboard/budgets/caps.py, `SessionBudget`) both describe their fields with these, so
the OpenAPI document shows one shape for one value wherever it appears.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, WithJsonSchema

# USD as the API writes it (costboard.models.usd): every significant digit, at least cents.
Money = Annotated[
    str,
    WithJsonSchema(
        {"type": "string", "pattern": r"^-?[0-9]+\.[0-9]{2,}$", "description": "USD, decimal"}
    ),
]
# A time as the API writes it: `datetime.isoformat()`, kept as written.
IsoTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
Count = Annotated[int, Field(ge=0)]
