from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
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
# After a turn that failed (the database restarting, say), the next one waits 1 s, then twice
# as long after each failure in a row, up to this: the loop outlives the outage.
RETRY_AT_MOST_S = 30.0

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Last:
    """The monotonic times the periodic jobs last ran (None: never)."""

    sweep: float | None = None
    retention: float | None = None
    billing: float | None = None


def _seconds(value: str) -> int:
    """--every's N: a whole number of seconds in digits 0-9 (a negative one swept every
    second, and int() reads other digits too)."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a number of seconds: write 0 (once) or N > 0, e.g. --every 60"
        )
    return int(text)


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
            type=_seconds,
            default=0,
            help="Repeat the runaway sweep every N seconds (0: run everything once).",
        )

    def handle(self, *args: Any, every: int, **options: Any) -> None:
        last = _Last()
        failures = 0  # turns in a row with a job that failed
        while True:
            ran = self._turn(last, every)
            if not every:
                return
            failures = 0 if ran else failures + 1
            close_old_connections()  # a broken connection is dropped; the next turn connects
            time.sleep(min(OUTBOX_EVERY_S * 2 ** max(failures - 1, 0), RETRY_AT_MOST_S))

    def _turn(self, last: _Last, every: int) -> bool:
        """One turn of the loop: each periodic job that is due, then the outbox. False if one
        failed: it stays due for the next turn, and the others still run."""
        ran = True
        now = time.monotonic()
        if last.sweep is None or now - last.sweep >= every:
            hourly = last.retention is None or now - last.retention >= RETENTION_EVERY_S
            if self._run("the sweep", lambda: self._sweep(hourly=hourly), every):
                last.sweep = now
                if hourly:
                    last.retention = now
            else:
                ran = False
        if last.billing is None or now - last.billing >= BILLING_EVERY_S:
            if self._run("the billing import", self._billing, every):
                last.billing = now
            else:
                ran = False
        return self._run("the outbox", lambda: self._outbox(every), every) and ran

    def _run(self, what: str, job: Callable[[], str], every: int) -> bool:
        """Run a job and write what it did. Once (no --every), its failure ends the command;
        in the loop it is logged and the loop goes on: a database restart, a broken row, must
        not stop the periodic jobs for good."""
        if not every:
            self._write(job())
            return True
        try:
            self._write(job())
        except Exception as exc:
            log.exception("guard_sweep: %s failed (%s); it runs again on the next turn", what, exc)
            close_old_connections()
            return False
        return True

    def _write(self, text: str) -> None:
        if text:
            self.stdout.write(text)

    def _billing(self) -> str:
        return "\n".join(f"billing: {line}" for line in scheduled_import())

    def _outbox(self, every: int) -> str:
        dispatched = outbox_dispatch(seconds=OUTBOX_SECONDS)
        return str(dispatched) if dispatched.claimed or not every else ""

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
