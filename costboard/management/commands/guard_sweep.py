from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from costboard.budgets.retention import retention_sweep
from costboard.budgets.sweep import runaway_sweep
from costboard.hooks import hourly_run

RETENTION_EVERY_S = 3600


class Command(BaseCommand):
    help = (
        "Run the runaway sweep (burn rate, projected overrun, long sessions), then retention "
        "and the memory lifecycle (TTL expiry; eviction, merge and compression proposals), "
        "once, or with --every N seconds in a loop (the last two hourly): Celery beat's "
        "periodic jobs for a deployment without a broker (make run starts it)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=int, default=0, help="Repeat every N seconds (0: run once)."
        )

    def handle(self, *args: Any, every: int, **options: Any) -> None:
        last_retention: float | None = None  # monotonic time of the last run (None: never)
        while True:
            result = runaway_sweep()
            flagged = ", ".join(f"{n} by {rule}" for rule, n in result.flagged.items())
            line = f"checked {result.sessions_checked} active sessions; flagged {flagged or 0}"
            if last_retention is None or time.monotonic() - last_retention >= RETENTION_EVERY_S:
                kept = retention_sweep()
                last_retention = time.monotonic()
                line += (
                    f"; retention deleted {kept.steps_deleted} steps and "
                    f"{kept.budget_events_deleted} budget events"
                )
                for done in hourly_run():
                    line += f"; {done}"
            self.stdout.write(line)
            if not every:
                return
            close_old_connections()
            time.sleep(every)
