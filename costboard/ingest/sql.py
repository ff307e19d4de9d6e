"""How ingest speaks SQL to either database: the few places PostgreSQL and SQLite spell it
differently (`Dialect`), a batch's rows as one typed array per column (server-side binding, the
same SQL text whatever the batch size), the usage columns every counted table shares, and the
settings of an ingest transaction, and whether a failure is the database's outage (retry)
rather than a statement it refused (`database_outage`). Every statement of ingest (writes/,
rollups.py) is built on it; nothing here knows a table."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from costboard.money import pico_usd

Column = tuple[str, str]  # a name and its PostgreSQL type


# A column of USD amounts sent as pico-dollar ints (str() of an int is the cheapest exact
# text there is) and scaled to dollars in SQL: numeric × 10⁻¹² is exact.
USD_PICO = "usd_pico"


_PICO_USD = "0.000000000001"


_ARRAY_TYPE = {USD_PICO: "numeric"}


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


class Dialect:
    """The few places PostgreSQL and SQLite spell SQL differently."""

    def __init__(self) -> None:
        self.postgres = connection.vendor == "postgresql"
        self.greatest = "GREATEST" if self.postgres else "MAX"
        self.least = "LEAST" if self.postgres else "MIN"
        self.ops = connection.ops

    def cursor(self) -> Any:
        """A cursor in the current transaction. On PostgreSQL it binds parameters server-side
        (Django's default cursor interpolates them into the SQL text client-side, which for
        arrays of hundreds of values costs more than the statement itself)."""
        if not self.postgres:
            return connection.cursor()
        connection.ensure_connection()
        raw: Any = psycopg.Cursor(connection.connection)  # Django wraps it as its own cursors
        if connection.queries_logged:
            return connection.make_debug_cursor(raw)
        return connection.make_cursor(raw)

    def rows(self, columns: list[Column], rows: list[list[Any]]) -> tuple[str, list[Any]]:
        """`WITH v (…) AS (…)` over these rows, and its parameters. On PostgreSQL one typed
        array per column, unnested: the SQL text is the same whatever the number of rows."""
        names = ", ".join(name for name, _ in columns)
        if self.postgres:
            # A column of NULLs (a batch's unset times, metadata, caps…) after the first goes
            # as an empty array: unnest pads the shorter arrays with NULLs to the longest (the
            # first column is a key: always full), so it costs neither dumping nor parsing.
            placeholders: list[str] = []
            params: list[Any] = []
            data = zip(columns, zip(*rows, strict=True), strict=True)
            for n, ((_, sql_type), column) in enumerate(data):
                if n and column.count(None) == len(column):
                    placeholder, param = f"%s::{_ARRAY_TYPE.get(sql_type, sql_type)}[]", "{}"
                else:
                    placeholder, param = _array_param(sql_type, column)
                placeholders.append(placeholder)
                params.append(param)
            arrays = ", ".join(placeholders)
            values = ", ".join(
                f"{name} * {_PICO_USD}" if sql_type == USD_PICO else name
                for name, sql_type in columns
            )
            return (
                f"WITH v ({names}) AS (SELECT {values} FROM unnest({arrays}) AS u ({names}))",
                params,
            )
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        params = [value for values in rows for value in values]
        return f"WITH v ({names}) AS (VALUES {', '.join([row] * len(rows))})", params

    def text_array(self, values: list[str]) -> tuple[str, Any]:
        """A text[] parameter on PostgreSQL, as its placeholder and its value."""
        return _array_param("text", values)

    def ids_reserve(self, cursor: Any, table: str, count: int) -> list[int]:
        """`count` new ids of `table`, ascending, for rows this transaction inserts later with
        their final values. PostgreSQL: from the id's sequence. SQLite: past the largest id
        the table has had (its whole database is locked by this transaction)."""
        if self.postgres:
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
                [table, count],
            )
            return sorted(row[0] for row in cursor.fetchall())
        cursor.execute(
            f"SELECT max(n) FROM (SELECT max(id) AS n FROM {table}"
            " UNION ALL SELECT seq FROM sqlite_sequence WHERE name = %s)",
            [table],
        )
        last = cursor.fetchone()[0] or 0
        return list(range(last + 1, last + 1 + count))

    def for_update(self, table: str) -> str:
        """Row locks, on PostgreSQL (SQLite locks the whole database for the transaction)."""
        return f"FOR UPDATE OF {table}" if self.postgres else ""

    def jsonb(self, expression: str) -> str:
        return f"CAST({expression} AS jsonb)" if self.postgres else expression

    def money(self, amount: int) -> Any:
        """Pico-dollars as the parameter of a USD_PICO column: the int itself for PostgreSQL
        (scaled there, exactly), else the Decimal amount."""
        return amount if self.postgres else pico_usd(amount)

    def usage(self, sums: tuple[int, ...]) -> Sequence[Any]:
        """The USAGE columns' parameters of steps_sum: as they are on PostgreSQL (the money in
        pico-dollars, scaled there), with the money as Decimal dollars on SQLite."""
        if self.postgres:
            return sums[:10]
        return [*sums[:5], *map(self.money, sums[5:10])]

    def dt(self, value: datetime | None) -> Any:
        return value if self.postgres else self.ops.adapt_datetimefield_value(value)

    def day(self, value: date) -> Any:
        return self.ops.adapt_datefield_value(value)


# Arrays of these types are sent as text literals, the others in binary.
_AS_TEXT = frozenset({"numeric", "bigint", "integer", USD_PICO})


def _array_literal(values: Sequence[Decimal | int | str | None]) -> str:
    """An array literal of numbers: exact (the str() of an int or a Decimal is valid input
    for PostgreSQL), and several times cheaper to build than psycopg's element-by-element
    array dump."""
    if None in values:
        return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"
    return "{" + ",".join(map(str, values)) + "}"  # the usual case: twice as fast


def _array_param(sql_type: str, values: Sequence[Any]) -> tuple[str, Any]:
    """A column of values as one array parameter of PostgreSQL: its placeholder (cast to the
    array type) and its value, a literal where one is cheap to build, else psycopg's binary
    array."""
    array_type = _ARRAY_TYPE.get(sql_type, sql_type)
    if sql_type in _AS_TEXT:
        return f"%s::{array_type}[]", _array_literal(values)
    literal = _quoted_literal(sql_type, values)
    if literal is not None:
        return f"%s::{array_type}[]", literal
    return f"%b::{array_type}[]", list(values)


def _quoted_literal(sql_type: str, values: Sequence[Any]) -> str | None:
    """A text or boolean column as an array literal, when it can be one cheaply: no NULL, and
    (text) no quote or backslash, so each value goes in double quotes as it is. A tenth of the
    cost of psycopg's binary array, element by element in Python; None: send it binary."""
    if sql_type == "text":
        if None in values:
            return None
        plain = "".join(values)
        if '"' in plain or "\\" in plain:
            return None
        return '{"' + '","'.join(values) + '"}'
    if sql_type == "boolean" and None not in values:
        return "{" + ",".join(["t" if value else "f" for value in values]) + "}"
    return None


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
