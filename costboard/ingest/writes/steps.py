"""A batch's fresh steps inserted (after their receipts), each with its session's tags under
its own and its session's user: on PostgreSQL one statement into the month partitions, on
SQLite one executemany."""

from __future__ import annotations

from typing import Any

from costboard.ingest.plan import PricedStep, step_tags
from costboard.ingest.sql import json_text
from costboard.ingest.writes.receipts import step_receipts_insert
from costboard.models import Project, Step
from costboard.sql_arrays import USD_PICO, Column, Dialect

STEP_TABLE = Step._meta.db_table


_STEP_COLUMNS: list[Column] = [
    ("session_id", "bigint"),
    ("turn_id", "bigint"),
    ("event_id", "text"),
    ('"timestamp"', "timestamptz"),
    ("step_type", "text"),
    ("model", "text"),
    ("family", "text"),
    ("provider", "text"),
    ("service_tier", "text"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("cache_read_input_tokens", "bigint"),
    ("cache_creation_input_tokens", "bigint"),
    ("cache_creation_1h_input_tokens", "bigint"),
    ("reasoning_tokens", "bigint"),
    ("input_audio_tokens", "bigint"),
    ("cache_audio_read_tokens", "bigint"),
    ("output_audio_tokens", "bigint"),
    ("duration_ms", "integer"),
    ("success", "boolean"),
    ("error", "text"),
    ("metadata", "text"),
    ("tags", "text"),
    ("user_id", "text"),
    ("price_id", "bigint"),
    ("cost_input_usd", USD_PICO),
    ("cost_output_usd", USD_PICO),
    ("cost_cache_read_usd", USD_PICO),
    ("cost_cache_write_usd", USD_PICO),
    ("cost_usd", USD_PICO),
]


STEP_COLUMN_NAMES = [name for name, _ in _STEP_COLUMNS]


def _step_values(
    step: PricedStep,
    session_ids: dict[str, int],
    turn_ids: dict[tuple[str, int], int],
    sql: Dialect,
    session_tags: dict[str, dict[str, str]],
    users: dict[str, str],
) -> list[Any]:
    inp, out, read, write, reasoning, c_in, c_out, c_read, c_write, c_total = step.counts[:10]
    money = sql.money
    # none is NULL (Step.input_audio_tokens): a batch without audio, nearly every one, sends
    # each audio column as an empty array (Dialect.cte) and its rows hold no bytes for them
    audio_in, audio_read, audio_out = step.audio
    return [
        session_ids[step.session_key],
        None if step.turn_no is None else turn_ids[(step.session_key, step.turn_no)],
        step.event_id,
        sql.dt(step.ts),
        step.step_type,
        step.model,
        step.family,
        step.provider,
        step.service_tier,
        inp,
        out,
        read,
        write,
        step.cache_creation_1h_input_tokens,
        reasoning,
        audio_in or None,
        audio_read or None,
        audio_out or None,
        step.duration_ms,
        step.success,
        step.error,
        json_text(step.metadata),
        json_text(step_tags(step, session_tags)),
        users[step.session_key],
        step.price_id,
        money(c_in),
        money(c_out),
        money(c_read),
        money(c_write),
        money(c_total),
    ]


def steps_insert(
    cursor: Any,
    sql: Dialect,
    project: Project,
    session_ids: dict[str, int],
    turn_ids: dict[tuple[str, int], int],
    steps: list[PricedStep],
    session_tags: dict[str, dict[str, str]],
    users: dict[str, str],
) -> list[PricedStep]:
    """Insert the steps, each with its tags (step_tags) and its session's user after the
    batch (`users`, by session key: the user its spend is rolled up under); return those
    stored (a replayed event_id is not: its receipt is already there, in whatever month its
    step is)."""
    if not steps:
        return []
    # Same order in every transaction, so two batches sharing event_ids cannot deadlock.
    steps = sorted(steps, key=lambda s: (s.event_id is None, s.event_id or ""))
    steps = step_receipts_insert(cursor, sql, project, steps)
    if not steps:
        return []
    names = ", ".join(name for name, _ in _STEP_COLUMNS)
    if sql.postgres:
        # A receipt was inserted for each of these in this transaction, so none should be a
        # replay; the partitions' own unique index stays as a second guard, and what it
        # skipped (a step kept past its receipt) is not counted.
        with_ids = any(s.event_id is not None for s in steps)
        with_v, params = sql.rows(
            _STEP_COLUMNS,
            [_step_values(s, session_ids, turn_ids, sql, session_tags, users) for s in steps],
        )
        select = ", ".join(
            sql.jsonb(f"v.{name}") if name in ("metadata", "tags") else f"v.{name}"
            for name, _ in _STEP_COLUMNS
        )
        cursor.execute(
            f"""
            {with_v}
            INSERT INTO {STEP_TABLE} (project_id, {names})
            SELECT %s, {select} FROM v
            ON CONFLICT DO NOTHING
            {"RETURNING event_id" if with_ids else ""}
            """,
            [*params, project.pk],
        )
        if not with_ids or cursor.rowcount == len(steps):
            return steps
        stored = {row[0] for row in cursor.fetchall()}
        return [s for s in steps if s.event_id is None or s.event_id in stored]
    placeholders = ", ".join(["%s"] * (len(_STEP_COLUMNS) + 1))
    cursor.executemany(
        f"INSERT INTO {STEP_TABLE} (project_id, {names}) VALUES ({placeholders})",
        [
            [project.pk, *_step_values(s, session_ids, turn_ids, sql, session_tags, users)]
            for s in steps
        ],
    )
    return steps
