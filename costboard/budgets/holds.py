"""Which sessions a stop-budget holds (docs/budgets.md, "Stopped by a budget"): the rule the
API's answers and the pages share, decided at read time from the ledgers.

A session is held while an exhausted period budget with action `stop`, in its current period,
covers it (`budget_covers`, asked with no key: a session is not tied to the key that sent
it, so an `api_key` budget stops that key's calls, never a session the pages could name).
Nothing is stored on the session: when the budget's period ends, or its limit is raised, the
sessions it held go on. `exhausted_stops` finds the budgets (the same call the API and ingest
make); `budget_sessions` is `budget_covers` as a filter over sessions, for lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db.models import Case, IntegerField, Q, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact

from costboard.budgets.period_ledgers import exhausted_stops, first_stopping
from costboard.budgets.periods import StepScope
from costboard.models import PeriodBudget, Session

NOTHING = Q(pk__in=[])


def stops_in_force(*, project_ids: Sequence[int], now: datetime) -> list[PeriodBudget]:
    """The projects' exhausted stop-budgets in their current periods, by id (two queries;
    one when no budget stops)."""
    budgets = PeriodBudget.objects.filter(
        project_id__in=project_ids, action=PeriodBudget.Action.STOP
    ).order_by("pk")
    return exhausted_stops(list(budgets), now)


def session_scope(session: Session) -> StepScope:
    """A stored session as budgets match it: its end user and tags, no key."""
    return StepScope(user_id=session.user_id, key_prefix="", tags=session.tags or None)


def session_held_by(session: Session, stops: Sequence[PeriodBudget]) -> PeriodBudget | None:
    """The first of `stops` (by id, as the API answers) that holds this session."""
    found = first_stopping(
        [b for b in stops if b.project_id == session.project_id], session_scope(session)
    )
    return next((b for b in stops if b.pk == found), None)


def budget_sessions(budget: PeriodBudget) -> Q:
    """The sessions `budget` covers, as a filter: `budget_covers` of each session's scope."""
    project = Q(project_id=budget.project_id)
    if budget.scope == PeriodBudget.Scope.PROJECT:
        return project
    if budget.scope == PeriodBudget.Scope.USER:
        return project & Q(user_id=budget.scope_value) if budget.scope_value else NOTHING
    if budget.scope == PeriodBudget.Scope.TAG:
        key, _, value = budget.scope_value.partition("=")
        # a key transform built by name (a key may hold "__"), compared as text
        return project & Q(Exact(KeyTextTransform(key, "tags"), value))
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
