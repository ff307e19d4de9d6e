"""A repricing's differences carried to the period budgets (docs/budgets.md, "Repricing").

Ingest adds a step's cost to the ledger of each period budget that covers it (and to the
budget's day, or a rolling budget's hour). When a repricing changes that cost, the same
ledgers, days and hours get the difference, in the repricing's chunk transaction, under
their row locks; the budgets' current periods are then decided again
(`repriced_budgets_decide`), as after a change of their limits, so a repricing that takes a
budget past a limit is a crossing and one that brings it back under clears it.

Which budgets a step counted toward is known again from what it is: its project, its
session's user (as it is now, as the user rollups take it), its tags (stored with it), its
time and its id: steps get their ids as they arrive, and a budget keeps the first one it could
count (`counts_from_step`), so a step that arrived before the budget was made is known not
counted, whatever its timestamp. The key that sent it is not kept: an `api_key` budget keeps
the cost it counted. A row that is gone (a period before retention, an hour out of every
window) gets nothing: nothing of it is read any more.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Q

from costboard.budgets.alerts import announce, incidents_resolve
from costboard.budgets.period_ledgers import (
    LEDGER_ORDER,
    budget_counted,
    period_budget_recheck,
    project_budgets,
)
from costboard.budgets.periods import (
    EPOCH,
    StepScope,
    budget_member,
    hour_of,
    period_bounds,
    rolling,
    zone,
)
from costboard.models import BudgetDay, BudgetHour, PeriodBudget, PeriodLedger, Project


@dataclass(frozen=True, slots=True)
class StepRepriced:
    """A repriced step as period budgets match it, and what its cost changed by."""

    project_id: int
    step_id: int
    at: datetime  # its timestamp
    user_id: str  # the end user it arrived with ("" for none; its session's now if not kept)
    tags: dict[str, str] | None
    cost_delta: Decimal


def period_ledgers_reprice(steps: Sequence[StepRepriced]) -> set[int]:
    """Add each step's cost difference to the ledgers, days and hours of the period budgets
    it counted toward (module docstring), in the caller's transaction, locking the ledgers in
    ingest's order (budget, period start, member). Returns the budgets changed."""
    ledgers: dict[tuple[int, datetime, str], Decimal] = defaultdict(Decimal)
    days: dict[tuple[int, date, str], Decimal] = defaultdict(Decimal)
    hours: dict[tuple[int, str, datetime], Decimal] = defaultdict(Decimal)
    by_project: dict[int, list[StepRepriced]] = defaultdict(list)
    for step in steps:
        if step.cost_delta:
            by_project[step.project_id].append(step)
    for project_id, changed in sorted(by_project.items()):
        for budget in project_budgets(Project(pk=project_id)):
            if budget.scope == PeriodBudget.Scope.API_KEY:
                continue  # which key sent a step is not kept
            for step in changed:
                if not _counted(budget, step):
                    continue
                member = budget_member(budget, StepScope(step.user_id, "", step.tags))
                if member is None:
                    continue
                if rolling(budget):  # its member's one ledger (locked too) keeps its hours'
                    hours[(budget.pk, member, hour_of(step.at))] += step.cost_delta
                    ledgers.setdefault((budget.pk, EPOCH, member), Decimal(0))
                    continue
                start, _ = period_bounds(budget.period, budget.timezone, step.at)
                ledgers[(budget.pk, start, member)] += step.cost_delta
                day = step.at.astimezone(zone(budget.timezone)).date()
                days[(budget.pk, day, member)] += step.cost_delta
    if not ledgers:
        return set()
    wanted = Q(pk__in=[])
    for budget_id, start, member in sorted(ledgers):
        wanted |= Q(budget_id=budget_id, period_start=start, member=member)
    locked = list(PeriodLedger.objects.select_for_update().filter(wanted).order_by(*LEDGER_ORDER))
    for row in locked:
        delta = ledgers[(row.budget_id, row.period_start, row.member)]
        if row.window_start is not None:  # a rolling ledger: the hours of its stored window
            delta = sum(
                (
                    amount
                    for (budget_id, member, hour), amount in hours.items()
                    if (budget_id, member) == (row.budget_id, row.member)
                    and hour >= row.window_start
                ),
                Decimal(0),
            )
        if delta:
            PeriodLedger.objects.filter(pk=row.pk).update(cost_usd=F("cost_usd") + delta)
    for (budget_id, day, member), delta in sorted(days.items()):
        BudgetDay.objects.filter(budget_id=budget_id, day=day, member=member).update(
            cost_usd=F("cost_usd") + delta
        )
    for (budget_id, member, hour), delta in sorted(hours.items()):
        BudgetHour.objects.filter(budget_id=budget_id, member=member, hour=hour).update(
            cost_usd=F("cost_usd") + delta
        )
    return {row.budget_id for row in locked} | {budget_id for budget_id, _, _ in hours}


def _counted(budget: PeriodBudget, step: StepRepriced) -> bool:
    """Did `budget` count this step, by when it arrived (`budget_counted`)."""
    return budget_counted(budget, step.step_id, step.at)


def repriced_budgets_decide(budget_ids: set[int], *, now: datetime) -> None:
    """Decide these budgets' current periods again after a repricing changed their spend,
    each in a transaction of its own with its row locked (as an edit of its limits does): a
    crossing is recorded once and announced; an incident whose budget is now under its limits
    is resolved."""
    for budget_id in sorted(budget_ids):
        with transaction.atomic():
            budget = (
                PeriodBudget.objects.select_for_update()
                .select_related("project")
                .filter(pk=budget_id)
                .first()
            )
            if budget is None:
                continue
            announce(period_budget_recheck(budget, now=now))
        incidents_resolve(now=now, budget_id=budget_id)
