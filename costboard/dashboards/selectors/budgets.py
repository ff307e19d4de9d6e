"""The period budgets' pages: each budget in its current period with its forecast, the
sessions it stops, and one budget's past periods, crossings and held sessions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Q

from costboard.budgets.holds import budget_sessions
from costboard.budgets.periods import (
    Forecast,
    LedgerSum,
    MemberStanding,
    budget_days,
    budgets_whole,
    forecast,
    ledger_sums,
    members_nearest_limit,
    per_member,
    period_bounds,
    rolling,
    state_of,
    window_bounds,
    zone,
)
from costboard.dashboards.selectors.shared import ZERO
from costboard.models import BudgetEvent, PeriodBudget, Session


@dataclass(frozen=True)
class BudgetRow:
    """A period budget in its current period, as the overview lists it."""

    budget: PeriodBudget
    state: str
    tokens_used: int
    cost_usd: Decimal
    forecast: Forecast | None
    period_end: datetime | None
    period_start: datetime
    # its figures as `budgets_whole` read them (None: nothing counted toward it yet)
    whole: LedgerSum | None = None

    @property
    def forecast_usd(self) -> Decimal | None:
        return self.forecast.cost_usd if self.forecast is not None else None

    @property
    def per_member(self) -> bool:
        """Its limits hold each member (user, key, tag value); its spend is all of theirs."""
        return per_member(self.budget)

    @property
    def used_pct(self) -> int | None:
        """The larger share of a limit used so far (tokens or USD), as a whole percentage
        rounded down, as every percentage the pages show (99.9 % used is not yet 100 %, which
        a budget near its limit would read as); None for a per-member budget, whose limits
        are each member's (its page lists them)."""
        if self.per_member:
            return None
        shares = []
        if self.budget.token_limit:
            shares.append(Decimal(self.tokens_used) / self.budget.token_limit * 100)
        if self.budget.cost_limit_usd:
            shares.append(self.cost_usd / self.budget.cost_limit_usd * 100)
        return int(max(shares)) if shares else None

    @property
    def forecast_over(self) -> bool:
        """At its rate so far, the period ends past its USD limit."""
        limit = self.budget.cost_limit_usd
        return limit is not None and self.forecast_usd is not None and self.forecast_usd > limit


def budgets_current(*, project_ids: list[int], now: datetime) -> list[BudgetRow]:
    """The projects' period budgets in their current periods, with their forecasts (three
    queries)."""
    budgets = list(
        PeriodBudget.objects.filter(project_id__in=project_ids)
        .select_related("project")
        .order_by("project__name", "name", "pk")
    )
    return _budget_rows(budgets, now)


def _budget_rows(budgets: list[PeriodBudget], now: datetime) -> list[BudgetRow]:
    """Each budget in its current period as a whole (`budgets_whole`, the API's figures
    too: a per-member budget's members summed, its state the worst of theirs), with its
    forecast (two queries; and two for rolling budgets)."""
    wholes = budgets_whole(budgets, now)
    days = budget_days(budgets, now)
    rows = []
    for b in budgets:
        whole = wholes[b.pk]
        start: datetime
        end: datetime | None
        if rolling(b):  # its window now
            start, end = window_bounds(b.window_hours or 1, now)
        else:
            start, end = period_bounds(b.period, b.timezone, now)
        tokens = whole.tokens_used if whole is not None else 0
        cost = whole.cost_usd if whole is not None else ZERO
        state = whole.state if whole is not None else state_of(b, 0, ZERO)
        rows.append(
            BudgetRow(
                budget=b,
                state=state,
                tokens_used=tokens,
                cost_usd=cost,
                # a per-member budget's forecasts are its members' (each its own days)
                forecast=None
                if per_member(b) or rolling(b)
                else forecast(
                    b,
                    cost,
                    start=start,
                    end=end,
                    days=days[b.pk],
                    now=now,
                    exhausted_at=whole.exhausted_at if whole is not None else None,
                ),
                period_end=end,
                period_start=start,
                whole=whole,
            )
        )
    return rows


def budget_in_scope(*, project_ids: list[int], budget_id: int) -> PeriodBudget | None:
    """One period budget of these projects (None: none such, or another team's)."""
    return (
        PeriodBudget.objects.select_related("project")
        .filter(pk=budget_id, project_id__in=project_ids)
        .first()
    )


def budgets_stopped_counts(
    *, rows: Sequence[BudgetRow], stops: Sequence[PeriodBudget]
) -> dict[int, int]:
    """For each of `stops` among `rows`: how many sessions it holds that were active in its
    current period (one query)."""
    starts = {row.budget.pk: row.period_start for row in rows}
    # an api_key budget stops its key's calls, never a session (costboard/budgets/holds.py)
    counting = [b for b in stops if b.pk in starts and b.scope != PeriodBudget.Scope.API_KEY]
    if not counting:
        return {}
    counts = Session.objects.filter(project_id__in={b.project_id for b in counting}).aggregate(
        **{
            f"b{b.pk}": Count("pk", filter=budget_sessions(b) & Q(last_active_at__gte=starts[b.pk]))
            for b in counting
        }
    )
    return {b.pk: counts[f"b{b.pk}"] or 0 for b in counting}


PAST_PERIODS_SHOWN = 24
BUDGET_EVENTS_SHOWN = 50
STOPPED_SESSIONS_SHOWN = 50


@dataclass(frozen=True)
class PeriodSpend:
    """One period of a budget as its ledger has it, its days in the budget's timezone; a
    rolling budget's one "period" is its window now (`_window_spend`)."""

    first_day: date
    last_day: date | None  # None: a total budget, which never ends
    current: bool
    state: str
    tokens_used: int
    cost_usd: Decimal
    warned_at: datetime | None
    exhausted_at: datetime | None


def _period_spend(budget: PeriodBudget, ledger: LedgerSum, current_start: datetime) -> PeriodSpend:
    tz = zone(budget.timezone)
    end = ledger.period_end
    return PeriodSpend(
        first_day=ledger.period_start.astimezone(tz).date(),
        last_day=(end - timedelta(microseconds=1)).astimezone(tz).date() if end else None,
        current=ledger.period_start == current_start,
        state=ledger.state,
        tokens_used=ledger.tokens_used,
        cost_usd=ledger.cost_usd,
        warned_at=ledger.warned_at,
        exhausted_at=ledger.exhausted_at,
    )


def _window_spend(row: BudgetRow) -> PeriodSpend:
    """A rolling budget's window now, as /budgets/ and the API read it (`budgets_whole`): its
    ledgers keep one row per member whatever the window (their period_start the epoch), with
    what the last batch decided, which is not the window once it has moved on."""
    whole = row.whole
    return PeriodSpend(
        first_day=row.period_start.date(),
        last_day=(row.period_end or row.period_start).date(),
        current=True,
        state=row.state,
        tokens_used=row.tokens_used,
        cost_usd=row.cost_usd,
        warned_at=whole.warned_at if whole is not None else None,
        exhausted_at=whole.exhausted_at if whole is not None else None,
    )


@dataclass(frozen=True)
class BudgetDetail:
    """One period budget's page: its current period, its periods newest first (spend from
    its ledgers), its latest crossings and the sessions it holds now."""

    row: BudgetRow
    periods: list[PeriodSpend]
    events: list[BudgetEvent]
    holding: bool  # an exhausted stop-budget: its sessions are told to stop
    stopped: list[Session]  # those active this period, the latest first
    stopped_total: int
    # a per-member budget's members nearest their limit this period (members_nearest_limit)
    members: list[MemberStanding] = field(default_factory=list)


def budget_detail(
    *, budget: PeriodBudget, stops: Sequence[PeriodBudget], now: datetime
) -> BudgetDetail:
    """`budget`'s page (five queries; a rolling budget's period is its window, read with its
    row). `stops`: its project's stop-budgets in force
    (holds.stops_in_force)."""
    row = _budget_rows([budget], now)[0]
    if rolling(budget):
        periods = [_window_spend(row)]
    else:
        periods = [
            _period_spend(budget, ledger, row.period_start)
            for ledger in ledger_sums(Q(budget=budget), newest=PAST_PERIODS_SHOWN)
        ]
    events = list(
        BudgetEvent.objects.filter(ledger__budget=budget)
        .select_related("ledger")
        .order_by("-at", "-id")[:BUDGET_EVENTS_SHOWN]
    )
    stop = next((b for b in stops if b.pk == budget.pk), None)
    holding = stop is not None
    stopped: list[Session] = []
    total = 0
    if stop is not None:
        active = Session.objects.filter(budget_sessions(stop), last_active_at__gte=row.period_start)
        total = active.count()
        stopped = list(active.order_by("-last_active_at", "-id")[:STOPPED_SESSIONS_SHOWN])
    return BudgetDetail(
        row=row,
        periods=periods,
        events=events,
        holding=holding,
        stopped=stopped,
        stopped_total=total,
        members=members_nearest_limit(budget, now) if per_member(budget) else [],
    )
