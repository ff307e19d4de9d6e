"""Read queries for pages: rollups first, never a scan of all steps for totals."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from django.db.models import QuerySet, Sum

from costboard.models import DailyRollup, Project, Session


@dataclass(frozen=True)
class Spend:
    label: str
    cost_usd: Decimal
    previous_usd: Decimal
    calls: int

    @property
    def change_pct(self) -> Decimal | None:
        if not self.previous_usd:
            return None
        return (self.cost_usd - self.previous_usd) / self.previous_usd * 100


def _rollup_sum(projects: QuerySet[Project], start: date, end: date) -> tuple[Decimal, int]:
    """Cost and calls over [start, end) days."""
    agg = DailyRollup.objects.filter(project__in=projects, day__gte=start, day__lt=end).aggregate(
        cost=Sum("cost_usd"), calls=Sum("calls")
    )
    return agg["cost"] or Decimal(0), agg["calls"] or 0


def spend_by_period(*, projects: QuerySet[Project], today: date) -> list[Spend]:
    """Spend today, over 7 and over 30 days, each against the period before it."""
    periods = []
    for label, days in (("Today", 1), ("7 days", 7), ("30 days", 30)):
        start = today - timedelta(days=days - 1)
        cost, calls = _rollup_sum(projects, start, today + timedelta(days=1))
        previous, _ = _rollup_sum(projects, start - timedelta(days=days), start)
        periods.append(Spend(label=label, cost_usd=cost, previous_usd=previous, calls=calls))
    return periods


def sessions_latest(*, projects: QuerySet[Project], limit: int = 20) -> QuerySet[Session]:
    return (
        Session.objects.filter(project__in=projects)
        .select_related("project")
        .order_by("-last_active_at")[:limit]
    )


@dataclass(frozen=True)
class UnpricedModel:
    model: str
    calls: int
    tokens: int


def models_unpriced(*, projects: QuerySet[Project]) -> list[UnpricedModel]:
    """Models with steps no price covers (from the rollups' unpriced call counts)."""
    rows = (
        DailyRollup.objects.filter(project__in=projects, unpriced_calls__gt=0)
        .values("model")
        .annotate(calls=Sum("unpriced_calls"), tokens=Sum("input_tokens") + Sum("output_tokens"))
        .order_by("-calls")
    )
    return [UnpricedModel(r["model"], r["calls"], r["tokens"] or 0) for r in rows]
