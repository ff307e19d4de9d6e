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

from django.db import connection

from costboard.budgets.engine import OK, Ledger
from costboard.budgets.periods import PeriodLimits, window_bounds, window_totals
from costboard.models import PeriodBudget, PeriodLedger


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
    ledgers: Sequence[tuple[PeriodBudget, PeriodLedger]], now: datetime
) -> set[LedgerKey]:
    """A rolling ledger keeps its window's totals from `window_start` on, the batches' spend in
    the window added by the upsert that locks it. The ledgers (as returned by that upsert,
    this batch's spend in) whose window has moved to another hour since — or that are new —
    are summed again from their hours (this batch's in: added with the ledgers, under their
    locks), in one query; their keys are returned (to be written)."""
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
        row.tokens_used, row.cost_usd = sums[(row.budget_id, row.member)]
        row.window_start = window_bounds(budget.window_hours or 1, now)[0]
        keys.add(key)
    return keys


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
