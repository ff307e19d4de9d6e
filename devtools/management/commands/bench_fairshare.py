from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.fairshare_bench import (
    FairshareOptions,
    env_redis,
    fairshare_run,
    options_faults,
    report_lines,
)


class Command(BaseCommand):
    help = (
        "Benchmark fair share (issue 31): key A sends eight 10,000-span OTLP exports at once "
        "while key B posts one-event batches in a loop, to a real gunicorn on PostgreSQL; "
        "prints per key what was answered (200/429/other), B's latency and how long A's "
        "admitted exports took."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = FairshareOptions()
        parser.add_argument(
            "--exports", type=int, default=defaults.exports, help="key A's exports at once"
        )
        parser.add_argument(
            "--spans", type=int, default=defaults.spans, help="spans per export (at most 10,000)"
        )
        parser.add_argument(
            "--traces",
            type=int,
            default=defaults.traces,
            help="traces per export (each a turn of its own session)",
        )
        parser.add_argument(
            "--workers", type=int, default=defaults.workers, help="gunicorn workers"
        )
        parser.add_argument(
            "--threads", type=int, default=defaults.threads, help="threads per gunicorn worker"
        )
        parser.add_argument(
            "--max-in-flight",
            type=int,
            default=defaults.max_in_flight,
            help="key A's project's requests in flight (0: no limit, as before issue 31)",
        )
        parser.add_argument(
            "--redis",
            default=env_redis(),
            help="the Redis the server keeps the API's limits in (default: CELERY_BROKER_URL "
            "when it is Redis; '' for none: each process counts its own)",
        )
        parser.add_argument(
            "--retry",
            action="store_true",
            help="key A sends a refused export again after Retry-After, as OTLP exporters do",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=defaults.timeout,
            help="seconds a client waits for one answer",
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the bench projects instead of deleting them"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        bench = FairshareOptions(
            exports=options["exports"],
            spans=options["spans"],
            traces=options["traces"],
            workers=options["workers"],
            threads=options["threads"],
            max_in_flight=options["max_in_flight"],
            redis=options["redis"],
            retry=options["retry"],
            timeout=options["timeout"],
            keep=options["keep"],
        )
        faults = options_faults(bench)
        if faults:
            raise CommandError("; ".join(faults))
        try:
            result = fairshare_run(bench, say=lambda line: self.stderr.write(line))
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        for line in report_lines(result):
            self.stdout.write(line)
        if result.problems:
            raise CommandError("the benchmark failed: see MISMATCH above")
