"""`events_ingest`: a validated batch → stored, priced, rolled up, budgets decided.

One transaction, a fixed number of statements whatever the batch size:

1. upsert the touched sessions (sorted, so concurrent batches lock in the same order);
   the upsert locks each row and returns its totals and caps as they are now;
2. record the event_ids of session and turn events (replays are skipped);
3. upsert the touched turns;
4. insert the steps; a replayed event_id is skipped by the unique index (PostgreSQL returns
   what it inserted, so a concurrent replay can never be counted twice);
5. add the inserted steps' sums to their sessions, deciding budget crossings in SQL
   (`warned_at IS NULL AND …`); add them to their turns;
6. add them to the daily rollups (the hottest rows, touched last so their locks are short);
7. record the crossings as BudgetEvents.

Everything is priced in Python before the transaction begins (a cached rate table).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from costboard.budgets import (
    SessionBudget,
    budget_decide,
    budget_event,
    cap_change_detail,
    caps_for,
    session_budget,
)
from costboard.ingest.normalize import Tokens
from costboard.ingest.schemas import Event, SessionEvent, StepEvent, TurnEvent
from costboard.models import (
    SYSTEM_SESSION_ID,
    BudgetEvent,
    DailyRollup,
    EventReceipt,
    Project,
    Session,
    Step,
    Turn,
)
from costboard.pricing import StepCost, rate_table

ZERO = Decimal(0)

SESSION_TABLE = Session._meta.db_table
TURN_TABLE = Turn._meta.db_table
STEP_TABLE = Step._meta.db_table
ROLLUP_TABLE = DailyRollup._meta.db_table
RECEIPT_TABLE = EventReceipt._meta.db_table


@dataclass
class IngestResult:
    accepted: int
    duplicates: int
    sessions: dict[str, SessionBudget]
    budget_events: list[BudgetEvent] = field(default_factory=list)


@dataclass(slots=True)
class _Step:
    session_key: str
    turn_no: int | None
    event_id: str | None
    ts: datetime
    step_type: str
    model: str
    provider: str
    tokens: Tokens
    duration_ms: int | None
    success: bool
    error: str
    metadata: dict[str, Any] | None
    cost: StepCost


@dataclass(slots=True)
class _Totals:
    """Sums of a group of steps."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_input_usd: Decimal = ZERO
    cost_output_usd: Decimal = ZERO
    cost_cache_read_usd: Decimal = ZERO
    cost_cache_write_usd: Decimal = ZERO
    cost_usd: Decimal = ZERO
    steps: int = 0
    errors: int = 0
    unpriced: int = 0
    duration_ms: int = 0

    def add(self, step: _Step) -> None:
        t = step.tokens
        c = step.cost
        self.input_tokens += t.input_tokens
        self.output_tokens += t.output_tokens
        self.cache_read_input_tokens += t.cache_read_input_tokens
        self.cache_creation_input_tokens += t.cache_creation_input_tokens
        self.reasoning_tokens += t.reasoning_tokens
        self.cost_input_usd += c.input
        self.cost_output_usd += c.output
        self.cost_cache_read_usd += c.cache_read
        self.cost_cache_write_usd += c.cache_write
        self.cost_usd += c.total
        self.steps += 1
        self.errors += not step.success
        self.unpriced += c.price_id is None
        self.duration_ms += step.duration_ms or 0

    def usage_values(self) -> list[Any]:
        return [
            self.input_tokens,
            self.output_tokens,
            self.cache_read_input_tokens,
            self.cache_creation_input_tokens,
            self.reasoning_tokens,
            self.cost_input_usd,
            self.cost_output_usd,
            self.cost_cache_read_usd,
            self.cost_cache_write_usd,
            self.cost_usd,
        ]


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
USAGE_TYPES = ["bigint"] * 5 + ["numeric"] * 5


@dataclass(slots=True)
class _SessionTouch:
    key: str
    first: datetime
    last: datetime
    user_id: str | None = None
    parent_key: str | None = None
    token_cap: int | None = None
    cost_cap_usd: Decimal | None = None
    caps_given: bool = False
    ended_at: datetime | None = None
    metadata: dict[str, Any] | None = None
    event_at: datetime | None = None

    def seen(self, ts: datetime) -> None:
        if ts < self.first:
            self.first = ts
        if ts > self.last:
            self.last = ts


@dataclass(slots=True)
class _TurnTouch:
    session_key: str
    number: int
    first: datetime
    last: datetime
    user_message: str | None = None
    assistant_response: str | None = None
    context: dict[str, Any] | None = None


class _Dialect:
    """The few places PostgreSQL and SQLite spell SQL differently."""

    def __init__(self) -> None:
        self.postgres = connection.vendor == "postgresql"
        self.greatest = "GREATEST" if self.postgres else "MAX"
        self.least = "LEAST" if self.postgres else "MIN"
        self.ops = connection.ops

    def ph(self, sql_type: str) -> str:
        """A placeholder typed for PostgreSQL (VALUES in a CTE has no column types)."""
        return f"CAST(%s AS {sql_type})" if self.postgres else "%s"

    def row(self, types: list[str]) -> str:
        return "(" + ", ".join(self.ph(t) for t in types) + ")"

    def json_in(self) -> str:
        return "CAST(%s AS jsonb)" if self.postgres else "%s"

    def dt(self, value: datetime | None) -> Any:
        return self.ops.adapt_datetimefield_value(value)

    def day(self, value: date) -> Any:
        return self.ops.adapt_datefield_value(value)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str, separators=(",", ":"))


def _plan(
    events: list[Event], now: datetime, project: Project
) -> tuple[
    dict[str, _SessionTouch],
    dict[tuple[str, int], _TurnTouch],
    list[_Step],
    list[SessionEvent | TurnEvent],
    int,
]:
    """Price the steps and gather what each session and turn is touched by (no I/O but the
    rate-table check)."""
    table = rate_table()
    sessions: dict[str, _SessionTouch] = {}
    turns: dict[tuple[str, int], _TurnTouch] = {}
    steps: list[_Step] = []
    others: list[SessionEvent | TurnEvent] = []
    seen_ids: set[str] = set()
    duplicates = 0

    def touch_session(key: str, ts: datetime) -> None:
        found = sessions.get(key)
        if found is None:
            sessions[key] = _SessionTouch(key=key, first=ts, last=ts)
        else:
            found.seen(ts)

    def touch_turn(key: str, number: int, ts: datetime) -> None:
        found = turns.get((key, number))
        if found is None:
            turns[(key, number)] = _TurnTouch(key, number, ts, ts)
        else:
            found.first = min(found.first, ts)
            found.last = max(found.last, ts)

    for event in events:
        if event.event_id is not None:
            if event.event_id in seen_ids:
                duplicates += 1
                continue
            seen_ids.add(event.event_id)
        ts = event.timestamp or now
        if isinstance(event, StepEvent):
            key = event.session_id or SYSTEM_SESSION_ID
            touch_session(key, ts)
            if event.turn is not None:
                touch_turn(key, event.turn, ts)
            tokens = event.tokens()
            provider = event.provider or ""
            cost = table.price(
                model=event.model,
                provider=provider,
                when=ts,
                input_tokens=tokens.input_tokens,
                output_tokens=tokens.output_tokens,
                cache_read_input_tokens=tokens.cache_read_input_tokens,
                cache_creation_input_tokens=tokens.cache_creation_input_tokens,
                cache_creation_1h_input_tokens=tokens.cache_creation_1h_input_tokens,
            )
            steps.append(
                _Step(
                    session_key=key,
                    turn_no=event.turn,
                    event_id=event.event_id,
                    ts=ts,
                    step_type=event.step_type,
                    model=event.model,
                    provider=provider,
                    tokens=tokens,
                    duration_ms=(None if event.duration_ms is None else round(event.duration_ms)),
                    success=event.success,
                    error=event.error or "",
                    metadata=event.metadata,
                    cost=cost,
                )
            )
        elif isinstance(event, TurnEvent):
            touch_session(event.session_id, ts)
            touch_turn(event.session_id, event.turn, ts)
            others.append(event)
        else:
            touch_session(event.session_id, ts)
            if event.parent_session_id:
                touch_session(event.parent_session_id, ts)
            others.append(event)
    return sessions, turns, steps, others, duplicates


def events_ingest(
    *, project: Project, events: list[Event], now: datetime | None = None
) -> IngestResult:
    """Store a validated batch all or nothing; see the module docstring for the statements."""
    now = now or timezone.now()
    sessions, turns, steps, others, duplicates = _plan(events, now, project)
    sql = _Dialect()

    with transaction.atomic():
        with connection.cursor() as cursor:
            rows = _sessions_upsert(cursor, sql, project, sessions)
            accepted_others, dup_others = _receipts_insert(cursor, sql, project, others, now)
            duplicates += dup_others
            _apply_other_events(accepted_others, sessions, turns, now)
            session_ids = {key: row["id"] for key, row in rows.items()}
            turn_ids = _turns_upsert(cursor, sql, session_ids, turns)
            inserted = _steps_insert(cursor, sql, project, session_ids, turn_ids, steps)
            duplicates += len(steps) - len(inserted)
            crossings = _sessions_update(
                cursor, sql, project, rows, sessions, session_ids, inserted, now
            )
            _turns_update(cursor, sql, turn_ids, inserted)
            _rollups_upsert(cursor, sql, project, inserted)
        budget_events = BudgetEvent.objects.bulk_create(crossings) if crossings else []
        touched = Session.objects.filter(id__in=session_ids.values())
        budgets = {s.external_id: session_budget(s, project) for s in touched}

    return IngestResult(
        accepted=len(others) - dup_others + len(inserted),
        duplicates=duplicates,
        sessions=dict(sorted(budgets.items())),
        budget_events=budget_events,
    )


def _sessions_upsert(
    cursor: Any, sql: _Dialect, project: Project, sessions: dict[str, _SessionTouch]
) -> dict[str, dict[str, Any]]:
    """Create missing sessions, lock all touched ones, and return their current state."""
    if not sessions:
        return {}
    ordered = sorted(sessions.values(), key=lambda s: s.key)
    values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(ordered))
    params: list[Any] = []
    for touch in ordered:
        params += [project.pk, touch.key, sql.dt(touch.first), sql.dt(touch.last), "{}"]
    cursor.execute(
        f"""
        INSERT INTO {SESSION_TABLE} (project_id, external_id, started_at, last_active_at, metadata)
        VALUES {values}
        ON CONFLICT (project_id, external_id) DO UPDATE SET
            started_at = {sql.least}({SESSION_TABLE}.started_at, excluded.started_at),
            last_active_at = {sql.greatest}({SESSION_TABLE}.last_active_at,
                                            excluded.last_active_at)
        RETURNING id, external_id, token_cap, cost_cap_usd, input_tokens, output_tokens,
                  cost_usd, state, warned_at, exhausted_at, metadata
        """,
        params,
    )
    rows = {}
    for row in cursor.fetchall():
        (id_, key, token_cap, cost_cap, inp, out, cost, state, warned, exhausted, meta) = row
        rows[key] = {
            "id": id_,
            "token_cap": token_cap,
            "cost_cap_usd": _as_decimal(cost_cap),
            "tokens_used": inp + out,
            "cost_usd": _as_decimal(cost),
            "state": state,
            "warned_at": _as_dt(warned),
            "exhausted_at": _as_dt(exhausted),
            "metadata": json.loads(meta) if isinstance(meta, str) else (meta or {}),
        }
    return rows


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


def _receipts_insert(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    others: list[SessionEvent | TurnEvent],
    now: datetime,
) -> tuple[list[SessionEvent | TurnEvent], int]:
    """Record the event_ids of session and turn events; return those not seen before."""
    ids = sorted({e.event_id for e in others if e.event_id is not None})
    if not ids:
        return others, 0
    values = ", ".join(["(%s, %s, %s)"] * len(ids))
    params: list[Any] = []
    for event_id in ids:
        params += [project.pk, event_id, sql.dt(now)]
    cursor.execute(
        f"""
        INSERT INTO {RECEIPT_TABLE} (project_id, event_id, received_at) VALUES {values}
        ON CONFLICT (project_id, event_id) DO NOTHING
        RETURNING event_id
        """,
        params,
    )
    fresh = {row[0] for row in cursor.fetchall()}
    accepted = [e for e in others if e.event_id is None or e.event_id in fresh]
    return accepted, len(others) - len(accepted)


def _apply_other_events(
    events: list[SessionEvent | TurnEvent],
    sessions: dict[str, _SessionTouch],
    turns: dict[tuple[str, int], _TurnTouch],
    now: datetime,
) -> None:
    """Fold accepted session and turn events into their touches, later events winning."""
    for event in events:
        ts = event.timestamp or now
        if isinstance(event, TurnEvent):
            turn = turns[(event.session_id, event.turn)]
            if event.user_message is not None:
                turn.user_message = event.user_message
            if event.assistant_response is not None:
                turn.assistant_response = event.assistant_response
            if event.context is not None:
                turn.context = event.context
            continue
        touch = sessions[event.session_id]
        touch.event_at = ts
        if event.user_id is not None:
            touch.user_id = event.user_id
        if event.parent_session_id is not None:
            touch.parent_key = event.parent_session_id
        if event.token_cap is not None:
            touch.token_cap = event.token_cap
            touch.caps_given = True
        if event.cost_cap_usd is not None:
            touch.cost_cap_usd = event.cost_cap_usd
            touch.caps_given = True
        if event.ended:
            touch.ended_at = ts
        if event.metadata is not None:
            touch.metadata = {**(touch.metadata or {}), **event.metadata}


def _turns_upsert(
    cursor: Any,
    sql: _Dialect,
    session_ids: dict[str, int],
    turns: dict[tuple[str, int], _TurnTouch],
) -> dict[tuple[str, int], int]:
    if not turns:
        return {}
    ordered = sorted(turns.values(), key=lambda t: (session_ids[t.session_key], t.number))
    values = ", ".join(
        [f"(%s, %s, %s, %s, COALESCE(%s, ''), COALESCE(%s, ''), {sql.json_in()})"] * len(ordered)
    )
    params: list[Any] = []
    for t in ordered:
        params += [
            session_ids[t.session_key],
            t.number,
            sql.dt(t.first),
            sql.dt(t.last),
            t.user_message,
            t.assistant_response,
            _json(t.context),
        ]
    # user_message and assistant_response are '' when not given: keep what is stored.
    cursor.execute(
        f"""
        INSERT INTO {TURN_TABLE} (session_id, number, started_at, last_active_at,
                                  user_message, assistant_response, context)
        VALUES {values}
        ON CONFLICT (session_id, number) DO UPDATE SET
            started_at = {sql.least}({TURN_TABLE}.started_at, excluded.started_at),
            last_active_at = {sql.greatest}({TURN_TABLE}.last_active_at, excluded.last_active_at),
            user_message = COALESCE(NULLIF(excluded.user_message, ''),
                                    {TURN_TABLE}.user_message),
            assistant_response = COALESCE(NULLIF(excluded.assistant_response, ''),
                                          {TURN_TABLE}.assistant_response),
            context = COALESCE(excluded.context, {TURN_TABLE}.context)
        RETURNING id, session_id, number
        """,
        params,
    )
    by_id = {v: k for k, v in session_ids.items()}
    return {(by_id[session_id], number): id_ for id_, session_id, number in cursor.fetchall()}


_STEP_COLUMNS = [
    ("session_id", "bigint"),
    ("turn_id", "bigint"),
    ("event_id", "text"),
    ('"timestamp"', "timestamptz"),
    ("step_type", "text"),
    ("model", "text"),
    ("provider", "text"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("cache_read_input_tokens", "bigint"),
    ("cache_creation_input_tokens", "bigint"),
    ("cache_creation_1h_input_tokens", "bigint"),
    ("reasoning_tokens", "bigint"),
    ("duration_ms", "integer"),
    ("success", "boolean"),
    ("error", "text"),
    ("metadata", "text"),
    ("price_id", "bigint"),
    ("cost_input_usd", "numeric"),
    ("cost_output_usd", "numeric"),
    ("cost_cache_read_usd", "numeric"),
    ("cost_cache_write_usd", "numeric"),
    ("cost_usd", "numeric"),
]


def _step_values(
    step: _Step, session_ids: dict[str, int], turn_ids: dict[tuple[str, int], int], sql: _Dialect
) -> list[Any]:
    t = step.tokens
    c = step.cost
    return [
        session_ids[step.session_key],
        None if step.turn_no is None else turn_ids[(step.session_key, step.turn_no)],
        step.event_id,
        sql.dt(step.ts),
        step.step_type,
        step.model,
        step.provider,
        t.input_tokens,
        t.output_tokens,
        t.cache_read_input_tokens,
        t.cache_creation_input_tokens,
        t.cache_creation_1h_input_tokens,
        t.reasoning_tokens,
        step.duration_ms,
        step.success,
        step.error,
        _json(step.metadata),
        c.price_id,
        c.input,
        c.output,
        c.cache_read,
        c.cache_write,
        c.total,
    ]


def _steps_insert(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    session_ids: dict[str, int],
    turn_ids: dict[tuple[str, int], int],
    steps: list[_Step],
) -> list[_Step]:
    """Insert the steps; return those stored (a replayed event_id is not)."""
    if not steps:
        return []
    # Same order in every transaction, so two batches sharing event_ids cannot deadlock.
    steps = sorted(steps, key=lambda s: (s.event_id is None, s.event_id or ""))
    names = ", ".join(name for name, _ in _STEP_COLUMNS)
    with_ids = any(s.event_id is not None for s in steps)

    if sql.postgres:
        columns = list(
            zip(*(_step_values(s, session_ids, turn_ids, sql) for s in steps), strict=True)
        )
        arrays = ", ".join(f"%s::{t}[]" for _, t in _STEP_COLUMNS)
        aliases = [f"c{i}" for i in range(len(_STEP_COLUMNS))]
        select = ", ".join(
            f"CAST({a} AS jsonb)" if name == "metadata" else a
            for a, (name, _) in zip(aliases, _STEP_COLUMNS, strict=True)
        )
        cursor.execute(
            f"""
            INSERT INTO {STEP_TABLE} (project_id, {names})
            SELECT %s, {select} FROM unnest({arrays}) AS u({", ".join(aliases)})
            ON CONFLICT (project_id, event_id) WHERE event_id IS NOT NULL DO NOTHING
            {"RETURNING event_id" if with_ids else ""}
            """,
            [project.pk, *(list(col) for col in columns)],
        )
        if not with_ids:
            return steps
        stored = {row[0] for row in cursor.fetchall()}
        return [s for s in steps if s.event_id is None or s.event_id in stored]

    # SQLite: the whole database is locked for this transaction (BEGIN IMMEDIATE), so
    # looking for replays first cannot race.
    fresh = steps
    if with_ids:
        ids = [s.event_id for s in steps if s.event_id is not None]
        existing: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            cursor.execute(
                f"SELECT event_id FROM {STEP_TABLE} WHERE project_id = %s AND event_id IN "
                f"({', '.join(['%s'] * len(chunk))})",
                [project.pk, *chunk],
            )
            existing.update(row[0] for row in cursor.fetchall())
        fresh = [s for s in steps if s.event_id is None or s.event_id not in existing]
    if fresh:
        placeholders = ", ".join(["%s"] * (len(_STEP_COLUMNS) + 1))
        cursor.executemany(
            f"INSERT INTO {STEP_TABLE} (project_id, {names}) VALUES ({placeholders})",
            [[project.pk, *_step_values(s, session_ids, turn_ids, sql)] for s in fresh],
        )
    return fresh


def _first_crossing(steps: list[_Step], tokens: int, cost: Decimal, hit: Any) -> datetime | None:
    """The time of the first step at which `hit(tokens, cost)` becomes true."""
    for step in sorted(steps, key=lambda s: s.ts):
        tokens += step.tokens.input_tokens + step.tokens.output_tokens
        cost += step.cost.total
        if hit(tokens, cost):
            return step.ts
    return None


def _sessions_update(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    rows: dict[str, dict[str, Any]],
    sessions: dict[str, _SessionTouch],
    session_ids: dict[str, int],
    inserted: list[_Step],
    now: datetime,
) -> list[BudgetEvent]:
    """Add the steps' sums to each touched session and decide its budget state.

    The rows were locked by the upsert, so the totals read there are current; the crossing
    is still written with `warned_at IS NULL` in SQL, so it can only ever be set once.
    """
    if not sessions:
        return []
    by_session: dict[str, list[_Step]] = defaultdict(list)
    for step in inserted:
        by_session[step.session_key].append(step)

    types = [
        "bigint",
        *USAGE_TYPES,
        "integer",
        "integer",
        "bigint",
        "numeric",
        "bigint",
        "text",
        "text",
        "timestamptz",
        "text",
        "timestamptz",
        "timestamptz",
        "integer",
        "integer",
    ]
    value_rows: list[str] = []
    params: list[Any] = []
    crossings: list[BudgetEvent] = []

    for key in sorted(sessions):
        touch = sessions[key]
        row = rows[key]
        totals = _Totals()
        for step in by_session.get(key, ()):
            totals.add(step)
        token_cap = touch.token_cap if touch.token_cap is not None else row["token_cap"]
        cost_cap = touch.cost_cap_usd if touch.cost_cap_usd is not None else row["cost_cap_usd"]
        old_caps = caps_for(
            project=project, token_cap=row["token_cap"], cost_cap_usd=row["cost_cap_usd"]
        )
        caps = caps_for(project=project, token_cap=token_cap, cost_cap_usd=cost_cap)
        old_tokens, old_cost = row["tokens_used"], row["cost_usd"]
        if not old_tokens and not old_cost:
            old_caps = caps  # caps given before any usage (at the start) are not a change
        tokens = old_tokens + totals.input_tokens + totals.output_tokens
        cost = old_cost + totals.cost_usd
        new_steps = by_session.get(key, [])
        event_at = touch.event_at or now

        decision = budget_decide(
            old_caps=old_caps,
            caps=caps,
            tokens_used=tokens,
            cost_usd=cost,
            warned_at=row["warned_at"],
            exhausted_at=row["exhausted_at"],
        )
        common = {
            "session": row["id"],
            "project": project,
            "tokens_used": tokens,
            "cost_usd": cost,
            "caps": caps,
        }
        if decision.cap_changed:
            detail = cap_change_detail(old_caps, caps, row["state"], decision.state)
            crossings.append(
                budget_event(
                    kind=BudgetEvent.Kind.CAP_CHANGED, at=event_at, detail=detail, **common
                )
            )
        warn_time = exhaust_time = None
        if decision.warns:
            warn_time = _first_crossing(new_steps, old_tokens, old_cost, caps.warned) or event_at
            crossings.append(
                budget_event(kind=BudgetEvent.Kind.SOFT_WARNED, at=warn_time, **common)
            )
        if decision.exhausts:
            exhaust_time = (
                _first_crossing(new_steps, old_tokens, old_cost, caps.exhausted) or event_at
            )
            crossings.append(
                budget_event(kind=BudgetEvent.Kind.EXHAUSTED, at=exhaust_time, **common)
            )

        metadata = None
        if touch.metadata is not None:
            metadata = _json({**row["metadata"], **touch.metadata})
        parent_id = None
        if touch.parent_key is not None and touch.parent_key != key:
            parent_id = rows[touch.parent_key]["id"]

        value_rows.append(sql.row(types))
        params += [
            row["id"],
            *totals.usage_values(),
            totals.steps,
            totals.errors,
            token_cap,
            cost_cap,
            parent_id,
            decision.state,
            touch.user_id,
            sql.dt(touch.ended_at),
            metadata,
            sql.dt(warn_time),
            sql.dt(exhaust_time),
            int(decision.clear_warned),
            int(decision.clear_exhausted),
        ]

    names = [
        "id",
        *USAGE_COLUMNS,
        "d_steps",
        "d_errors",
        "token_cap",
        "cost_cap_usd",
        "parent_id",
        "state",
        "user_id",
        "ended_at",
        "metadata",
        "warn_time",
        "exhaust_time",
        "clear_warned",
        "clear_exhausted",
    ]
    sums = ",\n".join(f"{c} = {SESSION_TABLE}.{c} + v.{c}" for c in USAGE_COLUMNS)
    metadata_sql = "CAST(v.metadata AS jsonb)" if sql.postgres else "v.metadata"
    cursor.execute(
        f"""
        WITH v ({", ".join(names)}) AS (VALUES {", ".join(value_rows)})
        UPDATE {SESSION_TABLE} SET
            {sums},
            step_count = {SESSION_TABLE}.step_count + v.d_steps,
            error_count = {SESSION_TABLE}.error_count + v.d_errors,
            turn_count = (SELECT COUNT(*) FROM {TURN_TABLE} t
                          WHERE t.session_id = {SESSION_TABLE}.id),
            token_cap = v.token_cap,
            cost_cap_usd = v.cost_cap_usd,
            parent_id = COALESCE(v.parent_id, {SESSION_TABLE}.parent_id),
            state = v.state,
            user_id = COALESCE(v.user_id, {SESSION_TABLE}.user_id),
            ended_at = COALESCE(v.ended_at, {SESSION_TABLE}.ended_at),
            metadata = COALESCE({metadata_sql}, {SESSION_TABLE}.metadata),
            warned_at = CASE
                WHEN v.clear_warned = 1 THEN NULL
                WHEN {SESSION_TABLE}.warned_at IS NULL AND v.warn_time IS NOT NULL
                    THEN v.warn_time
                ELSE {SESSION_TABLE}.warned_at END,
            exhausted_at = CASE
                WHEN v.clear_exhausted = 1 THEN NULL
                WHEN {SESSION_TABLE}.exhausted_at IS NULL AND v.exhaust_time IS NOT NULL
                    THEN v.exhaust_time
                ELSE {SESSION_TABLE}.exhausted_at END
        FROM v
        WHERE {SESSION_TABLE}.id = v.id
        """,
        params,
    )
    return crossings


def _turns_update(
    cursor: Any, sql: _Dialect, turn_ids: dict[tuple[str, int], int], inserted: list[_Step]
) -> None:
    sums: dict[int, _Totals] = defaultdict(_Totals)
    for step in inserted:
        if step.turn_no is not None:
            sums[turn_ids[(step.session_key, step.turn_no)]].add(step)
    if not sums:
        return
    types = ["bigint", *USAGE_TYPES, "integer", "integer"]
    params: list[Any] = []
    for turn_id in sorted(sums):
        totals = sums[turn_id]
        params += [turn_id, *totals.usage_values(), totals.steps, totals.errors]
    names = ["id", *USAGE_COLUMNS, "d_steps", "d_errors"]
    assignments = ",\n".join(f"{c} = {TURN_TABLE}.{c} + v.{c}" for c in USAGE_COLUMNS)
    cursor.execute(
        f"""
        WITH v ({", ".join(names)}) AS (VALUES {", ".join([sql.row(types)] * len(sums))})
        UPDATE {TURN_TABLE} SET
            {assignments},
            step_count = {TURN_TABLE}.step_count + v.d_steps,
            error_count = {TURN_TABLE}.error_count + v.d_errors
        FROM v
        WHERE {TURN_TABLE}.id = v.id
        """,
        params,
    )


def _rollups_upsert(cursor: Any, sql: _Dialect, project: Project, inserted: list[_Step]) -> None:
    sums: dict[tuple[date, str, str], _Totals] = defaultdict(_Totals)
    for step in inserted:
        sums[(step.ts.astimezone(UTC).date(), step.model, step.step_type)].add(step)
    if not sums:
        return
    columns = [
        "project_id",
        "day",
        "model",
        "step_type",
        *USAGE_COLUMNS,
        "calls",
        "errors",
        "unpriced_calls",
        "duration_ms",
    ]
    counters = [*USAGE_COLUMNS, "calls", "errors", "unpriced_calls", "duration_ms"]
    params: list[Any] = []
    for day, model, step_type in sorted(sums):
        totals = sums[(day, model, step_type)]
        params += [
            project.pk,
            sql.day(day),
            model,
            step_type,
            *totals.usage_values(),
            totals.steps,
            totals.errors,
            totals.unpriced,
            totals.duration_ms,
        ]
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    updates = ",\n".join(f"{c} = {ROLLUP_TABLE}.{c} + excluded.{c}" for c in counters)
    cursor.execute(
        f"""
        INSERT INTO {ROLLUP_TABLE} ({", ".join(columns)})
        VALUES {", ".join([row] * len(sums))}
        ON CONFLICT (project_id, day, model, step_type) DO UPDATE SET
            {updates}
        """,
        params,
    )
