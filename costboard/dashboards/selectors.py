"""Read queries for the pages: rollups first, never a scan of all steps for totals.

Every selector takes the ids of the projects in scope and runs a fixed number of queries,
whatever the amount of data. Models are shown by family (`gpt-4o-2024-08-06`, `openai/gpt-4o`
and `gpt-4o` are one `gpt-4o`: costboard/pricing/families.py), each with its exact names.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    F,
    IntegerField,
    Max,
    Min,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce, Greatest, Trunc
from django.db.models.lookups import Exact

from costboard.budgets.caps import Caps, stop_verdict
from costboard.budgets.holds import budget_sessions, held, held_by
from costboard.budgets.periods import (
    Forecast,
    MemberStanding,
    budget_days,
    forecast,
    members_nearest_limit,
    per_member,
    period_bounds,
    state_of,
    zone,
)
from costboard.ingest.latency import latency_bucket, percentile
from costboard.models import (
    TOOL_MODEL,
    BudgetEvent,
    DailyRollup,
    IngestTally,
    LatencyRollup,
    PeriodBudget,
    PeriodLedger,
    Session,
    SessionModelUsage,
    Step,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from costboard.numbers import usd_text
from costboard.pricing.rates import rate_table

ZERO = Decimal(0)
MILLION = Decimal(1_000_000)


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


# --- overview -------------------------------------------------------------------------------


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
class ExactModel:
    """One exact model name as steps sent it, within its family."""

    model: str
    calls: int = 0
    cost_usd: Decimal = ZERO


@dataclass
class FamilyUsage:
    """A model family's calls and cost, with the exact names behind them, costliest first."""

    family: str
    calls: int = 0
    cost_usd: Decimal = ZERO
    names: list[ExactModel] = field(default_factory=list)

    @property
    def is_tool(self) -> bool:
        return self.family == TOOL_MODEL

    @property
    def aliased(self) -> bool:
        """Sent under some other name than the family's own (one click shows which)."""
        return any(name.model != self.family for name in self.names)


class _FamilyTally:
    """Calls and cost per family and exact name, summed from rollup rows."""

    def __init__(self) -> None:
        self.families: dict[str, FamilyUsage] = {}
        self._names: dict[tuple[str, str], ExactModel] = {}

    def add(self, family: str, model: str, calls: int, cost: Decimal) -> None:
        usage = self.families.get(family)
        if usage is None:
            usage = self.families[family] = FamilyUsage(family)
        usage.calls += calls
        usage.cost_usd += cost
        name = self._names.get((family, model))
        if name is None:
            name = self._names[(family, model)] = ExactModel(model)
            usage.names.append(name)
        name.calls += calls
        name.cost_usd += cost

    def ordered(self) -> list[FamilyUsage]:
        """Costliest first, then most called; tool steps last ($0 by nature)."""
        for usage in self.families.values():
            usage.names.sort(key=lambda n: (-n.cost_usd, -n.calls, n.model))
        return sorted(
            self.families.values(),
            key=lambda u: (u.is_tool, -u.cost_usd, -u.calls, u.family),
        )


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
    families = _FamilyTally()
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
        rate = table.rate_at(model, "", _day_start(day) + timedelta(hours=12))
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
    *, project_ids: list[int], since: datetime, limit: int = 10
) -> QuerySet[Session]:
    return (
        Session.objects.filter(project_id__in=project_ids, last_active_at__gte=since)
        .select_related("project")
        .order_by("-cost_usd")[:limit]
    )


FLAGGED = Q(state__in=[Session.State.WARNING, Session.State.EXHAUSTED]) | Q(
    runaway_at__isnull=False
)


def sessions_flagged(
    *, project_ids: list[int], limit: int = 12, stops: Sequence[PeriodBudget] = ()
) -> tuple[list[Session], int]:
    """Near-cap, exhausted, runaway and budget-held sessions, the most urgent first, and how
    many there are."""
    flagged = _flagged_open(project_ids, stops)
    total = flagged.count()
    rows = list(flagged.select_related("project").order_by("-last_active_at")[: limit * 4])
    holding = _holding(stops, rows)
    for row in rows:
        if holding.get(row.pk) is not None and row.state != Session.State.EXHAUSTED:
            row.state = Session.State.EXHAUSTED  # as its agent is told (a copy, never saved)
    urgency: dict[str, int] = {
        Session.State.EXHAUSTED: 1,
        Session.State.WARNING: 2,
        Session.State.OK: 3,
    }
    rows.sort(key=lambda s: (s.runaway_at is None, urgency[s.state], -s.last_active_at.timestamp()))
    return rows[:limit], total


# --- flagged sessions page ------------------------------------------------------------------

# Each flagged session under its most urgent kind, so the kinds' counts add up to the list.
FLAG_KINDS: dict[str, Q] = {
    "runaway": Q(runaway_at__isnull=False),
    "exhausted": Q(runaway_at__isnull=True, state=Session.State.EXHAUSTED),
    "warning": Q(runaway_at__isnull=True, state=Session.State.WARNING),
}
# Session.acknowledged negated: never acknowledged, or flagged again since.
UNACKNOWLEDGED = (
    Q(acknowledged_at__isnull=True)
    | Q(runaway_at__gt=F("acknowledged_at"))
    | Q(exhausted_at__gt=F("acknowledged_at"))
    | Q(warned_at__gt=F("acknowledged_at"))
)
_NEVER = Value(datetime(1970, 1, 1, tzinfo=UTC), output_field=DateTimeField())


def _holding(stops: Sequence[PeriodBudget], sessions: Iterable[Session]) -> dict[int, int]:
    """Each of `sessions` a stop-budget holds → that budget's id (one query; none without
    stops)."""
    ids = [s.pk for s in sessions]
    if not stops or not ids:
        return {}
    return dict(
        Session.objects.filter(held(stops), pk__in=ids)
        .annotate(held_by_budget=held_by(stops))
        .values_list("pk", "held_by_budget")
    )


def _flagged_open(project_ids: list[int], stops: Sequence[PeriodBudget] = ()) -> QuerySet[Session]:
    # FLAGGED is session_flagged_recent's condition: only the (few) flagged rows are read.
    # A stop-budget in force adds the sessions it holds (docs/budgets.md, "Stopped by a budget").
    flagged = FLAGGED | held(stops) if stops else FLAGGED
    return Session.objects.filter(flagged, project_id__in=project_ids, ended_at__isnull=True)


def flag_kinds(stops: Sequence[PeriodBudget]) -> dict[str, Q]:
    """FLAG_KINDS with the sessions `stops` hold counted as exhausted, as their agents are told."""
    if not stops:
        return FLAG_KINDS
    hold = held(stops)
    return {
        "runaway": FLAG_KINDS["runaway"],
        "exhausted": FLAG_KINDS["exhausted"] | (Q(runaway_at__isnull=True) & hold),
        "warning": FLAG_KINDS["warning"] & ~hold,
    }


def sessions_flagged_list(
    *,
    project_ids: list[int],
    kind: str = "",
    acknowledged: bool = False,
    stops: Sequence[PeriodBudget] = (),
) -> QuerySet[Session]:
    """The flagged page: open near-cap, exhausted (or held by a stop-budget) and runaway
    sessions, runaway first, then exhausted, then near cap, each the newest flag first.
    Acknowledged ones (nothing flagged since) only with `acknowledged`; `kind` keeps one of
    FLAG_KINDS. Each is annotated `held_by_budget`: the stop-budget holding it, or None."""
    sessions = _flagged_open(project_ids, stops)
    if not acknowledged:
        sessions = sessions.filter(UNACKNOWLEDGED)
    kinds = flag_kinds(stops)
    if kind in kinds:
        sessions = sessions.filter(kinds[kind])
    urgency = Case(
        When(runaway_at__isnull=False, then=Value(0)),
        When(state=Session.State.EXHAUSTED, then=Value(1)),
        When(held(stops), then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    # Greatest is NULL on SQLite if any argument is: a missing flag counts as long ago.
    latest_flag = Greatest(
        Coalesce("runaway_at", _NEVER),
        Coalesce("exhausted_at", _NEVER),
        Coalesce("warned_at", _NEVER),
    )
    return (
        sessions.select_related("project")
        .alias(urgency=urgency, latest_flag=latest_flag)
        .annotate(held_by_budget=held_by(stops))
        .order_by("urgency", "-latest_flag", "-last_active_at", "-id")
    )


@dataclass(frozen=True)
class FlaggedCounts:
    runaway: int
    exhausted: int
    warning: int
    acknowledged: int  # of all open flagged sessions, shown or not

    @property
    def total(self) -> int:
        return self.runaway + self.exhausted + self.warning


def sessions_flagged_counts(
    *, project_ids: list[int], acknowledged: bool = False, stops: Sequence[PeriodBudget] = ()
) -> FlaggedCounts:
    """How many sessions the flagged page lists per kind, and how many are acknowledged (one
    query)."""
    listed = Q() if acknowledged else UNACKNOWLEDGED
    counts = _flagged_open(project_ids, stops).aggregate(
        **{name: Count("pk", filter=kind & listed) for name, kind in flag_kinds(stops).items()},
        acknowledged=Count("pk", filter=~UNACKNOWLEDGED),
    )
    return FlaggedCounts(**{name: value or 0 for name, value in counts.items()})


@dataclass(frozen=True)
class CapUse:
    """How much of one cap a session has used."""

    name: str  # "tokens" or "USD"
    used: int | Decimal
    cap: int | Decimal

    @property
    def fraction(self) -> Decimal:
        if not self.cap:
            return Decimal(1 if self.used else 0)
        return Decimal(self.used) / Decimal(self.cap)

    @property
    def percent(self) -> int:
        """Whole percent, rounded down: 99.9 % used is not yet the cap."""
        return int(self.fraction * 100)

    @property
    def reached(self) -> bool:
        return self.used >= self.cap


def session_cap_uses(session: Session, caps: Caps) -> list[CapUse]:
    """Its use of each cap, the fullest first."""
    uses = [
        CapUse("tokens", session.tokens_used, caps.token_cap),
        CapUse("USD", session.cost_usd, caps.cost_cap_usd),
    ]
    return sorted(uses, key=lambda use: -use.fraction)


def session_cap_reasons(session: Session, caps: Caps) -> list[CapUse]:
    """The caps behind its state: those reached when exhausted, those past the warning level
    when near cap (else the fullest: the caps changed since); none when ok, nor when a
    runaway, not a cap, holds it at exhausted."""
    if session.state == Session.State.OK:
        return []
    uses = session_cap_uses(session, caps)
    if session.state == Session.State.EXHAUSTED:
        crossed = [use for use in uses if use.reached]
        if not crossed and session.runaway:
            return []
    else:
        crossed = [use for use in uses if use.used >= caps.warn_at_pct * use.cap]
    return crossed or uses[:1]


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


# --- sessions list --------------------------------------------------------------------------


SESSION_SORTS = {
    "last_active": "last_active_at",
    "started": "started_at",
    "cost": "cost_usd",
    "tokens": "tokens_total",
    "turns": "turn_count",
    "steps": "step_count",
    "session": "external_id",
}
STATE_FILTERS = {
    "ok": Q(state=Session.State.OK, runaway_at__isnull=True),
    "warning": Q(state=Session.State.WARNING),
    "exhausted": Q(state=Session.State.EXHAUSTED),
    "runaway": Q(runaway_at__isnull=False),
    "flagged": FLAGGED,
    # what a stop-budget in force stops (its stopped_by is "budget:<id>"): state_filter
    "stopped": Q(pk__in=[]),
}


def state_filter(state: str, stops: Sequence[PeriodBudget]) -> Q:
    """A state filter of the sessions list, with the sessions `stops` hold in the state their
    agents are told: exhausted (and flagged), no longer ok or near cap; `stopped` keeps those a
    budget stops (not exhausted by their own caps)."""
    if not stops:
        return STATE_FILTERS[state]
    hold = held(stops)
    own = Q(state=Session.State.EXHAUSTED)
    return {
        "ok": STATE_FILTERS["ok"] & ~hold,
        "warning": STATE_FILTERS["warning"] & ~hold,
        "exhausted": own | hold,
        "flagged": FLAGGED | hold,
        "stopped": hold & ~own,
    }.get(state, STATE_FILTERS[state])


@dataclass(frozen=True)
class SessionStop:
    """A session's state as its agent is told it (costboard/budgets/caps.py, stop_verdict) and
    the stop-budget that stops it, when that is what does."""

    state: str
    stopped_by: str | None  # "session", "runaway", "budget:<id>" or None
    budget: PeriodBudget | None


def session_stop(session: Session, caps: Caps, budget: PeriodBudget | None) -> SessionStop:
    """`session`'s SessionStop, `budget` the stop-budget holding it (holds.session_held_by)."""
    state, stopped_by = stop_verdict(
        state=session.state,
        runaway=session.runaway,
        tokens_used=session.tokens_used,
        cost_usd=session.cost_usd,
        caps=caps,
        stopped_by_budget=budget.pk if budget is not None else None,
    )
    by_budget = stopped_by is not None and stopped_by.startswith("budget:")
    return SessionStop(state=state, stopped_by=stopped_by, budget=budget if by_budget else None)


@dataclass(frozen=True)
class SessionFilters:
    state: str = ""
    model: str = ""  # a family (or an exact name: links from before families still work)
    exact: str = ""  # an exact model name
    user: str = ""
    tag: str = ""  # key=value: sessions with that tag
    q: str = ""
    since: date | None = None
    until: date | None = None
    sort: str = "-last_active"

    @property
    def sort_key(self) -> str:
        return self.sort.lstrip("-")

    @property
    def everything(self) -> bool:
        """No filter and no period: every session of the projects, in some order."""
        return not any(
            (
                self.state,
                self.model,
                self.exact,
                self.user,
                self.tag,
                self.q,
                self.since,
                self.until,
            )
        )

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")


def sessions_filtered(
    *, project_ids: list[int], filters: SessionFilters, stops: Sequence[PeriodBudget] = ()
) -> QuerySet[Session]:
    """The sessions list's rows, each annotated `held_by_budget`: the id of the first of
    `stops` (the projects' stop-budgets in force, holds.stops_in_force) holding it, or None."""
    sessions = Session.objects.filter(project_id__in=project_ids)
    if filters.state in STATE_FILTERS:
        sessions = sessions.filter(state_filter(filters.state, stops))
    if filters.exact:  # an exact name (within the family `model`, if given)
        usage = SessionModelUsage.objects.filter(model=filters.exact)
        if filters.model:
            usage = usage.filter(Q(family=filters.model) | Q(model=filters.model))
        sessions = sessions.filter(pk__in=usage.values("session_id"))
    elif filters.model and _is_family(project_ids, filters.model):
        # a test on each row of the period: no join of the model mix, whatever its history
        sessions = sessions.filter(families__has_key=filters.model)
    elif filters.model:  # an exact name, as links had it before families
        usage = SessionModelUsage.objects.filter(model=filters.model)
        sessions = sessions.filter(pk__in=usage.values("session_id"))
    if filters.user:  # a prefix: "acme-" finds acme-1, acme-2…
        sessions = sessions.filter(user_id__startswith=filters.user)
    if filters.tag:
        key, _, value = filters.tag.partition("=")
        # a key transform built by name (not a lookup path: a key may hold "__"), compared as
        # text: `tag_value=` takes JSON equality, which on SQLite reads the value as JSON
        sessions = sessions.annotate(tag_value=KeyTextTransform(key, "tags")).filter(
            Exact(F("tag_value"), value)
        )
    if filters.q:
        sessions = sessions.filter(external_id__icontains=filters.q)
    if filters.since:
        sessions = sessions.filter(last_active_at__gte=_day_start(filters.since))
    if filters.until:
        sessions = sessions.filter(last_active_at__lt=_day_start(filters.until) + timedelta(days=1))
    column = SESSION_SORTS.get(filters.sort_key, "last_active_at")
    if column == "tokens_total":
        sessions = sessions.alias(tokens_total=F("input_tokens") + F("output_tokens"))
    order = f"-{column}" if filters.descending else column
    sessions = sessions.annotate(held_by_budget=held_by(stops))
    return sessions.select_related("project").order_by(order, "-id" if filters.descending else "id")


def sessions_total(*, project_ids: list[int]) -> int:
    """How many sessions the projects have, from their tallies: the sessions ingest made less
    those deleted (a few hundred rows over a year, where counting the sessions themselves
    reads every one of them)."""
    total = IngestTally.objects.filter(project_id__in=project_ids).aggregate(
        n=Sum(F("sessions_made") - F("sessions_deleted"))
    )["n"]
    return int(total or 0)


def _is_family(project_ids: list[int], name: str) -> bool:
    """Whether the projects' steps have a family of this name (else it is an exact name)."""
    return DailyRollup.objects.filter(project_id__in=project_ids, family=name).exists()


def model_mix(*, session_ids: Iterable[int]) -> dict[int, list[FamilyUsage]]:
    """Each session's model families with their exact names, costliest first (one query for
    a page of sessions)."""
    tallies: dict[int, _FamilyTally] = defaultdict(_FamilyTally)
    rows = SessionModelUsage.objects.filter(session_id__in=list(session_ids)).values_list(
        "session_id", "family", "model", "calls", "cost_usd"
    )
    for session_id, family, model, calls, cost in rows:
        tallies[session_id].add(family, model, calls, cost)
    return {session_id: tally.ordered() for session_id, tally in tallies.items()}


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


# --- one session ----------------------------------------------------------------------------


@dataclass
class TurnView:
    turn: Turn
    steps: list[Step] = field(default_factory=list)


MAX_TURNS_SHOWN = 100
MAX_TURN_STEPS_SHOWN = 5000
MAX_LOOSE_STEPS_SHOWN = 200
MAX_POINTS = 2000


@dataclass
class SessionDetail:
    session: Session
    turns: list[TurnView]
    turns_hidden: int
    loose_steps: list[Step]
    loose_more: bool  # there are earlier steps outside a turn than those shown
    cumulative: list[tuple[datetime, int]]
    cost_by_turn: dict[str, dict[int, Decimal]]
    forks: list[Session]
    events: list[BudgetEvent]
    # The latest turn, when its prompt nears its model's context window, and that model.
    summarize_turn: Turn | None = None
    summarize_model: str = ""


def _prompt_tokens(step: Step) -> int:
    return step.input_tokens + step.cache_read_input_tokens + step.cache_creation_input_tokens


def _largest_prompt_model(turn: Turn, steps: list[Step]) -> str:
    """The model of the turn's largest prompt (the one its context pressure is of): from the
    steps shown, else one query."""
    if steps:
        return max(steps, key=_prompt_tokens).model
    largest = (
        Step.objects.filter(session_id=turn.session_id, turn=turn)
        .alias(
            prompt=F("input_tokens")
            + F("cache_read_input_tokens")
            + F("cache_creation_input_tokens")
        )
        .order_by("-prompt", "id")
        .values_list("model", flat=True)
        .first()
    )
    return largest or ""


def session_detail(*, session: Session) -> SessionDetail:
    """A session's turns with their steps, its charts' data, forks and budget events: a fixed
    number of queries, each bounded whatever the session's size (a project's `system` budget
    can gather millions of steps)."""
    turn_count = session.turn_count
    turns = list(Turn.objects.filter(session=session).order_by("-number")[:MAX_TURNS_SHOWN])
    turns.reverse()
    views = {t.pk: TurnView(turn=t) for t in turns}
    loaded = 0
    if views:
        turn_steps = Step.objects.filter(session=session, turn_id__in=list(views)).order_by(
            "timestamp", "id"
        )
        for step in turn_steps[:MAX_TURN_STEPS_SHOWN]:
            views[step.turn_id].steps.append(step)  # type: ignore[index]
            loaded += 1
    loose = list(
        Step.objects.filter(session=session, turn__isnull=True).order_by("-timestamp", "-id")[
            : MAX_LOOSE_STEPS_SHOWN + 1
        ]
    )
    loose_more = len(loose) > MAX_LOOSE_STEPS_SHOWN
    loose = loose[:MAX_LOOSE_STEPS_SHOWN]
    loose.reverse()

    by_turn: dict[str, dict[int, Decimal]] = defaultdict(dict)
    for row in (
        Step.objects.filter(session=session, turn_id__in=list(views))
        .values("turn__number", "step_type")
        .annotate(cost=Coalesce(Sum("cost_usd"), ZERO))
        .order_by()
    ):
        by_turn[row["step_type"]][row["turn__number"]] = row["cost"]

    summarize = turns[-1] if turns and turns[-1].should_summarize else None
    summarize_model = ""
    if summarize is not None:
        # The latest turn's steps are the last loaded: some may be cut when the limit is hit.
        shown = views[summarize.pk].steps if loaded < MAX_TURN_STEPS_SHOWN else []
        summarize_model = _largest_prompt_model(summarize, shown)

    return SessionDetail(
        session=session,
        turns=list(views.values()),
        turns_hidden=max(0, turn_count - len(turns)),
        loose_steps=loose,
        loose_more=loose_more,
        cumulative=session_cumulative_tokens(session=session),
        cost_by_turn=dict(by_turn),
        forks=list(session.forks.order_by("started_at")[:50]),
        events=session_budget_events(session=session),
        summarize_turn=summarize,
        summarize_model=summarize_model,
    )


def session_budget_events(*, session: Session) -> list[BudgetEvent]:
    """Its crossings, cap changes and runaway flags, oldest first."""
    return list(BudgetEvent.objects.filter(session=session).order_by("at", "id"))


def session_cumulative_tokens(*, session: Session) -> list[tuple[datetime, int]]:
    """Tokens used over time: per step up to MAX_POINTS steps, else summed per minute, hour or
    day (whichever keeps the points under MAX_POINTS) in SQL, so a long session is not read
    step by step."""
    steps = Step.objects.filter(session=session)
    if session.step_count <= MAX_POINTS:
        rows = steps.order_by("timestamp", "id").values_list(
            "timestamp", "input_tokens", "output_tokens"
        )
        points, running = [], 0
        for ts, inp, out in rows:
            running += inp + out
            points.append((ts, running))
        return points
    span = session.last_active_at - session.started_at
    unit = next((kind for kind, width in _BUCKETS if span / width <= MAX_POINTS), "day")
    buckets = (
        steps.annotate(at=Trunc("timestamp", unit, tzinfo=UTC))
        .values("at")
        .annotate(tokens=Sum(F("input_tokens") + F("output_tokens")))
        .order_by("at")
    )
    points, running = [], 0
    for row in buckets:
        running += row["tokens"] or 0
        points.append((row["at"], running))
    return points


_BUCKETS = [("minute", timedelta(minutes=1)), ("hour", timedelta(hours=1))]


# --- steps ----------------------------------------------------------------------------------


@dataclass
class StepTypeModelRow:
    """One step type × model family, with the exact names behind it."""

    step_type: str
    family: str
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
    name, `step_type` one step type. The same condition on DailyRollup and Step, whose
    columns share their names."""

    model: str = ""
    exact: str = ""
    step_type: str = ""

    @property
    def by_model(self) -> bool:
        """A model filter: what the latency and tag rollups, kept without models, can't apply."""
        return bool(self.model or self.exact)

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
        return condition


def _period_steps(
    project_ids: list[int], since: date, until: date, steps: StepFilter
) -> QuerySet[Step]:
    """The steps of the period (UTC days, as the rollups count them) that `steps` keeps: what
    /steps/ reads when its filter is one no rollup holds."""
    return Step.objects.filter(
        steps.q,
        project_id__in=project_ids,
        timestamp__gte=_day_start(since),
        timestamp__lt=_day_start(until) + timedelta(days=1),
    )


def steps_by_type_and_model(
    *,
    project_ids: list[int],
    since: date,
    until: date,
    steps: StepFilter = StepFilter(),
) -> list[StepTypeModelRow]:
    """Calls, errors, tokens and cost per step type and model family (kept by `steps`), each
    row with its exact names."""
    rows = DailyRollup.objects.filter(
        steps.q, project_id__in=project_ids, day__gte=since, day__lte=until
    )
    grouped: dict[tuple[str, str], StepTypeModelRow] = {}
    for r in (
        rows.values("step_type", "family", "model")
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
    ):
        key = (r["step_type"], r["family"])
        row = grouped.get(key)
        if row is None:
            row = grouped[key] = StepTypeModelRow(step_type=r["step_type"], family=r["family"])
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
    result.sort(key=lambda r: (r.is_tool, -r.cost_usd, r.step_type, r.family))
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
        timed = _period_steps(project_ids, since, until, steps).filter(duration_ms__isnull=False)
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
            started_at__gte=_day_start(since),
            started_at__lt=_day_start(until) + timedelta(days=1),
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
        _period_steps(project_ids, since, until, steps)
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


# --- period budgets ---------------------------------------------------------------------------


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

    @property
    def forecast_usd(self) -> Decimal | None:
        return self.forecast.cost_usd if self.forecast is not None else None

    @property
    def per_member(self) -> bool:
        """Its limits hold each member (user, key, tag value); its spend is all of theirs."""
        return per_member(self.budget)

    @property
    def used_pct(self) -> Decimal | None:
        """The larger share of a limit used so far (tokens or USD), as a percentage; None for
        a per-member budget, whose limits are each member's (its page lists them)."""
        if self.per_member:
            return None
        shares = []
        if self.budget.token_limit:
            shares.append(Decimal(self.tokens_used) / self.budget.token_limit * 100)
        if self.budget.cost_limit_usd:
            shares.append(self.cost_usd / self.budget.cost_limit_usd * 100)
        return max(shares) if shares else None

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
    """Each budget in its current period, with its forecast (two queries)."""
    starts = {b.pk: period_bounds(b.period, b.timezone, now) for b in budgets}
    current = Q(pk__in=[])
    for b in budgets:
        current |= Q(budget_id=b.pk, period_start=starts[b.pk][0])
    ledgers = {row.budget_id: row for row in _ledger_sums(current)} if budgets else {}
    days = budget_days(budgets, now)
    rows = []
    for b in budgets:
        ledger = ledgers.get(b.pk)
        start, end = starts[b.pk]
        tokens = ledger.tokens_used if ledger is not None else 0
        cost = ledger.cost_usd if ledger is not None else ZERO
        state = ledger.state if ledger is not None else state_of(b, 0, ZERO)
        rows.append(
            BudgetRow(
                budget=b,
                state=state,
                tokens_used=tokens,
                cost_usd=cost,
                # a per-member budget's forecasts are its members' (each its own days)
                forecast=None
                if per_member(b)
                else forecast(b, cost, start=start, end=end, days=days[b.pk], now=now),
                period_end=end,
                period_start=start,
            )
        )
    return rows


_STATE_RANK = {"ok": 0, "warning": 1, "exhausted": 2}


@dataclass(frozen=True)
class LedgerSum:
    """A budget in one period as the pages show it: a per-member budget's members summed."""

    budget_id: int
    period_start: datetime
    period_end: datetime | None
    tokens_used: int
    cost_usd: Decimal
    state: str
    warned_at: datetime | None
    exhausted_at: datetime | None


def _ledger_sums(where: Q, *, newest: int | None = None) -> list[LedgerSum]:
    """The ledgers matching `where`, one per budget and period: a per-member budget's
    members summed (their spend; its state the worst of theirs, its crossings the first),
    so the pages' totals are all that counted toward it. `newest`: only the latest periods,
    that many. One query."""
    worst = Max(
        Case(
            *[When(state=state, then=Value(rank)) for state, rank in _STATE_RANK.items()],
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
        )
        .order_by("-period_start", "budget_id")
    )
    states = {rank: state for state, rank in _STATE_RANK.items()}
    return [
        LedgerSum(
            budget_id=row["budget_id"],
            period_start=row["period_start"],
            period_end=row["end"],
            tokens_used=row["tokens"],
            cost_usd=row["cost"],
            state=states[row["rank"]],
            warned_at=row["warned"],
            exhausted_at=row["exhausted"],
        )
        for row in (rows[:newest] if newest is not None else rows)
    ]


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
    """One period of a budget as its ledger has it, its days in the budget's timezone."""

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
    """`budget`'s page (five queries). `stops`: its project's stop-budgets in force
    (holds.stops_in_force)."""
    row = _budget_rows([budget], now)[0]
    periods = [
        _period_spend(budget, ledger, row.period_start)
        for ledger in _ledger_sums(Q(budget=budget), newest=PAST_PERIODS_SHOWN)
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


# --- end users ----------------------------------------------------------------------------------

USER_SORTS = {
    "user": "user_id",
    "cost": "cost_usd",
    "tokens": "tokens",
    "sessions": "sessions",
    "steps": "steps",
}


@dataclass(frozen=True)
class UserSpend:
    user_id: str
    cost_usd: Decimal
    input_tokens: int
    output_tokens: int
    steps: int
    sessions: int

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def per_step(self) -> Decimal | None:
        return self.cost_usd / self.steps if self.steps else None


def users_spend(
    *, project_ids: list[int], since: date, until: date, sort: str = "-cost"
) -> list[UserSpend]:
    """Spend, tokens and steps per end user between two UTC days, from the per-user daily
    rollups, with the sessions each started in those days (two queries). Sorted by `sort`
    (a USER_SORTS key, "-" for descending)."""
    sums = (
        UserDailyRollup.objects.filter(project_id__in=project_ids, day__gte=since, day__lte=until)
        .values("user_id")
        .annotate(
            cost=Sum("cost_usd"),
            inp=Sum("input_tokens"),
            out=Sum("output_tokens"),
            calls=Sum("calls"),
        )
    )
    started = dict(
        Session.objects.filter(
            project_id__in=project_ids,
            # the same sessions (one is last active when or after it starts), found through
            # session_recent's range rather than a scan of every session there has been
            last_active_at__gte=_day_start(since),
            started_at__gte=_day_start(since),
            started_at__lt=_day_start(until + timedelta(days=1)),
        )
        .values("user_id")
        .annotate(n=Count("id"))
        .values_list("user_id", "n")
    )
    rows = [
        UserSpend(
            user_id=row["user_id"],
            cost_usd=row["cost"] or ZERO,
            input_tokens=row["inp"] or 0,
            output_tokens=row["out"] or 0,
            steps=row["calls"] or 0,
            sessions=started.get(row["user_id"], 0),
        )
        for row in sums
    ]
    name = sort.lstrip("-")
    field_name = USER_SORTS.get(name, "cost_usd")
    rows.sort(key=lambda r: (getattr(r, field_name), r.user_id), reverse=sort.startswith("-"))
    return rows


# --- tags ---------------------------------------------------------------------------------------

TAG_KEYS_SHOWN = 50


@dataclass(frozen=True)
class TagSpend:
    value: str | None  # None: the steps without the key ("untagged")
    calls: int
    tokens: int
    cost_usd: Decimal


def tag_keys(*, project_ids: list[int], since: date, until: date) -> list[str]:
    """The tag keys steps carried between two UTC days, from the per-tag rollups."""
    keys = (
        TagDailyRollup.objects.filter(project_id__in=project_ids, day__gte=since, day__lte=until)
        .values_list("key", flat=True)
        .distinct()
        .order_by("key")
    )
    return list(keys[:TAG_KEYS_SHOWN])


def spend_by_tag(
    *,
    project_ids: list[int],
    since: date,
    until: date,
    key: str,
    steps: StepFilter = StepFilter(),
) -> list[TagSpend]:
    """Spend per value of one tag key between two UTC days, costliest first, and the steps
    without the key as one untagged row (value None): the rows add up to the period's whole
    spend (two queries). With a filter of /steps/, which the tag rollups are not kept by,
    from the period's steps it keeps (one query)."""
    if steps.any:
        return _spend_by_tag_of_steps(_period_steps(project_ids, since, until, steps), key)
    rows = (
        TagDailyRollup.objects.filter(
            project_id__in=project_ids, day__gte=since, day__lte=until, key=key
        )
        .values("value")
        .annotate(
            calls=Sum("calls"),
            inp=Sum("input_tokens"),
            out=Sum("output_tokens"),
            cost=Sum("cost_usd"),
        )
        .order_by("-cost", "value")
    )
    tagged = [
        TagSpend(
            value=r["value"],
            calls=r["calls"] or 0,
            tokens=(r["inp"] or 0) + (r["out"] or 0),
            cost_usd=r["cost"] or ZERO,
        )
        for r in rows
    ]
    whole = DailyRollup.objects.filter(
        project_id__in=project_ids, day__gte=since, day__lte=until
    ).aggregate(
        calls=Sum("calls"), inp=Sum("input_tokens"), out=Sum("output_tokens"), cost=Sum("cost_usd")
    )
    # a step has at most one value per key: what the values leave out carries no such tag
    untagged = TagSpend(
        value=None,
        calls=(whole["calls"] or 0) - sum(t.calls for t in tagged),
        tokens=(whole["inp"] or 0) + (whole["out"] or 0) - sum(t.tokens for t in tagged),
        cost_usd=(whole["cost"] or ZERO) - sum((t.cost_usd for t in tagged), ZERO),
    )
    if not (untagged.calls or untagged.tokens or untagged.cost_usd):
        return tagged
    # costliest first, the untagged row among the values
    return sorted([*tagged, untagged], key=lambda t: t.cost_usd, reverse=True)


def _spend_by_tag_of_steps(steps: QuerySet[Step], key: str) -> list[TagSpend]:
    """spend_by_tag over some steps: their value of the tag key (None: without it)."""
    rows = (
        steps.annotate(tag_value=KeyTextTransform(key, "tags"))
        .values("tag_value")
        .annotate(
            calls=Count("*"),
            inp=Sum("input_tokens"),
            out=Sum("output_tokens"),
            cost=Sum("cost_usd"),
        )
        .order_by()
    )
    found = [
        TagSpend(
            value=r["tag_value"],
            calls=r["calls"],
            tokens=(r["inp"] or 0) + (r["out"] or 0),
            cost_usd=r["cost"] or ZERO,
        )
        for r in rows
    ]
    return sorted(found, key=lambda t: (-t.cost_usd, t.value is None, t.value or ""))
