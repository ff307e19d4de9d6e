from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django import template

register = template.Library()


@register.filter
def usd(amount: Decimal | None) -> str:
    """$1,234.56 for amounts from a cent up; small amounts keep 4 significant places."""
    if amount is None:
        return "—"
    amount = Decimal(amount)
    if amount == 0:
        return "$0.00"
    if abs(amount) >= Decimal("0.01"):
        return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"
    return f"${amount:.4g}" if abs(amount) >= Decimal("1e-4") else f"${amount:.2e}"


@register.filter
def tokens(count: int | None) -> str:
    if count is None:
        return "—"
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if abs(count) >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)
