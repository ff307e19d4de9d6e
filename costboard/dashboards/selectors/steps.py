"""/steps/'s reads: the names steps carried (the model and step-type filters' choices), the
filter its table, charts and tag breakdown share, and the table, latency and turn-cost
histogram it keeps."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from itertools import pairwise

from django.db.models import Case, Count, IntegerField, Q, QuerySet, Sum, Value, When

from costboard.dashboards.selectors.shared import ZERO, ExactModel, day_start
from costboard.ingest.latency import latency_bucket, percentile
from costboard.models import (
    STANDARD_TIER,
    TOOL_MODEL,
    DailyRollup,
    LatencyRollup,
    ModelPrice,
    Step,
    Turn,
)
from costboard.numbers import usd_text


@dataclass(frozen=True)
class StepNames:
    """The names the projects' steps have ever carried: what the model, exact-name and
    step-type filters accept (docs/pages.md, "Parameters"); `families` are the model
    filter's choices."""

    families: list[str]
    models: list[str]
    step_types: list[str]

    @property
    def model_filters(self) -> set[str]:
        """`?model=` takes a family, or an exact name (as links from before families did)."""
        return {*self.families, *self.models}


def step_names(*, project_ids: list[int]) -> StepNames:
    """The families, exact models and step types of the projects' steps, from their daily
    rollups (one query over the rollups' distinct keys, not the steps)."""
    rows = (
        DailyRollup.objects.filter(project_id__in=project_ids)
        .values_list("family", "model", "step_type")
        .distinct()
        .order_by()
    )
    families, models, step_types = set(), set(), set()
    for family, model, step_type in rows:
        families.add(family)
        models.add(model)
        step_types.add(step_type)
    return StepNames(sorted(families), sorted(models), sorted(step_types))


@dataclass
class StepTypeModelRow:
    """One step type × model family, with the exact names behind it."""

    step_type: str
    family: str
    service_tier: str = ""  # when grouped by tier (`?by_tier=1`), else ""
    calls: int = 0
    errors: int = 0
    unpriced: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cost_usd: Decimal = ZERO
    names: list[ExactModel] = field(default_factory=list)

    @property
    def is_tool(self) -> bool:
        return self.family == TOOL_MODEL

    @property
    def aliased(self) -> bool:
        return any(name.model != self.family for name in self.names)

    @property
    def cost_per_call(self) -> Decimal:
        return self.cost_usd / self.calls if self.calls else ZERO

    @property
    def error_rate(self) -> float:
        return self.errors / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class StepFilter:
    """/steps/'s filters, which its table, charts and tag breakdown all apply: `model` keeps
    one family (or one exact name, as links from before families did), `exact` one exact
    name, `step_type` one step type, `tier` one service tier; `by_tier` splits the table's
    rows by service tier. The same condition on DailyRollup and Step, whose columns share
    their names, but for the tier, which only steps keep: with it, every read is of steps."""

    model: str = ""
    exact: str = ""
    step_type: str = ""
    tier: str = ""
    by_tier: bool = False

    @property
    def by_model(self) -> bool:
        """A model or tier filter: what the latency and tag rollups, kept without models and
        tiers, can't apply."""
        return bool(self.model or self.exact or self.tier)

    @property
    def of_steps(self) -> bool:
        """Whether the table must read steps (the daily rollups keep no tier)."""
        return bool(self.tier or self.by_tier)

    @property
    def any(self) -> bool:
        return self.by_model or bool(self.step_type)

    @property
    def q(self) -> Q:
        condition = Q()
        if self.model:
            condition &= Q(family=self.model) | Q(model=self.model)
        if self.exact:
            condition &= Q(model=self.exact)
        if self.step_type:
            condition &= Q(step_type=self.step_type)
        if self.tier:
            condition &= Q(service_tier=self.tier)
        return condition


def service_tiers() -> list[str]:
    """The tiers /steps/ offers to filter by: standard and those the rate table prices (a
    step's own word, with no price row, is accepted too: `?tier=` takes any tier word)."""
    tiers = ModelPrice.objects.values_list("service_tier", flat=True).distinct().order_by()
    return sorted({STANDARD_TIER, *tiers})


def period_steps(
    project_ids: list[int], since: date, until: date, steps: StepFilter
) -> QuerySet[Step]:
    """The steps of the period (UTC days, as the rollups count them) that `steps` keeps: what
    /steps/ reads when its filter is one no rollup holds."""
    return Step.objects.filter(
        steps.q,
        project_id__in=project_ids,
        timestamp__gte=day_start(since),
        timestamp__lt=day_start(until) + timedelta(days=1),
    )


def steps_by_type_and_model(
    *,
    project_ids: list[int],
    since: date,
    until: date,
    steps: StepFilter = StepFilter(),
) -> list[StepTypeModelRow]:
    """Calls, errors, tokens and cost per step type and model family (kept by `steps`), each
    row with its exact names; per service tier too with `steps.by_tier`. From the daily
    rollups, or from the period's steps when a tier filters or groups (no rollup keeps it)."""
    if steps.of_steps:
        tier = "service_tier" if steps.by_tier else None
        found = (
            period_steps(project_ids, since, until, steps)
            .values("step_type", "family", "model", *([tier] if tier else []))
            .annotate(
                calls=Count("*"),
                errors=Count("id", filter=Q(success=False)),
                unpriced=Count("id", filter=Q(price__isnull=True) & ~Q(family=TOOL_MODEL)),
                inp=Sum("input_tokens"),
                out=Sum("output_tokens"),
                cr=Sum("cache_read_input_tokens"),
                cw=Sum("cache_creation_input_tokens"),
                cost=Sum("cost_usd"),
            )
            .order_by()
        )
    else:
        found = (
            DailyRollup.objects.filter(
                steps.q, project_id__in=project_ids, day__gte=since, day__lte=until
            )
            .values("step_type", "family", "model")
            .annotate(
                calls=Sum("calls"),
                errors=Sum("errors"),
                unpriced=Sum("unpriced_calls"),
                inp=Sum("input_tokens"),
                out=Sum("output_tokens"),
                cr=Sum("cache_read_input_tokens"),
                cw=Sum("cache_creation_input_tokens"),
                cost=Sum("cost_usd"),
            )
            .order_by()
        )
    grouped: dict[tuple[str, str, str], StepTypeModelRow] = {}
    for r in found:
        key = (r["step_type"], r["family"], r.get("service_tier", ""))
        row = grouped.get(key)
        if row is None:
            row = grouped[key] = StepTypeModelRow(
                step_type=r["step_type"], family=r["family"], service_tier=key[2]
            )
        row.calls += r["calls"]
        row.errors += r["errors"]
        row.unpriced += r["unpriced"]
        row.input_tokens += r["inp"]
        row.output_tokens += r["out"]
        row.cache_read_input_tokens += r["cr"]
        row.cache_creation_input_tokens += r["cw"]
        row.cost_usd += r["cost"]
        row.names.append(ExactModel(r["model"], r["calls"], r["cost"]))
    result = list(grouped.values())
    for row in result:
        row.names.sort(key=lambda n: (-n.cost_usd, -n.calls, n.model))
    result.sort(key=lambda r: (r.is_tool, -r.cost_usd, r.step_type, r.family, r.service_tier))
    return result


@dataclass(frozen=True)
class Latency:
    step_type: str
    calls: int
    p50_ms: float | None
    p95_ms: float | None


def latency_by_step_type(
    *,
    project_ids: list[int],
    since: date,
    until: date,
    steps: StepFilter = StepFilter(),
) -> list[Latency]:
    """p50 and p95 per step type of the steps `steps` keeps, from the latency histograms; with
    a model filter, which they are not kept by, from the period's steps of that model."""
    histograms: dict[str, dict[int, int]] = defaultdict(dict)
    if steps.by_model:
        timed = period_steps(project_ids, since, until, steps).filter(duration_ms__isnull=False)
        for step_type, duration, calls in (
            timed.values("step_type", "duration_ms")
            .annotate(calls=Count("*"))
            .order_by()
            .values_list("step_type", "duration_ms", "calls")
        ):
            bucket = latency_bucket(duration or 0)  # never None: filtered out
            histogram = histograms[step_type]
            histogram[bucket] = histogram.get(bucket, 0) + calls
    else:
        rows = LatencyRollup.objects.filter(
            project_id__in=project_ids, day__gte=since, day__lte=until
        )
        if steps.step_type:
            rows = rows.filter(step_type=steps.step_type)
        for row in rows.values("step_type", "bucket").annotate(calls=Sum("calls")).order_by():
            histograms[row["step_type"]][row["bucket"]] = row["calls"]
    return sorted(
        (
            Latency(
                step_type=name,
                calls=sum(h.values()),
                p50_ms=percentile(h, 0.5),
                p95_ms=percentile(h, 0.95),
            )
            for name, h in histograms.items()
        ),
        key=lambda lat: -(lat.p95_ms or 0),
    )


# Upper bounds of the cost-per-turn histogram, in USD; the last bucket is open.
TURN_COST_EDGES = [
    Decimal(x)
    for x in ("0.0001", "0.0003", "0.001", "0.003", "0.01", "0.03", "0.1", "0.3", "1", "3", "10")
]


def turn_cost_distribution(
    *,
    project_ids: list[int],
    since: date,
    until: date,
    steps: StepFilter = StepFilter(),
) -> list[tuple[str, int]]:
    """How many turns cost how much (one pass over the period's turns, counted in SQL). With
    a filter, the turns that have a step it keeps in the period, each by what those steps
    cost: the spend the table beside it shows, per turn."""
    if steps.any:
        counts = _kept_turn_costs(project_ids, since, until, steps)
    else:
        turns = Turn.objects.filter(
            project_id__in=project_ids,
            started_at__gte=day_start(since),
            started_at__lt=day_start(until) + timedelta(days=1),
        )
        # One CASE per turn (a few comparisons) rather than a filtered count per bucket (two
        # comparisons each, for every turn): a third of the time on 300k turns.
        bucket = Case(
            *(When(cost_usd__lt=high, then=Value(i)) for i, high in enumerate(TURN_COST_EDGES)),
            default=Value(len(TURN_COST_EDGES)),
            output_field=IntegerField(),
        )
        counts = dict(
            turns.annotate(bucket=bucket)
            .values("bucket")
            .annotate(turns=Count("*"))
            .order_by()
            .values_list("bucket", "turns")
        )
    edges = [usd_text(high).removesuffix(".00") for high in TURN_COST_EDGES]  # $0.001, $3
    labels = [f"< {edges[0]}"]
    labels += [f"{low}–{high}" for low, high in pairwise(edges)]
    labels.append(f"≥ {edges[-1]}")
    return [(label, counts.get(i, 0)) for i, label in enumerate(labels)]


def _kept_turn_costs(
    project_ids: list[int], since: date, until: date, steps: StepFilter
) -> dict[int, int]:
    """turn_cost_distribution's buckets → turns under a filter: the kept steps of the period
    summed per turn in SQL, bucketed here (a CASE over a per-turn subquery ran the subquery
    once per comparison: 2.7 s on 300,000 steps, where this reads them once)."""
    per_turn = (
        period_steps(project_ids, since, until, steps)
        .filter(turn_id__isnull=False)
        .values("turn_id")
        .annotate(cost=Sum("cost_usd"))
        .order_by()
        .values_list("cost", flat=True)
    )
    counts: dict[int, int] = defaultdict(int)
    for cost in per_turn:  # one Decimal per turn: no server-side cursor (WITH HOLD copies it)
        counts[bisect_right(TURN_COST_EDGES, cost or ZERO)] += 1  # the first edge above it
    return counts
