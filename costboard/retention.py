"""Retention: a project with `retention_days` keeps its steps that long. Older steps are
deleted; the rollups (sessions, turns, daily and latency rollups, model mixes) stay, so every
total and chart is unchanged. Ended sessions past retention also lose their budget state:
their budget events and alert deliveries (the session row and its totals stay).
Step receipts (the event_ids that make a replay a duplicate in any month) go with their
steps. Idempotency-Key answers (costboard/ingest/idempotency.py) are deleted 48 hours after
they were stored: docs/api.md ("Idempotency") promises at least 24. Each project's tally of
sessions is checked against its sessions (costboard/projects.py, sessions_tally_check) in the
same sweep. Rolling budgets' hourly buckets older than their windows are deleted
(`budget_hours_prune`).

On PostgreSQL the steps are partitioned by month (costboard/partitions.py): a month whose
every step is past its project's retention is dropped whole (no row-by-row delete, no dead
rows to vacuum). A project without retention keeps its steps forever, so a month it has steps
in is never dropped; there, as in the DEFAULT partition and on SQLite, older steps are deleted.

Run hourly by Celery beat (and by `manage.py guard_sweep`); deletes go in chunks, each its
own short transaction, and running it twice deletes nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db import OperationalError, transaction
from django.db.models import Model, QuerySet
from django.utils import timezone

from costboard.models import (
    BudgetEvent,
    BudgetHour,
    IdempotentRequest,
    PeriodBudget,
    Project,
    Step,
    StepReceipt,
)
from costboard.partitions import (
    lock_busy,
    month_add,
    step_partition_drop,
    step_partitions,
)
from costboard.projects import sessions_tally_check

log = logging.getLogger(__name__)

CHUNK = 5000
IDEMPOTENCY_KEEP = timedelta(hours=48)


@dataclass(frozen=True, slots=True)
class RetentionResult:
    steps_deleted: int
    budget_events_deleted: int
    idempotency_keys_deleted: int = 0


def _delete_in_chunks(queryset: QuerySet[Any], model: type[Model]) -> int:
    """Delete the rows of `queryset` CHUNK at a time, each chunk its own transaction (no
    long lock on a busy table). Steps have nothing depending on them, so Django deletes
    each chunk with one DELETE; budget events take their deliveries with them."""
    deleted = 0
    while ids := list(queryset.values_list("pk", flat=True)[:CHUNK]):
        with transaction.atomic():
            _, by_model = model._default_manager.filter(pk__in=ids).delete()
        deleted += by_model.get(model._meta.label, 0)
    return deleted


def project_retention(project: Project, now: datetime) -> RetentionResult:
    if not project.retention_days:
        return RetentionResult(0, 0)
    cutoff = now - timedelta(days=project.retention_days)
    steps = _delete_in_chunks(
        Step.objects.filter(project=project, timestamp__lt=cutoff).order_by(), Step
    )
    _receipts_prune(project, cutoff)
    events = _delete_in_chunks(
        BudgetEvent.objects.filter(project=project, session__ended_at__lt=cutoff).order_by(),
        BudgetEvent,
    )
    return RetentionResult(steps, events)


def _receipts_prune(project: Project, cutoff: datetime) -> int:
    """Delete the step receipts older than `cutoff`: their steps are gone (deleted above, or
    their month dropped), and an event_id is a duplicate only as long as its step is kept.
    One DELETE over the project's receipts (found by the primary key's leading column; no
    index on their time, which every step would pay for). Ingest only inserts receipts, so
    it never waits on this."""
    count, _ = StepReceipt.objects.filter(project=project, timestamp__lt=cutoff).delete()
    return count


def idempotency_prune(now: datetime) -> int:
    """Delete the Idempotency-Key answers older than IDEMPOTENCY_KEEP, every project's."""
    cutoff = now - IDEMPOTENCY_KEEP
    return _delete_in_chunks(
        IdempotentRequest.objects.filter(created_at__lt=cutoff).order_by(), IdempotentRequest
    )


def budget_hours_prune(now: datetime) -> int:
    """Delete the rolling budgets' hours before their windows at `now` (a window is the hour
    of `now` and the window_hours − 1 before it: costboard/budgets/periods.py, window_bounds),
    and any of a budget no longer rolling. One DELETE per rolling budget; safe to run twice."""
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    deleted = 0
    rolling = PeriodBudget.objects.filter(period=PeriodBudget.Period.ROLLING)
    for budget_id, hours in rolling.values_list("pk", "window_hours").order_by("pk"):
        start = current - timedelta(hours=(hours or 1) - 1)
        deleted += BudgetHour.objects.filter(budget_id=budget_id, hour__lt=start).delete()[0]
    others = BudgetHour.objects.exclude(budget_id__in=rolling.values("pk"))
    return deleted + others.delete()[0]


def step_months_drop(now: datetime) -> int:
    """Drop the month partitions whose steps are all past their projects' retention (the
    month ends at or before each one's cutoff); return how many steps they held. A month
    whose locks are busy is left to the chunked deletes, and tried again next hour."""
    cutoffs = {
        pk: now - timedelta(days=days or 0)  # never None here: the filter
        for pk, days in Project.objects.filter(retention_days__gt=0).values_list(
            "pk", "retention_days"
        )
    }
    if not cutoffs:
        return 0
    latest = max(cutoffs.values())
    dropped = 0
    for month in sorted(step_partitions()):
        end = datetime.combine(month_add(month, 1), time(), tzinfo=UTC)
        if end > latest:
            break  # every later month ends past every cutoff

        def past_every_cutoff(projects: list[int], end: datetime = end) -> bool:
            # a project without retention (not in cutoffs) keeps its steps: no drop
            return all(pk in cutoffs and end <= cutoffs[pk] for pk in projects)

        try:
            dropped += step_partition_drop(month, droppable=past_every_cutoff)
        except OperationalError as exc:
            if not lock_busy(exc):
                raise
            log.warning("step partition of %s not dropped now: %s", month, exc)
    return dropped


def retention_sweep(now: datetime | None = None) -> RetentionResult:
    now = now or timezone.now()
    steps = step_months_drop(now)
    events = 0
    for project in Project.objects.filter(retention_days__isnull=False).order_by("pk"):
        result = project_retention(project, now)
        steps += result.steps_deleted
        events += result.budget_events_deleted
    keys = idempotency_prune(now)
    budget_hours_prune(now)
    sessions_tally_check()
    if steps or events or keys:
        log.info(
            "retention deleted %s steps, %s budget events and %s idempotency keys",
            steps,
            events,
            keys,
        )
    return RetentionResult(steps, events, keys)
