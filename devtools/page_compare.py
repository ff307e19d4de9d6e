"""`bench_pages --against URL`: every page timed on two databases in turn, for a growth
figure on a machine whose speed wanders.

Two runs of `bench_pages`, one per database, minutes apart, compare the machine at two
moments as much as the two databases: on a shared two-core machine the same page moved by
30-60 % between runs. Here each database has a process of its own (its own settings and
connections), and the pages are timed in rounds, a few requests on one, then on the other,
the order swapped each round: whatever the machine does, both see it.

This module imports nothing of Django's at its top: a worker process sets its database first.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any


@dataclass(frozen=True)
class Sample:
    status: int
    size: int
    queries: int
    times_ms: list[float]


def _serve(database_url: str, conn: Connection) -> None:
    """A worker: the pages of the database at `database_url`, timed on request."""
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, override_settings

    from devtools.page_bench import PLAIN_STATIC, _get, bench_client, page_cases

    with override_settings(STORAGES={**settings.STORAGES, "staticfiles": PLAIN_STATIC}):
        client = bench_client()
        cases = {case.name: case for case in page_cases()}
        conn.send([(case.name, case.path) for case in cases.values()])
        counted: dict[str, int] = {}
        while (ask := conn.recv()) is not None:
            name, runs, warmup = ask
            case = cases[name]
            for _ in range(warmup):
                _get(client, case)
            if name not in counted:
                with CaptureQueriesContext(connection) as captured:
                    _get(client, case)
                counted[name] = len(captured.captured_queries)
            times = []
            status = size = 0
            for _ in range(runs):
                start = time.perf_counter()
                status, size = _get(client, case)
                times.append((time.perf_counter() - start) * 1000)
            conn.send(Sample(status, size, counted[name], times))
    connection.close()


def _p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=100, method="inclusive")[94]


@dataclass(frozen=True)
class Compared:
    name: str
    here: Sample
    there: Sample

    @property
    def ratio_p50(self) -> float:
        return statistics.median(self.there.times_ms) / statistics.median(self.here.times_ms)

    @property
    def ratio_p95(self) -> float:
        return _p95(self.there.times_ms) / _p95(self.here.times_ms)

    def line(self, width: int) -> str:
        here, there = self.here.times_ms, self.there.times_ms
        flag = "" if self.here.status == self.there.status == 200 else "  not 200"
        return (
            f"{self.name:<{width}}  {statistics.median(here):7.1f} {_p95(here):7.1f}  "
            f"{statistics.median(there):7.1f} {_p95(there):7.1f}  "
            f"{self.ratio_p50:5.2f} {self.ratio_p95:5.2f}  "
            f"{self.here.queries:3d} {self.there.queries:3d}{flag}"
        )


def pages_compare(
    *, here: str, there: str, runs: int, warmup: int, rounds: int, say: Any = lambda line: None
) -> list[Compared]:
    """Each page on both databases (`here`, `there`: DATABASE_URLs), `runs` requests each,
    in `rounds` alternating rounds. Pages are paired by name (each side picks its own paths:
    its last page, its largest session)."""
    context = multiprocessing.get_context("spawn")
    pipes, workers = [], []
    for url in (here, there):
        parent, child = context.Pipe()
        worker = context.Process(target=_serve, args=(url, child), daemon=True)
        worker.start()
        pipes.append(parent)
        workers.append(worker)
    try:
        names = [[name for name, _ in pipe.recv()] for pipe in pipes]
        per_round = [runs // rounds + (1 if r < runs % rounds else 0) for r in range(rounds)]
        compared = []
        for name in [n for n in names[0] if n in names[1]]:
            say(f"  {name} …")
            samples: list[list[Sample]] = [[], []]
            for r, count in enumerate(per_round):
                if not count:
                    continue
                for side in (0, 1) if r % 2 == 0 else (1, 0):
                    pipes[side].send((name, count, warmup if r < 2 else 0))
                    samples[side].append(pipes[side].recv())
            here_s, there_s = (
                Sample(
                    s[-1].status,
                    s[-1].size,
                    s[-1].queries,
                    [t for sample in s for t in sample.times_ms],
                )
                for s in samples
            )
            compared.append(Compared(name, here_s, there_s))
        return compared
    finally:
        for pipe in pipes:
            pipe.send(None)
        for worker in workers:
            worker.join(timeout=30)


def compare_lines(compared: list[Compared], *, limit: float = 1.2) -> list[str]:
    width = max(len(c.name) for c in compared)
    lines = [
        f"{'page':<{width}}  {'here p50':>7} {'p95':>7}  {'there p50':>7} {'p95':>7}  "
        f"{'÷ p50':>5} {'p95':>5}  queries"
    ]
    lines += [c.line(width) for c in compared]
    over = [c.name for c in compared if c.ratio_p95 > limit]
    lines.append(
        f"{len(compared) - len(over)} of {len(compared)} pages within {limit:.2f}× at p95"
        + (f"; over: {', '.join(over)}" if over else "")
    )
    return lines
