"""A batch's spend against every budget above it: the one question ingest asks of budgets.

Ingest stores a batch's steps and turns, then calls `batch_budgets` once, inside its
transaction and under its sessions' locks, with each touched session's ledger as locked and
what the batch adds to it, and the stored steps. Everything a budget decides of the batch is
decided here, in this order:

1. each session's caps (its own, else its project's, else the environment's: caps.py) and
   the engine's outcome (engine.py): its state, its crossings, a runaway flag raised by its
   turns, a cap changed by a session event — which ingest then writes with the session's
   sums, in the session's one write of the batch;
2. the crossings recorded as BudgetEvents;
3. the period budgets (period_ledgers.py): the steps counted toward each budget and period
   they fall in, decided, their crossings recorded;
4. the stop verdict: each touched session an exhausted stop-budget covers — by its steps'
   periods, or, for a session the batch gave no steps, by the budgets' current periods;
5. the crossings announced through the outbox (sessions', then period budgets').

What ingest answers with is read back from the verdict (`BatchBudgets.answer`) once the
sessions are written: their `<budget>`s and the `<period budget>`s the batch touched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from costboard.budgets.alerts import announce
from costboard.budgets.caps import BudgetFields, CapsMemo, SessionBudget, session_budget
from costboard.budgets.engine import Flag, Ledger, SpendLike, budget_decide
from costboard.budgets.period_ledgers import (
    MovedSpend,
    SpendBatch,
    SpendStep,
    period_budgets_apply,
    project_budgets,
    stopping_budgets,
)
from costboard.budgets.periods import (
    StepScope,
    member_days,
    per_member,
    period_bounds,
    period_budget_view,
    rolling,
    rolling_views,
    window_bounds,
)
from costboard.budgets.services import budget_events_of
from costboard.models import SYSTEM_SESSION_ID, BudgetEvent, PeriodBudget, PeriodLedger, Project
from costboard.models import Session as SessionRow


@dataclass(slots=True)
class SessionSpend:
    """A touched session as ingest hands it over: its ledger as locked (`before`), the caps
    it had and the caps it has after the batch's session events (its own: None for its
    project's), the batch's steps in it and their sums, the runaway flag its turns raised,
    and when a crossing no step caused is dated (a session event's time, else now)."""

    key: str
    session_id: int
    before: Ledger
    caps_before: tuple[int | None, Decimal | None]
    caps_after: tuple[int | None, Decimal | None]
    steps: Sequence[SpendLike]
    added: tuple[int, Decimal]  # tokens and USD
    flag: Flag | None
    at: datetime


@dataclass(frozen=True, slots=True)
class StepMoved:
    """A stored step the batch moved out of `system` (ingest's writes/moves.py): its id, the
    step in its new session, and the end user and tags it had there and has now."""

    step_id: int
    step: SpendStep
    user_before: str
    tags_before: dict[str, str] | None
    user_after: str
    tags_after: dict[str, str] | None

    def spend(self) -> MovedSpend:
        """The step as period budgets match it where it was and where it is."""
        return MovedSpend(
            step=self.step,
            step_id=self.step_id,
            before=StepScope(user_id=self.user_before, key_prefix="", tags=self.tags_before),
            after=StepScope(user_id=self.user_after, key_prefix="", tags=self.tags_after),
        )


@dataclass(frozen=True)
class BatchSpend:
    """Everything of a batch a budget reads: its project, its touched sessions (each once),
    its stored steps and what period budgets match them by — the key that sent them, each
    session's end user as it stands after the batch, each step's tags (`step_tags`) and each
    session's (a session given no steps is matched by them) — the batch's time, and the
    stored steps it moved out of `system` (`moved`: their user and tags there and now, for
    the user and tag budgets they leave and join; period_ledgers.py)."""

    project: Project
    sessions: Sequence[SessionSpend]
    steps: Sequence[SpendStep]
    key_prefix: str
    user_of: Mapping[str, str]
    step_tags: Callable[[Any], dict[str, str] | None]
    session_tags: Mapping[str, dict[str, str]]
    now: datetime
    moved: Sequence[StepMoved] = ()


@dataclass
class BatchAnswer:
    """The budgets part of ingest's answer: the sessions' `<budget>`s (those answered), the
    touched period budgets' `<period budget>`s, and how many sessions were left out as ok."""

    sessions: dict[str, SessionBudget]
    budgets: dict[str, dict[str, Any]]
    sessions_ok: int


@dataclass
class BatchBudgets:
    """What the budgets decided of a batch: each session's ledger after it (to write), the
    budget events recorded (announced), the session each exhausted stop-budget stops, and
    the period ledgers it touched."""

    project: Project
    now: datetime
    caps_of: CapsMemo
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    events: list[BudgetEvent] = field(default_factory=list)
    stopped: dict[str, int] = field(default_factory=dict)  # session key → budget id
    periods: list[tuple[PeriodBudget, PeriodLedger]] = field(default_factory=list)

    def answer(self, sessions: Sequence[BudgetFields], *, flagged_only: bool) -> BatchAnswer:
        """The answer for these sessions as written. `flagged_only` (`Prefer:
        return=minimal`): only the sessions that are not ok — warned, exhausted, runaway or
        stopped by a budget — the others counted in `sessions_ok`."""
        answered = [
            s
            for s in sessions
            if not flagged_only
            or s.state != SessionRow.State.OK
            or s.runaway
            or s.external_id in self.stopped
        ]
        budgets = {
            s.external_id: session_budget(
                s,
                self.project,
                stopped_by_budget=self.stopped.get(s.external_id),
                caps_of=self.caps_of,
            )
            for s in answered
        }
        return BatchAnswer(
            sessions=dict(sorted(budgets.items())),
            budgets=_period_views(self.periods, self.now),
            sessions_ok=len(sessions) - len(budgets),
        )


def batch_budgets(batch: BatchSpend) -> BatchBudgets:
    """Decide every budget the batch touches (the module docstring's order), in the caller's
    transaction: the sessions' rows are locked by the caller, the period ledgers here."""
    project, now = batch.project, batch.now
    above = project_budgets(project)
    decided = BatchBudgets(project=project, now=now, caps_of=CapsMemo(project))
    crossings: list[BudgetEvent] = []
    for spend in batch.sessions:
        system = spend.key == SYSTEM_SESSION_ID
        caps = decided.caps_of(*spend.caps_after, system)
        old_caps = None
        if spend.before.tokens_used or spend.before.cost_usd:  # caps given before any usage
            old_caps = decided.caps_of(*spend.caps_before, system)
        outcome = budget_decide(
            ledger=spend.before,
            limits=caps,
            old_limits=old_caps,
            spends=spend.steps,
            added=spend.added,
            flag=spend.flag,
            at=spend.at,
            stops_runaways=project.runaway_stops,
        )
        decided.ledgers[spend.key] = outcome.ledger
        crossings += budget_events_of(
            outcome.crossings, project=project, session_id=spend.session_id, caps=caps
        )
    session_events = BudgetEvent.objects.bulk_create(crossings) if crossings else []
    spent = SpendBatch(
        steps=batch.steps,
        key_prefix=batch.key_prefix,
        user_of=batch.user_of,
        tags_of=batch.step_tags,
        moved=[moved.spend() for moved in batch.moved],
    )
    periods = period_budgets_apply(project=project, budgets=above, batch=spent, now=now)
    decided.stopped = _stopped(batch, above, periods.stopped)
    decided.periods = periods.ledgers
    decided.events = [*session_events, *periods.events]
    announce(session_events)
    announce(periods.events)
    return decided


def _stopped(
    batch: BatchSpend, above: Sequence[PeriodBudget], by_steps: dict[str, int]
) -> dict[str, int]:
    """Each touched session an exhausted stop-budget covers in its current period (`now`'s,
    as every read decides it) → that budget: those whose steps counted toward it there
    (`by_steps`: a step's own tags match too), then the others by what the session is (its
    user, its tags, the key): a session touched by a session or turn event alone, or whose
    steps were all timed in a period before (a late batch), is told to stop as a read of it
    would be, and one whose late steps exhausted a past period is not. A session whose steps
    all counted in the current periods was decided by them, unless a stop budget is a tag's:
    a step's own tag may replace its session's (`team=b` on a step of a `team=a` session),
    so with one, every session is asked (one query)."""
    stopped = dict(by_steps)
    stops = [budget for budget in above if budget.action == PeriodBudget.Action.STOP]
    if not stops:
        return stopped
    # the span every stop budget's current period holds: a session whose steps all fall in it
    # was decided by them (its scope is its steps'), the others are asked
    bounds = [
        (window_bounds(b.window_hours or 1, batch.now)[0], None)  # later spend counts too
        if rolling(b)
        else period_bounds(b.period, b.timezone, batch.now)
        for b in stops
    ]
    first = max(start for start, _ in bounds)
    end = min((end for _, end in bounds if end is not None), default=None)
    # a tag budget may match a session by a tag its steps override: every session is asked
    by_tags = any(b.scope == PeriodBudget.Scope.TAG for b in stops)
    scopes = {
        s.key: StepScope(
            user_id=batch.user_of.get(s.key, ""),
            key_prefix=batch.key_prefix,
            tags=batch.session_tags.get(s.key),
        )
        for s in batch.sessions
        if s.key not in stopped
        and (
            by_tags
            or not s.steps
            or not all(first <= t.at and (end is None or t.at < end) for t in s.steps)
        )
    }
    if scopes:
        stopped.update(stopping_budgets(above, scopes, batch.now))
    return stopped


def _period_views(
    ledgers: list[tuple[PeriodBudget, PeriodLedger]], now: datetime
) -> dict[str, dict[str, Any]]:
    """`<period budget>` of each budget the batch touched, with its forecast (one query),
    keyed by id; a per-member budget of which the batch touched several members, each of
    them by "<id>:<member>". A batch whose steps fell in several periods of one budget (a
    late step, a client's clock ahead across midnight) is answered for the period `now` falls
    in, as a read of the budget at that moment is; without one, for the latest it touched."""
    if not ledgers:
        return {}
    # a rolling budget has no forecast: no days read for it
    days = member_days(
        [(budget.pk, ledger.member) for budget, ledger in ledgers if not rolling(budget)], now
    )
    members = Counter(pk for pk, _ in {(b.pk, ledger.member) for b, ledger in ledgers})
    # a rolling budget's entries share all but the member's figures: built together, once
    windows: dict[int, tuple[PeriodBudget, list[PeriodLedger]]] = {}
    for budget, ledger in ledgers:
        if rolling(budget):
            windows.setdefault(budget.pk, (budget, []))[1].append(ledger)
    rolled = {
        id(ledger): view
        for budget, group in windows.values()
        for ledger, view in zip(group, rolling_views(budget, group, now), strict=True)
    }
    views = {}
    current: set[str] = set()  # the keys answered for the period of `now`
    for budget, ledger in ledgers:  # each budget's periods in order, the latest last
        several = per_member(budget) and members[budget.pk] > 1
        key = f"{budget.pk}:{ledger.member}" if several else str(budget.pk)
        if key in current:
            continue
        if ledger.period_end is None or ledger.period_start <= now < ledger.period_end:
            current.add(key)
        if id(ledger) in rolled:
            views[key] = rolled[id(ledger)]
            continue
        views[key] = period_budget_view(
            budget, ledger, now=now, days=days.get((budget.pk, ledger.member))
        )
    return views
