"""Reconciliation (docs/billing.md, "Reconciliation"): Costboard's estimate beside what the
providers billed, per project × provider × UTC day × model. Reads only; the drift alerts it
feeds are recorded by costboard/billing/services.py.

The estimate is read from the steps (no rollup keeps a step's provider): per project, UTC
day, exact model name and provider, their `cost_usd` and `input_tokens`. A step's provider
is its price row's (the rate table's choice, `ModelPrice.provider`), else the provider it
was sent with (canonical: `Anthropic` → `anthropic`), else the model's home provider as
genai-prices knows it (`claude-…` → `anthropic`); a step with none of them, and tool steps
($0 by nature), are never reconciled. Steps no longer kept (deleted by retention, or with
their sessions in the admin) are still in the daily rollups, as the spend API counts them:
what a day's rollup of a model holds beyond its kept steps is added to the estimate (by the
provider of the model's kept steps, else of the bill naming its family, else the rate
table's: `_removed_add`), and the line says `steps_removed`.

What was billed is read from `BilledUsage`, per project, provider, day and model name: the
cost from the cost sources, the reported input tokens from the usage sources. Rows sent by
hand (`csv`, `api`) for a project's provider-day replace that provider-day's imported rows
(an invoice is the last word): the hand-sent source sent last counts alone for the cost, and
for the tokens when any of its rows gives them (else the imported usage report's stay).
Rows of no Costboard project (an unmapped provider project) belong to no reconciliation.

Only a provider-day something was billed or reported for is reconciled: there is nothing to
compare a day's steps with before its bill is imported. Within one, the names are matched
exactly first; a name left on either side joins the line of its family if one was matched
exactly, and the rest are then matched by family (the name lower-cased, without a provider
prefix or a snapshot suffix: `gpt-4o-2024-08-06` and `openai/gpt-4o` are `gpt-4o`;
costboard/pricing/families.py), a step by its stored family. A line matched by family takes
the billed name when one billed name matched, else the family. A name left unmatched is a
line of its own: billed with no steps, it is **uninstrumented** spend
(calls that never reported, or cost no step carries such as a tool's line item with no
model); steps with no bill are a line billed at $0.

drift_usd = billed − estimated (positive: the provider billed more than Costboard
estimated); drift_pct = drift ÷ billed × 100, to two decimals, null when billed is 0 (there
is no percentage of nothing).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import Count, Max, Sum
from django.db.models.functions import TruncDate

from costboard.models import TOOL_MODEL, BilledUsage, DailyRollup, Step
from costboard.pricing.families import model_family
from costboard.pricing.names import billing_provider, home_provider
from costboard.pricing.rates import rate_table

ZERO = Decimal(0)
PCT = Decimal("0.01")
GROUPS = ("day", "provider", "model")
HAND = (BilledUsage.Source.CSV, BilledUsage.Source.API)
COST_SOURCES = frozenset(
    {BilledUsage.Source.OPENAI_COSTS, BilledUsage.Source.ANTHROPIC_COST_REPORT, *HAND}
)
USAGE_SOURCES = frozenset({BilledUsage.Source.OPENAI_USAGE, BilledUsage.Source.ANTHROPIC_USAGE})


def drift_pct(drift: Decimal, billed: Decimal) -> Decimal | None:
    """drift ÷ billed × 100 to two decimals; None when nothing was billed."""
    if billed == 0:
        return None
    return (drift / billed * 100).quantize(PCT, rounding=ROUND_HALF_EVEN)


@dataclass(slots=True)
class Figures:
    """Estimated beside billed, for a line or any group of lines."""

    estimated_cost_usd: Decimal = ZERO
    billed_cost_usd: Decimal = ZERO
    estimated_input_tokens: int = 0
    billed_input_tokens: int | None = None  # None: no billed row reported input tokens
    steps: int = 0
    billed_rows: int = 0
    uninstrumented_cost_usd: Decimal = ZERO  # billed on lines with no step
    steps_removed: int = 0  # of `steps`, those no longer kept: estimated from the rollups

    @property
    def drift_usd(self) -> Decimal:
        return self.billed_cost_usd - self.estimated_cost_usd

    @property
    def drift_pct(self) -> Decimal | None:
        return drift_pct(self.drift_usd, self.billed_cost_usd)

    @property
    def uninstrumented(self) -> bool:
        """The provider billed or reported something here and Costboard has no step of it."""
        return self.steps == 0 and self.billed_rows > 0

    @property
    def estimated_from_rollups(self) -> bool:
        """Some of the estimate's steps are gone (retention): their part is the rollups'."""
        return self.steps_removed > 0

    def add(self, other: Figures) -> None:
        self.estimated_cost_usd += other.estimated_cost_usd
        self.billed_cost_usd += other.billed_cost_usd
        self.estimated_input_tokens += other.estimated_input_tokens
        if other.billed_input_tokens is not None:
            self.billed_input_tokens = (self.billed_input_tokens or 0) + other.billed_input_tokens
        self.steps += other.steps
        self.billed_rows += other.billed_rows
        self.uninstrumented_cost_usd += other.uninstrumented_cost_usd
        self.steps_removed += other.steps_removed


@dataclass(slots=True)
class Line(Figures):
    """One project × provider × day × model (None: billed cost no model names)."""

    project_id: int = 0
    provider: str = ""
    day: date = date.min
    model: str | None = None

    def group(self, names: Sequence[str]) -> tuple[str | None, ...]:
        return tuple(self.day.isoformat() if n == "day" else getattr(self, n) for n in names)


@dataclass(slots=True)
class Group(Figures):
    """Lines summed by some of day, provider, model (and project)."""

    values: dict[str, str | int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Wanted:
    """What to reconcile: projects (None: every project), UTC days, maybe one provider,
    day or model (the model as a line names it)."""

    project_ids: list[int] | None
    since: date
    until: date
    provider: str = ""
    model: str = ""


def step_provider(price_provider: str | None, sent: str, model: str) -> str:
    """The provider a step is billed by: its price row's (or, priced by the row of a provider
    whose models the one it was sent through resells, that reseller's: Azure, not OpenAI),
    else the one it was sent with, else its model's home provider; "" when none is known."""
    return billing_provider(price_provider or "", sent) or home_provider(model) or ""


# --- reading -----------------------------------------------------------------------------------


_Key = tuple[int, str, date]  # project, provider, day


@dataclass(slots=True)
class _Side:
    cost: Decimal = ZERO
    tokens: int | None = None
    count: int = 0
    family: str = ""
    removed: int = 0  # of `count`, steps no longer kept (their share read from the rollups)

    def add(self, cost: Decimal | None, tokens: int | None, count: int) -> None:
        self.cost += cost or ZERO
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens
        self.count += count


def _billed(wanted: Wanted) -> dict[_Key, dict[str | None, _Side]]:
    rows = BilledUsage.objects.filter(
        project_id__isnull=False, day__gte=wanted.since, day__lte=wanted.until
    )
    if wanted.project_ids is not None:
        rows = rows.filter(project_id__in=wanted.project_ids)
    if wanted.provider:
        rows = rows.filter(provider=wanted.provider)
    grouped = rows.values("project_id", "provider", "day", "source", "model").annotate(
        cost=Sum("cost_usd"), tokens=Sum("input_tokens"), n=Count("id"), last=Max("imported_at")
    )
    by_key: dict[_Key, list[dict[str, object]]] = defaultdict(list)
    for row in grouped:
        by_key[(row["project_id"], row["provider"], row["day"])].append(dict(row))
    billed: dict[_Key, dict[str | None, _Side]] = {}
    for key, rows_of_day in by_key.items():
        sides: dict[str | None, _Side] = defaultdict(_Side)
        hand = [r for r in rows_of_day if r["source"] in HAND]
        if hand:
            # the hand-sent source sent last (`api` after `csv` on a tie) counts alone
            last = max(hand, key=lambda r: (r["last"], r["source"] == BilledUsage.Source.API))
            chosen = [r for r in hand if r["source"] == last["source"]]
            costs, tokens = chosen, chosen
            if all(r["tokens"] is None for r in chosen):
                tokens = [r for r in rows_of_day if r["source"] in USAGE_SOURCES]
        else:
            costs = [r for r in rows_of_day if r["source"] in COST_SOURCES]
            tokens = [r for r in rows_of_day if r["source"] in USAGE_SOURCES]
        for r in costs:
            sides[_name(r["model"])].add(_decimal(r["cost"]), None, _int(r["n"]))
        for r in tokens:
            side = sides[_name(r["model"])]
            side.add(None, _optional_int(r["tokens"]), 0 if r in costs else _int(r["n"]))
        billed[key] = dict(sides)
    return billed


def _steps(
    wanted: Wanted, billed: dict[_Key, dict[str | None, _Side]]
) -> dict[_Key, dict[str, _Side]]:
    keys = set(billed)
    start = datetime.combine(wanted.since, time.min, tzinfo=UTC)
    end = datetime.combine(wanted.until + timedelta(days=1), time.min, tzinfo=UTC)
    projects = sorted({k[0] for k in keys})
    steps = (
        Step.objects.filter(project_id__in=projects, timestamp__gte=start, timestamp__lt=end)
        .exclude(family=TOOL_MODEL)  # a tool step's family, however its model was spelt
        .annotate(utc_day=TruncDate("timestamp", tzinfo=UTC))
        .values("project_id", "utc_day", "model", "family", "provider", "price__provider")
        .annotate(cost=Sum("cost_usd"), tokens=Sum("input_tokens"), n=Count("id"))
        .order_by()
    )
    found: dict[_Key, dict[str, _Side]] = defaultdict(dict)
    kept: dict[tuple[int, date, str, str], _Side] = defaultdict(lambda: _Side(tokens=0))
    sent_by: dict[tuple[int, str], Counter[str]] = defaultdict(Counter)  # project, model
    for row in steps:
        kept[(row["project_id"], row["utc_day"], row["family"], row["model"])].add(
            _decimal(row["cost"]), _int(row["tokens"]), _int(row["n"])
        )
        provider = step_provider(row["price__provider"], row["provider"], row["model"])
        sent_by[(row["project_id"], row["model"])][provider] += _int(row["n"])
        key = (row["project_id"], provider, row["utc_day"])
        if key not in keys:
            continue  # nothing billed to compare with
        side = found[key].setdefault(row["model"], _Side(tokens=0))
        side.add(_decimal(row["cost"]), _int(row["tokens"]), _int(row["n"]))
        side.family = row["family"] or model_family(row["model"])
    _removed_add(wanted, projects, billed, kept, sent_by, found)
    return found


def _removed_add(
    wanted: Wanted,
    projects: list[int],
    billed: dict[_Key, dict[str | None, _Side]],
    kept: dict[tuple[int, date, str, str], _Side],
    sent_by: dict[tuple[int, str], Counter[str]],
    found: dict[_Key, dict[str, _Side]],
) -> None:
    """Add what each day's rollup of a model holds beyond its kept steps (steps deleted by
    retention: the rollups keep their totals as last priced) to `found`. A rollup keeps
    no provider: the model's is the one its kept steps in the period have (the most of
    them), else the one whose bill that day names its family, else the one the rate table
    prices it by with none given, else its home provider."""
    rollups = (
        DailyRollup.objects.filter(
            project_id__in=projects, day__gte=wanted.since, day__lte=wanted.until
        )
        .exclude(family=TOOL_MODEL)
        .values("project_id", "day", "family", "model")
        .annotate(cost=Sum("cost_usd"), tokens=Sum("input_tokens"), n=Sum("calls"))
        .order_by()
    )
    table = None
    billed_families: dict[tuple[int, date], list[tuple[str, set[str]]]] = defaultdict(list)
    for (project_id, provider, day), names in sorted(billed.items()):
        families = {model_family(name) for name in names if name}
        billed_families[(project_id, day)].append((provider, families))
    for row in rollups:
        there = kept.get((row["project_id"], row["day"], row["family"], row["model"]), _Side())
        removed = _int(row["n"]) - there.count
        if removed <= 0:
            continue
        family = row["family"] or model_family(row["model"])
        providers = sent_by.get((row["project_id"], row["model"]))
        if providers:
            provider = providers.most_common(1)[0][0]
        else:
            named = [
                billed_by
                for billed_by, families in billed_families[(row["project_id"], row["day"])]
                if family in families
            ]
            if named:
                provider = named[0]
            else:
                if table is None:
                    table = rate_table()
                rates = table.candidates(row["model"])
                priced_by = next((r.provider for r in rates if r.provider), "")
                provider = step_provider(priced_by, "", row["model"])
        key = (row["project_id"], provider, row["day"])
        if key not in billed:
            continue  # nothing billed to compare with
        side = found[key].setdefault(row["model"], _Side(tokens=0))
        side.add(
            _decimal(row["cost"]) - there.cost,
            _int(row["tokens"]) - (there.tokens or 0),
            removed,
        )
        side.removed += removed
        side.family = family


def _name(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _decimal(value: object) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value or 0))


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | Decimal | float) else 0


def _optional_int(value: object) -> int | None:
    return None if value is None else _int(value)


# --- matching ----------------------------------------------------------------------------------


def _matched(key: _Key, billed: dict[str | None, _Side], steps: dict[str, _Side]) -> list[Line]:
    """A provider-day's lines: exact names first; then each name left joins the line of its
    family if one was matched exactly, else the names left are matched by family; the rest
    stand alone."""
    project_id, provider, day = key

    def add(made: Line, bills: list[_Side], ran: list[_Side]) -> Line:
        for bill in bills:
            made.billed_cost_usd += bill.cost
            if bill.tokens is not None:
                made.billed_input_tokens = (made.billed_input_tokens or 0) + bill.tokens
            made.billed_rows += bill.count
        for step in ran:
            made.estimated_cost_usd += step.cost
            made.estimated_input_tokens += step.tokens or 0
            made.steps += step.count
            made.steps_removed += step.removed
        return made

    def line(model: str | None, bills: list[_Side], ran: list[_Side]) -> Line:
        return add(Line(project_id=project_id, provider=provider, day=day, model=model), bills, ran)

    bills = dict(billed)
    ran = dict(steps)
    lines: list[Line] = []
    exact: dict[str, Line] = {}  # family → the first line matched exactly in it
    for name in sorted(set(bills) & set(ran), key=str):
        assert name is not None  # noqa: S101 — narrows the type: steps are named
        family = ran[name].family
        lines.append(line(name, [bills.pop(name)], [ran.pop(name)]))
        exact.setdefault(family, lines[-1])
    for name in [n for n in bills if n is not None and model_family(n) in exact]:
        add(exact[model_family(name)], [bills.pop(name)], [])
    for name in [n for n, step in ran.items() if step.family in exact]:
        add(exact[ran[name].family], [], [ran.pop(name)])
    by_family: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for name in bills:
        if name is not None:
            by_family[model_family(name)][0].append(name)
    for name, step in ran.items():
        by_family[step.family][1].append(name)
    for family, (billed_names, step_names) in sorted(by_family.items()):
        if not billed_names or not step_names:
            continue
        lines.append(
            line(
                billed_names[0] if len(billed_names) == 1 else family,
                [bills.pop(n) for n in sorted(billed_names)],
                [ran.pop(n) for n in sorted(step_names)],
            )
        )
    for billed_name, bill in sorted(bills.items(), key=lambda item: str(item[0] or "")):
        lines.append(line(billed_name, [bill], []))
    for step_name, step in sorted(ran.items()):
        lines.append(line(step_name, [], [step]))
    for made in lines:
        if made.uninstrumented:
            made.uninstrumented_cost_usd = made.billed_cost_usd
    return lines


def reconcile(wanted: Wanted) -> list[Line]:
    """Every line of the projects' provider-days billed between since and until (included),
    by project, day, provider and model."""
    billed = _billed(wanted)
    if not billed:
        return []
    steps = _steps(wanted, billed)
    lines = [
        made
        for key in sorted(billed)
        for made in _matched(key, billed[key], steps.get(key, {}))
        if not wanted.model or made.model == wanted.model
    ]
    return lines


def grouped(lines: Iterable[Line], names: Sequence[str]) -> list[Group]:
    """The lines summed by `names` (any of project_id, day, provider, model), in the order of
    their values (a null model last)."""
    groups: dict[tuple[str | int | None, ...], Group] = {}
    for made in lines:
        values = {n: (made.day.isoformat() if n == "day" else getattr(made, n)) for n in names}
        key = tuple(values.values())
        groups.setdefault(key, Group(values=values)).add(made)
    return [groups[k] for k in sorted(groups, key=_order)]


def _order(values: tuple[str | int | None, ...]) -> list[tuple[bool, int, str]]:
    return [(v is None, v if isinstance(v, int) else 0, str(v or "")) for v in values]


def total(lines: Iterable[Figures]) -> Figures:
    whole = Figures()
    for made in lines:
        whole.add(made)
    return whole
