"""The overview's reads: spend by period, the month's charts by model family, step type and
token kind, the costliest sessions, the recent spend anomalies, and the models no price covers
(staff only)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Q, QuerySet, Sum

from costboard.budgets.holds import held_by
from costboard.dashboards.selectors.shared import MILLION, ZERO, FamilyTally, FamilyUsage, day_start
from costboard.models import DailyRollup, PeriodBudget, Session, SpendAnomaly
from costboard.pricing.rates import rate_table


@dataclass(frozen=True)
class Spend:
    label: str
    cost_usd: Decimal
    previous_usd: Decimal
    calls: int

    @property
    def compared_to(self) -> str:
        return "yesterday" if self.label == "Today" else f"the previous {self.label}"

    @property
    def change_pct(self) -> Decimal | None:
        if not self.previous_usd:
            return None
        return (self.cost_usd - self.previous_usd) / self.previous_usd * 100


PERIODS = (("Today", 1), ("7 days", 7), ("30 days", 30))


def spend_by_period(*, project_ids: list[int], today: date) -> list[Spend]:
    """Spend today, over 7 and over 30 days, each against the period before it (one query)."""
    first = today - timedelta(days=2 * PERIODS[-1][1] - 1)
    rows = (
        DailyRollup.objects.filter(project_id__in=project_ids, day__gte=first, day__lte=today)
        .values("day")
        .annotate(cost=Sum("cost_usd"), calls=Sum("calls"))
    )
    by_day = {r["day"]: (r["cost"] or ZERO, r["calls"] or 0) for r in rows}
    periods = []
    for label, days in PERIODS:
        current = [today - timedelta(days=i) for i in range(days)]
        previous = [today - timedelta(days=days + i) for i in range(days)]
        periods.append(
            Spend(
                label=label,
                cost_usd=sum((by_day.get(d, (ZERO, 0))[0] for d in current), ZERO),
                previous_usd=sum((by_day.get(d, (ZERO, 0))[0] for d in previous), ZERO),
                calls=sum(by_day.get(d, (ZERO, 0))[1] for d in current),
            )
        )
    return periods


@dataclass
class UsageBreakdown:
    """The overview's charts, from one pass over the period's rollups."""

    days: list[date]
    cost_by_day_model: dict[str, dict[date, Decimal]]  # by family
    cost_by_step_type: dict[str, Decimal]
    tokens_by_kind: dict[str, int]
    cost_by_kind: dict[str, Decimal]
    cache_savings_usd: Decimal
    families: list[FamilyUsage] = field(default_factory=list)


TOKEN_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache read": "cache_read_input_tokens",
    "cache write": "cache_creation_input_tokens",
}
COST_KINDS = {
    "input": "cost_input_usd",
    "output": "cost_output_usd",
    "cache read": "cost_cache_read_usd",
    "cache write": "cost_cache_write_usd",
}


def usage_breakdown(*, project_ids: list[int], since: date, until: date) -> UsageBreakdown:
    """Cost by day and model family, by step type, tokens and cost by kind, each family's
    exact names, and what cache reads saved against the model's uncached input rate — over
    [since, until]."""
    sums = {name: Sum(name) for name in (*TOKEN_KINDS.values(), *COST_KINDS.values())}
    rows = (
        DailyRollup.objects.filter(project_id__in=project_ids, day__gte=since, day__lte=until)
        .values("day", "family", "model", "step_type")
        .annotate(cost=Sum("cost_usd"), calls=Sum("calls"), **sums)
        .order_by()
    )
    families = FamilyTally()
    by_day_model: dict[str, dict[date, Decimal]] = defaultdict(lambda: defaultdict(lambda: ZERO))
    by_step_type: dict[str, Decimal] = defaultdict(lambda: ZERO)
    tokens = dict.fromkeys(TOKEN_KINDS, 0)
    costs = dict.fromkeys(COST_KINDS, ZERO)
    cache_reads: dict[tuple[str, date], list[Any]] = defaultdict(lambda: [0, ZERO])
    row: dict[str, Any]  # the sums' keys are built above, so the stubs cannot type them
    for row in rows:  # type: ignore[assignment]
        families.add(row["family"], row["model"], row["calls"] or 0, row["cost"] or ZERO)
        by_day_model[row["family"]][row["day"]] += row["cost"] or ZERO
        by_step_type[row["step_type"]] += row["cost"] or ZERO
        for kind, column in TOKEN_KINDS.items():
            tokens[kind] += row[column] or 0
        for kind, column in COST_KINDS.items():
            costs[kind] += row[column] or ZERO
        if row["cache_read_input_tokens"]:
            pair = cache_reads[(row["model"], row["day"])]
            pair[0] += row["cache_read_input_tokens"]
            pair[1] += row["cost_cache_read_usd"] or ZERO
    table = rate_table()
    savings = ZERO
    for (model, day), (read_tokens, paid) in cache_reads.items():
        rate = table.rate_at(model, "", day_start(day) + timedelta(hours=12))
        if rate is not None:
            savings += Decimal(read_tokens) * rate.base.input / MILLION - paid
    days = [since + timedelta(days=i) for i in range((until - since).days + 1)]
    ordered = dict(sorted(by_day_model.items(), key=lambda item: -sum(item[1].values())))
    return UsageBreakdown(
        days=days,
        cost_by_day_model=ordered,
        cost_by_step_type=dict(sorted(by_step_type.items(), key=lambda i: -i[1])),
        tokens_by_kind=tokens,
        cost_by_kind=costs,
        cache_savings_usd=savings,
        families=families.ordered(),
    )


def sessions_costliest(
    *,
    project_ids: list[int],
    since: datetime,
    limit: int = 10,
    stops: Sequence[PeriodBudget] = (),
) -> QuerySet[Session]:
    """The costliest sessions active since `since`, each annotated `held_by_budget`: the id
    of the first of `stops` (the projects' stop-budgets in force) holding it, or None."""
    return (
        Session.objects.filter(project_id__in=project_ids, last_active_at__gte=since)
        .select_related("project")
        .annotate(held_by_budget=held_by(stops))
        .order_by("-cost_usd", "-id")[:limit]
    )


@dataclass(frozen=True)
class UnpricedModel:
    model: str
    calls: int
    tokens: int


def models_unpriced(*, project_ids: list[int]) -> list[UnpricedModel]:
    """Exact model names with steps no price covers (from the rollups' unpriced call counts:
    tool steps are never among them). Models whose calls carried no tokens at all are left
    out: with no tokens there is nothing a price would change."""
    rows = (
        DailyRollup.objects.filter(project_id__in=project_ids, unpriced_calls__gt=0)
        .values("model")
        .annotate(
            calls=Sum("unpriced_calls"),
            tokens=Sum("input_tokens") + Sum("output_tokens"),
            cached=Sum("cache_read_input_tokens") + Sum("cache_creation_input_tokens"),
        )
        .filter(Q(tokens__gt=0) | Q(cached__gt=0))
        .order_by("-calls")
    )
    return [UnpricedModel(r["model"], r["calls"], r["tokens"] or 0) for r in rows]


def anomalies_recent(
    *, project_ids: list[int], since: datetime, limit: int = 10
) -> tuple[list[SpendAnomaly], int]:
    """The latest `limit` spend anomalies raised since `since`, newest first, and how many
    were (each was alerted): one query, a second only when the list is full."""
    raised = SpendAnomaly.objects.filter(project_id__in=project_ids, at__gte=since)
    latest = list(raised.select_related("project").order_by("-at", "-pk")[:limit])
    return latest, (raised.count() if len(latest) == limit else len(latest))
