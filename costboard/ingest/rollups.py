"""The sums ingest adds to rows that many batches share: the daily rollups (by model, by
user, by tag), the latency histograms and each session's per-model usage (the project's ingest
tally, run with them, is costboard/projects.py's). Each is one upsert that adds to what is
stored, so concurrent batches lose no count; the hottest ones are built before the transaction
and run last, back to back, to hold their locks briefly (costboard/ingest/service.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import date
from functools import lru_cache
from itertools import chain
from typing import TYPE_CHECKING, Any

from costboard.ingest.latency import latency_bucket
from costboard.ingest.plan import PricedStep, Totals, step_tags, steps_sum
from costboard.ingest.sql import USAGE, Statement
from costboard.models import (
    SYSTEM_SESSION_ID,
    DailyRollup,
    LatencyRollup,
    Project,
    SessionModelUsage,
    TagDailyRollup,
    UserDailyRollup,
)
from costboard.sql_arrays import USD_PICO, Column, Dialect

if TYPE_CHECKING:
    from costboard.ingest.writes.moves import MovedStep

ROLLUP_TABLE = DailyRollup._meta.db_table


USER_ROLLUP_TABLE = UserDailyRollup._meta.db_table


TAG_ROLLUP_TABLE = TagDailyRollup._meta.db_table


MODEL_USAGE_TABLE = SessionModelUsage._meta.db_table


LATENCY_TABLE = LatencyRollup._meta.db_table


_ROLLUP_COLUMNS: list[Column] = [
    ("day", "date"),
    ("family", "text"),
    ("model", "text"),
    ("step_type", "text"),
    *USAGE,
    ("calls", "bigint"),
    ("errors", "bigint"),
    ("unpriced_calls", "bigint"),
    ("duration_ms", "bigint"),
]


def hot_statements(sql: Dialect, project: Project, steps: list[PricedStep]) -> list[Statement]:
    """The daily rollup and latency upserts of these steps. Every batch of a project-day
    writes the same few rows, so concurrent batches queue on their locks: the statements are
    built before the transaction and run last, back to back, to hold those locks briefly."""
    return [
        statement
        for statement in (
            _rollups_statement(sql, project, steps),
            _latency_statement(sql, project, steps),
        )
        if statement is not None
    ]


def hot_run(cursor: Any, statements: list[Statement]) -> None:
    """Run the shared rows' upserts (hot_statements, attribution_statements, the tally's), back
    to back: the transaction's last statements, so their locks are held only until the
    commit."""
    for statement, params in statements:
        cursor.execute(statement, params)


_USER_ROLLUP_COLUMNS: list[Column] = [
    ("day", "date"),
    ("user_id", "text"),
    *USAGE,
    ("calls", "bigint"),
]


_TAG_ROLLUP_COLUMNS: list[Column] = [
    ("day", "date"),
    ("key", "text"),
    ("value", "text"),
    *USAGE,
    ("calls", "bigint"),
]


def attribution_statements(
    sql: Dialect,
    project: Project,
    steps: list[PricedStep],
    users: dict[str, str],
    session_tags: dict[str, dict[str, str]],
    moved: Sequence[MovedStep] = (),
) -> list[Statement]:
    """The per-user and per-tag daily rollup upserts of these steps (run with the other hot
    statements, last): each step under its session's user and under each of its tags. The
    `moved` steps (writes/moves.py) are added likewise and taken out of the user and tags
    they were rolled up under, in the same statement (one per table: its rows locked in key
    order, as every batch locks them); a row left with no calls is then deleted."""
    by_user: dict[tuple[date, str], list[PricedStep]] = defaultdict(list)
    by_tag: dict[tuple[date, str, str], list[PricedStep]] = defaultdict(list)
    for step in chain(steps, (m.step for m in moved)):
        by_user[(step.day, users.get(step.session_key) or "")].append(step)
        tags = step_tags(step, session_tags)
        if tags:
            for key, value in tags.items():
                by_tag[(step.day, key, value)].append(step)
    user_out: dict[tuple[date, str], list[PricedStep]] = defaultdict(list)
    tag_out: dict[tuple[date, str, str], list[PricedStep]] = defaultdict(list)
    for m in moved:
        user_out[(m.step.day, m.old_user)].append(m.step)
        for key, value in (m.old_tags or {}).items():
            tag_out[(m.step.day, key, value)].append(m.step)
    statements = []
    for table, columns, conflict, groups, out in (
        (USER_ROLLUP_TABLE, _USER_ROLLUP_COLUMNS, "project_id, day, user_id", by_user, user_out),
        (TAG_ROLLUP_TABLE, _TAG_ROLLUP_COLUMNS, "project_id, day, key, value", by_tag, tag_out),
    ):
        deltas = {
            key: _signed(groups.get(key, []), out.get(key, [])) for key in sorted({*groups, *out})
        }
        deltas = {key: delta for key, delta in deltas.items() if any(delta)}
        if not deltas:
            continue
        keys = len(columns) - len(USAGE) - 1
        rows = [
            [
                *(sql.day(part) if isinstance(part, date) else part for part in key),
                *sql.usage(delta[:10]),
                delta[10],
            ]
            for key, delta in deltas.items()
        ]
        with_v, params = sql.rows(columns, rows)
        names = ", ".join(name for name, _ in columns)
        updates = ",\n".join(f"{c} = {table}.{c} + excluded.{c}" for c, _ in columns[keys:])
        statements.append(
            (
                f"""
                {with_v}
                INSERT INTO {table} (project_id, {names})
                SELECT %s, {names} FROM v WHERE true
                ON CONFLICT ({conflict}) DO UPDATE SET
                    {updates}
                """,
                [*params, project.pk],
            )
        )
        emptied = [
            row[:keys] for row, delta in zip(rows, deltas.values(), strict=True) if delta[10] < 0
        ]
        if emptied:
            with_v, params = sql.rows(columns[:keys], emptied)
            match = " AND ".join(f"{table}.{c} = v.{c}" for c, _ in columns[:keys])
            statements.append(
                (
                    f"""
                    {with_v}
                    DELETE FROM {table} WHERE project_id = %s AND calls = 0
                        AND EXISTS (SELECT 1 FROM v WHERE {match})
                    """,
                    [*params, project.pk],
                )
            )
    return statements


def _signed(added: list[PricedStep], taken: list[PricedStep]) -> tuple[int, ...]:
    """The usage sums (steps_sum's first ten) and the calls of `added` less those of `taken`."""
    plus, minus = steps_sum(added), steps_sum(taken)
    return (*(a - b for a, b in zip(plus[:10], minus[:10], strict=True)), len(added) - len(taken))


def _rollups_statement(sql: Dialect, project: Project, steps: list[PricedStep]) -> Statement | None:
    groups: dict[tuple[date, str, str, str], list[PricedStep]] = defaultdict(list)
    for step in steps:
        groups[(step.day, step.family, step.model, step.step_type)].append(step)
    if not groups:
        return None
    sums = {key: Totals.of(steps) for key, steps in groups.items()}
    with_v, params = sql.rows(
        _ROLLUP_COLUMNS,
        [
            [
                sql.day(day),
                family,
                model,
                step_type,
                *totals.usage_values(sql),
                totals.steps,
                totals.errors,
                totals.unpriced,
                totals.duration_ms,
            ]
            for (day, family, model, step_type), totals in sorted(sums.items())
        ],
    )
    names = ", ".join(name for name, _ in _ROLLUP_COLUMNS)
    counters = [name for name, _ in _ROLLUP_COLUMNS[4:]]
    updates = ",\n".join(f"{c} = {ROLLUP_TABLE}.{c} + excluded.{c}" for c in counters)
    return (
        f"""
        {with_v}
        INSERT INTO {ROLLUP_TABLE} (project_id, {names})
        SELECT %s, {names} FROM v WHERE true
        ON CONFLICT (project_id, day, family, model, step_type) DO UPDATE SET
            {updates}
        """,
        [*params, project.pk],
    )


def model_usage_upsert(
    cursor: Any,
    sql: Dialect,
    project: Project,
    session_ids: dict[str, int],
    inserted: list[PricedStep],
    moved: Sequence[MovedStep] = (),
) -> None:
    """Add the inserted and `moved` steps to their session's row per family and model (its
    sessions are locked), the moved ones taken out of `system`'s rows; a row left with no
    calls is deleted."""
    groups: dict[tuple[int, str, str], list[int]] = {}
    system_id = session_ids.get(SYSTEM_SESSION_ID)
    signed = [(step, session_ids[step.session_key], 1) for step in inserted]
    for m in moved:
        signed.append((m.step, session_ids[m.step.session_key], 1))
        if system_id is not None:
            signed.append((m.step, system_id, -1))
    for step, session_id, sign in signed:
        key = (session_id, step.family, step.model)
        group = groups.get(key)
        if group is None:
            groups[key] = [sign, sign * step.tokens, sign * step.cost_pico]
        else:
            group[0] += sign
            group[1] += sign * step.tokens
            group[2] += sign * step.cost_pico
    if not groups:
        return
    with_v, params = sql.rows(
        [
            ("session_id", "bigint"),
            ("family", "text"),
            ("model", "text"),
            ("calls", "bigint"),
            ("tokens_used", "bigint"),
            ("cost_usd", USD_PICO),
        ],
        [
            [session_id, family, model, calls, tokens, sql.money(cost)]
            for (session_id, family, model), (calls, tokens, cost) in sorted(groups.items())
        ],
    )
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {MODEL_USAGE_TABLE} (project_id, session_id, family, model, calls,
                                         tokens_used, cost_usd)
        SELECT %s, session_id, family, model, calls, tokens_used, cost_usd FROM v WHERE true
        ON CONFLICT (session_id, family, model, project_id) DO UPDATE SET
            calls = {MODEL_USAGE_TABLE}.calls + excluded.calls,
            tokens_used = {MODEL_USAGE_TABLE}.tokens_used + excluded.tokens_used,
            cost_usd = {MODEL_USAGE_TABLE}.cost_usd + excluded.cost_usd
        """,
        [*params, project.pk],
    )
    if moved and system_id is not None:
        cursor.execute(
            f"DELETE FROM {MODEL_USAGE_TABLE} WHERE session_id = %s AND calls = 0",
            [system_id],
        )


@lru_cache(maxsize=65_536)
def _bucket(duration_ms: int) -> int:
    return latency_bucket(duration_ms)  # durations repeat: a lookup, not a log10, per step


def _latency_statement(sql: Dialect, project: Project, steps: list[PricedStep]) -> Statement | None:
    """Count the steps that report a duration in their latency histogram buckets."""
    counts: dict[tuple[date, str, int], int] = defaultdict(int)
    for step in steps:
        if step.duration_ms is not None:
            counts[(step.day, step.step_type, _bucket(step.duration_ms))] += 1
    if not counts:
        return None
    with_v, params = sql.rows(
        [("day", "date"), ("step_type", "text"), ("bucket", "integer"), ("calls", "bigint")],
        [
            [sql.day(day), step_type, bucket, n]
            for (day, step_type, bucket), n in sorted(counts.items())
        ],
    )
    return (
        f"""
        {with_v}
        INSERT INTO {LATENCY_TABLE} (project_id, day, step_type, bucket, calls)
        SELECT %s, day, step_type, bucket, calls FROM v WHERE true
        ON CONFLICT (project_id, day, step_type, bucket) DO UPDATE SET
            calls = {LATENCY_TABLE}.calls + excluded.calls
        """,
        [*params, project.pk],
    )
