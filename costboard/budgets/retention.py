"""Retention: a project with `retention_days` keeps its steps that long. Older steps are
deleted; the rollups (sessions, turns, daily and latency rollups, model mixes) stay, so every
total and chart is unchanged. Ended sessions past retention also lose their budget state:
their budget events and alert deliveries (the session row and its totals stay).
Idempotency-Key answers (costboard/api/idempotency.py) are deleted 48 hours after they were
stored: the contract keeps them at least 24.

Run hourly by Celery beat (and by `manage.py guard_sweep`); deletes go in chunks, each its
own short transaction, and running it twice deletes nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Model, QuerySet
from django.utils import timezone

from costboard.models import BudgetEvent, IdempotentRequest, Project, Step

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
    events = _delete_in_chunks(
        BudgetEvent.objects.filter(project=project, session__ended_at__lt=cutoff).order_by(),
        BudgetEvent,
    )
    return RetentionResult(steps, events)


def idempotency_prune(now: datetime) -> int:
    """Delete the Idempotency-Key answers older than IDEMPOTENCY_KEEP, every project's."""
    cutoff = now - IDEMPOTENCY_KEEP
    return _delete_in_chunks(
        IdempotentRequest.objects.filter(created_at__lt=cutoff).order_by(), IdempotentRequest
    )


def retention_sweep(now: datetime | None = None) -> RetentionResult:
    now = now or timezone.now()
    steps = events = 0
    for project in Project.objects.filter(retention_days__isnull=False).order_by("pk"):
        result = project_retention(project, now)
        steps += result.steps_deleted
        events += result.budget_events_deleted
    keys = idempotency_prune(now)
    if steps or events or keys:
        log.info(
            "retention deleted %s steps, %s budget events and %s idempotency keys",
            steps,
            events,
            keys,
        )
    return RetentionResult(steps, events, keys)
