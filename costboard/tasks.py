"""Celery tasks: take ids or plain values, fetch rows again, call a service."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from celery import shared_task
from django.utils import timezone

from costboard.budgets import retention
from costboard.budgets import sweep as guard
from costboard.budgets.alerts import alert_deliver, alerts_dispatch  # noqa: F401  (registered with the worker)
from costboard.budgets.caps import caps_for, session_recheck
from costboard.models import SYSTEM_SESSION_ID, Project, Session
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
    """After a project's caps change: recompute the state of each session using them."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return 0
    old_project = Project(
        token_cap=old.get("token_cap"), system_token_cap=old.get("system_token_cap")
    )
    for name in ("cost_cap_usd", "system_cost_cap_usd", "warn_at_pct"):
        if old.get(name) is not None:
            setattr(old_project, name, Decimal(old[name]))
    now = timezone.now()
    changed = 0
    sessions = Session.objects.filter(project=project).values_list(
        "pk", "external_id", "token_cap", "cost_cap_usd"
    )
    for session_id, external_id, token_cap, cost_cap in sessions.iterator(chunk_size=2000):
        caps = {"token_cap": token_cap, "cost_cap_usd": cost_cap}
        system = external_id == SYSTEM_SESSION_ID
        old_caps = caps_for(project=old_project, system=system, **caps)
        new_caps = caps_for(project=project, system=system, **caps)
        if old_caps != new_caps:
            session_recheck(session_id, now=now, old_caps=old_caps)
            changed += 1
    return changed


@shared_task(soft_time_limit=50, time_limit=55, acks_late=True)
def runaway_sweep() -> dict[str, int]:
    """Every minute: the window rules (burn rate, projected overrun, long sessions). Safe
    to run twice: a session is flagged with a conditional UPDATE."""
    return guard.runaway_sweep().flagged


@shared_task(soft_time_limit=3000, time_limit=3300, acks_late=True)
def retention_sweep() -> int:
    """Every hour: delete steps past their project's retention."""
    return retention.retention_sweep().steps_deleted
