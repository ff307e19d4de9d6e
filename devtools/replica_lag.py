"""A streaming replica's lag sampled while a benchmark runs (`bench_ingest --replica URL`):
what a page deciding between the replica and the primary would read (costboard/replicas.py's
LAG_SQL and lag_of), every `every` seconds on a thread of its own, on a connection of its own."""

from __future__ import annotations

import threading
from decimal import Decimal
from types import TracebackType
from typing import Any

import psycopg

from costboard.replicas import LAG_SQL, LAG_UNKNOWN, lag_of


class NotAReplica(ValueError):
    pass


def replica_connect(url: str) -> psycopg.Connection[Any]:
    """A connection to the standby at `url`; NotAReplica if it is not one (or does not answer)."""
    try:
        connection = psycopg.connect(url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        raise NotAReplica(f"--replica {url} does not answer: {exc}".strip()) from None
    row = connection.execute("SELECT pg_is_in_recovery()").fetchone()
    if not (row and row[0]):
        connection.close()
        raise NotAReplica(
            f"--replica {url} is not a standby (pg_is_in_recovery() is false): name a streaming "
            "replica of DATABASE_URL's server, as pg_basebackup -R makes one"
        )
    return connection


class LagSampler:
    """`with LagSampler(url):` samples the replica's lag from entering to leaving: once on
    entering, every `every` seconds meanwhile, and once on leaving (so at least two samples).
    Entering refuses a server that is not a standby or does not answer (NotAReplica). A
    replica that stops answering meanwhile ends the sampling, not the benchmark: `lost` says
    why, and the samples taken until then stand."""

    def __init__(self, url: str, *, every: float = 0.1) -> None:
        self.url = url
        self.every = every
        self.samples: list[Decimal] = []
        self.lost = ""  # why the replica stopped answering, if it did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connection: psycopg.Connection[Any] | None = None

    def _sample(self) -> None:
        if self._connection is None:
            raise RuntimeError("LagSampler samples only inside its with block")
        row = self._connection.execute(LAG_SQL).fetchone()
        if row is None:
            raise RuntimeError("the lag query answered no row")
        self.samples.append(lag_of(row))

    def _run(self) -> None:
        while not self.lost and not self._stop.wait(self.every):
            self._sample_or_lose()

    def _sample_or_lose(self) -> None:
        try:
            self._sample()
        except psycopg.Error as exc:
            self.lost = str(exc).strip() or type(exc).__name__

    def __enter__(self) -> LagSampler:
        self._connection = replica_connect(self.url)
        self._sample()
        self._thread = threading.Thread(target=self._run, name="replica-lag", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if not self.lost:
                self._sample_or_lose()
        finally:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def lag_line(samples: list[Decimal], every: float, *, lost: str = "") -> str:
    """The report line of a run's samples: p50, p95 and max in seconds, the samples taken
    while the replica had replayed nothing yet counted apart, and why the replica stopped
    answering (`lost`), if it did."""
    known = sorted(float(lag) for lag in samples if lag != LAG_UNKNOWN)
    unknown = len(samples) - len(known)
    stopped = f"; then it stopped answering: {lost}" if lost else ""
    if not known:
        return f"replica:    {len(samples)} samples, none with a transaction replayed yet{stopped}"

    def at(pct: float) -> float:
        return known[min(len(known) - 1, int(len(known) * pct / 100))]

    return (
        f"replica:    lag over {len(samples)} samples every {every:g} s: p50 {at(50):.3f} s, "
        f"p95 {at(95):.3f} s, max {known[-1]:.3f} s"
        + (f"; {unknown} with nothing replayed yet" if unknown else "")
        + stopped
    )
