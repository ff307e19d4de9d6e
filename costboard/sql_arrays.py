"""A batch's rows as SQL, the same text whatever their number, on either database: on
PostgreSQL one typed array per column, unnested, bound server-side; on SQLite rows of VALUES
(`Dialect.rows`, `Dialect.cte`). The few other places PostgreSQL and SQLite spell SQL
differently are `Dialect`'s too. Ingest's statements (costboard/ingest/) and the budgets'
ledger upserts (costboard/budgets/period_ledgers.py) are built on it; nothing here knows a
table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
from django.db import connection

from costboard.money import pico_usd

Column = tuple[str, str]  # a name and its PostgreSQL type


# A column of USD amounts sent as pico-dollar ints (str() of an int is the cheapest exact
# text there is) and scaled to dollars in SQL: numeric × 10⁻¹² is exact.
USD_PICO = "usd_pico"


_PICO_USD = "0.000000000001"


_ARRAY_TYPE = {USD_PICO: "numeric"}


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
        """`WITH v (…) AS (…)` over these rows, and its parameters."""
        cte, params = self.cte("v", columns, rows)
        return f"WITH {cte}", params

    def cte(
        self, name: str, columns: Sequence[Column], rows: Sequence[Sequence[Any]]
    ) -> tuple[str, list[Any]]:
        """`<name> (…) AS (…)`, a common table expression of these rows, and its parameters
        (USD_PICO columns as pico-dollar ints on PostgreSQL, as `money` gives them; times as
        `dt`). On PostgreSQL one typed array per column, unnested: the SQL text is the same
        whatever the number of rows."""
        names = ", ".join(column for column, _ in columns)
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
                f"{column} * {_PICO_USD}" if sql_type == USD_PICO else column
                for column, sql_type in columns
            )
            return (
                f"{name} ({names}) AS (SELECT {values} FROM unnest({arrays}) AS u ({names}))",
                params,
            )
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        params = [value for values in rows for value in values]
        return f"{name} ({names}) AS (VALUES {', '.join([row] * len(rows))})", params

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
