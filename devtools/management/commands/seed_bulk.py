from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.bulk_seed import seed_bulk


class Command(BaseCommand):
    help = (
        "Add --steps steps (sessions of ~100 steps in 20 turns, bench_ingest's shape) to one "
        "project with PostgreSQL COPY, then rebuild its totals and rollups set-based and "
        "ANALYZE: the 10M-step growth benchmark's data in minutes. Additive: each run adds "
        "new sessions."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--steps", type=int, required=True, help="steps to add (> 0)")
        parser.add_argument(
            "--project", default="bulk", help="slug of the project (made if missing)"
        )
        parser.add_argument(
            "--days", type=int, default=90, help="spread the steps over this many days back"
        )
        parser.add_argument(
            "--days-ago",
            type=int,
            default=0,
            help="the days end this many days back (default 0, now): older history",
        )
        parser.add_argument(
            "--run", default=None, help="prefix of the new sessions' ids (default: bulk<time>)"
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["steps"] < 1:
            raise CommandError(f"--steps must be at least 1, not {options['steps']}")
        try:
            result = seed_bulk(
                steps=options["steps"],
                slug=options["project"],
                days=options["days"],
                days_ago=options["days_ago"],
                run=options["run"],
                progress=not options["no_progress"],
                say=lambda line: self.stderr.write(line),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if result.api_key:
            self.stdout.write(f"made project {result.project.slug}; its API key: {result.api_key}")
        if result.over_caps:
            self.stderr.write(
                f"{result.over_caps} sessions reach their caps' warning but are left ok "
                "(the seeder replays no budget crossings)"
            )
        self.stdout.write(result.line())
