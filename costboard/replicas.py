"""Reads from read replicas (docs/operations.md, "Read replicas").

Every read goes to the primary unless its view asks otherwise. The pages, the spend and
reconciliation APIs and the exports are wrapped in `replica_reads`: for a GET it picks a replica
within COSTBOARD_REPLICA_MAX_LAG_S of the primary (its lag measured on the replica and kept a
few seconds per process) and lets the router send that view's reads there. Never to a replica
inside a transaction the view opened, after the view wrote, on a browser's requests for a few
seconds after it wrote (a cookie, set by `ReadYourWritesMiddleware`), or to a replica that does
not answer: those read the primary, and the page says so (`read_source`).

A replica that stops answering (its machine frozen, or cut off) keeps this process's
connection open and sends nothing: each statement's answer is waited for a bounded time
(`ReplicaConnection`), the page is read again from the primary, and no page tries that replica
again for COSTBOARD_REPLICA_RETRY_S.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from functools import wraps
from typing import Any, TypeVar, cast

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.models import Model
from django.dispatch import receiver
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase

PRIMARY = DEFAULT_DB_ALIAS
# Set on a browser's response to a write (POST, PUT, PATCH, DELETE); while the browser sends it
# back, its pages read the primary, so a page right after an action shows the action's result.
WROTE_COOKIE = "costboard_wrote"
# How long one lag reading of a replica is used before it is measured again, per process.
LAG_CHECK_SECONDS = 2.0
# A replica with WAL received but no transaction replayed yet: behind by an unknown amount.
LAG_UNKNOWN = Decimal("Infinity")
_READ_METHODS = {"GET", "HEAD"}
_WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def replica_aliases() -> list[str]:
    """The replicas' database aliases (settings: DATABASE_REPLICA_URLS), in order."""
    return [alias for alias in connections if alias.startswith("replica_")]


class ReplicaConnection(psycopg.Connection[Any]):
    """A replica's connection, whose every wait for the server (a statement's answer, a
    cursor's next rows, Django's health check) ends after COSTBOARD_REPLICA_TIMEOUT_S and a
    second: a live server has cancelled the statement by then (its statement_timeout), so
    only one that does not answer at all gets here. Without it a stopped server holds the
    request, and its worker, until the operating system gives up on the connection (minutes:
    a frozen machine's kernel may even go on acknowledging)."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        bound = float(settings.COSTBOARD_REPLICA_TIMEOUT_S) + 1
        try:
            return super().wait(gen, interval, timeout=bound if timeout is None else timeout)
        except psycopg.errors._WaitTimeout:
            # half-way through the protocol: the connection is of no further use
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"the replica did not answer within {bound:g} s (COSTBOARD_REPLICA_TIMEOUT_S "
                "and a second); it is not read for COSTBOARD_REPLICA_RETRY_S"
            ) from None


@receiver(connection_created)
def _replica_connection_bounded(connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.alias.startswith("replica_") and isinstance(
        connection.connection, psycopg.Connection
    ):
        connection.connection.__class__ = ReplicaConnection


# Caught up when it has replayed all the WAL it received: an idle primary sends no
# transactions, so the last one replayed can be old with nothing behind it.
LAG_SQL = """
SELECT pg_is_in_recovery(),
       pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn(),
       EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())
"""


def lag_measured(alias: str) -> Decimal | None:
    """Seconds the replica `alias` is behind its primary: 0 when it has replayed all it has
    received (or is not a standby at all), LAG_UNKNOWN when behind with no transaction replayed
    yet; None when it does not answer."""
    # On a connection made for the measurement, not the process's open one: a replica whose
    # machine stopped answering (frozen, or cut off) sends no reset, and a query on the open
    # connection would wait for ever, where connecting gives up after its connect_timeout.
    connection = connections.create_connection(alias)
    try:
        with connection.cursor() as cursor:
            cursor.execute(LAG_SQL)
            row = cursor.fetchone()
    except DatabaseError:
        return None
    finally:
        connection.close()
    return lag_of(row)


def lag_of(row: tuple[bool, bool, Any]) -> Decimal:
    """The lag in seconds that a row of LAG_SQL says (see lag_measured)."""
    in_recovery, caught_up, behind = row
    if not in_recovery or caught_up:
        return Decimal(0)
    if behind is None:
        return LAG_UNKNOWN
    return max(Decimal(str(behind)), Decimal(0))


def _retry_seconds() -> float:
    return float(settings.COSTBOARD_REPLICA_RETRY_S)


class LagGauge:
    """Each replica's lag, measured at most once per `keep_seconds` of `clock` per process; a
    replica that did not answer is not asked again for `retry_seconds()`, counted from its
    answer (or from its failure in a page)."""

    def __init__(
        self,
        *,
        measure: Callable[[str], Decimal | None] = lag_measured,
        clock: Callable[[], float] = time.monotonic,
        keep_seconds: float = LAG_CHECK_SECONDS,
        retry_seconds: Callable[[], float] = _retry_seconds,
    ) -> None:
        self.measure = measure
        self.clock = clock
        self.keep_seconds = keep_seconds
        self.retry_seconds = retry_seconds
        self._readings: dict[str, tuple[float, Decimal | None]] = {}
        self._measuring: set[str] = set()
        self._lock = threading.Lock()

    def lag(self, alias: str) -> Decimal | None:
        now = self.clock()
        with self._lock:
            reading = self._readings.get(alias)
            if reading is not None:
                kept = self.keep_seconds if reading[1] is not None else self.retry_seconds()
                if now - reading[0] < kept:
                    return reading[1]
            if alias in self._measuring:
                # another thread of this process is measuring it: the primary meanwhile, so a
                # replica that does not answer costs one request its timeout, not each thread's
                return None
            self._measuring.add(alias)
        try:
            lag = self.measure(alias)
        finally:
            with self._lock:
                self._measuring.discard(alias)
        with self._lock:
            # kept from when the reading came: a replica that took its connect timeout (longer
            # than the keep time) to fail is not asked again by the very next page
            self._readings[alias] = (self.clock(), lag)
        return lag

    def unreachable(self, alias: str) -> None:
        """`alias` failed in the middle of a request: not read for `retry_seconds()`."""
        with self._lock:
            self._readings[alias] = (self.clock(), None)

    def forget(self) -> None:
        with self._lock:
            self._readings.clear()


GAUGE = LagGauge()


@dataclass(frozen=True)
class ReadSource:
    """Where a view's reads go: a replica (and its lag), or the primary and why."""

    alias: str
    lag: Decimal | None = None
    why: str = ""  # the primary's: "wrote", "lagging" or "unreachable"

    @property
    def replica(self) -> bool:
        return self.alias != PRIMARY


_turns = itertools.count()


def source_chosen(
    *, aliases: list[str], wrote: bool, gauge: LagGauge, max_lag: Decimal
) -> ReadSource:
    """One of the replicas `aliases` within `max_lag` seconds (in turn, when several are), else
    the primary; the primary without asking any after this browser wrote."""
    if wrote:
        return ReadSource(PRIMARY, why="wrote")
    fresh: list[tuple[str, Decimal]] = []
    why = "unreachable"
    for alias in aliases:
        lag = gauge.lag(alias)
        if lag is None:
            continue
        if lag > max_lag:
            why = "lagging"
            continue
        fresh.append((alias, lag))
    if not fresh:
        return ReadSource(PRIMARY, why=why)
    alias, lag = fresh[next(_turns) % len(fresh)]
    return ReadSource(alias, lag=lag)


@dataclass
class _Reads:
    source: ReadSource
    depth: int  # the primary's atomic blocks open when the view began
    wrote: bool = False


_reads: ContextVar[_Reads | None] = ContextVar("costboard_replica_reads", default=None)


def read_source() -> ReadSource | None:
    """Where the running view reads (None: a view that reads the primary, as all do unless
    they ask)."""
    reads = _reads.get()
    if reads is None:
        return None
    if reads.wrote and reads.source.replica:
        return ReadSource(PRIMARY, why="wrote")
    return reads.source


class ReplicaRouter:
    """Reads to the replica `replica_reads` chose, while it may; all else to the primary."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        reads = _reads.get()
        if reads is None or not reads.source.replica or reads.wrote:
            return PRIMARY
        if len(connections[PRIMARY].atomic_blocks) > reads.depth:
            return PRIMARY  # a transaction of the view's own sees its own writes
        return reads.source.alias

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        reads = _reads.get()
        if reads is not None:
            reads.wrote = True  # the view's later reads must see it
        return PRIMARY  # a row read from a replica is saved to the primary too

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        return True  # a replica holds the primary's rows

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db.startswith("replica_") else None


def _reading(reads: _Reads, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A streamed response's chunks, each made with the view's reads routed as in the view
    (the server pulls them after the view has returned)."""
    iterator = iter(chunks)
    while True:
        token = _reads.set(reads)
        try:
            chunk = next(iterator, None)
        finally:
            _reads.reset(token)
        if chunk is None:
            return
        yield chunk


V = TypeVar("V", bound=Callable[..., HttpResponseBase])


def _answer(
    source: ReadSource,
    view: Callable[..., HttpResponseBase],
    request: HttpRequest,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> HttpResponseBase:
    reads = _Reads(source=source, depth=len(connections[PRIMARY].atomic_blocks))
    token = _reads.set(reads)
    try:
        response = view(request, *args, **kwargs)
    finally:
        _reads.reset(token)
    if isinstance(response, StreamingHttpResponse) and source.replica:
        response.streaming_content = _reading(reads, response.streaming_content)  # type: ignore[arg-type]
    return response


def replica_reads(view: V) -> V:
    """Let `view`'s reads go to a replica within the lag limit (GET and HEAD; the primary
    otherwise). A replica that fails during the view: the view runs again on the primary."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        aliases = replica_aliases()
        if request.method not in _READ_METHODS or not aliases:
            return view(request, *args, **kwargs)
        source = source_chosen(
            aliases=aliases,
            wrote=WROTE_COOKIE in request.COOKIES,
            gauge=GAUGE,
            max_lag=settings.COSTBOARD_REPLICA_MAX_LAG_S,
        )
        try:
            return _answer(source, view, request, args, kwargs)
        except DatabaseError:
            if not source.replica:
                raise
            GAUGE.unreachable(source.alias)
            connections[source.alias].close()
            return _answer(ReadSource(PRIMARY, why="unreachable"), view, request, args, kwargs)

    wrapper.reads_replica = True  # type: ignore[attr-defined]  # tests/costboard/test_replicas.py lists them
    return cast(V, wrapper)


class ReadYourWritesMiddleware:
    """A browser's write (not an API key's: it sends no cookies) sets WROTE_COOKIE for as long
    as a replica that is read may be behind, COSTBOARD_REPLICA_MAX_LAG_S."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if (
            request.method in _WRITE_METHODS
            and "HTTP_AUTHORIZATION" not in request.META
            and replica_aliases()
        ):
            response.set_cookie(
                WROTE_COOKIE,
                "1",
                max_age=max(1, math.ceil(settings.COSTBOARD_REPLICA_MAX_LAG_S)),
                secure=request.is_secure(),
                httponly=True,
                samesite="Lax",
            )
        return response
