"""Period budgets decided with the spend: what ingest calls, inside the batch's transaction,
after the steps are stored (and last, so the ledger rows are held only until the commit).

For each of the project's budgets, the batch's steps it covers (periods.budget_covers) are
grouped by the period their timestamps fall in; each (budget, period) ledger row is made if
missing, then all of them are locked in one order (budget, period start), so two batches
never deadlock and never decide on stale totals; the budget engine decides each (the same
`budget_decide` as a session's) and its crossings become BudgetEvents — soft_warned and
exhausted once per budget and period (a unique constraint holds it under any race) — which
the caller announces through the outbox.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db.models import Q

from costboard.budgets.engine import EXHAUSTED, Ledger, Spend, budget_decide
from costboard.budgets.periods import PeriodLimits, StepScope, budget_covers, period_bounds
from costboard.models import BudgetEvent, PeriodBudget, PeriodLedger, Project


@dataclass(frozen=True, slots=True)
class BudgetedStep:
    """A stored step as period budgets see it."""

    session_key: str
    at: datetime
    tokens: int
    cost_usd: Decimal
    scope: StepScope


@dataclass
class PeriodOutcome:
    """The ledgers a batch touched (after it), its crossings, and for each session the
    exhausted stop-budget that stops it, if any."""

    ledgers: list[tuple[PeriodBudget, PeriodLedger]] = field(default_factory=list)
    events: list[BudgetEvent] = field(default_factory=list)
    stopped: dict[str, int] = field(default_factory=dict)  # session key → budget id


def project_budgets(project: Project) -> list[PeriodBudget]:
    return list(PeriodBudget.objects.filter(project=project).order_by("pk"))


def period_budgets_apply(
    *,
    project: Project,
    budgets: Sequence[PeriodBudget],
    steps: Iterable[BudgetedStep],
    now: datetime,
) -> PeriodOutcome:
    """Count `steps` toward the budgets that cover them and decide each (module docstring)."""
    outcome = PeriodOutcome()
    if not budgets:
        return outcome
    groups: dict[tuple[int, datetime], list[BudgetedStep]] = defaultdict(list)
    ends: dict[tuple[int, datetime], datetime | None] = {}
    sessions_of: dict[tuple[int, datetime], set[str]] = defaultdict(set)
    by_id = {budget.pk: budget for budget in budgets}
    # each budget's last period seen: a batch's steps mostly share one
    last: dict[int, tuple[datetime, datetime | None]] = {}
    for step in steps:
        for budget in budgets:
            if not budget_covers(budget, step.scope):
                continue
            bounds = last.get(budget.pk)
            if bounds is None or not (
                bounds[0] <= step.at and (bounds[1] is None or step.at < bounds[1])
            ):
                bounds = period_bounds(budget.period, budget.timezone, step.at)
                last[budget.pk] = bounds
            key = (budget.pk, bounds[0])
            groups[key].append(step)
            ends[key] = bounds[1]
            sessions_of[key].add(step.session_key)
    if not groups:
        return outcome

    PeriodLedger.objects.bulk_create(
        [
            PeriodLedger(
                budget_id=budget_id, period_start=start, period_end=ends[(budget_id, start)]
            )
            for budget_id, start in sorted(groups)
        ],
        ignore_conflicts=True,
    )
    wanted = Q()
    for budget_id, start in groups:
        wanted |= Q(budget_id=budget_id, period_start=start)
    locked = list(
        PeriodLedger.objects.select_for_update()
        .filter(wanted)
        .order_by("budget_id", "period_start")
    )

    changed: list[PeriodLedger] = []
    events: list[BudgetEvent] = []
    for row in locked:
        budget = by_id[row.budget_id]
        spends = [
            Spend(s.at, s.tokens, s.cost_usd) for s in groups[(row.budget_id, row.period_start)]
        ]
        decided = budget_decide(
            ledger=Ledger(
                tokens_used=row.tokens_used,
                cost_usd=row.cost_usd,
                state=row.state,
                warned_at=row.warned_at,
                exhausted_at=row.exhausted_at,
            ),
            limits=PeriodLimits.of(budget),
            at=now,
            spends=spends,
        )
        after = decided.ledger
        row.tokens_used, row.cost_usd, row.state = after.tokens_used, after.cost_usd, after.state
        row.warned_at, row.exhausted_at, row.updated_at = after.warned_at, after.exhausted_at, now
        changed.append(row)
        events.extend(
            BudgetEvent(
                project=project,
                ledger=row,
                kind=crossing.kind,
                at=crossing.at,
                tokens_used=crossing.tokens_used,
                cost_usd=crossing.cost_usd,
                detail={
                    "budget_id": budget.pk,
                    "budget": budget.name,
                    **PeriodLimits.of(budget).describe(),
                    "warn_at_pct": str(budget.warn_at_pct),
                },
            )
            for crossing in decided.crossings
        )
        outcome.ledgers.append((budget, row))
        if budget.action == PeriodBudget.Action.STOP and row.state == EXHAUSTED:
            for session_key in sessions_of[(row.budget_id, row.period_start)]:
                outcome.stopped.setdefault(session_key, budget.pk)
    PeriodLedger.objects.bulk_update(
        changed, ["tokens_used", "cost_usd", "state", "warned_at", "exhausted_at", "updated_at"]
    )
    if events:
        outcome.events = BudgetEvent.objects.bulk_create(events)
    return outcome


def stopping_budget(
    project: Project, *, user_id: str, tags: dict[str, str] | None, key_prefix: str, now: datetime
) -> int | None:
    """The id of an exhausted stop-budget (in its current period) that covers a session of
    this user and these tags asked about with this key; None if nothing stops it."""
    scope = StepScope(user_id=user_id, key_prefix=key_prefix, tags=tags or None)
    stops = [
        budget
        for budget in PeriodBudget.objects.filter(project=project, action=PeriodBudget.Action.STOP)
        if budget_covers(budget, scope)
    ]
    if not stops:
        return None
    current = Q()
    for budget in stops:
        current |= Q(
            budget=budget, period_start=period_bounds(budget.period, budget.timezone, now)[0]
        )
    exhausted = PeriodLedger.objects.filter(current, state=EXHAUSTED).order_by("budget_id").first()
    return exhausted.budget_id if exhausted is not None else None
