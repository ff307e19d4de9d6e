"""Rolling budgets' windows (docs/budgets.md, "Rolling windows"): which of a batch's steps
count toward a window, the hourly buckets (BudgetHour) ingest adds them to under the
ledgers' locks, and a rolling ledger as the engine decides it — its window's totals, and a
new episode once they fell back under the first warn fraction since a crossing.

Called by period_ledgers.py inside the batch's transaction; the windows' sums are read by
periods.window_totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

import psycopg
from django.db import connection

from costboard.budgets.engine import OK, Ledger
from costboard.budgets.periods import PeriodLimits, hour_of, window_bounds, window_totals
from costboard.models import BudgetHour, PeriodBudget, PeriodLedger
from costboard.money import pico_text, pico_usd


class SpendStep(Protocol):
    """A stored step as a window reads it (period_ledgers.SpendStep has these and more)."""

    @property
    def at(self) -> datetime: ...
    @property
    def tokens(self) -> int: ...
    @property
    def cost_pico(self) -> int: ...  # USD × 10^12


S = TypeVar("S", bound=SpendStep)

# a ledger row's key: (budget id, period start, member ('' unless the budget is per member))
LedgerKey = tuple[int, datetime, str]

# a list of steps' id → the list (held, so no other list takes its id while the batch is
# decided) and its first and last moment
Spans = dict[int, tuple[Sequence[SpendStep], datetime, datetime]]


def span(steps: Sequence[SpendStep], spans: Spans) -> tuple[datetime, datetime]:
    """The first and last moment of `steps`, read once per list in a batch (`spans`): the
    budgets that cover a whole batch share one list."""
    known = spans.get(id(steps))
    if known is None:
        moments = [step.at for step in steps]
        known = spans[id(steps)] = (steps, min(moments), max(moments))
    return known[1], known[2]


def in_window(start: datetime, steps: Sequence[S], spans: Spans) -> Sequence[S]:
    """The steps that count toward a rolling budget's window beginning at `start`: those
    stamped from it on (mostly all of them, found from the first step alone)."""
    if span(steps, spans)[0] >= start:
        return steps
    return [step for step in steps if step.at >= start]


def window_ledger(row: PeriodLedger, limits: PeriodLimits, totals: tuple[int, Decimal]) -> Ledger:
    """A rolling ledger as the engine decides it: its window's totals (before the batch), and
    when they fell back under the first warn fraction since a crossing, a new episode — its
    state back to ok, its crossings recordable again (`row.episode` one more)."""
    tokens, cost = totals
    stored = Ledger.of(row)
    if not limits.warned(tokens, cost) and (
        stored.state != OK or stored.warned_at is not None or row.threshold_crossed is not None
    ):
        row.episode += 1
        return Ledger(tokens_used=tokens, cost_usd=cost)
    return replace(stored, tokens_used=tokens, cost_usd=cost)


def window_moved(
    ledgers: Sequence[tuple[PeriodBudget, PeriodLedger]],
    added: dict[LedgerKey, tuple[int, int]],
    now: datetime,
) -> set[LedgerKey]:
    """A rolling ledger keeps its window's totals from `window_start` on, the batches' spend in
    the window added by the upsert that locks it. The ledgers (as returned by that upsert,
    this batch's `added` in) whose window has moved to another hour since — or that are new
    — are summed again from their hours (before this batch's are added) plus this batch's
    spend, in one query; their keys are returned (to be written)."""
    stale = [
        (budget, row)
        for budget, row in ledgers
        if row.window_start != window_bounds(budget.window_hours or 1, now)[0]
    ]
    if not stale:
        return set()
    sums = window_totals([(budget, row.member) for budget, row in stale], now)
    keys = set()
    for budget, row in stale:
        key = (row.budget_id, row.period_start, row.member)
        tokens, cost = sums[(row.budget_id, row.member)]
        row.tokens_used = tokens + added[key][0]
        row.cost_usd = cost + pico_usd(added[key][1])
        row.window_start = window_bounds(budget.window_hours or 1, now)[0]
        keys.add(key)
    return keys


def hours_add(
    project_id: int,
    groups: dict[LedgerKey, Sequence[SpendStep]],
    sums: dict[int, tuple[int, int]],
    spans: Spans,
) -> None:
    """Add the batch to each rolling budget's (and member's) hours: one statement. A group
    within one hour adds its sums as they are."""
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
    if not adds:
        return
    with_v, params = upsert_rows(
        _HOUR_COLUMNS,
        [
            [budget_id, member, hour, tokens, pico]
            for (budget_id, member, hour), (tokens, pico) in sorted(adds.items())
        ],
    )
    table = BudgetHour._meta.db_table
    with bound_cursor() as cursor:
        cursor.execute(
            f"{with_v} INSERT INTO {table} (project_id, budget_id, member, hour, tokens_used, "
            f"cost_usd) SELECT %s, budget_id, member, hour, tokens_used, cost_usd FROM v "
            f"WHERE true ON CONFLICT (budget_id, member, hour, project_id) DO UPDATE SET "
            f"tokens_used = {table}.tokens_used + excluded.tokens_used, "
            f"cost_usd = {table}.cost_usd + excluded.cost_usd",
            [*params, project_id],
        )


def windows_set(rows: Sequence[PeriodLedger]) -> None:
    """Write rolling ledgers as decided — their window's totals and start, state, crossings and
    episode — in one statement: an upsert onto rows that exist (locked by this batch since its first
    upsert), so every one takes the update, on PostgreSQL and SQLite alike."""
    if not rows:
        return
    table = PeriodLedger._meta.db_table
    ops = connection.ops
    ordered = sorted(rows, key=lambda row: (row.budget_id, row.period_start, row.member))
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(ordered))
    params: list[Any] = []
    for row in ordered:
        params += [
            row.project_id,
            row.budget_id,
            ops.adapt_datetimefield_value(row.period_start),
            row.member,
            row.tokens_used,
            ops.adapt_decimalfield_value(row.cost_usd),
            row.state,
            ops.adapt_datetimefield_value(row.warned_at),
            ops.adapt_datetimefield_value(row.exhausted_at),
            ops.adapt_decimalfield_value(row.threshold_crossed),
            row.episode,
            ops.adapt_datetimefield_value(row.updated_at),
            ops.adapt_datetimefield_value(row.window_start),
        ]
    columns = (
        "tokens_used",
        "cost_usd",
        "state",
        "warned_at",
        "exhausted_at",
        "threshold_crossed",
        "episode",
        "updated_at",
        "window_start",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (project_id, budget_id, period_start, member, "
            f"{', '.join(columns)}) VALUES {values} "
            f"ON CONFLICT (budget_id, period_start, member, project_id) DO UPDATE SET "
            + ", ".join(f"{column} = excluded.{column}" for column in columns),
            params,
        )


# --- the budgets' upserts as typed arrays ------------------------------------------------------

# a column of a ledger-like upsert: its name and PostgreSQL type ("pico": USD as pico-dollar
# ints, scaled to dollars in SQL, exactly)
Column = tuple[str, str]
PICO = "pico"


def upsert_rows(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """`WITH v (…) AS (…)` over these rows (times aware, money in pico-dollars) and its
    parameters. On PostgreSQL one array per column, unnested, the same SQL text whatever the
    number of rows (as ingest's statements, costboard/ingest/sql.py): numbers as array
    literals, text and times in psycopg's binary arrays; a column of NULLs as an empty array
    (unnest pads it). On SQLite, rows of VALUES, the money as Decimal text."""
    names = ", ".join(name for name, _ in columns)
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
        return f"WITH v ({names}) AS (VALUES {', '.join([one] * len(rows))})", params
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
        f"{name} * 0.000000000001" if kind == PICO else name for name, kind in columns
    )
    return (
        f"WITH v ({names}) AS (SELECT {values} FROM unnest({', '.join(arrays)}) AS u ({names}))",
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


_HOUR_COLUMNS: list[Column] = [
    ("budget_id", "bigint"),
    ("member", "text"),
    ("hour", "timestamptz"),
    ("tokens_used", "bigint"),
    ("cost_usd", PICO),
]
