"""Celery tasks: take ids or plain values, fetch rows again, call a service."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.utils import timezone

from costboard.budgets import retention, services
from costboard.budgets import sweep as guard
from costboard.budgets.alerts import (  # noqa: F401  (registered with the worker)
    alert_deliver,
    alerts_dispatch,
)
from costboard.pricing.repricing import PriceMatch, models_affected, steps_reprice

log = logging.getLogger(__name__)


@shared_task(soft_time_limit=1800, time_limit=1900, acks_late=True)
def prices_reprice(matches: list[dict[str, str]]) -> int:
    """Reprice the steps a changed price row covers (its old and new model patterns)."""
    models = models_affected([PriceMatch.from_dict(m) for m in matches])
    result = steps_reprice(models=models)
    log.info(
        "repriced %s of %s steps of %s; cost changed by %s",
        result.steps_changed,
        result.steps_seen,
        models,
        result.cost_delta,
    )
    return result.steps_changed


@shared_task(soft_time_limit=1800, time_limit=1900, acks_late=True)
def project_budgets_recheck(project_id: int, old: dict[str, Any]) -> int:
    """After a project's caps changed from `old`: decide again each affected session's state
    (budgets.services.project_caps_set enqueues it by name)."""
    return services.project_budgets_recheck(project_id=project_id, old=old, at=timezone.now())


@shared_task(soft_time_limit=50, time_limit=55, acks_late=True)
def runaway_sweep() -> dict[str, int]:
    """Every minute: the window rules (burn rate, projected overrun, long sessions). Safe
    to run twice: a session is flagged with a conditional UPDATE."""
    return guard.runaway_sweep().flagged


@shared_task(soft_time_limit=3000, time_limit=3300, acks_late=True)
def retention_sweep() -> int:
    """Every hour: delete steps past their project's retention."""
    return retention.retention_sweep().steps_deleted
