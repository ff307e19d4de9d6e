"""The event_ids a project has seen, so a replayed event is stored once: session and turn
events' receipts, and the steps' (one table keyed (project, event_id) beside the step
partitions, whatever month a replay's timestamp is in)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from costboard.ingest.plan import PricedStep
from costboard.ingest.schemas import SessionEvent, TurnEvent
from costboard.models import EventReceipt, Project, StepReceipt
from costboard.sql_arrays import Dialect

RECEIPT_TABLE = EventReceipt._meta.db_table


STEP_RECEIPT_TABLE = StepReceipt._meta.db_table


def receipts_insert(
    cursor: Any,
    sql: Dialect,
    project: Project,
    others: list[SessionEvent | TurnEvent],
    now: datetime,
) -> tuple[list[SessionEvent | TurnEvent], int]:
    """Record the event_ids of session and turn events; return those not seen before, as a
    session or turn event's id or as a step's (an event_id is one event in its project)."""
    ids = sorted({e.event_id for e in others if e.event_id is not None})
    if not ids:
        return others, 0
    with_v, params = sql.rows([("event_id", "text")], [[event_id] for event_id in ids])
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {RECEIPT_TABLE} (project_id, event_id, received_at)
        SELECT %s, v.event_id, %s FROM v
        WHERE NOT EXISTS (
            SELECT 1 FROM {STEP_RECEIPT_TABLE} s
            WHERE s.project_id = %s AND s.event_id = v.event_id
        )
        ON CONFLICT (project_id, event_id) DO NOTHING
        RETURNING event_id
        """,
        [*params, project.pk, sql.dt(now), project.pk],
    )
    fresh = {row[0] for row in cursor.fetchall()}
    accepted = [e for e in others if e.event_id is None or e.event_id in fresh]
    return accepted, len(others) - len(accepted)


def step_receipts_insert(
    cursor: Any, sql: Dialect, project: Project, steps: list[PricedStep]
) -> list[PricedStep]:
    """Record the event_ids of these steps (sorted by event_id, those without one last);
    return the steps whose event_id was not seen before in the project, in any month, as a
    step's id or as a session or turn event's.

    The receipts' primary key is (project, event_id), one table beside the month partitions:
    a concurrent batch inserting the same event_id waits for this transaction and then finds
    it, so a replay racing its original is counted once. Steps without an event_id are
    always stored."""
    ids = [s.event_id for s in steps if s.event_id is not None]
    if not ids:
        return steps
    with_v, params = sql.rows(
        [("event_id", "text"), ('"timestamp"', "timestamptz")],
        [[s.event_id, sql.dt(s.ts)] for s in steps if s.event_id is not None],
    )
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {STEP_RECEIPT_TABLE} (project_id, event_id, "timestamp")
        SELECT %s, v.event_id, v."timestamp" FROM v
        WHERE NOT EXISTS (
            SELECT 1 FROM {RECEIPT_TABLE} e WHERE e.project_id = %s AND e.event_id = v.event_id
        )
        ON CONFLICT (project_id, event_id) DO NOTHING
        RETURNING event_id
        """,
        [*params, project.pk, project.pk],
    )
    if sql.postgres and cursor.rowcount == len(ids):
        return steps  # all new: no need to read which (SQLite inserts as they are read)
    fresh = {row[0] for row in cursor.fetchall()}
    return [s for s in steps if s.event_id is None or s.event_id in fresh]
