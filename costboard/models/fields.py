"""The columns the models share, and money's JSON text.

Money is numeric(…, 12) in USD: exact for every rate with up to six decimals per million
tokens (PostgreSQL numeric; SQLite keeps 15 significant digits, enough for the demo). A cap
is blank to inherit; `usd` writes an amount as the API and the budget events show it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

from django.db import models

if TYPE_CHECKING:  # DecimalField is generic in django-stubs only, not at run time
    from django.db.models.expressions import Combinable

    # What a decimal column takes and gives: any number or an expression in; a Decimal out,
    # or None from a column that is null=True.
    _DecimalIn: TypeAlias = str | float | Decimal | Combinable
    DecimalColumn: TypeAlias = models.DecimalField[_DecimalIn, Decimal]
    NullDecimalColumn: TypeAlias = models.DecimalField[_DecimalIn | None, Decimal | None]


def money_field(**options: Any) -> DecimalColumn:
    """USD: a step's cost is tokens × rate / 1e6, exact at 12 places for rates with ≤ 6
    decimals per million tokens."""
    return models.DecimalField(
        max_digits=24, decimal_places=12, default=Decimal(0), db_default=Decimal(0), **options
    )


@overload
def rate_field(*, null: Literal[True], **options: Any) -> NullDecimalColumn: ...
@overload
def rate_field(*, null: Literal[False] = ..., **options: Any) -> DecimalColumn: ...
def rate_field(**options: Any) -> DecimalColumn | NullDecimalColumn:
    """USD per million tokens; genai-prices has a few rates with 18 decimals, rounded to 10."""
    return models.DecimalField(max_digits=20, decimal_places=10, **options)


def cap_field(**options: Any) -> NullDecimalColumn:
    """A cap in USD; blank means "inherit"."""
    return models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True, **options)


def usd(amount: Decimal | None) -> str | None:
    """A USD amount as a JSON string: every significant digit, at least cents."""
    if amount is None:
        return None
    text = format(amount.normalize(), "f")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"
