"""The rows a batch adds to the budgets' tables — period ledgers, calendar budgets' days
(BudgetDay), rolling budgets' hours (BudgetHour) — as the upserts of period_ledgers.py's one
statement write them: each table's rows a common table expression, one typed array per column
on PostgreSQL (as ingest's statements), rows of VALUES on SQLite."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

import psycopg
from django.db import connection

from costboard.budgets.periods import hour_of, zone
from costboard.budgets.windows import LedgerKey, Spans, SpendStep, span
from costboard.models import BudgetDay, BudgetHour, PeriodBudget
from costboard.money import pico_text

# a column of a ledger-like upsert: its name and PostgreSQL type ("pico": USD as pico-dollar
# ints, scaled to dollars in SQL, exactly)
Column = tuple[str, str]
PICO = "pico"


def upsert_rows(
    name: str, columns: Sequence[Column], rows: Sequence[Sequence[Any]]
) -> tuple[str, list[Any]]:
    """`<name> (…) AS (…)`, a common table expression of these rows (times aware, money in
    pico-dollars), and its parameters. On PostgreSQL one array per column, unnested, the same
    SQL text whatever the number of rows (as ingest's statements): numbers as array literals,
    text, days and times in psycopg's binary arrays, a column of NULLs as an empty array
    (unnest pads it). On SQLite, rows of VALUES, the money as its decimal text."""
    names = ", ".join(column for column, _ in columns)
    if connection.vendor != "postgresql":
        ops = connection.ops
        params: list[Any] = []
        for row in rows:
            for (_, kind), value in zip(columns, row, strict=True):
                if kind == PICO:
                    value = pico_text(value)
                elif kind == "timestamptz":
                    value = ops.adapt_datetimefield_value(value)
                params.append(value)
        one = "(" + ", ".join(["%s"] * len(columns)) + ")"
        return f"{name} ({names}) AS (VALUES {', '.join([one] * len(rows))})", params
    arrays: list[str] = []
    params = []
    for n, (_, kind) in enumerate(columns):
        column = [row[n] for row in rows]
        if kind in ("bigint", PICO):
            arrays.append(f"%s::{'numeric' if kind == PICO else kind}[]")
            params.append("{" + ",".join(map(str, column)) + "}")
        elif column.count(None) == len(column):
            arrays.append(f"%s::{kind}[]")
            params.append("{}")
        else:
            arrays.append(f"%b::{kind}[]")
            params.append(column)
    values = ", ".join(
        f"{column} * 0.000000000001" if kind == PICO else column for column, kind in columns
    )
    return (
        f"{name} ({names}) AS (SELECT {values} FROM unnest({', '.join(arrays)}) AS u ({names}))",
        params,
    )


def bound_cursor() -> Any:
    """A cursor in the current transaction; on PostgreSQL one that binds its parameters
    server-side (Django's interpolates them into the text, which for arrays costs more than
    the statement)."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    raw: Any = psycopg.Cursor(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


# a rolling budget's hours, as `adding` writes them: its columns and its unique key
HOURS: tuple[str, list[Column], str] = (
    BudgetHour._meta.db_table,
    [
        ("budget_id", "bigint"),
        ("member", "text"),
        ("hour", "timestamptz"),
        ("tokens_used", "bigint"),
        ("cost_usd", PICO),
    ],
    "budget_id, member, hour",
)


# a calendar budget's days, as `adding` writes them: its columns and its unique key
DAYS: tuple[str, list[Column], str] = (
    BudgetDay._meta.db_table,
    [
        ("budget_id", "bigint"),
        ("day", "date"),
        ("member", "text"),
        ("tokens_used", "bigint"),
        ("cost_usd", PICO),
    ],
    "budget_id, day, member",
)


def day_rows(
    budgets: dict[int, PeriodBudget],
    groups: Mapping[LedgerKey, Sequence[SpendStep]],
    sums: dict[int, tuple[int, int]],
    spans: Spans,
) -> list[list[Any]]:
    """What the batch adds to each calendar budget's (and member's) days, in its timezone, as
    rows of `DAYS` in key order. A group within one day adds its sums as they are."""
    adds: dict[tuple[int, date, str], list[int]] = {}
    for (budget_id, _, member), steps in sorted(groups.items()):
        tz = zone(budgets[budget_id].timezone)
        earliest, latest = span(steps, spans)
        first, last = earliest.astimezone(tz).date(), latest.astimezone(tz).date()
        if first == last and id(steps) in sums:
            adds[(budget_id, first, member)] = list(sums[id(steps)])
            continue
        for step in steps:
            day = step.at.astimezone(tz).date()
            tally = adds.setdefault((budget_id, day, member), [0, 0])
            tally[0] += step.tokens
            tally[1] += step.cost_pico
    return [[*key, *tally] for key, tally in sorted(adds.items())]


def hour_rows(
    groups: Mapping[LedgerKey, Sequence[SpendStep]],
    sums: dict[int, tuple[int, int]],
    spans: Spans,
) -> list[list[Any]]:
    """What the batch adds to each rolling budget's (and member's) hours, as rows of
    `HOURS` (budget, member, hour, tokens, pico-dollars), in key order. A group within one
    hour adds its sums as they are."""
    adds: dict[tuple[int, str, datetime], list[int]] = {}
    for (budget_id, _, member), steps in sorted(groups.items()):
        if not steps:
            continue
        earliest, latest = span(steps, spans)
        first, last = hour_of(earliest), hour_of(latest)
        if first == last and id(steps) in sums:
            adds[(budget_id, member, first)] = list(sums[id(steps)])
            continue
        for step in steps:
            tally = adds.setdefault((budget_id, member, hour_of(step.at)), [0, 0])
            tally[0] += step.tokens
            tally[1] += step.cost_pico
    return [[*key, *tally] for key, tally in sorted(adds.items())]
