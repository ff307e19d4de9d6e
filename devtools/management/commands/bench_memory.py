from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.memory_bench import BenchOptions, bench_run, report_lines


class Command(BaseCommand):
    help = (
        "Benchmark memory: detection throughput (messages/s on one core), MEMORY.md of a "
        "scope of 10,000 approved memories (p50/p95) and ranked search over them (p95, "
        "PostgreSQL only). Uses a project of its own and deletes it afterwards."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--memories", type=int, default=10_000, help="approved memories in the scope"
        )
        parser.add_argument(
            "--messages", type=int, default=20_000, help="generated turns to detect in"
        )
        parser.add_argument("--runs", type=int, default=50, help="timed MEMORY.md renderings")
        parser.add_argument("--queries", type=int, default=200, help="timed searches")
        parser.add_argument("--seed", type=int, default=7, help="seed of the generated data")
        parser.add_argument(
            "--keep", action="store_true", help="keep the bench project instead of deleting it"
        )
        parser.add_argument(
            "--strict", action="store_true", help="fail if a figure misses its target"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("memories", "messages", "runs", "queries"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        bench = BenchOptions(
            memories=options["memories"],
            messages=options["messages"],
            runs=options["runs"],
            queries=options["queries"],
            seed=options["seed"],
            keep=options["keep"],
        )
        result = bench_run(bench, say=lambda line: self.stderr.write(line))
        for line in report_lines(result):
            self.stdout.write(line)
        if options["strict"] and result.missed:
            raise CommandError(f"missed the target: {', '.join(result.missed)}")
