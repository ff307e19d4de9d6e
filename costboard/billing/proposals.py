"""From drift to a fix (docs/billing.md, "Proposed adjustments"): when one provider's model
family is billed a steady percentage off Costboard's estimate, day after day, propose the
negotiated rate (a PriceAdjustment, docs/pricing.md "Negotiated rates") that explains it.

A pure function of reconciliation lines (costboard/billing/reconcile.py) and the percentage
already in force for a scope: it reads nothing and writes nothing.

Per project × provider × model family (the family of the line's name), the days that have
both steps and a bill (billed and estimated above $0; several lines of a family on a day are
summed) are walked back from the latest: the run goes on while every day's drift_pct stays
within 1 point of every other day's in it (max − min ≤ 1). A day with a line that does not
qualify — billed with no step (uninstrumented), steps billed $0 — ends the run; a calendar day
with no line of the family at all (no traffic, or no bill imported), or only $0 on both
sides, is skipped, neither counted nor ending it. A run of at least MIN_DAYS such days
proposes, from its first day, the percent on list that makes the estimate equal the bill
over the run:

    percent = ((1 + in_force/100) × billed/estimated − 1) × 100, to 4 places (half-even)

— `in_force` being the adjustment already applied to the estimate on the run's first day (the
new one, project and family, is the most specific and so replaces it). None is proposed when
the bill already agrees with the estimate within NEGLIGIBLE_PCT (an adjustment in force
explains it), or the percent falls outside what a PriceAdjustment accepts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import ROUND_HALF_EVEN, Decimal

from costboard.billing.reconcile import Line, drift_pct
from costboard.models import OutboxItem
from costboard.pricing.families import model_family
from costboard.pricing.rates import rate_table
from costboard.pricing.services import REPRICE, REPRICE_ADJUSTED

MIN_DAYS = 7
STEADY_POINTS = Decimal(1)  # every day's drift_pct within this of every other day's
NEGLIGIBLE_PCT = Decimal("0.5")  # |billed ÷ estimated − 1| below this: nothing to fix
PERCENT_PLACES = Decimal("0.0001")  # what PriceAdjustment.percent keeps
MIN_PERCENT, MAX_PERCENT = Decimal(-100), Decimal(1000)

InForce = Callable[[int, str, str, date], Decimal]  # project, provider, family, day → percent


def _none_in_force(project_id: int, provider: str, family: str, day: date) -> Decimal:
    return Decimal(0)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A negotiated rate the bill asks for: `percent` on list for the project's steps of this
    provider and family from `since` on."""

    project_id: int
    provider: str
    family: str
    since: date
    until: date  # the run's last day
    days: int  # billed days with steps in the run
    estimated_cost_usd: Decimal  # over the run
    billed_cost_usd: Decimal
    in_force: Decimal  # the percent already applied on `since` (0: list)
    percent: Decimal  # the adjustment to add, 4 places

    @property
    def off_list(self) -> Decimal:
        """How far under (negative) or over list the provider billed, in percent, 1 place."""
        return self.percent.quantize(Decimal("0.1"), rounding=ROUND_HALF_EVEN)

    @property
    def percent_shown(self) -> str:
        """The percent as a person writes it: −12, +5, −11.9873 (no trailing zeros)."""
        text = f"{abs(self.percent).normalize():f}"
        return ("−" if self.percent < 0 else "+") + text

    @property
    def text(self) -> str:
        """billed 12.0 % under list for claude-sonnet-4-5 since 2026-10-01: add −12 % from
        that date"""
        side = "under" if self.percent < 0 else "over"
        return (
            f"billed {abs(self.off_list)} % {side} list for {self.family} since "
            f"{self.since.isoformat()}: add {self.percent_shown} % from that date"
        )


@dataclass(slots=True)
class _Day:
    estimated: Decimal = Decimal(0)
    billed: Decimal = Decimal(0)
    steps: int = 0

    @property
    def qualifies(self) -> bool:
        return self.steps > 0 and self.estimated > 0 and self.billed > 0

    @property
    def pct(self) -> Decimal | None:
        return drift_pct(self.billed - self.estimated, self.billed)


def drift_proposals(lines: Iterable[Line], in_force: InForce = _none_in_force) -> list[Proposal]:
    """The adjustments the lines' steady drifts propose, by project, provider and family."""
    series: dict[tuple[int, str, str], dict[date, _Day]] = defaultdict(lambda: defaultdict(_Day))
    for line in lines:
        if line.model is None:
            continue  # a cost no model names (a tool's line item): no family to adjust
        day = series[(line.project_id, line.provider, model_family(line.model))][line.day]
        day.estimated += line.estimated_cost_usd
        day.billed += line.billed_cost_usd
        day.steps += line.steps
    proposals = []
    for (project_id, provider, family), days in sorted(series.items()):
        proposal = _proposal(project_id, provider, family, days, in_force)
        if proposal is not None:
            proposals.append(proposal)
    return proposals


def _proposal(
    project_id: int, provider: str, family: str, days: dict[date, _Day], in_force: InForce
) -> Proposal | None:
    run: list[tuple[date, _Day]] = []
    low = high = None
    for day in sorted(days, reverse=True):
        figures = days[day]
        if figures.estimated == 0 and figures.billed == 0:
            continue  # steps that cost nothing, billed nothing: nothing to compare
        pct = figures.pct
        if not figures.qualifies or pct is None:
            break
        low = pct if low is None else min(low, pct)
        high = pct if high is None else max(high, pct)
        if high - low > STEADY_POINTS:
            break
        run.append((day, figures))
    if len(run) < MIN_DAYS:
        return None
    since, until = run[-1][0], run[0][0]
    estimated = sum((f.estimated for _, f in run), Decimal(0))
    billed = sum((f.billed for _, f in run), Decimal(0))
    ratio = billed / estimated
    if abs(ratio - 1) * 100 < NEGLIGIBLE_PCT:
        return None
    applied = in_force(project_id, provider, family, since)
    percent = ((1 + applied / 100) * ratio - 1) * 100
    percent = percent.quantize(PERCENT_PLACES, rounding=ROUND_HALF_EVEN)
    if not MIN_PERCENT <= percent <= MAX_PERCENT:
        return None
    return Proposal(
        project_id=project_id,
        provider=provider,
        family=family,
        since=since,
        until=until,
        days=len(run),
        estimated_cost_usd=estimated,
        billed_cost_usd=billed,
        in_force=applied,
        percent=percent,
    )


# --- what the page reads beside the lines --------------------------------------------------


def adjustment_in_force(project_id: int, provider: str, family: str, day: date) -> Decimal:
    """The percent on list the rate table applies to this project's steps of this provider
    and family at 00:00 UTC of `day` (0: list price)."""
    when = datetime.combine(day, time.min, tzinfo=UTC)
    found = rate_table().adjustment_at(project_id, provider, family, when)
    return Decimal(0) if found is None else found.percent


def repricing_pending(project_ids: Collection[int]) -> bool:
    """A repricing of these projects' steps is queued and not yet carried out: a price row's
    (every project's steps), or an adjustment's for every project or one of these. Until it
    is, their estimate is not what the rate table says, and no proposal can be trusted;
    another project's adjustment changes none of theirs."""
    pending = OutboxItem.objects.filter(status=OutboxItem.Status.PENDING)
    if pending.filter(kind=REPRICE).exists():
        return True
    for payload in pending.filter(kind=REPRICE_ADJUSTED).values_list("payload", flat=True):
        for scope in payload.get("scopes", []):
            if scope.get("project_id") is None or scope["project_id"] in project_ids:
                return True
    return False
