"""Exact USD as ints: costs are kept to 12 decimal places, so a cost is a whole number of
pico-dollars (10**-12 USD), summed as ints and turned back into `Decimal` exactly."""

from __future__ import annotations

from decimal import Decimal

PICO = 10**12  # pico-dollars per USD


def pico_text(amount: int) -> str:
    """Pico-dollars as the exact decimal text of the USD amount ("0.000123450000")."""
    whole, fraction = divmod(abs(amount), PICO)
    return f"{'-' if amount < 0 else ''}{whole}.{fraction:012d}"


def pico_usd(amount: int) -> Decimal:
    return Decimal(pico_text(amount))
