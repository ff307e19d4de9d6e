from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.page_bench import TARGET_MS, data_size, pages_bench, report_lines
from devtools.page_compare import compare_lines, pages_compare


class Command(BaseCommand):
    help = (
        "Time every dashboard page and fragment on the data in the database (server time "
        "p50/p95/max, query count, size). Build a large data set first with "
        "`seed_demo --steps 1000000`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=20, help="timed requests per page")
        parser.add_argument("--warmup", type=int, default=2, help="untimed requests per page")
        parser.add_argument(
            "--target-ms", type=float, default=TARGET_MS, help="flag pages slower at p95"
        )
        parser.add_argument(
            "--strict", action="store_true", help="fail if any page misses the target"
        )
        parser.add_argument(
            "--against",
            metavar="DATABASE_URL",
            help="time every page here and in this database in turn (a process each, "
            "alternating rounds) and print both with their ratio: a growth figure that the "
            "machine's changing speed does not skew",
        )
        parser.add_argument(
            "--rounds", type=int, default=10, help="with --against: alternating rounds"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["runs"] < 1 or options["warmup"] < 0:
            raise CommandError("--runs must be at least 1 and --warmup 0 or more")
        size = data_size()
        if size.sessions == 0:
            raise CommandError(
                "the database has no sessions to show: run `python manage.py seed_demo "
                "--steps 1000000` first (about 60,000 sessions)"
            )
        self.stdout.write(size.line())
        if options["against"]:
            self._compare(options)
            return
        try:
            timings = pages_bench(
                runs=options["runs"],
                warmup=options["warmup"],
                say=lambda line: self.stderr.write(line),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for line in report_lines(timings, target_ms=options["target_ms"]):
            self.stdout.write(line)
        missed = [t for t in timings if t.p95 >= options["target_ms"] or t.status != 200]
        if options["strict"] and missed:
            raise CommandError(f"{len(missed)} pages missed the target")

    def _compare(self, options: dict[str, Any]) -> None:
        here = os.environ.get("DATABASE_URL", "")
        if not here:
            raise CommandError(
                "--against compares the database in DATABASE_URL with another: set "
                "DATABASE_URL to the first (postgres://…)"
            )
        if options["rounds"] < 1 or options["rounds"] > options["runs"]:
            raise CommandError("--rounds must be between 1 and --runs")
        compared = pages_compare(
            here=here,
            there=options["against"],
            runs=options["runs"],
            warmup=options["warmup"],
            rounds=options["rounds"],
            say=lambda line: self.stderr.write(line),
        )
        for line in compare_lines(compared):
            self.stdout.write(line)
