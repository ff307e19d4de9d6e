from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from costboard.billing.services import scheduled_import
from costboard.budgets.anomalies import anomaly_sweep
from costboard.budgets.period_ledgers import period_forecast_sweep
from costboard.budgets.sweep import runaway_sweep
from costboard.hooks import hourly_run
from costboard.outbox import outbox_dispatch
from costboard.partitions import step_partitions_ahead, step_statistics_refresh
from costboard.reports.services import spend_reports_due
from costboard.retention import retention_sweep

RETENTION_EVERY_S = 3600
BILLING_EVERY_S = 86400  # the providers' bills, yesterday's and today's (docs/billing.md)
OUTBOX_EVERY_S = 1.0
OUTBOX_SECONDS = 10.0  # one pass's budget, so a backlog never holds up the runaway sweep long


class Command(BaseCommand):
    help = (
        "Run the runaway sweep (burn rate, projected overrun, long sessions) and the spend "
        "anomalies, then the step "
        "partitions ahead (PostgreSQL), retention and the memory lifecycle (TTL expiry; "
        "eviction, merge and compression proposals), and carry out the outbox (alerts, "
        "memory detection, repricing), once, or with --every N seconds in a loop (the outbox "
        "every second; partitions, retention, the lifecycle and the spend reports (sent once "
        "each) hourly; the providers' bills daily, when an admin key is set): Celery beat's "
        "periodic jobs for a deployment without a broker (make run starts it)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every",
            type=int,
            default=0,
            help="Repeat the runaway sweep every N seconds (0: run everything once).",
        )

    def handle(self, *args: Any, every: int, **options: Any) -> None:
        last_sweep: float | None = None  # monotonic times of the last runs (None: never)
        last_retention: float | None = None
        last_billing: float | None = None
        while True:
            now = time.monotonic()
            if last_sweep is None or now - last_sweep >= every:
                hourly = last_retention is None or now - last_retention >= RETENTION_EVERY_S
                self.stdout.write(self._sweep(hourly=hourly))
                last_sweep = now
                if hourly:
                    last_retention = now
            if last_billing is None or now - last_billing >= BILLING_EVERY_S:
                for line in scheduled_import():
                    self.stdout.write(f"billing: {line}")
                last_billing = now
            dispatched = outbox_dispatch(seconds=OUTBOX_SECONDS)
            if dispatched.claimed or not every:
                self.stdout.write(str(dispatched))
            if not every:
                return
            close_old_connections()
            time.sleep(OUTBOX_EVERY_S)

    def _sweep(self, *, hourly: bool) -> str:
        result = runaway_sweep()
        flagged = ", ".join(f"{n} by {rule}" for rule, n in result.flagged.items())
        line = f"checked {result.sessions_checked} active sessions; flagged {flagged or 0}"
        forecasts = period_forecast_sweep(now=timezone.now())
        if forecasts:
            line += f"; {forecasts} budgets projected past their limit"
        anomalies = anomaly_sweep(now=timezone.now())
        if anomalies:
            line += f"; {anomalies} spend anomalies"
        if hourly:
            made = step_partitions_ahead(now=timezone.now())
            if made:
                line += f"; made step partitions {', '.join(made)}"
            if step_statistics_refresh():
                line += "; analyzed the step table"
            kept = retention_sweep()
            line += (
                f"; retention deleted {kept.steps_deleted} steps and "
                f"{kept.budget_events_deleted} budget events"
            )
            for done in hourly_run():
                line += f"; {done}"
            for queued in spend_reports_due(now=timezone.now()):
                line += f"; spend report {queued}"
        return line
