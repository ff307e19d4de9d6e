"""`events_ingest`: a validated batch → stored, priced, rolled up, budgets decided.

One transaction, a fixed number of statements whatever the batch size:

1. find which sessions are missing (a read that locks nothing) and create them (an insert
   that skips any made meanwhile), then lock all touched ones in key order (so concurrent
   batches lock in the same order) and read their totals and caps as they are now;
2. record the event_ids of session and turn events (replays are skipped);
3. read the touched turns and reserve ids for the missing ones (their sessions' locks keep
   them to this batch);
4. record the steps' event_ids as receipts (one table keyed (project, event_id), beside the
   month partitions: a replay is skipped whatever month its timestamp is in, and a
   concurrent replay waits on the key and is counted once) and insert the fresh steps (on
   PostgreSQL into their month partitions, made before the transaction if missing); then write each
   touched turn once — an update of those found, an insert of the new ones with their final
   values: the inserted steps' sums, its messages, and its retry-loop streaks advanced over
   those steps, checking the per-turn runaway rules (turn_rules);
5. write each touched session once: the inserted steps' sums and the new turns, with the
   budget engine's decision (crossings, runaway flag), returning the sessions' new state
   for the response;
6. record the crossings as BudgetEvents;
7. add the inserted steps to their sessions' per-model usage (the model mix);
8. add them to the daily rollups and the latency histograms, and the batch's events to the
   project's ingest tally (/metrics) — the hottest rows, touched last so their locks are
   short. Every caller's events are counted (the API's, OTLP's, the demo's), once.

Everything is priced in Python before the transaction begins (a cached rate table), and each
step given its model family (costboard/pricing/families.py); a step without a model (a tool
call, a retrieval: model `none`) is never priced and never counted unpriced. On
PostgreSQL every statement carries its rows as one typed array per column, unnested, with
server-side binding: the SQL text is the same for every batch and nothing is interpolated.
Numbers and plain text go as array literals, a column of NULLs as an empty array (unnest
pads it): cheaper to build than psycopg's binary arrays, element by element in Python.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from functools import lru_cache
from operator import attrgetter
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field
from django.utils import timezone

from costboard.budgets.alerts import announce
from costboard.budgets.caps import CapsMemo, CapsOf, SessionBudget, session_budget
from costboard.budgets.engine import Flag, Ledger, budget_decide
from costboard.budgets.period_ledgers import (
    SpendBatch,
    period_budgets_apply,
    project_budgets,
    stopping_budgets,
)
from costboard.budgets.periods import StepScope, member_days, per_member, period_budget_view
from costboard.budgets.services import budget_events_of
from costboard.hooks import Ingested, after_ingest_run
from costboard.ingest.latency import latency_bucket
from costboard.ingest.schemas import Event, SessionEvent, StepEvent, TurnEvent
from costboard.ingest.turn_rules import TurnStreaks, step_signature, turn_check
from costboard.models import (
    SYSTEM_SESSION_ID,
    TOOL_MODEL,
    BudgetEvent,
    DailyRollup,
    EventReceipt,
    IngestTally,
    LatencyRollup,
    PeriodBudget,
    PeriodLedger,
    Project,
    Session,
    SessionModelUsage,
    Step,
    StepReceipt,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from costboard.money import pico_usd
from costboard.partitions import step_partitions_cover
from costboard.pricing.families import is_tool_model, model_family, price_families
from costboard.pricing.rates import UNPRICED_PICO, RateTable, rate_table

ZERO = Decimal(0)

SESSION_TABLE = Session._meta.db_table
TURN_TABLE = Turn._meta.db_table
STEP_TABLE = Step._meta.db_table
ROLLUP_TABLE = DailyRollup._meta.db_table
USER_ROLLUP_TABLE = UserDailyRollup._meta.db_table
TAG_ROLLUP_TABLE = TagDailyRollup._meta.db_table
RECEIPT_TABLE = EventReceipt._meta.db_table
STEP_RECEIPT_TABLE = StepReceipt._meta.db_table
MODEL_USAGE_TABLE = SessionModelUsage._meta.db_table
LATENCY_TABLE = LatencyRollup._meta.db_table
TALLY_TABLE = IngestTally._meta.db_table


@dataclass
class IngestResult:
    accepted: int
    duplicates: int
    sessions: dict[str, SessionBudget]
    budget_events: list[BudgetEvent] = field(default_factory=list)
    # the period budgets the batch touched, each in the period it touched (`<period budget>`)
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # touched sessions left out of `sessions` because they may go on (flagged_only)
    sessions_ok: int = 0


Column = tuple[str, str]  # a name and its PostgreSQL type


@dataclass(slots=True)
class _Step:
    session_key: str
    turn_no: int | None
    event_id: str | None
    ts: datetime
    day: date  # UTC: the day of its rollups
    step_type: str
    model: str
    family: str  # what pages group it under
    provider: str
    duration_ms: int | None
    success: bool
    error: str
    metadata: dict[str, Any] | None
    tags: dict[str, str] | None  # its own; its session's are merged under them at insert
    price_id: int | None
    cache_creation_1h_input_tokens: int
    # What the step adds to its turn, session and rollups, in _Totals' field order: tokens,
    # then USD in pico-dollars (exact ints: sums are int additions), errors, unpriced, ms.
    counts: tuple[int, ...]
    context_window: int | None  # of its model, from the rate table (context pressure)
    sig: int  # what makes two steps of a turn "the same step" (turn_rules); 0 outside turns

    @property
    def prompt_tokens(self) -> int:
        """The prompt's size: input, cache reads and cache writes."""
        return self.counts[0] + self.counts[2] + self.counts[3]

    @property
    def cost_pico(self) -> int:
        return self.counts[9]

    # what the budget engine reads of a spend (only to time a crossing: sums come summed)
    @property
    def at(self) -> datetime:
        return self.ts

    @property
    def tokens(self) -> int:
        """Tokens used: input + output."""
        return self.counts[0] + self.counts[1]

    @property
    def cost_usd(self) -> Decimal:
        return pico_usd(self.counts[9])


@dataclass(slots=True)
class _Totals:
    """Sums of a group of steps (USD in pico-dollars)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_input_pico: int = 0
    cost_output_pico: int = 0
    cost_cache_read_pico: int = 0
    cost_cache_write_pico: int = 0
    cost_pico: int = 0
    errors: int = 0
    unpriced: int = 0
    duration_ms: int = 0
    steps: int = 0

    @classmethod
    def of(cls, steps: list[_Step]) -> _Totals:
        totals = cls(*_sums(steps))
        totals.steps = len(steps)
        return totals

    def usage_values(self, sql: _Dialect) -> Sequence[Any]:
        return sql.usage(
            (
                self.input_tokens,
                self.output_tokens,
                self.cache_read_input_tokens,
                self.cache_creation_input_tokens,
                self.reasoning_tokens,
                self.cost_input_pico,
                self.cost_output_pico,
                self.cost_cache_read_pico,
                self.cost_cache_write_pico,
                self.cost_pico,
            )
        )


_NO_COUNTS = (0,) * 13


def _sums(steps: Sequence[_Step]) -> tuple[int, ...]:
    """The column sums of these steps' counts, in _Step.counts' order (zip and sum run in C: a
    fraction of adding step by step). A session's or a turn's share of a wide batch, most of
    them one step, is read as this tuple, with no _Totals built for each."""
    if len(steps) == 1:
        return steps[0].counts
    if not steps:
        return _NO_COUNTS
    return tuple(map(sum, zip(*(s.counts for s in steps), strict=True)))


# A column of USD amounts sent as pico-dollar ints (str() of an int is the cheapest exact
# text there is) and scaled to dollars in SQL: numeric × 10⁻¹² is exact.
USD_PICO = "usd_pico"
_PICO_USD = "0.000000000001"
_ARRAY_TYPE = {USD_PICO: "numeric"}

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
USAGE_TYPES = ["bigint"] * 5 + [USD_PICO] * 5
USAGE: list[Column] = list(zip(USAGE_COLUMNS, USAGE_TYPES, strict=True))


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
    tags: dict[str, str] | None = None
    event_at: datetime | None = None


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
        """`WITH v (…) AS (…)` over these rows, and its parameters. On PostgreSQL one typed
        array per column, unnested: the SQL text is the same whatever the number of rows."""
        names = ", ".join(name for name, _ in columns)
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
                f"{name} * {_PICO_USD}" if sql_type == USD_PICO else name
                for name, sql_type in columns
            )
            return (
                f"WITH v ({names}) AS (SELECT {values} FROM unnest({arrays}) AS u ({names}))",
                params,
            )
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        params = [value for values in rows for value in values]
        return f"WITH v ({names}) AS (VALUES {', '.join([row] * len(rows))})", params

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
        """The USAGE columns' parameters of _sums: as they are on PostgreSQL (the money in
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


def _json_default(value: Any) -> Any:
    # JSON fractions are parsed as Decimal (exact money); in metadata they stay numbers.
    return float(value) if isinstance(value, Decimal) else str(value)


def _json(value: Any) -> str | None:
    return (
        None if value is None else json.dumps(value, default=_json_default, separators=(",", ":"))
    )


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
    rate-table check). The hottest loop of ingest: kept flat on purpose."""
    table = rate_table()
    families = price_families(table.rates, key=table)
    sessions: dict[str, _SessionTouch] = {}
    turns: dict[tuple[str, int], _TurnTouch] = {}
    steps: list[_Step] = []
    others: list[SessionEvent | TurnEvent] = []
    seen_ids: set[str] = set()
    duplicates = 0

    for event in events:
        if event.event_id is not None:
            if event.event_id in seen_ids:
                duplicates += 1
                continue
            seen_ids.add(event.event_id)
        ts = _utc_at(event, now)
        if isinstance(event, StepEvent):
            key = event.session_id or SYSTEM_SESSION_ID
            _touch_session(sessions, key, ts)
            if event.turn is not None:
                _touch_turn(turns, key, event.turn, ts)
            steps.append(_step(event, key, ts, table, families))
        elif isinstance(event, TurnEvent):
            _touch_session(sessions, event.session_id, ts)
            _touch_turn(turns, event.session_id, event.turn, ts)
            others.append(event)
        else:
            _touch_session(sessions, event.session_id, ts)
            if event.parent_session_id:
                _touch_session(sessions, event.parent_session_id, ts)
            others.append(event)
    return sessions, turns, steps, others, duplicates


def _utc_at(event: Event, now: datetime) -> datetime:
    """When the event happened, in UTC: the day of its rollups and its month partition, and
    the time psycopg sends cheapest (a parsed offset's tzinfo is asked for its offset value
    by value, in Python)."""
    ts = event.at(now)
    return ts if ts.tzinfo is UTC else ts.astimezone(UTC)


def _touch_session(sessions: dict[str, _SessionTouch], key: str, ts: datetime) -> None:
    touch = sessions.get(key)
    if touch is None:
        sessions[key] = _SessionTouch(key, ts, ts)
    elif ts < touch.first:
        touch.first = ts
    elif ts > touch.last:
        touch.last = ts


def _touch_turn(
    turns: dict[tuple[str, int], _TurnTouch], key: str, number: int, ts: datetime
) -> None:
    touch = turns.get((key, number))
    if touch is None:
        turns[(key, number)] = _TurnTouch(key, number, ts, ts)
    elif ts < touch.first:
        touch.first = ts
    elif ts > touch.last:
        touch.last = ts


def _step(
    event: StepEvent, key: str, ts: datetime, table: RateTable, families: dict[int, str]
) -> _Step:
    if event.usage is None:  # the common case: the token fields as sent
        inp = event.input_tokens or 0
        out = event.output_tokens or 0
        read = event.cache_read_input_tokens or 0
        write = event.cache_creation_input_tokens or 0
        write_1h = 0
        reasoning = event.reasoning_tokens or 0
    else:
        t = event.tokens()
        inp, out, read = t.input_tokens, t.output_tokens, t.cache_read_input_tokens
        write, write_1h = t.cache_creation_input_tokens, t.cache_creation_1h_input_tokens
        reasoning = t.reasoning_tokens
    provider = event.provider or ""
    if is_tool_model(event.model):  # a tool call or a retrieval: $0 by nature, not unpriced
        price_id, c_in, c_out, c_read, c_write = UNPRICED_PICO
        family, unpriced = TOOL_MODEL, False
    else:
        price_id, c_in, c_out, c_read, c_write = table.price_pico(
            event.model, provider, ts, inp, out, read, write, write_1h
        )
        if price_id is None:
            family, unpriced = model_family(event.model), True
        else:
            family, unpriced = families[price_id], False
    duration = None if event.duration_ms is None else round(event.duration_ms)
    window = sig = None
    if event.turn is not None:
        window = table.windows.get(price_id) if price_id is not None else None
        sig = step_signature(event.step_type, event.model, inp + read + write)
    counts = (
        inp,
        out,
        read,
        write,
        reasoning,
        c_in,
        c_out,
        c_read,
        c_write,
        c_in + c_out + c_read + c_write,
        0 if event.success else 1,  # counts, summed as ints (errors, unpriced)
        1 if unpriced else 0,
        duration or 0,
    )
    return _Step(
        key,
        event.turn,
        event.event_id,
        ts,
        ts.date(),  # in UTC (_plan)
        event.step_type,
        event.model,
        family,
        provider,
        duration,
        event.success,
        event.error or "",
        event.metadata,
        event.tags,
        price_id,
        write_1h,
        counts,
        window,
        sig or 0,
    )


def step_months_ready(events: Sequence[Event], now: datetime) -> None:
    """Make the month partitions these events' steps go to (PostgreSQL), each in a
    transaction of its own. events_ingest does this itself before its transaction; a caller
    that holds a batch in a transaction of its own (an Idempotency-Key's, a whole OTLP
    request's) calls this first, with the `now` it then gives events_ingest. Made inside the
    caller's transaction, a partition's locks would be held to its end: a batch of the same
    sessions would lock them and wait on the new partition, and this one then on them — a
    deadlock, one of the two lost."""
    if connection.vendor != "postgresql":
        return
    days = {_utc_at(event, now).date() for event in events if isinstance(event, StepEvent)}
    if days:
        step_partitions_cover(days=days, now=now)


def events_ingest(
    *,
    project: Project,
    events: list[Event],
    now: datetime | None = None,
    key_prefix: str = "",
    flagged_only: bool = False,
) -> IngestResult:
    """Store a validated batch all or nothing; see the module docstring for the statements.
    `key_prefix`: the API key that sent it (its api_key budgets count it). `flagged_only`:
    answer only for the touched sessions that are not ok (`Prefer: return=minimal`), the
    others counted in `sessions_ok`."""
    now = now or timezone.now()
    budgets_above = project_budgets(project)
    sessions, turns, steps, others, duplicates = _plan(events, now, project)
    sql = _Dialect()
    hot = _hot_statements(sql, project, steps)
    if steps and sql.postgres:
        step_partitions_cover(days={step.day for step in steps}, now=now)

    with transaction.atomic(), sql.cursor() as cursor:
        ingest_settings(cursor)
        rows, sessions_made = _sessions_lock(cursor, sql, project, sessions)
        accepted_others, dup_others = _receipts_insert(cursor, sql, project, others, now)
        duplicates += dup_others
        _apply_other_events(accepted_others, sessions, turns, now)
        session_ids = {key: row["id"] for key, row in rows.items()}
        session_tags = _session_tags(rows, sessions)
        turns_now = _turns_ensure(cursor, sql, project, session_ids, turns)
        turn_ids = {key: turn.id for key, turn in turns_now.items()}
        inserted = _steps_insert(cursor, sql, project, session_ids, turn_ids, steps, session_tags)
        if len(inserted) < len(steps):
            duplicates += len(steps) - len(inserted)
            hot = _hot_statements(sql, project, inserted)
        runaways = _turns_update(cursor, sql, project, session_ids, turns_now, turns, inserted)
        new_turns = Counter(turn.session_key for turn in turns_now.values() if turn.new)
        caps_of = CapsMemo(project)
        crossings, touched = _sessions_update(
            cursor, sql, project, rows, sessions, inserted, now, runaways, caps_of, new_turns
        )
        budget_events = BudgetEvent.objects.bulk_create(crossings) if crossings else []
        announce(budget_events)
        after_ingest_run(Ingested(project, _turns_with_text(accepted_others, turn_ids)))
        _model_usage_upsert(cursor, sql, project, session_ids, inserted)
        users = _users_of(rows, sessions)
        hot += _attribution_statements(sql, project, inserted, users, session_tags)
        accepted = len(others) - dup_others + len(inserted)
        hot.append(_tally_statement(sql, project, now, accepted, duplicates, sessions_made))
        for statement, params in hot:
            cursor.execute(statement, params)
        # last: the ledger rows a project's batches share are held only until the commit
        periods = period_budgets_apply(
            project=project,
            budgets=budgets_above,
            batch=SpendBatch(
                steps=inserted,
                key_prefix=key_prefix,
                user_of=users,
                tags_of=lambda step: step_tags(step, session_tags),
            ),
            now=now,
        )
        announce(periods.events)
    stopped = _stopped_sessions(
        periods.stopped,
        budgets_above,
        _stepless(touched, inserted),
        users,
        session_tags,
        key_prefix,
        now,
    )
    answered = [
        s
        for s in touched
        if not flagged_only or s.state != Session.State.OK or s.runaway or s.external_id in stopped
    ]
    budgets = {
        s.external_id: session_budget(
            s, project, stopped_by_budget=stopped.get(s.external_id), caps_of=caps_of
        )
        for s in answered
    }

    return IngestResult(
        accepted=accepted,
        duplicates=duplicates,
        sessions=dict(sorted(budgets.items())),
        budget_events=[*budget_events, *periods.events],
        budgets=_period_views(periods.ledgers, now),
        sessions_ok=len(touched) - len(budgets),
    )


def ingest_settings(cursor: Any) -> None:
    """Settings of an ingest transaction (SET LOCAL: they end with it), in one round trip
    (PostgreSQL; nothing on SQLite).

    Every row ingest reads or writes it finds by key, a few hundred at most, in pages a busy
    server holds in memory: each join is index probes for the batch's keys. Left to its
    estimates (stale where autovacuum lags, as it does on a growing table), the planner hash-
    or merge-joins a whole table instead: a sequential scan of every session, or every turn
    in key order, per batch, growing with the table (13 ms of a 500-session batch at 11k
    turns).

    A statement running past COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS (a lock another
    transaction holds too long, a plan gone wrong) is cancelled: the transaction rolls back,
    nothing of it stored, and the API answers 503 with Retry-After (costboard/api/failures.py:
    SQLSTATE 57014 is class 57)."""
    if connection.vendor != "postgresql":
        return
    cursor.execute(_INGEST_SETTINGS, [str(settings.COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS)])


_INGEST_SETTINGS = (
    "SELECT set_config('enable_hashjoin', 'off', true),"
    " set_config('enable_mergejoin', 'off', true),"
    " set_config('random_page_cost', '1.1', true),"
    " set_config('statement_timeout', %s, true)"
)


def _period_views(
    ledgers: list[tuple[PeriodBudget, PeriodLedger]], now: datetime
) -> dict[str, dict[str, Any]]:
    """`<period budget>` of each budget the batch touched, with its forecast (one query),
    keyed by id; a per-member budget of which the batch touched several members, each of
    them by "<id>:<member>"."""
    if not ledgers:
        return {}
    days = member_days([(budget.pk, ledger.member) for budget, ledger in ledgers], now)
    members = Counter(pk for pk, _ in {(b.pk, ledger.member) for b, ledger in ledgers})
    views = {}
    for budget, ledger in ledgers:
        several = per_member(budget) and members[budget.pk] > 1
        key = f"{budget.pk}:{ledger.member}" if several else str(budget.pk)
        views[key] = period_budget_view(
            budget, ledger, now=now, days=days[(budget.pk, ledger.member)]
        )
    return views


def _stepless(touched: list[_SessionNow], steps: list[_Step]) -> list[_SessionNow]:
    """The touched sessions none of these steps belongs to."""
    with_steps = {step.session_key for step in steps}
    return [s for s in touched if s.external_id not in with_steps]


def _stopped_sessions(
    by_steps: dict[str, int],
    budgets_above: list[PeriodBudget],
    stepless: list[_SessionNow],
    users: dict[str, str],
    session_tags: dict[str, dict[str, str]],
    key_prefix: str,
    now: datetime,
) -> dict[str, int]:
    """Each touched session an exhausted stop-budget covers → that budget: those whose steps
    counted toward it (decided in the periods their steps fall in), and `stepless`, the
    sessions touched by a session or turn event alone, by the budgets' current periods (they
    are told to stop too)."""
    stopped = dict(by_steps)
    if not stepless or not budgets_above:
        return stopped
    scopes = {
        s.external_id: StepScope(
            user_id=users.get(s.external_id, ""),
            key_prefix=key_prefix,
            tags=session_tags.get(s.external_id),
        )
        for s in stepless
    }
    stopped.update(stopping_budgets(budgets_above, scopes, now))
    return stopped


def _users_of(
    rows: dict[str, dict[str, Any]], sessions: dict[str, _SessionTouch]
) -> dict[str, str]:
    """Each touched session's end user as it stands after this batch ("" for none)."""
    return {
        key: touch.user_id if touch.user_id is not None else rows[key]["user_id"]
        for key, touch in sessions.items()
    }


def _session_tags(
    rows: dict[str, dict[str, Any]], sessions: dict[str, _SessionTouch]
) -> dict[str, dict[str, str]]:
    """Each touched session's tags after this batch's session events (theirs merged over the
    stored ones): what its steps carry, under their own."""
    tags = {}
    for key, row in rows.items():
        given = sessions[key].tags
        merged = {**row["tags"], **given} if given else row["tags"]
        if merged:
            tags[key] = merged
    return tags


def step_tags(step: _Step, session_tags: dict[str, dict[str, str]]) -> dict[str, str] | None:
    """A step's tags: its session's, its own merged over them; None when it has none."""
    inherited = session_tags.get(step.session_key)
    if not step.tags:
        return inherited or None
    return {**inherited, **step.tags} if inherited else step.tags


def _turns_with_text(
    events: list[SessionEvent | TurnEvent], turn_ids: dict[tuple[str, int], int]
) -> list[int]:
    """The turns whose text arrived in this batch (for memory detection, after commit)."""
    return sorted(
        {
            turn_ids[(event.session_id, event.turn)]
            for event in events
            if isinstance(event, TurnEvent) and (event.user_message or event.assistant_response)
        }
    )


def _sessions_lock(
    cursor: Any, sql: _Dialect, project: Project, sessions: dict[str, _SessionTouch]
) -> tuple[dict[str, dict[str, Any]], int]:
    """Create the missing sessions, lock all touched ones and return their current state (and
    how many this batch made: another batch may have made some by now): an insert that skips
    the existing ones, then a locking read. A session is written once a
    batch, by _sessions_update (an upsert here would write every row twice, with an entry in
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
    cursor: Any, sql: _Dialect, project: Project, ordered: list[_SessionTouch]
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
    cursor: Any, sql: _Dialect, project: Project, keys: list[str]
) -> dict[str, dict[str, Any]]:
    """These sessions, locked in key order, as _sessions_lock returns them."""
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
    with_v, params = sql.rows([("event_id", "text")], [[event_id] for event_id in ids])
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {RECEIPT_TABLE} (project_id, event_id, received_at)
        SELECT %s, v.event_id, %s FROM v WHERE true
        ON CONFLICT (project_id, event_id) DO NOTHING
        RETURNING event_id
        """,
        [*params, project.pk, sql.dt(now)],
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
        ts = _utc_at(event, now)
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
        if event.tags is not None:
            touch.tags = {**(touch.tags or {}), **event.tags}


@dataclass(slots=True)
class _TurnNow:
    """A turn as it stood before the batch (a new one: as made, empty)."""

    id: int
    session_key: str
    number: int
    step_count: int
    streaks: TurnStreaks
    new: bool = False


def _turns_ensure(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    session_ids: dict[str, int],
    turns: dict[tuple[str, int], _TurnTouch],
) -> dict[tuple[str, int], _TurnNow]:
    """The touched turns as they stand: a read; the missing ones get ids reserved (their
    steps carry them), and _turns_update inserts them after the steps with their final
    values, so a new turn is written once. Their sessions are locked (_sessions_lock), and
    every writer of a turn holds its session's lock, so no other batch makes or changes them
    meanwhile; _turns_update writes each once."""
    if not turns:
        return {}
    by_id = {v: k for k, v in session_ids.items()}
    ordered = sorted(turns.values(), key=lambda t: (session_ids[t.session_key], t.number))
    with_v, params = sql.rows(
        [("session_id", "bigint"), ("number", "integer")],
        [[session_ids[t.session_key], t.number] for t in ordered],
    )
    cursor.execute(
        f"""
        {with_v}
        SELECT t.id, t.session_id, t.number, t.step_count,
               t.fail_streak, t.fail_peak, t.repeat_sig, t.repeat_streak, t.repeat_peak
        FROM {TURN_TABLE} t JOIN v ON t.session_id = v.session_id AND t.number = v.number
        """,
        params,
    )
    result: dict[tuple[str, int], _TurnNow] = {}
    for id_, session_id, number, step_count, *streaks in cursor.fetchall():
        key = by_id[session_id]
        result[(key, number)] = _TurnNow(id_, key, number, step_count, TurnStreaks(*streaks))
    missing = [t for t in ordered if (t.session_key, t.number) not in result]
    if missing:
        for touch, id_ in zip(
            missing, sql.ids_reserve(cursor, TURN_TABLE, len(missing)), strict=True
        ):
            result[(touch.session_key, touch.number)] = _TurnNow(
                id_, touch.session_key, touch.number, 0, TurnStreaks(), new=True
            )
    return result


_STEP_COLUMNS: list[Column] = [
    ("session_id", "bigint"),
    ("turn_id", "bigint"),
    ("event_id", "text"),
    ('"timestamp"', "timestamptz"),
    ("step_type", "text"),
    ("model", "text"),
    ("family", "text"),
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
    ("tags", "text"),
    ("price_id", "bigint"),
    ("cost_input_usd", USD_PICO),
    ("cost_output_usd", USD_PICO),
    ("cost_cache_read_usd", USD_PICO),
    ("cost_cache_write_usd", USD_PICO),
    ("cost_usd", USD_PICO),
]
STEP_COLUMN_NAMES = [name for name, _ in _STEP_COLUMNS]


def _step_values(
    step: _Step,
    session_ids: dict[str, int],
    turn_ids: dict[tuple[str, int], int],
    sql: _Dialect,
    session_tags: dict[str, dict[str, str]],
) -> list[Any]:
    inp, out, read, write, reasoning, c_in, c_out, c_read, c_write, c_total = step.counts[:10]
    money = sql.money
    return [
        session_ids[step.session_key],
        None if step.turn_no is None else turn_ids[(step.session_key, step.turn_no)],
        step.event_id,
        sql.dt(step.ts),
        step.step_type,
        step.model,
        step.family,
        step.provider,
        inp,
        out,
        read,
        write,
        step.cache_creation_1h_input_tokens,
        reasoning,
        step.duration_ms,
        step.success,
        step.error,
        _json(step.metadata),
        _json(step_tags(step, session_tags)),
        step.price_id,
        money(c_in),
        money(c_out),
        money(c_read),
        money(c_write),
        money(c_total),
    ]


def _steps_insert(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    session_ids: dict[str, int],
    turn_ids: dict[tuple[str, int], int],
    steps: list[_Step],
    session_tags: dict[str, dict[str, str]],
) -> list[_Step]:
    """Insert the steps, each with its tags (step_tags); return those stored (a replayed
    event_id is not: its receipt is already there, in whatever month its step is)."""
    if not steps:
        return []
    # Same order in every transaction, so two batches sharing event_ids cannot deadlock.
    steps = sorted(steps, key=lambda s: (s.event_id is None, s.event_id or ""))
    steps = _step_receipts_insert(cursor, sql, project, steps)
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
            [_step_values(s, session_ids, turn_ids, sql, session_tags) for s in steps],
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
        [[project.pk, *_step_values(s, session_ids, turn_ids, sql, session_tags)] for s in steps],
    )
    return steps


def _step_receipts_insert(
    cursor: Any, sql: _Dialect, project: Project, steps: list[_Step]
) -> list[_Step]:
    """Record the event_ids of these steps (sorted by event_id, those without one last);
    return the steps whose event_id was not seen before in the project, in any month.

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
        SELECT %s, v.event_id, v."timestamp" FROM v WHERE true
        ON CONFLICT (project_id, event_id) DO NOTHING
        RETURNING event_id
        """,
        [*params, project.pk],
    )
    if sql.postgres and cursor.rowcount == len(ids):
        return steps  # all new: no need to read which (SQLite inserts as they are read)
    fresh = {row[0] for row in cursor.fetchall()}
    return [s for s in steps if s.event_id is None or s.event_id in fresh]


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


def _sessions_update(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    rows: dict[str, dict[str, Any]],
    sessions: dict[str, _SessionTouch],
    inserted: list[_Step],
    now: datetime,
    runaways: dict[str, Flag],
    caps_of: CapsOf,
    new_turns: dict[str, int],
) -> tuple[list[BudgetEvent], list[_SessionNow]]:
    """Add the steps' sums (and `new_turns`, the turns the batch made, by session) to each
    touched session, and apply what the budget engine decides of its budget (its state,
    crossings and runaway flag): the session's one write of the batch. Return the crossings
    to record and the sessions as they now are (for their budgets).

    The rows were locked by _sessions_lock, so the ledger read there is current: the engine's
    outcome is written as it is, and each crossing is decided exactly once.
    """
    if not sessions:
        return [], []
    by_session: dict[str, list[_Step]] = defaultdict(list)
    for step in inserted:
        by_session[step.session_key].append(step)

    values: list[list[Any]] = []
    crossings: list[BudgetEvent] = []

    for key in sorted(sessions):
        touch = sessions[key]
        row = rows[key]
        new_steps = by_session.get(key, [])
        counted = _sums(new_steps)
        token_cap = touch.token_cap if touch.token_cap is not None else row["token_cap"]
        cost_cap = touch.cost_cap_usd if touch.cost_cap_usd is not None else row["cost_cap_usd"]
        system = key == SYSTEM_SESSION_ID
        caps = caps_of(token_cap, cost_cap, system)
        old_caps = None
        if row["tokens_used"] or row["cost_usd"]:  # caps given before any usage: no change
            old_caps = caps_of(row["token_cap"], row["cost_cap_usd"], system)
        outcome = budget_decide(
            ledger=Ledger(
                tokens_used=row["tokens_used"],
                cost_usd=row["cost_usd"],
                state=row["state"],
                warned_at=row["warned_at"],
                exhausted_at=row["exhausted_at"],
                runaway_at=row["runaway_at"],
                runaway_reason=row["runaway_reason"],
                acknowledged_at=row["acknowledged_at"],
            ),
            limits=caps,
            old_limits=old_caps,
            spends=new_steps,
            added=(counted[0] + counted[1], pico_usd(counted[9])),
            flag=runaways.get(key),
            # a crossing no step caused (a cap given in this batch): the session event's time
            at=touch.event_at or now,
            stops_runaways=project.runaway_stops,
        )
        crossings += budget_events_of(
            outcome.crossings, project=project, session_id=row["id"], caps=caps
        )
        after = outcome.ledger

        metadata = tags = None
        if touch.metadata is not None:
            metadata = _json({**row["metadata"], **touch.metadata})
        if touch.tags is not None:
            tags = _json({**row["tags"], **touch.tags})
        families = None
        known = row["families"]
        if any(step.family not in known for step in new_steps):
            met = {step.family: True for step in new_steps}
            families = _json(dict(sorted({**known, **met}.items())))
        parent_id = None
        if touch.parent_key is not None and touch.parent_key != key:
            parent_id = rows[touch.parent_key]["id"]

        values.append(
            [
                row["id"],
                sql.dt(touch.first),
                sql.dt(touch.last),
                *sql.usage(counted),
                len(new_steps),
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
            started_at = {sql.least}({SESSION_TABLE}.started_at, v.started_at),
            last_active_at = {sql.greatest}({SESSION_TABLE}.last_active_at, v.last_active_at),
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
    return crossings, _sessions_read(cursor.fetchall())


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
class _SessionNow:
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


def _sessions_read(rows: list[tuple[Any, ...]]) -> list[_SessionNow]:
    """Raw rows of _BUDGET_FIELDS as _SessionNow: PostgreSQL's come typed; SQLite's are
    converted as the ORM would (it returns text times and float amounts)."""
    if connection.vendor == "postgresql":
        return [_SessionNow(*row) for row in rows]
    readers = []
    for name in _BUDGET_FIELDS:
        model_field = Session._meta.get_field(name)
        assert isinstance(model_field, Field)
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
        sessions.append(_SessionNow(**values))
    return sessions


def _turns_update(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    session_ids: dict[str, int],
    turns_now: dict[tuple[str, int], _TurnNow],
    turns: dict[tuple[str, int], _TurnTouch],
    inserted: list[_Step],
) -> dict[str, Flag]:
    """Each touched turn's one write of the batch: its times, its messages and context, the
    sums of its inserted steps (a replay refused by the insert is not among them), the
    largest prompt (context pressure), and its retry-loop streaks advanced over those steps;
    an update of those that existed, an insert of the new ones (their ids reserved by
    _turns_ensure). Returns the per-turn runaway rules broken, by session key (the first
    turn's, in turn order)."""
    if not turns_now:
        return {}
    new_steps: dict[tuple[str, int], list[_Step]] = defaultdict(list)
    for step in inserted:
        if step.turn_no is not None:
            new_steps[(step.session_key, step.turn_no)].append(step)
    flags: dict[str, Flag] = {}
    values = []
    new_values = []
    for key in sorted(turns_now, key=lambda k: turns_now[k].id):
        turn, touch = turns_now[key], turns[key]
        added = new_steps.get(key, [])
        streaks = turn.streaks
        largest = None
        if added:
            if len(added) > 1:
                added.sort(key=_BY_TS)
            streaks, flag = turn_check(project, turn.number, streaks, added, turn.step_count)
            if flag is not None and turn.session_key not in flags:
                flags[turn.session_key] = flag
            largest = added[0] if len(added) == 1 else max(added, key=_BY_PROMPT)
        counted = _sums(added)
        row = [
            turn.id,
            sql.dt(touch.first),
            sql.dt(touch.last),
            touch.user_message,
            touch.assistant_response,
            _json(touch.context),
            *sql.usage(counted),
            len(added),
            counted[10],
            largest.prompt_tokens if largest else 0,
            largest.context_window if largest else None,
            streaks.fail_streak,
            streaks.fail_peak,
            streaks.repeat_sig,
            streaks.repeat_streak,
            streaks.repeat_peak,
        ]
        if turn.new:
            new_values.append([*row, session_ids[turn.session_key], turn.number])
        else:
            values.append(row)
    if new_values:
        _turns_insert(cursor, sql, project, new_values)
    if values:
        _turns_write(cursor, sql, values)
    return flags


def _turns_insert(cursor: Any, sql: _Dialect, project: Project, values: list[list[Any]]) -> None:
    """Insert the batch's new turns as _turns_update would leave them had they been made
    empty first: rows of _TURN_UPDATE_COLUMNS, then the session id and the number."""
    with_v, params = sql.rows(
        [*_TURN_UPDATE_COLUMNS, ("session_id", "bigint"), ("number", "integer")], values
    )
    usage = ", ".join(USAGE_COLUMNS)
    streaks = ", ".join(_STREAK_COLUMNS)
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {TURN_TABLE} (id, project_id, session_id, number, started_at, last_active_at,
                                  user_message, assistant_response, context, {usage},
                                  step_count, error_count, context_tokens, context_window,
                                  {streaks})
        SELECT v.id, %s, v.session_id, v.number, v.started_at, v.last_active_at,
               COALESCE(v.user_message, ''), COALESCE(v.assistant_response, ''),
               {sql.jsonb("v.context")}, {usage}, v.d_steps, v.d_errors, v.context_tokens,
               CASE WHEN v.context_tokens > 0 THEN v.context_window END, {streaks}
        FROM v WHERE true
        """,
        [*params, project.pk],
    )


def _turns_write(cursor: Any, sql: _Dialect, values: list[list[Any]]) -> None:
    """Update the batch's turns that existed: rows of _TURN_UPDATE_COLUMNS."""
    with_v, params = sql.rows(_TURN_UPDATE_COLUMNS, values)
    sums = ",\n".join(f"{c} = {TURN_TABLE}.{c} + v.{c}" for c in USAGE_COLUMNS)
    streak_columns = ",\n".join(f"{c} = v.{c}" for c in _STREAK_COLUMNS)
    # user_message and assistant_response are '' or NULL when not given: keep what is stored.
    cursor.execute(
        f"""
        {with_v}
        UPDATE {TURN_TABLE} SET
            started_at = {sql.least}({TURN_TABLE}.started_at, v.started_at),
            last_active_at = {sql.greatest}({TURN_TABLE}.last_active_at, v.last_active_at),
            user_message = COALESCE(NULLIF(v.user_message, ''), {TURN_TABLE}.user_message),
            assistant_response = COALESCE(NULLIF(v.assistant_response, ''),
                                          {TURN_TABLE}.assistant_response),
            context = COALESCE({sql.jsonb("v.context")}, {TURN_TABLE}.context),
            context_window = CASE WHEN v.context_tokens > {TURN_TABLE}.context_tokens
                                  THEN v.context_window
                                  ELSE {TURN_TABLE}.context_window END,
            context_tokens = {sql.greatest}({TURN_TABLE}.context_tokens, v.context_tokens),
            {sums},
            step_count = {TURN_TABLE}.step_count + v.d_steps,
            error_count = {TURN_TABLE}.error_count + v.d_errors,
            {streak_columns}
        FROM v
        WHERE {TURN_TABLE}.id = v.id
        """,
        params,
    )


_BY_TS = attrgetter("ts")
_BY_PROMPT = attrgetter("prompt_tokens")
_STREAK_COLUMNS = ["fail_streak", "fail_peak", "repeat_sig", "repeat_streak", "repeat_peak"]
_TURN_UPDATE_COLUMNS: list[Column] = [
    ("id", "bigint"),
    ("started_at", "timestamptz"),
    ("last_active_at", "timestamptz"),
    ("user_message", "text"),
    ("assistant_response", "text"),
    ("context", "text"),
    *USAGE,
    ("d_steps", "integer"),
    ("d_errors", "integer"),
    ("context_tokens", "bigint"),
    ("context_window", "integer"),
    ("fail_streak", "integer"),
    ("fail_peak", "integer"),
    ("repeat_sig", "bigint"),
    ("repeat_streak", "integer"),
    ("repeat_peak", "integer"),
]


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


Statement = tuple[str, list[Any]]


def _hot_statements(sql: _Dialect, project: Project, steps: list[_Step]) -> list[Statement]:
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


def _attribution_statements(
    sql: _Dialect,
    project: Project,
    steps: list[_Step],
    users: dict[str, str],
    session_tags: dict[str, dict[str, str]],
) -> list[Statement]:
    """The per-user and per-tag daily rollup upserts of these steps (run with the other hot
    statements, last): each step under its session's user and under each of its tags."""
    by_user: dict[tuple[date, str], list[_Step]] = defaultdict(list)
    by_tag: dict[tuple[date, str, str], list[_Step]] = defaultdict(list)
    for step in steps:
        by_user[(step.day, users.get(step.session_key) or "")].append(step)
        tags = step_tags(step, session_tags)
        if tags:
            for key, value in tags.items():
                by_tag[(step.day, key, value)].append(step)
    statements = []
    for table, columns, conflict, groups in (
        (USER_ROLLUP_TABLE, _USER_ROLLUP_COLUMNS, "project_id, day, user_id", by_user),
        (TAG_ROLLUP_TABLE, _TAG_ROLLUP_COLUMNS, "project_id, day, key, value", by_tag),
    ):
        if not groups:
            continue
        keys = len(columns) - len(USAGE) - 1
        with_v, params = sql.rows(
            columns,
            [
                [
                    *(sql.day(part) if isinstance(part, date) else part for part in key),
                    *(totals := _Totals.of(group)).usage_values(sql),
                    totals.steps,
                ]
                for key, group in sorted(groups.items())
            ],
        )
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
    return statements


def _rollups_statement(sql: _Dialect, project: Project, steps: list[_Step]) -> Statement | None:
    groups: dict[tuple[date, str, str, str], list[_Step]] = defaultdict(list)
    for step in steps:
        groups[(step.day, step.family, step.model, step.step_type)].append(step)
    if not groups:
        return None
    sums = {key: _Totals.of(steps) for key, steps in groups.items()}
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


def _model_usage_upsert(
    cursor: Any,
    sql: _Dialect,
    project: Project,
    session_ids: dict[str, int],
    inserted: list[_Step],
) -> None:
    """Add the inserted steps to their session's row per family and model (its sessions are
    locked)."""
    groups: dict[tuple[int, str, str], list[int]] = {}
    for step in inserted:
        key = (session_ids[step.session_key], step.family, step.model)
        group = groups.get(key)
        if group is None:
            groups[key] = [1, step.tokens, step.cost_pico]
        else:
            group[0] += 1
            group[1] += step.tokens
            group[2] += step.cost_pico
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


@lru_cache(maxsize=65_536)
def _bucket(duration_ms: int) -> int:
    return latency_bucket(duration_ms)  # durations repeat: a lookup, not a log10, per step


def _latency_statement(sql: _Dialect, project: Project, steps: list[_Step]) -> Statement | None:
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


def _tally_statement(
    sql: _Dialect,
    project: Project,
    now: datetime,
    accepted: int,
    duplicates: int,
    sessions_made: int,
) -> Statement:
    """Add the batch's events (/metrics) and the sessions it made (the project's count of
    sessions) to the project's tally of the day, in SQL so concurrent batches lose no count; in
    ingest's transaction, so a batch rolled back (a whole OTLP request, an idempotent retry
    racing its twin) is not counted. The row is one every batch of the project writes anyway,
    last, held only to the commit: counting sessions here locks nothing more."""
    return (
        f"""
        INSERT INTO {TALLY_TABLE} (project_id, day, accepted, duplicates, refused, sessions_made)
        VALUES (%s, %s, %s, %s, 0, %s)
        ON CONFLICT (project_id, day) DO UPDATE SET
            accepted = {TALLY_TABLE}.accepted + excluded.accepted,
            duplicates = {TALLY_TABLE}.duplicates + excluded.duplicates,
            sessions_made = {TALLY_TABLE}.sessions_made + excluded.sessions_made
        """,
        [project.pk, sql.day(now.astimezone(UTC).date()), accepted, duplicates, sessions_made],
    )
