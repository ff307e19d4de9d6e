"""The rows a batch adds to the budgets' tables — period ledgers, calendar budgets' days
(BudgetDay), rolling budgets' hours (BudgetHour) — as the upserts of period_ledgers.py's one
statement write them: each table's rows a common table expression, one typed array per column
on PostgreSQL, rows of VALUES on SQLite (costboard/sql_arrays.py, as ingest's statements)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from costboard.budgets.periods import hour_of, zone
from costboard.budgets.windows import LedgerKey, Spans, SpendStep, span
from costboard.models import BudgetDay, BudgetHour, PeriodBudget
from costboard.sql_arrays import USD_PICO, Column, Dialect


def upsert_rows(
    sql: Dialect, name: str, columns: Sequence[Column], rows: Sequence[Sequence[Any]]
) -> tuple[str, list[Any]]:
    """`<name> (…) AS (…)`, a common table expression of these rows (times aware, money in
    pico-dollars) and its parameters: `Dialect.cte`'s, with the money and times given as
    the database takes them (`Dialect.money`, `Dialect.dt`)."""
    if not sql.postgres:
        rows = [
            [
                sql.money(value)
                if kind == USD_PICO
                else sql.dt(value)
                if kind == "timestamptz"
                else value
                for (_, kind), value in zip(columns, row, strict=True)
            ]
            for row in rows
        ]
    return sql.cte(name, columns, rows)


# a rolling budget's hours, as `adding` writes them: its columns and its unique key
HOURS: tuple[str, list[Column], str] = (
    BudgetHour._meta.db_table,
    [
        ("budget_id", "bigint"),
        ("member", "text"),
        ("hour", "timestamptz"),
        ("tokens_used", "bigint"),
        ("cost_usd", USD_PICO),
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
        ("cost_usd", USD_PICO),
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
