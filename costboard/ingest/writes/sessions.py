"""A batch's sessions: made where missing and locked in key order (`sessions_lock`); what
the batch adds to each, as the budgets read it (`session_spends`); then written once with
the inserted steps' sums and what the budgets decided (`sessions_update`), which returns
them as the budget answer reads them (`SessionNow`)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Context, Decimal
from itertools import chain
from typing import Any

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from costboard.budgets.batch import SessionSpend
from costboard.budgets.engine import Flag, Ledger
from costboard.ingest.plan import PricedStep, SessionTouch, steps_sum
from costboard.ingest.sql import USAGE, USAGE_COLUMNS, json_text
from costboard.models import SYSTEM_SESSION_ID, Project, Session
from costboard.money import pico_usd
from costboard.sql_arrays import Column, Dialect

SESSION_TABLE = Session._meta.db_table


def sessions_lock(
    cursor: Any, sql: Dialect, project: Project, sessions: dict[str, SessionTouch]
) -> tuple[dict[str, dict[str, Any]], int]:
    """Create the missing sessions, lock all touched ones and return their current state (and
    how many this batch made: another batch may have made some by now): an insert that skips
    the existing ones, then a locking read. A session is written once a
    batch, by sessions_update (an upsert here would write every row twice, with an entry in
    each of its indexes each time). Deadlock-free: the insert locks nothing that exists, and
    both go in key order (locking the existing first and inserting the missing after would
    let two batches each hold what the other waits for). On PostgreSQL an unlocking read
    first finds which are missing, so a batch of sessions that all exist (most batches) skips
    the insert: it locks nothing, so the order above still holds."""
    if not sessions:
        return {}, 0
    ordered = sorted(sessions.values(), key=lambda s: s.key)
    keys = [touch.key for touch in ordered]
    missing = ordered
    if sql.postgres:
        array, param = sql.text_array(keys)
        cursor.execute(
            f"SELECT external_id FROM {SESSION_TABLE}"
            f" WHERE project_id = %s AND external_id = ANY({array})",
            [project.pk, param],
        )
        found = {row[0] for row in cursor.fetchall()}
        missing = [touch for touch in ordered if touch.key not in found]
    made = _sessions_insert(cursor, sql, project, missing) if missing else 0
    # a statement of its own: its snapshot sees the sessions another batch just made
    return _sessions_locked(cursor, sql, project, keys), made


def _sessions_insert(
    cursor: Any, sql: Dialect, project: Project, ordered: list[SessionTouch]
) -> int:
    """Insert these sessions (in key order), skipping any that exist by now, empty; return
    how many it inserted."""
    with_v, params = sql.rows(
        [("external_id", "text"), ("started_at", "timestamptz"), ("last_active_at", "timestamptz")],
        [[touch.key, sql.dt(touch.first), sql.dt(touch.last)] for touch in ordered],
    )
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {SESSION_TABLE} (project_id, external_id, started_at, last_active_at, metadata)
        SELECT %s, v.external_id, v.started_at, v.last_active_at, '{{}}' FROM v WHERE true
        ON CONFLICT (project_id, external_id) DO NOTHING
        """,
        [*params, project.pk],
    )
    if sql.postgres:
        return int(cursor.rowcount)
    cursor.execute("SELECT changes()")  # sqlite3 gives no rowcount for a statement led by WITH
    return int(cursor.fetchone()[0])


def _sessions_locked(
    cursor: Any, sql: Dialect, project: Project, keys: list[str]
) -> dict[str, dict[str, Any]]:
    """These sessions, locked in key order, as sessions_lock returns them."""
    columns = """s.id, s.external_id, s.token_cap, s.cost_cap_usd, s.input_tokens,
        s.output_tokens, s.cost_usd, s.state, s.warned_at, s.exhausted_at, s.runaway_at,
        s.runaway_reason, s.acknowledged_at, s.metadata, s.tags, s.user_id, s.families"""
    if sql.postgres:
        # The keys as an index condition on (project, external_id): no join for the planner
        # to get wrong (with a project's size underestimated, it joined every one of its
        # sessions to every key).
        array, param = sql.text_array(keys)
        cursor.execute(
            f"""
            SELECT {columns} FROM {SESSION_TABLE} s
            WHERE s.project_id = %s AND s.external_id = ANY({array})
            ORDER BY s.external_id {sql.for_update("s")}
            """,
            [project.pk, param],
        )
    else:
        with_v, params = sql.rows([("external_id", "text")], [[key] for key in keys])
        cursor.execute(
            f"""
            {with_v}
            SELECT {columns} FROM {SESSION_TABLE} s JOIN v ON s.external_id = v.external_id
            WHERE s.project_id = %s ORDER BY s.external_id
            """,
            [*params, project.pk],
        )
    rows = {}
    for row in cursor.fetchall():
        (id_, key, token_cap, cost_cap, inp, out, cost, state, warned, exhausted) = row[:10]
        runaway, runaway_reason, acknowledged, meta, tags, user_id, families = row[10:]
        rows[key] = {
            "id": id_,
            "token_cap": token_cap,
            "cost_cap_usd": _as_decimal(cost_cap),
            "tokens_used": inp + out,
            "cost_usd": _as_decimal(cost),
            "state": state,
            "warned_at": _as_dt(warned),
            "exhausted_at": _as_dt(exhausted),
            "runaway_at": _as_dt(runaway),
            "runaway_reason": runaway_reason,
            "acknowledged_at": _as_dt(acknowledged),
            "metadata": _json_object(meta),
            "tags": _json_object(tags),
            "user_id": user_id or "",
            "families": _json_object(families),
        }
    return rows


def _json_object(value: Any) -> dict[str, Any]:
    """A jsonb object column read by a raw cursor (text: Django reads jsonb unparsed); most
    sessions' metadata and tags are empty."""
    if not value or value == "{}":
        return {}
    return json.loads(value) if isinstance(value, str) else dict(value)


_SQLITE_DIGITS = Context(prec=15)


def _as_decimal(value: Any) -> Decimal | None:
    """A numeric column read by a raw cursor: Decimal from PostgreSQL; from SQLite a float
    (15 significant digits, as Django's own converter reads it) or an int."""
    if value is None or isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return _SQLITE_DIGITS.create_decimal_from_float(value)
    return Decimal(value)


def _as_dt(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else timezone.make_aware(parsed, UTC)


_SESSION_UPDATE_COLUMNS: list[Column] = [
    ("id", "bigint"),
    ("started_at", "timestamptz"),
    ("last_active_at", "timestamptz"),
    *USAGE,
    ("d_steps", "integer"),
    ("d_errors", "integer"),
    ("d_turns", "integer"),
    ("token_cap", "bigint"),
    ("cost_cap_usd", "numeric"),
    ("parent_id", "bigint"),
    ("user_id", "text"),
    ("ended_at", "timestamptz"),
    ("metadata", "text"),
    ("tags", "text"),
    ("families", "text"),
    ("state", "text"),
    ("warned_at", "timestamptz"),
    ("exhausted_at", "timestamptz"),
    ("runaway_at", "timestamptz"),
    ("runaway_reason", "text"),
]


def session_spends(
    rows: dict[str, dict[str, Any]],
    sessions: dict[str, SessionTouch],
    inserted: list[PricedStep],
    runaways: dict[str, Flag],
    now: datetime,
    moved: Sequence[PricedStep] = (),
) -> dict[str, SessionAdd]:
    """What the batch adds to each touched session (in key order): its inserted steps and
    the steps `moved` into it (writes/moves.py), their sums, and what the budgets read of it
    (its ledger as locked, its caps before and after the batch's session events, the runaway
    flag its turns raised). The moved steps are taken out of `system`: its sums go down."""
    by_session: dict[str, list[PricedStep]] = defaultdict(list)
    for step in chain(inserted, moved):
        by_session[step.session_key].append(step)
    adds = {}
    for key in sorted(sessions):
        touch, row = sessions[key], rows[key]
        steps = by_session.get(key, [])
        counted = steps_sum(steps)
        step_delta = len(steps)
        if key == SYSTEM_SESSION_ID and moved:
            out = steps_sum(moved)
            counted = tuple(a - b for a, b in zip(counted, out, strict=True))
            step_delta -= len(moved)
        token_cap = touch.token_cap if touch.token_cap is not None else row["token_cap"]
        cost_cap = touch.cost_cap_usd if touch.cost_cap_usd is not None else row["cost_cap_usd"]
        spend = SessionSpend(
            key=key,
            session_id=row["id"],
            before=Ledger.of(row),
            caps_before=(row["token_cap"], row["cost_cap_usd"]),
            caps_after=(token_cap, cost_cap),
            steps=steps,
            added=(counted[0] + counted[1], pico_usd(counted[9])),
            flag=runaways.get(key),
            # a crossing no step caused (a cap given in this batch): the session event's time
            at=touch.event_at or now,
        )
        adds[key] = SessionAdd(spend, steps, counted, step_delta)
    return adds


@dataclass(slots=True)
class SessionAdd:
    """A touched session's share of the batch: what the budgets read (`spend`), its inserted
    and moved-in steps, the column sums (`counted`, steps_sum's order) and the step count
    they add (`system`'s less those moved out)."""

    spend: SessionSpend
    steps: list[PricedStep]
    counted: tuple[int, ...]
    step_delta: int


def sessions_update(
    cursor: Any,
    sql: Dialect,
    rows: dict[str, dict[str, Any]],
    sessions: dict[str, SessionTouch],
    adds: dict[str, SessionAdd],
    ledgers: dict[str, Ledger],
    new_turns: dict[str, int],
) -> list[SessionNow]:
    """Add the steps' sums (and `new_turns`, the turns the batch made, by session) to each
    touched session, with its budget as the budgets decided it (`ledgers`: its state,
    crossing times and runaway flag): the session's one write of the batch. Return the
    sessions as they now are (for their budgets).

    The rows were locked by sessions_lock, so the ledgers the budgets read there are
    current: their outcome is written as it is, and each crossing decided exactly once.
    """
    if not sessions:
        return []
    values: list[list[Any]] = []
    for key in sorted(sessions):
        touch, row, add = sessions[key], rows[key], adds[key]
        new_steps, counted = add.steps, add.counted
        token_cap, cost_cap = add.spend.caps_after
        after = ledgers[key]

        metadata = tags = None
        if touch.metadata is not None:
            metadata = json_text({**row["metadata"], **touch.metadata})
        if touch.tags is not None:
            tags = json_text({**row["tags"], **touch.tags})
        families = None
        known = row["families"]
        if any(step.family not in known for step in new_steps):
            met = {step.family: True for step in new_steps}
            families = json_text(dict(sorted({**known, **met}.items())))
        parent_id = None
        if touch.parent_key is not None and touch.parent_key != key:
            parent_id = rows[touch.parent_key]["id"]

        values.append(
            [
                row["id"],
                sql.dt(touch.first if touch.timed else None),
                sql.dt(touch.last if touch.timed else None),
                *sql.usage(counted),
                add.step_delta,
                counted[10],
                new_turns.get(key, 0),
                token_cap,
                cost_cap,
                parent_id,
                touch.user_id,
                sql.dt(touch.ended_at),
                metadata,
                tags,
                families,
                after.state,
                sql.dt(after.warned_at),
                sql.dt(after.exhausted_at),
                sql.dt(after.runaway_at),
                after.runaway_reason[:200],
            ]
        )

    with_v, params = sql.rows(_SESSION_UPDATE_COLUMNS, values)
    sums = ",\n".join(f"{c} = {SESSION_TABLE}.{c} + v.{c}" for c in USAGE_COLUMNS)
    cursor.execute(
        f"""
        {with_v}
        UPDATE {SESSION_TABLE} SET
            started_at = COALESCE({sql.least}({SESSION_TABLE}.started_at, v.started_at),
                                  {SESSION_TABLE}.started_at),
            last_active_at = COALESCE({sql.greatest}({SESSION_TABLE}.last_active_at,
                                                     v.last_active_at),
                                      {SESSION_TABLE}.last_active_at),
            {sums},
            step_count = {SESSION_TABLE}.step_count + v.d_steps,
            error_count = {SESSION_TABLE}.error_count + v.d_errors,
            turn_count = {SESSION_TABLE}.turn_count + v.d_turns,
            token_cap = v.token_cap,
            cost_cap_usd = v.cost_cap_usd,
            parent_id = COALESCE(v.parent_id, {SESSION_TABLE}.parent_id),
            user_id = COALESCE(v.user_id, {SESSION_TABLE}.user_id),
            ended_at = COALESCE(v.ended_at, {SESSION_TABLE}.ended_at),
            metadata = COALESCE({sql.jsonb("v.metadata")}, {SESSION_TABLE}.metadata),
            tags = COALESCE({sql.jsonb("v.tags")}, {SESSION_TABLE}.tags),
            families = COALESCE({sql.jsonb("v.families")}, {SESSION_TABLE}.families),
            state = v.state,
            warned_at = v.warned_at,
            exhausted_at = v.exhausted_at,
            runaway_at = v.runaway_at,
            runaway_reason = v.runaway_reason
        FROM v
        WHERE {SESSION_TABLE}.id = v.id
        RETURNING {", ".join(f"{SESSION_TABLE}.{name}" for name in _BUDGET_FIELDS)}
        """,
        params,
    )
    return _sessions_read(cursor.fetchall())


# What `session_budget` reads of a session.
_BUDGET_FIELDS = [
    "external_id",
    "state",
    "runaway_at",
    "input_tokens",
    "output_tokens",
    "token_cap",
    "cost_usd",
    "cost_cap_usd",
    "turn_count",
    "step_count",
    "warned_at",
    "exhausted_at",
]


@dataclass(slots=True)
class SessionNow:
    """A session's budget fields as the update left them (what `session_budget` reads; a
    Django instance per session would cost more than the statement)."""

    external_id: str
    state: str
    runaway_at: datetime | None
    input_tokens: int
    output_tokens: int
    token_cap: int | None
    cost_usd: Decimal
    cost_cap_usd: Decimal | None
    turn_count: int
    step_count: int
    warned_at: datetime | None
    exhausted_at: datetime | None

    @property
    def runaway(self) -> bool:
        return self.runaway_at is not None

    @property
    def tokens_used(self) -> int:
        return self.input_tokens + self.output_tokens


def _sessions_read(rows: list[tuple[Any, ...]]) -> list[SessionNow]:
    """Raw rows of _BUDGET_FIELDS as SessionNow: PostgreSQL's come typed; SQLite's are
    converted as the ORM would (it returns text times and float amounts)."""
    if connection.vendor == "postgresql":
        return [SessionNow(*row) for row in rows]
    readers = []
    for name in _BUDGET_FIELDS:
        model_field = Session._meta.get_field(name)
        assert isinstance(model_field, Field)  # noqa: S101 — narrows the type: a concrete column
        column = model_field.get_col(SESSION_TABLE)
        converters = connection.ops.get_db_converters(column)
        converters += model_field.get_db_converters(connection)
        readers.append((name, column, converters))
    sessions = []
    for row in rows:
        values = {}
        for (name, column, converters), value in zip(readers, row, strict=True):
            for convert in converters:
                value = convert(value, column, connection)
            values[name] = value
        sessions.append(SessionNow(**values))
    return sessions
