"""A negotiated rate as the rate table applies it: one PriceAdjustment row, its percentage
as an exact ratio, its scope's specificity and its words
(docs/pricing.md, "Negotiated rates")."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from decimal import Decimal

from costboard.models import PriceAdjustment


@dataclass(frozen=True, slots=True)
class Adjustment:
    """One PriceAdjustment, ready to apply: a cost × numerator / denominator."""

    id: int
    provider: str
    family: str  # "": every family of the provider
    project_id: int | None  # None: every project
    percent: Decimal
    effective_from: datetime  # 00:00 UTC of its day
    numerator: int = field(init=False, repr=False, compare=False)
    denominator: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        numerator, denominator = ((Decimal(100) + self.percent) / 100).as_integer_ratio()
        object.__setattr__(self, "numerator", numerator)
        object.__setattr__(self, "denominator", denominator)

    @property
    def specificity(self) -> int:
        """project and family 3, project 2, family 1, the provider alone 0."""
        return (2 if self.project_id is not None else 0) + (1 if self.family else 0)

    def scale(self, amount: int) -> int:
        """Pico-dollars × (1 + percent/100), to the pico-dollar, half-even (as `_usd`)."""
        quotient, remainder = divmod(amount * self.numerator, self.denominator)
        twice = 2 * remainder
        if twice > self.denominator or (twice == self.denominator and quotient % 2):
            quotient += 1
        return quotient

    def describe(self) -> str:
        scope = self.provider + (f" {self.family}" if self.family else "")
        if self.project_id is not None:
            scope += " (this project)"
        sign = "−" if self.percent < 0 else "+"
        return (
            f"{sign}{abs(self.percent).normalize():f} % negotiated on list for {scope} "
            f"from {self.effective_from:%Y-%m-%d}"
        )


def adjustment_from_row(row: PriceAdjustment) -> Adjustment:
    return Adjustment(
        id=row.pk,
        provider=row.provider.strip().lower(),
        family=row.family.strip().lower(),
        project_id=row.project_id,
        percent=row.percent,
        effective_from=datetime.combine(row.effective_from, time.min, tzinfo=UTC),
    )
