from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.ingest_bench import (
    COPY_TABLES,
    BenchOptions,
    bench_run,
    report_lines,
    require_postgres,
)
from devtools.replica_lag import NotAReplica, replica_connect


class Command(BaseCommand):
    help = (
        "Benchmark ingest: concurrent clients post batches of step events to a real gunicorn "
        "on PostgreSQL; checks the stored totals and compares with a raw COPY of the same rows."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--events", type=int, default=200_000, help="events timed")
        parser.add_argument("--batch", type=int, default=500, help="events per request")
        parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
        parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
        parser.add_argument("--threads", type=int, default=1, help="threads per gunicorn worker")
        parser.add_argument(
            "--warmup", type=int, default=2, help="untimed batches per client first"
        )
        parser.add_argument(
            "--copy-table",
            choices=sorted(COPY_TABLES),
            default="logged",
            help="the bare table of the COPY baseline: logged (WAL, like the step table; the "
            "default), unlogged or temp (neither writes WAL: a faster baseline)",
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the bench project instead of deleting it"
        )
        parser.add_argument(
            "--budgets",
            type=int,
            default=0,
            help="period budgets over the bench project, decided by every batch (never "
            "reached): a project's month and day and the bench key's month, in turn",
        )

        parser.add_argument(
            "--spread",
            type=int,
            default=None,
            help="sessions per batch (1 to --batch): 500 is a gateway batching across its "
            "users, one step per session; default: 20 steps a session (25 per batch of 500)",
        )

        parser.add_argument(
            "--single",
            type=int,
            default=200,
            help="first, on the server just started, this many one-step posts one after "
            "another (an agent reporting each call), then as many budget reads: their "
            "latency percentiles (0: skip)",
        )

        parser.add_argument(
            "--users",
            type=int,
            default=0,
            help="give the sessions end users, this many (a session event naming the user "
            "in each session's first batch); 0: none",
        )
        parser.add_argument(
            "--rolling-user-budget",
            action="store_true",
            help='a rolling 24-hour stop-budget per end user ("*"), never reached, decided '
            "by every batch (needs --users; compare with the same --users without it)",
        )

        parser.add_argument(
            "--replica",
            default="",
            metavar="URL",
            help="a streaming replica of DATABASE_URL's server (postgres://…): its lag, as the "
            "pages measure it, sampled every 0.1 s while the batches are posted",
        )
        parser.add_argument(
            "--minimal",
            action="store_true",
            help="send the batches with Prefer: return=minimal (the answer names only the "
            "sessions that are not ok), as a gateway batching across its users would",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            require_postgres()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        bench = BenchOptions(
            events=options["events"],
            batch=options["batch"],
            clients=options["clients"],
            workers=options["workers"],
            threads=options["threads"],
            warmup=options["warmup"],
            keep=options["keep"],
            copy_table=options["copy_table"],
            budgets=options["budgets"],
            spread=options["spread"],
            single=options["single"],
            minimal=options["minimal"],
            users=options["users"],
            rolling_user_budget=options["rolling_user_budget"],
            replica=options["replica"],
        )
        self._check(bench)
        if bench.replica:
            try:
                replica_connect(bench.replica).close()
            except NotAReplica as exc:
                raise CommandError(str(exc)) from None
        try:
            result = bench_run(bench, say=lambda line: self.stderr.write(line))
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        for line in report_lines(result):
            self.stdout.write(line)
        if not result.ok:
            raise CommandError("the benchmark failed: see FAILED / MISMATCH above")

    @staticmethod
    def _check(bench: BenchOptions) -> None:
        if not 1 <= bench.batch <= 1000:
            raise CommandError("--batch must be 1 to 1000 (the API's limit per request)")
        for name in ("events", "clients", "workers", "threads"):
            if getattr(bench, name) < 1:
                raise CommandError(f"--{name} must be at least 1")
        if bench.budgets < 0:
            raise CommandError("--budgets must be 0 or more")
        if bench.single < 0:
            raise CommandError("--single must be 0 or more")
        if bench.warmup < 0:
            raise CommandError("--warmup must be 0 or more")
        if bench.users < 0:
            raise CommandError("--users must be 0 or more")
        if bench.rolling_user_budget and not bench.users:
            raise CommandError("--rolling-user-budget needs --users N: sessions with end users")
        if bench.spread is not None and not 1 <= bench.spread <= bench.batch:
            raise CommandError("--spread must be 1 to --batch (sessions in a batch)")
