"""Celery tasks: take ids or plain values, fetch rows again, call a service."""

from __future__ import annotations

import logging

from celery import shared_task  # no type hints: each task ignores [untyped-decorator]
from django.utils import timezone

from costboard import outbox, partitions, retention
from costboard.billing import services as billing_services
from costboard.budgets import alerts, anomalies, period_ledgers  # noqa: F401  (alerts: handlers)
from costboard.budgets import services as budget_services  # noqa: F401  (outbox handler)
from costboard.budgets import sweep as guard
from costboard.pricing import services as pricing_services  # noqa: F401  (outbox handler)
from costboard.reports import services as report_services

log = logging.getLogger(__name__)


def _outbox_run(queue: str) -> dict[str, int]:
    result = outbox.outbox_dispatch(seconds=50, queue=queue)
    if result.claimed:
        log.info("%s (queue %s)", result, queue)
    return {"done": result.done, "retried": result.retried, "failed": result.failed}


# One task per queue (settings.CELERY_TASK_ROUTES), each run by beat every second and taking
# only its queue's kinds: a worker of one queue never waits on another's work. The time limits
# let a long repricing finish (its lease is longer).
@shared_task(soft_time_limit=3500, time_limit=3550, acks_late=True)  # type: ignore[untyped-decorator]
def outbox_dispatch() -> dict[str, int]:
    """Carry out the outbox's due items that no other queue takes (budget rechecks, and any
    kind without a queue of its own) until none is due. Safe in any number of workers at
    once: each item is claimed by one."""
    return _outbox_run(outbox.DEFAULT_QUEUE)


@shared_task(soft_time_limit=3500, time_limit=3550, acks_late=True)  # type: ignore[untyped-decorator]
def outbox_alerts() -> dict[str, int]:
    """The `alerts` queue: alerts made from budget events and billing drifts, and their
    deliveries (webhook, email, Slack, PagerDuty)."""
    return _outbox_run(outbox.ALERTS_QUEUE)


@shared_task(soft_time_limit=3500, time_limit=3550, acks_late=True)  # type: ignore[untyped-decorator]
def outbox_memory() -> dict[str, int]:
    """The `memory` queue: memory detection in newly ingested turns."""
    return _outbox_run(outbox.MEMORY_QUEUE)


@shared_task(soft_time_limit=3500, time_limit=3550, acks_late=True)  # type: ignore[untyped-decorator]
def outbox_repricing() -> dict[str, int]:
    """The `repricing` queue: steps repriced after a price or an adjustment changed."""
    return _outbox_run(outbox.REPRICING_QUEUE)


@shared_task(soft_time_limit=50, time_limit=55, acks_late=True)  # type: ignore[untyped-decorator]
def runaway_sweep() -> dict[str, int]:
    """Every minute: the window rules (burn rate, projected overrun, long sessions). Safe
    to run twice: a session is flagged with a conditional UPDATE."""
    return guard.runaway_sweep().flagged


@shared_task(soft_time_limit=600, time_limit=660, acks_late=True)  # type: ignore[untyped-decorator]
def period_forecast_sweep() -> int:
    """Every 15 minutes: a forecast alert, once per period, for each period budget projected
    at its recent daily rate to pass its USD limit."""
    return period_ledgers.period_forecast_sweep(now=timezone.now())


@shared_task(soft_time_limit=240, time_limit=270, acks_late=True)  # type: ignore[untyped-decorator]
def anomaly_sweep() -> int:
    """Every 5 minutes: an anomaly alert, once per project or tag value and day, for a day's
    spend far above its trailing 14 days (docs/budgets.md, "Spend anomalies")."""
    return anomalies.anomaly_sweep(now=timezone.now())


@shared_task(soft_time_limit=3000, time_limit=3300, acks_late=True)  # type: ignore[untyped-decorator]
def retention_sweep() -> int:
    """Every hour: delete steps past their project's retention."""
    return retention.retention_sweep().steps_deleted


@shared_task(soft_time_limit=300, time_limit=330, acks_late=True)  # type: ignore[untyped-decorator]
def step_partitions_ahead() -> list[str]:
    """Every hour: this month's and the next two months' step partitions made (PostgreSQL),
    so ingest makes one itself only for a late or early step. Safe to run twice: the
    partition DDL is serialized by an advisory lock and makes only what is missing. Once a
    day it also analyzes the partitioned table, which autovacuum never does."""
    made = partitions.step_partitions_ahead(now=timezone.now())
    partitions.step_statistics_refresh()
    return made


# reject_on_worker_lost: a worker process killed mid-import (SIGKILL, the OOM killer) puts the
# task back on the queue rather than acknowledging it: run daily, a lost run would leave
# yesterday's bill as the day before's import saw it, never to be read again.
@shared_task(soft_time_limit=1800, time_limit=1900, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator]
def billing_import() -> list[str]:
    """Every day, on the `billing` queue: yesterday's and today's bills of each provider with
    an admin key (docs/billing.md). Safe to run twice: each day's rows are replaced whole."""
    lines = billing_services.scheduled_import()
    for line in lines:
        log.info("%s", line)
    return lines


@shared_task(soft_time_limit=300, time_limit=330, acks_late=True)  # type: ignore[untyped-decorator]
def spend_reports() -> list[str]:
    """Every hour: each project with report recipients is sent its last complete week and
    month within a day of its end in the project's budget timezone (docs/reports.md). Safe to
    run twice: a report goes to each recipient once."""
    lines = [str(queued) for queued in report_services.spend_reports_due(now=timezone.now())]
    for line in lines:
        log.info("spend report %s", line)
    return lines
