"""Period budgets: which period a moment falls in, whether a step counts toward a budget, a
budget as a whole in a period (`budgets_whole`: a per-member budget's members summed, its
state the worst of theirs — what the pages and the API both show), and the budget as the
API shows it (docs/api.md, "Period budgets").

Pure functions but for the reads (`budgets_whole`, `ledger_sums`, the windows' and members'
sums); the writes are services in costboard/budgets/period_services.py, the decisions the
budget engine's (engine.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db.models import (
    Case,
    DecimalField,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Greatest

from costboard.budgets.engine import EXHAUSTED, OK, WARNING, limits_reached, threshold_state
from costboard.models import BudgetDay, BudgetHour, PeriodBudget, PeriodLedger, usd

# a total budget's one period begins here
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def zone(name: str) -> ZoneInfo:
    """The IANA timezone `name`; ValueError naming the fix if there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{name[:64]!r} is not a timezone: use an IANA name such as UTC or Europe/Berlin"
        ) from None


def period_bounds(period: str, tz_name: str, at: datetime) -> tuple[datetime, datetime | None]:
    """The period of `at`: its start and end (exclusive; None for a total budget), in UTC.
    Days, weeks (from Monday) and months begin at midnight in the budget's timezone, so a
    day of a DST change is 23 or 25 hours long. A rolling budget's ledgers are kept like a
    total budget's, one per member (its window: `window_bounds`)."""
    if period in (PeriodBudget.Period.TOTAL, PeriodBudget.Period.ROLLING):
        return EPOCH, None
    tz = zone(tz_name)
    local = at.astimezone(tz).date()
    if period == PeriodBudget.Period.DAY:
        first, after = local, local + timedelta(days=1)
    elif period == PeriodBudget.Period.WEEK:
        first = local - timedelta(days=local.weekday())
        after = first + timedelta(days=7)
    elif period == PeriodBudget.Period.MONTH:
        first = local.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown period {period!r}")
    return _midnight(first, tz), _midnight(after, tz)


def _midnight(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, time.min, tzinfo=tz).astimezone(UTC)


HOUR = timedelta(hours=1)


def hour_of(at: datetime) -> datetime:
    """The start of the UTC hour `at` falls in: a rolling budget's bucket."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def window_bounds(window_hours: int, at: datetime) -> tuple[datetime, datetime]:
    """A rolling window at `at`: the hour `at` falls in and the `window_hours` − 1 before it
    (start inclusive, end exclusive, UTC). Spend stamped after `at` counts too (a client's
    clock ahead of ours): the window's sum reads every hour from its start on."""
    current = hour_of(at)
    return current - (window_hours - 1) * HOUR, current + HOUR


def rolling(budget: PeriodBudget) -> bool:
    return budget.period == PeriodBudget.Period.ROLLING


def window_totals(
    keys: Collection[tuple[PeriodBudget, str]], now: datetime
) -> dict[tuple[int, str], tuple[int, Decimal]]:
    """Each (rolling budget, member)'s tokens and cost in its window at `now`: the sum of its
    hours (one query; (0, 0) for a member with none)."""
    found: dict[tuple[int, str], tuple[int, Decimal]] = {
        (budget.pk, member): (0, Decimal(0)) for budget, member in keys
    }
    if not found:
        return found
    members: dict[int, set[str]] = {}
    starts: dict[int, datetime] = {}
    for budget, member in keys:
        members.setdefault(budget.pk, set()).add(member)
        starts[budget.pk] = window_bounds(budget.window_hours or 1, now)[0]
    wanted = Q(pk__in=[])
    for pk, start in starts.items():
        wanted |= Q(budget_id=pk, member__in=members[pk], hour__gte=start)
    rows = (
        BudgetHour.objects.filter(wanted)
        .values("budget_id", "member")
        .annotate(tokens=Sum("tokens_used"), cost=Sum("cost_usd"))
        .values_list("budget_id", "member", "tokens", "cost")
    )
    for budget_id, member, tokens, cost in rows:
        found[(budget_id, member)] = (int(tokens or 0), cost or Decimal(0))
    return found


def window_members(
    budgets: Collection[PeriodBudget], now: datetime
) -> dict[int, dict[str, tuple[int, Decimal]]]:
    """Each rolling budget's members with spend in its window at `now` → their tokens and
    cost (member '' for a budget that is not per member; one query)."""
    found: dict[int, dict[str, tuple[int, Decimal]]] = {b.pk: {} for b in budgets}
    wanted = Q(pk__in=[])
    for budget in budgets:
        wanted |= Q(budget_id=budget.pk, hour__gte=window_bounds(budget.window_hours or 1, now)[0])
    if not found:
        return found
    rows = (
        BudgetHour.objects.filter(wanted)
        .values("budget_id", "member")
        .annotate(tokens=Sum("tokens_used"), cost=Sum("cost_usd"))
        .values_list("budget_id", "member", "tokens", "cost")
    )
    for budget_id, member, tokens, cost in rows:
        found[budget_id][member] = (int(tokens or 0), cost or Decimal(0))
    return found


def ledger_as_of(
    budget: PeriodBudget, ledger: PeriodLedger, totals: tuple[int, Decimal]
) -> PeriodLedger:
    """A rolling budget's ledger with its window's `totals` now (not stored): its state and
    the crossings still true by them; the rest as stored (a read between batches)."""
    limits = PeriodLimits.of(budget)
    tokens, cost = totals
    state = threshold_state(limits, tokens, cost)
    crossed = None
    for share in limits.thresholds:
        if not limits.reaches(tokens, cost, share):
            break
        crossed = share
    return replace_ledger(
        ledger,
        tokens_used=tokens,
        cost_usd=cost,
        state=state,
        warned_at=ledger.warned_at if state in (WARNING, EXHAUSTED) else None,
        exhausted_at=ledger.exhausted_at if state == EXHAUSTED else None,
        threshold_crossed=crossed,
    )


def replace_ledger(ledger: PeriodLedger, **values: Any) -> PeriodLedger:
    """A copy of `ledger` (same id, unsaved) with these values."""
    copy = PeriodLedger.from_db(
        ledger._state.db,
        [f.attname for f in PeriodLedger._meta.concrete_fields],
        [getattr(ledger, f.attname) for f in PeriodLedger._meta.concrete_fields],
    )
    for name, value in values.items():
        setattr(copy, name, value)
    return copy


@dataclass(frozen=True, slots=True)
class StepScope:
    """What a step is, for matching budgets: its session's end user, the key that sent it
    and its tags."""

    user_id: str
    key_prefix: str
    tags: dict[str, str] | None


EVERY = "*"  # a scope value (a tag's value) that makes a budget per member


def per_member(budget: PeriodBudget) -> bool:
    """Is `budget` held per member: each user, key or tag value on its own ("*", "key=*")?"""
    if budget.scope == PeriodBudget.Scope.TAG:
        return budget.scope_value.partition("=")[2] == EVERY
    return budget.scope != PeriodBudget.Scope.PROJECT and budget.scope_value == EVERY


def budget_member(budget: PeriodBudget, step: StepScope) -> str | None:
    """The member of `budget` a step counts toward: None if it does not count, '' for a
    budget that is not per member, else the user_id, key prefix or tag value. The one rule
    of which budget covers what (its period aside)."""
    scope, wanted = budget.scope, budget.scope_value
    if scope == PeriodBudget.Scope.PROJECT:
        return ""
    if scope == PeriodBudget.Scope.USER:
        found = step.user_id
    elif scope == PeriodBudget.Scope.API_KEY:
        found = step.key_prefix
    elif scope == PeriodBudget.Scope.TAG:
        key, _, wanted = wanted.partition("=")
        found = step.tags.get(key, "") if step.tags is not None else ""
    else:
        return None
    if not found:
        return None
    if wanted == EVERY:
        return found
    return "" if found == wanted else None


def budget_covers(budget: PeriodBudget, step: StepScope) -> bool:
    """Does this step count toward `budget` (toward one of its members, if per member)?"""
    return budget_member(budget, step) is not None


@dataclass(frozen=True, slots=True)
class PeriodLimits:
    """A period budget's limits, as the budget engine asks them (engine.Limits)."""

    token_limit: int | None
    cost_limit_usd: Decimal | None
    warn_at: Decimal  # the first warn fraction: `warning` and `soft_warned`
    thresholds: tuple[Decimal, ...] = ()  # every warn fraction, ascending

    @classmethod
    def of(cls, budget: PeriodBudget) -> PeriodLimits:
        fractions = budget.thresholds
        return cls(budget.token_limit, budget.cost_limit_usd, fractions[0], fractions)

    def warned(self, tokens_used: int, cost_usd: Decimal) -> bool:
        return limits_reached(
            tokens_used, cost_usd, self.token_limit, self.cost_limit_usd, self.warn_at
        )

    def reaches(self, tokens_used: int, cost_usd: Decimal, share: Decimal) -> bool:
        return limits_reached(tokens_used, cost_usd, self.token_limit, self.cost_limit_usd, share)

    def exhausted(self, tokens_used: int, cost_usd: Decimal) -> bool:
        return limits_reached(tokens_used, cost_usd, self.token_limit, self.cost_limit_usd)

    def describe(self) -> dict[str, object]:
        return {"token_limit": self.token_limit, "cost_limit_usd": usd(self.cost_limit_usd)}


def state_of(budget: PeriodBudget, tokens_used: int, cost_usd: Decimal) -> str:
    return threshold_state(PeriodLimits.of(budget), tokens_used, cost_usd)


RATE_DAYS = 7  # the daily rate is the mean of at most this many recent days


def forecast_cost(
    cost_usd: Decimal, start: datetime, end: datetime | None, now: datetime
) -> Decimal | None:
    """The period's cost at its end if it goes on at its rate so far (at least an hour of it
    counted); None for a total budget, or a period not begun. (Without daily figures:
    `forecast` projects from the recent days.)"""
    if end is None or now < start:
        return None
    if now >= end:
        return cost_usd
    elapsed = max(now - start, timedelta(hours=1))
    return (cost_usd * Decimal((end - start) / elapsed)).quantize(Decimal("0.000001"))


@dataclass(frozen=True, slots=True)
class Forecast:
    """Where a period is heading at its recent daily rate: its cost at the period's end, the
    range the recent days' lowest and highest rates give, and the day its USD limit is
    crossed at the mean rate (None: not within the period, or no USD limit)."""

    cost_usd: Decimal
    low_usd: Decimal
    high_usd: Decimal
    daily_usd: Decimal
    crossing_day: date | None


def forecast(
    budget: PeriodBudget,
    cost_usd: Decimal,
    *,
    start: datetime,
    end: datetime | None,
    days: dict[date, Decimal],
    now: datetime,
    exhausted_at: datetime | None = None,
) -> Forecast | None:
    """The period's forecast from `days` (cost per day in the budget's timezone). The rate
    is the mean of the recent complete days in the period (at most RATE_DAYS, a day without
    spend counting as $0); on the period's first day, today's pace so far. A USD limit
    already crossed was crossed the day the period was exhausted (`exhausted_at`, its
    ledger's), not the day it is asked: a late batch's past period, a month exhausted on
    the 3rd read on the 28th."""
    if end is None or now < start:
        return None
    tz = zone(budget.timezone)
    today = now.astimezone(tz).date()
    first = max(start.astimezone(tz).date(), budget.created_at.astimezone(tz).date())
    recent = [
        days.get(today - timedelta(days=n), Decimal(0))
        for n in range(1, RATE_DAYS + 1)
        if today - timedelta(days=n) >= first
    ]
    if not recent:  # the first day: today's spend over the part of it gone
        midnight = datetime.combine(today, time.min, tzinfo=tz)
        gone = max((now - midnight) / timedelta(days=1), 1 / 24)
        recent = [days.get(today, Decimal(0)) / Decimal(gone)]
    mean = sum(recent, Decimal(0)) / len(recent)
    left = Decimal(max(end - now, timedelta(0)) / timedelta(days=1))
    cents = Decimal("0.000001")
    crossing = None
    limit = budget.cost_limit_usd
    if limit is not None:
        if cost_usd >= limit:
            crossing = exhausted_at.astimezone(tz).date() if exhausted_at is not None else today
        elif mean > 0 and (limit - cost_usd) / mean < left:  # crossed before the end
            at = now + timedelta(days=float((limit - cost_usd) / mean))
            crossing = at.astimezone(tz).date()
    return Forecast(
        cost_usd=(cost_usd + mean * left).quantize(cents),
        low_usd=(cost_usd + min(recent) * left).quantize(cents),
        high_usd=(cost_usd + max(recent) * left).quantize(cents),
        daily_usd=mean.quantize(cents),
        crossing_day=crossing,
    )


# the states in order, ok < warning < exhausted: a budget read as a whole is in its worst
# member's (the pages, the API and the ledgers' sums all rank by this)
STATE_RANK = {OK: 0, WARNING: 1, EXHAUSTED: 2}


def worst_state(states: Iterable[str]) -> str | None:
    """The worst of `states` (ok < warning < exhausted); None for none."""
    return max(states, key=STATE_RANK.__getitem__, default=None)


@dataclass(frozen=True, slots=True)
class LedgerSum:
    """A budget in one period read as a whole: its ledger, or a per-member budget's members'
    ledgers summed — their tokens and USD added, its state the worst of theirs, its
    crossings the first of theirs and its threshold the highest."""

    budget_id: int
    period_start: datetime
    period_end: datetime | None
    tokens_used: int
    cost_usd: Decimal
    state: str
    warned_at: datetime | None
    exhausted_at: datetime | None
    threshold_crossed: Decimal | None = None

    @property
    def member(self) -> str:
        """The whole budget is no member's (as a ledger of a budget not per member)."""
        return ""


def ledger_sums(where: Q, *, newest: int | None = None) -> list[LedgerSum]:
    """The ledgers matching `where`, one `LedgerSum` per budget and period, newest period
    first: a per-member budget's members summed, so its totals are all that counted toward
    it. `newest`: only the latest periods, that many. One query. (A rolling budget's current
    window is `budgets_whole`'s: its ledgers keep only what its last batch decided.)"""
    worst = Max(
        Case(
            *[When(state=state, then=Value(rank)) for state, rank in STATE_RANK.items()],
            default=Value(0),
            output_field=IntegerField(),
        )
    )
    rows = (
        PeriodLedger.objects.filter(where)
        .values("budget_id", "period_start")
        .annotate(
            end=Max("period_end"),
            tokens=Sum("tokens_used"),
            cost=Sum("cost_usd"),
            rank=worst,
            warned=Min("warned_at"),
            exhausted=Min("exhausted_at"),
            crossed=Max("threshold_crossed"),
        )
        .order_by("-period_start", "budget_id")
    )
    states = {rank: state for state, rank in STATE_RANK.items()}
    return [
        LedgerSum(
            budget_id=row["budget_id"],
            period_start=row["period_start"],
            period_end=row["end"],
            tokens_used=int(row["tokens"] or 0),
            cost_usd=row["cost"] if row["cost"] is not None else Decimal(0),
            state=states[row["rank"]],
            warned_at=row["warned"],
            exhausted_at=row["exhausted"],
            threshold_crossed=row["crossed"],
        )
        for row in (rows[:newest] if newest is not None else rows)
    ]


def budgets_whole(budgets: Sequence[PeriodBudget], now: datetime) -> dict[int, LedgerSum | None]:
    """Each budget read as a whole at `now` (None: nothing counted toward it yet), the one
    rule the pages (/budgets/, the overview) and the API (`GET /api/v1/budgets`) share: a
    calendar budget's ledgers of the period `now` falls in, summed over its members
    (`ledger_sums`); a rolling budget's window at `now`, summed over its members' hours, each
    member's state by its own window's totals and the budget's the worst of theirs, its
    crossings those still true by them (`ledger_as_of`). A budget that is not per member has
    one member, '', whose figures these are. One query, and two more for rolling budgets."""
    found: dict[int, LedgerSum | None] = {b.pk: None for b in budgets}
    calendar = [b for b in budgets if not rolling(b)]
    current = Q(pk__in=[])
    for b in calendar:
        current |= Q(budget_id=b.pk, period_start=period_bounds(b.period, b.timezone, now)[0])
    if calendar:
        for whole in ledger_sums(current):
            found[whole.budget_id] = whole
    windows = [b for b in budgets if rolling(b)]
    spent = window_members(windows, now)
    states = {
        b.pk: {member: state_of(b, *totals) for member, totals in spent[b.pk].items()}
        for b in windows
    }
    # a crossing is still true only for a member its window keeps past a warn fraction: the
    # ledgers of those (few) members are read for their times
    crossing = Q(pk__in=[])
    for b in windows:
        hot = [member for member, state in states[b.pk].items() if state != OK]
        if hot:
            crossing |= Q(budget_id=b.pk, period_start=EPOCH, member__in=hot)
    ledgers: dict[int, list[PeriodLedger]] = {b.pk: [] for b in windows}
    if any(state != OK for by_member in states.values() for state in by_member.values()):
        for ledger in PeriodLedger.objects.filter(crossing):
            ledgers[ledger.budget_id].append(ledger)
    for b in windows:
        members = spent[b.pk]
        if not members:
            continue
        as_of = [ledger_as_of(b, ledger, members[ledger.member]) for ledger in ledgers[b.pk]]
        start, end = window_bounds(b.window_hours or 1, now)
        found[b.pk] = LedgerSum(
            budget_id=b.pk,
            period_start=start,
            period_end=end,
            tokens_used=sum(tokens for tokens, _ in members.values()),
            cost_usd=sum((cost for _, cost in members.values()), Decimal(0)),
            state=worst_state(states[b.pk].values()) or OK,
            warned_at=min((x.warned_at for x in as_of if x.warned_at), default=None),
            exhausted_at=min((x.exhausted_at for x in as_of if x.exhausted_at), default=None),
            threshold_crossed=max(
                (x.threshold_crossed for x in as_of if x.threshold_crossed is not None),
                default=None,
            ),
        )
    return found


def whole_of_members(budget: PeriodBudget, ledger: PeriodLedger | LedgerSum | None) -> bool:
    """Is this a per-member budget read as a whole (not one member's ledger)?"""
    return per_member(budget) and (ledger is None or not ledger.member)


def period_budget_view(
    budget: PeriodBudget,
    ledger: PeriodLedger | LedgerSum | None,
    *,
    now: datetime,
    days: dict[date, Decimal] | None = None,
) -> dict[str, Any]:
    """`<period budget>`: the budget in the period of `now` (the ledger's, when given: a
    member's ledger for a per-member budget's member, `budgets_whole`'s sum for the budget
    as a whole); `days` (its recent cost per day, `budget_days`) makes the forecast's range
    and crossing day, else the forecast is the rate so far. A per-member budget read as a
    whole has no forecast: its limits, and so its forecasts, are each member's."""
    crossed: Decimal | None = None
    if ledger is not None:
        start, end = ledger.period_start, ledger.period_end
        tokens, cost = ledger.tokens_used, ledger.cost_usd
        warned, exhausted = ledger.warned_at, ledger.exhausted_at
        state, crossed = ledger.state, ledger.threshold_crossed
    else:
        start, end = period_bounds(budget.period, budget.timezone, now)
        tokens, cost, warned, exhausted = 0, Decimal(0), None, None
        state = state_of(budget, 0, Decimal(0))
    if rolling(budget):  # its period is the window at `now`
        start, end = window_bounds(budget.window_hours or 1, now)
    # a window has no end to project to; a per-member budget's forecasts are its members'
    unforecast = rolling(budget) or whole_of_members(budget, ledger)
    ahead = (
        forecast(budget, cost, start=start, end=end, days=days, now=now, exhausted_at=exhausted)
        if days is not None and not unforecast
        else None
    )
    projected = ahead.cost_usd if ahead is not None else forecast_cost(cost, start, end, now)
    if unforecast:
        projected = None
    return {
        "id": budget.pk,
        "name": budget.name,
        "scope": budget.scope,
        "scope_value": budget.scope_value or None,
        "member": (ledger.member or None) if ledger is not None else None,
        "period": budget.period,
        "window_hours": budget.window_hours,
        "timezone": budget.timezone,
        "period_start": start.isoformat(),
        "period_end": end.isoformat() if end is not None else None,
        "state": state,
        "tokens_used": tokens,
        "token_limit": budget.token_limit,
        "cost_usd": usd(cost),
        "cost_limit_usd": usd(budget.cost_limit_usd),
        "warn_at": [float(fraction) for fraction in budget.thresholds],
        "warn_at_pct": float(budget.warn_at_pct),
        "threshold_crossed": float(crossed) if crossed is not None else None,
        "action": budget.action,
        "channels": budget.channels or None,
        "warned_at": warned.isoformat() if warned else None,
        "exhausted_at": exhausted.isoformat() if exhausted else None,
        "forecast_cost_usd": usd(projected),
        "forecast_range_usd": [usd(ahead.low_usd), usd(ahead.high_usd)] if ahead else None,
        "forecast_daily_usd": usd(ahead.daily_usd) if ahead else None,
        "crossing_date": ahead.crossing_day.isoformat() if ahead and ahead.crossing_day else None,
    }


def rolling_views(
    budget: PeriodBudget, ledgers: Sequence[PeriodLedger], now: datetime
) -> list[dict[str, Any]]:
    """`period_budget_view` of each of a rolling budget's ledgers at `now` (a batch's members):
    what is the budget's and its window's — the same for every member, no forecast — built
    once, each ledger's own figures set on a copy (the keys in the same order)."""
    if not ledgers:
        return []
    shared = period_budget_view(budget, ledgers[0], now=now)
    views = []
    for ledger in ledgers:
        view = shared.copy()
        crossed, warned, exhausted = ledger.threshold_crossed, ledger.warned_at, ledger.exhausted_at
        view["member"] = ledger.member or None
        view["state"] = ledger.state
        view["tokens_used"] = ledger.tokens_used
        view["cost_usd"] = usd(ledger.cost_usd)
        view["threshold_crossed"] = float(crossed) if crossed is not None else None
        view["warned_at"] = warned.isoformat() if warned else None
        view["exhausted_at"] = exhausted.isoformat() if exhausted else None
        views.append(view)
    return views


def ledger_now(budget: PeriodBudget, now: datetime, member: str = "") -> PeriodLedger | None:
    """The ledger of the period `now` falls in (of `member`, for a per-member budget), if
    anything counted toward it yet; a rolling budget's with its window's figures at `now`
    (`ledger_as_of`)."""
    start, _ = period_bounds(budget.period, budget.timezone, now)
    found = PeriodLedger.objects.filter(budget=budget, period_start=start, member=member).first()
    if found is not None and rolling(budget):
        totals = window_totals([(budget, member)], now)[(budget.pk, member)]
        return ledger_as_of(budget, found, totals)
    return found


def budget_days(budgets: list[PeriodBudget], now: datetime) -> dict[int, dict[date, Decimal]]:
    """Each budget's cost per day over the recent days a forecast reads (one query); a
    per-member budget's are its members', read with `member_days`."""
    found = member_days([(b.pk, "") for b in budgets], now)
    return {b.pk: found[(b.pk, "")] for b in budgets}


def member_days(
    keys: Collection[tuple[int, str]], now: datetime
) -> dict[tuple[int, str], dict[date, Decimal]]:
    """The cost per day of each (budget id, member) over the recent days a forecast reads
    (one query; member '' for a budget that is not per member)."""
    found: dict[tuple[int, str], dict[date, Decimal]] = {key: {} for key in keys}
    if not found:
        return found
    since = (now - timedelta(days=RATE_DAYS + 2)).date()
    rows = BudgetDay.objects.filter(
        budget_id__in={budget_id for budget_id, _ in found},
        member__in={member for _, member in found},
        day__gte=since,
    ).values_list("budget_id", "member", "day", "cost_usd")
    for budget_id, member, day, cost in rows:
        if (budget_id, member) in found:
            found[(budget_id, member)][day] = cost
    return found


@dataclass(frozen=True, slots=True)
class MemberStanding:
    """A member of a per-member budget in a period: what it spent, its limits, how near it
    is to them (the larger of tokens/token_limit and cost/cost_limit; 1 or more: exhausted)
    and its state."""

    member: str
    tokens_used: int
    token_limit: int | None
    cost_usd: Decimal
    cost_limit_usd: Decimal | None
    fraction: Decimal
    state: str


def _fraction(budget: PeriodBudget, tokens: int, cost: Decimal) -> Decimal:
    parts = [Decimal(0)]
    if budget.token_limit:
        parts.append(Decimal(tokens) / Decimal(budget.token_limit))
    if budget.cost_limit_usd:
        parts.append(cost / budget.cost_limit_usd)
    return max(parts).quantize(Decimal("0.0001"))


def members_nearest_limit(
    budget: PeriodBudget, now: datetime, limit: int = 10
) -> list[MemberStanding]:
    """The members of a per-member budget that spent in its period of `now` (a rolling
    budget: in its window, from its hours), nearest their limit first (ties by member), at
    most `limit` of them (one query). The ordering is the database's: max(tokens/T, cost/C)
    orders as max(tokens*C, cost*T), the limits being the same for every member."""
    tokens_limit, cost_limit = budget.token_limit, budget.cost_limit_usd
    if rolling(budget):  # its members' windows now, from their hours
        spent = window_members([budget], now)[budget.pk]
        standings = [
            MemberStanding(
                member=member,
                tokens_used=tokens,
                token_limit=tokens_limit,
                cost_usd=cost,
                cost_limit_usd=cost_limit,
                fraction=_fraction(budget, tokens, cost),
                state=state_of(budget, tokens, cost),
            )
            for member, (tokens, cost) in spent.items()
            if member
        ]
        standings.sort(key=lambda standing: (-standing.fraction, standing.member))
        return standings[: max(limit, 0)]
    start, _ = period_bounds(budget.period, budget.timezone, now)
    rows = PeriodLedger.objects.filter(budget=budget, period_start=start).exclude(member="")
    nearness: Any
    if tokens_limit is not None and cost_limit is not None:
        nearness = Greatest(
            ExpressionWrapper(F("tokens_used") * Value(cost_limit), output_field=DecimalField()),
            ExpressionWrapper(F("cost_usd") * Value(tokens_limit), output_field=DecimalField()),
        )
    else:
        nearness = F("tokens_used") if tokens_limit is not None else F("cost_usd")
    ordered = rows.annotate(nearness=nearness).order_by("-nearness", "member")[: max(limit, 0)]
    return [
        MemberStanding(
            member=row.member,
            tokens_used=row.tokens_used,
            token_limit=tokens_limit,
            cost_usd=row.cost_usd,
            cost_limit_usd=cost_limit,
            fraction=_fraction(budget, row.tokens_used, row.cost_usd),
            state=row.state,
        )
        for row in ordered
    ]
