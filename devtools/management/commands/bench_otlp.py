from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costboard.ingest.otlp import MAX_SPANS
from devtools.ingest_bench import require_postgres
from devtools.otlp_bench import SHAPES, BenchOptions, bench_run, report_lines


class Command(BaseCommand):
    help = (
        "Benchmark OTLP: exports of 10,000 GenAI spans (one trace; one span per trace) posted "
        "one after another to a real gunicorn on PostgreSQL, each timed; stored steps and cost "
        "checked against what was sent."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--spans", type=int, default=MAX_SPANS, help="spans per export")
        parser.add_argument(
            "--shape",
            choices=[*SHAPES, "both"],
            default="both",
            help="trace: one trace (an agent run); traces: one span per trace (a gateway's "
            "batch); both (the default), alternated",
        )
        parser.add_argument("--runs", type=int, default=3, help="timed exports per shape")
        parser.add_argument(
            "--sessions", type=int, default=100, help="sessions the traces shape spreads over"
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the bench project instead of deleting it"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            require_postgres("bench_otlp")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not 1 <= options["spans"] <= MAX_SPANS:
            raise CommandError(f"--spans must be 1 to {MAX_SPANS} (the API's limit per export)")
        for name in ("runs", "sessions"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        bench = BenchOptions(
            spans=options["spans"],
            shapes=SHAPES if options["shape"] == "both" else (options["shape"],),
            runs=options["runs"],
            sessions=options["sessions"],
            keep=options["keep"],
        )
        result = bench_run(bench, say=lambda line: self.stderr.write(line))
        for line in report_lines(result):
            self.stdout.write(line)
        if not result.ok:
            raise CommandError("the benchmark failed: see FAILED / MISMATCH above")
