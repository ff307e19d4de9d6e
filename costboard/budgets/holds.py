"""Which sessions a stop-budget holds (docs/budgets.md, "Stopped by a budget"): the rule the
API's answers and the pages share, decided at read time from the ledgers.

A session is held while an exhausted period budget with action `stop`, in its current period,
covers it (`budget_covers`, asked with no key: a session is not tied to the key that sent
it, so an `api_key` budget stops that key's calls, never a session the pages could name).
Nothing is stored on the session: when the budget's period ends, or its limit is raised, the
sessions it held go on. `stops_in_force` finds the budgets and, for a per-member budget
(docs/budgets.md, "Per-member budgets"), its exhausted members; `budget_sessions` is
`budget_member` as a filter over sessions, for lists; both ask `budget_member`
(costboard/budgets/periods.py), the one rule of which budget covers what.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db.models import Case, IntegerField, Q, Value, When
from django.db.models.lookups import Exact, In

from costboard.budgets.engine import EXHAUSTED
from costboard.budgets.periods import (
    PeriodLimits,
    StepScope,
    budget_member,
    per_member,
    period_bounds,
    rolling,
    window_members,
)
from costboard.models import PeriodBudget, PeriodLedger, Session
from costboard.tag_values import TagValue

NOTHING = Q(pk__in=[])


def stops_in_force(*, project_ids: Sequence[int], now: datetime) -> list[PeriodBudget]:
    """The projects' exhausted stop-budgets in their current periods (a rolling budget: its
    window at `now`, from its hours), by id (two queries, three with rolling budgets; one when
    no budget stops). Each carries `exhausted_since`: the members whose ledgers are
    exhausted ('' alone for a budget that is not per member), each with when."""
    budgets = list(
        PeriodBudget.objects.filter(
            project_id__in=project_ids, action=PeriodBudget.Action.STOP
        ).order_by("pk")
    )
    if not budgets:
        return []
    current = NOTHING
    for budget in budgets:
        if not rolling(budget):
            start = period_bounds(budget.period, budget.timezone, now)[0]
            current |= Q(budget=budget, period_start=start)
    exhausted: dict[int, dict[str, datetime | None]] = {}
    for budget_id, member, since in PeriodLedger.objects.filter(
        current, state=EXHAUSTED
    ).values_list("budget_id", "member", "exhausted_at"):
        exhausted.setdefault(budget_id, {})[member] = since
    windows = [budget for budget in budgets if rolling(budget)]
    for budget_id, spent in window_members(windows, now).items():
        limits = PeriodLimits.of(next(b for b in windows if b.pk == budget_id))
        for member, (tokens, cost) in spent.items():
            if limits.exhausted(tokens, cost):
                exhausted.setdefault(budget_id, {})[member] = None  # since: its window's
    found = []
    for budget in budgets:
        if budget.pk in exhausted:
            budget.exhausted_since = exhausted[budget.pk]  # type: ignore[attr-defined]
            found.append(budget)
    return found


def held_since(stops: Sequence[PeriodBudget], moment: str) -> Q:
    """The sessions any of `stops` holds by a hold that began after the session's `moment`
    (a datetime field, e.g. its acknowledgement): each member's from its ledger's exhaustion;
    one whose start is not kept (a rolling window's) counts as after it."""
    found = NOTHING
    for budget in stops:
        for member, at in _exhausted_since(budget).items():
            sessions = budget_sessions(budget, members=frozenset({member}))
            found |= sessions if at is None else sessions & Q(**{f"{moment}__lt": at})
    return found


def _exhausted_since(budget: PeriodBudget) -> dict[str, datetime | None]:
    """Its exhausted members ('' alone for a budget that is not per member), each with when
    its ledger was exhausted (None: not kept, a rolling window's)."""
    return getattr(budget, "exhausted_since", {"": None})


def _members(budget: PeriodBudget) -> frozenset[str]:
    return frozenset(_exhausted_since(budget))


def session_scope(session: Session) -> StepScope:
    """A stored session as budgets match it: its end user and tags, no key."""
    return StepScope(user_id=session.user_id, key_prefix="", tags=session.tags or None)


def session_held_by(session: Session, stops: Sequence[PeriodBudget]) -> PeriodBudget | None:
    """The first of `stops` (by id, as the API answers) that holds this session: it covers
    the session's scope, for a member that is exhausted."""
    scope = session_scope(session)
    for budget in stops:
        if budget.project_id == session.project_id:
            member = budget_member(budget, scope)
            if member is not None and member in _members(budget):
                return budget
    return None


def budget_sessions(budget: PeriodBudget, members: frozenset[str] | None = None) -> Q:
    """The sessions `budget` holds, as a filter: `budget_member` of each session's scope, in
    the budget's exhausted members (or those of `members`) when it is per member."""
    project = Q(project_id=budget.project_id)
    if budget.scope == PeriodBudget.Scope.PROJECT:
        return project
    every = per_member(budget)
    chosen = sorted(m for m in (members or _members(budget)) if m)
    if budget.scope == PeriodBudget.Scope.USER:
        if every:
            return project & Q(user_id__in=chosen) if chosen else NOTHING
        return project & Q(user_id=budget.scope_value) if budget.scope_value else NOTHING
    if budget.scope == PeriodBudget.Scope.TAG:
        key, _, value = budget.scope_value.partition("=")
        # the tag's value by its key (costboard/tag_values.py), compared as text
        if every:
            return project & Q(In(TagValue(key), chosen)) if chosen else NOTHING
        return project & Q(Exact(TagValue(key), value))
    return NOTHING  # api_key: the key is stopped, not a session (module docstring)


def held(stops: Sequence[PeriodBudget]) -> Q:
    """The sessions any of `stops` holds."""
    found = NOTHING
    for budget in stops:
        found |= budget_sessions(budget)
    return found


def held_by(stops: Sequence[PeriodBudget]) -> Case | Value:
    """Each session's holding budget's id (the first by id, as the API answers), or NULL:
    an annotation for lists."""
    whens = [When(budget_sessions(b), then=Value(b.pk)) for b in stops]
    if not whens:
        return Value(None, output_field=IntegerField())
    return Case(*whens, default=None, output_field=IntegerField())
