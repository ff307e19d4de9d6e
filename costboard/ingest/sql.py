"""What ingest's SQL shares beyond the dialect (costboard/sql_arrays.py: a batch's rows as one
typed array per column, `Dialect`): the usage columns every counted table shares, a JSON
column's text, the settings of an ingest transaction, and whether a failure is the database's
outage (retry) rather than a statement it refused (`database_outage`). Nothing here knows a
table."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import psycopg
from django.conf import settings
from django.db import DataError, InterfaceError, OperationalError, connection

from costboard.ingest.schemas import SumsOutOfRange
from costboard.sql_arrays import USD_PICO, Column

USAGE_COLUMNS = [
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "cost_input_usd",
    "cost_output_usd",
    "cost_cache_read_usd",
    "cost_cache_write_usd",
    "cost_usd",
]


USAGE_TYPES = ["bigint"] * 5 + [USD_PICO] * 5


USAGE: list[Column] = list(zip(USAGE_COLUMNS, USAGE_TYPES, strict=True))


def _json_default(value: Any) -> Any:
    # JSON fractions are parsed as Decimal (exact money); in metadata they stay numbers.
    return float(value) if isinstance(value, Decimal) else str(value)


def json_text(value: Any) -> str | None:
    return (
        None if value is None else json.dumps(value, default=_json_default, separators=(",", ":"))
    )


Statement = tuple[str, list[Any]]


def ingest_settings(cursor: Any) -> None:
    """Settings of an ingest transaction (SET LOCAL: they end with it), in one round trip
    (PostgreSQL; nothing on SQLite).

    Every row ingest reads or writes it finds by key, a few hundred at most, in pages a busy
    server holds in memory: each join is index probes for the batch's keys. Left to its
    estimates (stale where autovacuum lags, as it does on a growing table), the planner hash-
    or merge-joins a whole table instead: a sequential scan of every session, or every turn
    in key order, per batch, growing with the table (13 ms of a 500-session batch at 11k
    turns).

    A statement running past COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS (a lock another
    transaction holds too long, a plan gone wrong) is cancelled: the transaction rolls back,
    nothing of it stored, and the API answers 503 with Retry-After (costboard/api/failures.py:
    SQLSTATE 57014 is class 57)."""
    if connection.vendor != "postgresql":
        return
    cursor.execute(_INGEST_SETTINGS, [str(settings.COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS)])


@contextmanager
def sums_in_range(event_count: int) -> Iterator[None]:
    """Around an ingest transaction (outside it, so it has rolled back): PostgreSQL refusing
    a sum past its column (numeric(24, 12) USD, bigint tokens; SQLSTATE 22003) is the batch's
    fault, a 422 naming it (SumsOutOfRange), not the server's 500. SQLite keeps any sum."""
    try:
        yield
    except DataError as exc:
        if isinstance(exc.__cause__, psycopg.errors.NumericValueOutOfRange):
            raise SumsOutOfRange(event_count) from exc
        raise


_INGEST_SETTINGS = (
    "SELECT set_config('enable_hashjoin', 'off', true),"
    " set_config('enable_mergejoin', 'off', true),"
    " set_config('random_page_cost', '1.1', true),"
    " set_config('statement_timeout', %s, true)"
)


# SQLite's primary result codes for a file that cannot be used now (any other: the statement)
SQLITE_UNAVAILABLE = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
    }
)
# PostgreSQL's SQLSTATE classes for a server that cannot serve: connection exception,
# insufficient resources, operator intervention (shutdown, cancelled), system error
POSTGRES_UNAVAILABLE = ("08", "53", "57", "58")


def database_outage(exc: BaseException | None) -> bool:
    """Whether a failure means the database cannot serve now (retry) rather than that it
    refused this statement (a bug): Django's errors carry the driver's as their cause."""
    if isinstance(exc, InterfaceError):  # the connection is gone
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if isinstance(cause, sqlite3.Error):
        return cause.sqlite_errorcode & 0xFF in SQLITE_UNAVAILABLE
    if isinstance(cause, psycopg.Error):  # no SQLSTATE: no server answered
        return cause.sqlstate is None or cause.sqlstate[:2] in POSTGRES_UNAVAILABLE
    return True  # a driver that does not say: an outage, as before
