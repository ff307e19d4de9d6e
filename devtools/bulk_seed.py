"""The bulk seeder behind `manage.py seed_bulk`: millions of steps in minutes, for the growth
benchmark (issue 16), without going through ingest one batch at a time.

A run makes new sessions (~100 steps in 20 turns, bench_ingest's shape: its models, step
types and token ranges) spread over the last `days` days, and writes them with COPY in
chunks: sessions and turns first (their ids reserved from their sequences), then the steps,
priced by the rate table ingest uses. Then, set-based from the project's steps, it rebuilds
every total and rollup ingest keeps, and ANALYZEs what it wrote.

What is not derivable from the steps is written as ingest would have left it: a session's
user and tags (one session event each, no event_id, so no receipt), a turn's retry-loop
streaks (ingest's own TurnStreaks over the turn's steps in time order), and the day's
ingest tally (the events accepted, counted on the day of the run, as ingest counts them).
The same events can be fed to the real ingest (`workload_events`), which is how the tests
prove the rebuild right.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from costboard.budgets.caps import CapsMemo
from costboard.ingest.latency import latency_bucket
from costboard.ingest.sql import USAGE_COLUMNS
from costboard.ingest.turn_rules import TurnStreaks, step_signature
from costboard.models import (
    SYSTEM_SESSION_ID,
    TOOL_MODEL,
    ApiKey,
    DailyRollup,
    IngestTally,
    LatencyRollup,
    ModelPrice,
    PeriodBudget,
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
from costboard.partitions import month_add, month_of, step_partitions_ensure
from costboard.pricing.families import is_tool_model, price_families, step_classify
from costboard.pricing.rates import RateTable, rate_table
from costboard.projects import ingest_tally_statement
from devtools.ingest_bench import (
    BENCH_RATE_LIMIT,
    MODELS,
    STEP_TYPES,
    STEPS_PER_TURN,
    prices_ensure,
    require_postgres,
)

STEPS_PER_SESSION = 100  # bench_ingest's default: 5 batches of 20 steps
STEP_SECONDS = 7  # a step every 7 s: a session lasts ~12 minutes
USAGE_TEMPLATES = 400  # distinct token mixes, each priced once per price row
USERS = 250
TAG_VALUES = {"team": ("search", "support", "billing", "growth"), "env": ("prod", "staging")}
CHUNK_SESSIONS = 500  # sessions per COPY transaction (~50,000 steps)
LATENCY_LOOKUP_MS = 100_000  # durations below this are bucketed by a table built by Python

SESSION_TABLE = Session._meta.db_table
TURN_TABLE = Turn._meta.db_table
STEP_TABLE = Step._meta.db_table
RECEIPT_TABLE = StepReceipt._meta.db_table
PRICE_TABLE = ModelPrice._meta.db_table

WRITTEN = (
    Session,
    Turn,
    Step,
    StepReceipt,
    DailyRollup,
    UserDailyRollup,
    TagDailyRollup,
    SessionModelUsage,
    LatencyRollup,
    IngestTally,
)


# --- the workload ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """A token mix steps draw from (bench_ingest's ranges)."""

    model: str
    provider: str
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    reasoning_tokens: int


def usage_templates(seed: int) -> list[Usage]:
    rng = random.Random(seed)
    templates = []
    for _ in range(USAGE_TEMPLATES):
        model, provider = rng.choice(MODELS)
        templates.append(
            Usage(
                model,
                provider,
                rng.randint(50, 900),
                rng.randint(5, 400),
                rng.choice((0, rng.randint(500, 30_000))),
                rng.choice((0, 0, rng.randint(100, 3_000))),
                rng.choice((0, 0, 0, rng.randint(1, 5))),
            )
        )
    return templates


# One step of a session: turn, event_id, timestamp, step type, usage template, duration (ms).
SeedStep = tuple[int, str, datetime, str, int, int]


@dataclass(frozen=True, slots=True)
class SeedSession:
    key: str
    user_id: str
    tags: dict[str, str]
    steps: list[SeedStep]

    @property
    def started_at(self) -> datetime:
        return self.steps[0][2]

    @property
    def last_active_at(self) -> datetime:
        return self.steps[-1][2]


@dataclass(frozen=True)
class Workload:
    """`steps` steps of run `run` in sessions of STEPS_PER_SESSION, each starting at a random
    second of the `days` days before `now`. Deterministic: the same arguments, the same
    events."""

    run: str
    steps: int
    days: int
    now: datetime
    seed: int = 7
    templates: list[Usage] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", usage_templates(self.seed))

    @property
    def session_count(self) -> int:
        return -(-self.steps // STEPS_PER_SESSION)

    def sessions(self) -> Iterator[SeedSession]:
        rng = random.Random(f"{self.seed}:{self.run}")
        r = rng.random
        span = self.days * 86_400 - STEPS_PER_SESSION * STEP_SECONDS
        end = self.now.replace(microsecond=0) - timedelta(seconds=STEPS_PER_SESSION * STEP_SECONDS)
        n_types, n_templates = len(STEP_TYPES), len(self.templates)
        left = self.steps
        for number in range(self.session_count):
            size = min(STEPS_PER_SESSION, left)
            left -= size
            start = end - timedelta(seconds=int(r() * max(span, 1)))
            key = f"{self.run}-s{number}"
            steps = [
                (
                    k // STEPS_PER_TURN + 1,
                    f"{key}-{k}",
                    start + timedelta(seconds=k * STEP_SECONDS),
                    STEP_TYPES[int(r() * n_types)],
                    int(r() * n_templates),
                    80 + int(r() * 3_921),
                )
                for k in range(size)
            ]
            tags = {name: values[number % len(values)] for name, values in TAG_VALUES.items()}
            yield SeedSession(key, f"user-{int(r() * USERS)}", tags, steps)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def workload_events(workload: Workload) -> Iterator[list[dict[str, Any]]]:
    """The workload as events API payloads, a session at a time: its session event (user and
    tags, at its first step's time), then its steps as bench_ingest sends them."""
    templates = workload.templates
    for session in workload.sessions():
        events: list[dict[str, Any]] = [
            {
                "type": "session",
                "session_id": session.key,
                "user_id": session.user_id,
                "tags": session.tags,
                "timestamp": _iso(session.started_at),
            }
        ]
        for turn, event_id, ts, step_type, template, duration in session.steps:
            usage = templates[template]
            event: dict[str, Any] = {
                "event_id": event_id,
                "session_id": session.key,
                "turn": turn,
                "step_type": step_type,
                "model": usage.model,
                "timestamp": _iso(ts),
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                "reasoning_tokens": usage.reasoning_tokens,
                "duration_ms": duration,
            }
            if usage.provider:
                event["provider"] = usage.provider
            events.append(event)
        yield events


# --- pricing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Priced:
    """A template as priced by one price row: what its steps store."""

    price_id: int | None
    family: str
    costs: tuple[Decimal, ...]  # input, output, cache read, cache write, total


class Pricer:
    """Ingest's pricing (plan._step) of the templates, once per template and price row:
    the row is looked up per step (rate_at: a bisect), the arithmetic is not repeated."""

    def __init__(self, templates: list[Usage], table: RateTable) -> None:
        self.templates = templates
        self.table = table
        self.families = price_families(table.rates, key=table)
        self.memo: dict[tuple[int, int | None], Priced] = {}

    def __call__(self, template: int, ts: datetime) -> Priced:
        usage = self.templates[template]
        rate = (
            None
            if is_tool_model(usage.model)
            else self.table.rate_at(usage.model, usage.provider, ts)
        )
        key = (template, None if rate is None else rate.id)
        priced = self.memo.get(key)
        if priced is None:
            priced = self.memo[key] = self._price(usage, ts)
        return priced

    def _price(self, usage: Usage, ts: datetime) -> Priced:
        (price_id, *picos), family, _ = step_classify(
            self.table,
            self.families,
            usage.model,
            usage.provider,
            ts,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
            0,
        )
        c_in, c_out, c_read, c_write = picos
        costs = tuple(pico_usd(p) for p in (c_in, c_out, c_read, c_write, sum(picos)))
        return Priced(price_id, family, costs)


# --- the COPY path ---------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    rows: int = 0  # copy: rows written; rollups and analyze: the project's steps they cover
    seconds: float = 0.0

    @property
    def unit(self) -> str:
        return "rows" if self.name == "copy" else "steps"

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class SeedResult:
    project: Project
    steps: int = 0
    sessions: int = 0
    turns: int = 0
    phases: list[Phase] = field(default_factory=list)
    api_key: str | None = None  # when the project was made by this run
    over_caps: int = 0  # sessions whose totals a budget would have flagged (left ok)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def line(self) -> str:
        phases = ", ".join(
            f"{p.name} {p.seconds:.1f} s ({p.rate:,.0f} {p.unit}/s)" for p in self.phases
        )
        return (
            f"seeded {self.steps:,} steps, {self.sessions:,} sessions, {self.turns:,} turns "
            f"into {self.project.slug} in {self.seconds:.1f} s: {phases}"
        )


def project_ensure(slug: str) -> tuple[Project, str | None]:
    """The project of this slug, made with an API key if missing (the key is returned only
    then). A project with period budgets is refused: their ledgers are not rebuilt."""
    project = Project.objects.filter(slug=slug).first()
    if project is not None:
        if PeriodBudget.objects.filter(project=project).exists():
            raise ValueError(
                f"project {slug} has period budgets, whose ledgers seed_bulk does not rebuild: "
                "seed another project (--project)"
            )
        return project, None
    project = Project.objects.create(
        name=f"Bulk {slug}", slug=slug, api_rate_limit=BENCH_RATE_LIMIT
    )
    _, key = ApiKey.issue(project=project, name="seed_bulk")
    return project, key


def partitions_make(workload: Workload) -> list[str]:
    """The step partitions of every month the workload's days reach."""
    first = month_of(workload.now - timedelta(days=workload.days))
    last = month_of(workload.now)
    months = [first]
    while months[-1] < last:
        months.append(month_add(months[-1], 1))
    return step_partitions_ensure(months=months)


def _ids(cursor: Any, table: str, count: int) -> list[int]:
    """`count` ids from the table's own sequence (concurrent writers get others)."""
    if not count:
        return []
    cursor.execute(
        "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
        [table, count],
    )
    return [row[0] for row in cursor.fetchall()]


_SESSION_COPY = (
    "id, project_id, external_id, user_id, tags, metadata, started_at, last_active_at, state"
)
_TURN_COPY = (
    "id, project_id, session_id, number, started_at, last_active_at, "
    "fail_streak, fail_peak, repeat_sig, repeat_streak, repeat_peak"
)
_STEP_COPY = (
    'project_id, session_id, turn_id, event_id, "timestamp", step_type, model, family, '
    "provider, input_tokens, output_tokens, cache_read_input_tokens, "
    "cache_creation_input_tokens, cache_creation_1h_input_tokens, reasoning_tokens, "
    "duration_ms, success, error, tags, user_id, price_id, cost_input_usd, cost_output_usd, "
    "cost_cache_read_usd, cost_cache_write_usd, cost_usd"
)


def _tags_json(tags: dict[str, str]) -> str:
    return json.dumps(tags, separators=(",", ":"))


def sessions_copy(
    *,
    project: Project,
    workload: Workload,
    progress: Callable[[int], None] = lambda n: None,
) -> tuple[int, int, int]:
    """COPY the workload's sessions, turns and steps, CHUNK_SESSIONS sessions a transaction;
    return (sessions, turns, steps) written."""
    pricer = Pricer(workload.templates, rate_table())
    templates = workload.templates
    sigs: dict[tuple[str, int], int] = {}
    totals = [0, 0, 0]
    chunk: list[SeedSession] = []

    def flush() -> None:
        with transaction.atomic(), connection.cursor() as wrapper:
            cursor = wrapper.cursor  # psycopg's own: it has copy()
            session_ids = _ids(cursor, SESSION_TABLE, len(chunk))
            turn_keys = [
                (s, turn)
                for s, session in enumerate(chunk)
                for turn in sorted({step[0] for step in session.steps})
            ]
            turn_ids = dict(zip(turn_keys, _ids(cursor, TURN_TABLE, len(turn_keys)), strict=True))
            with cursor.copy(f"COPY {SESSION_TABLE} ({_SESSION_COPY}) FROM STDIN") as copy:
                for session, id_ in zip(chunk, session_ids, strict=True):
                    copy.write_row(
                        (
                            id_,
                            project.pk,
                            session.key,
                            session.user_id,
                            _tags_json(session.tags),
                            "{}",
                            session.started_at,
                            session.last_active_at,
                            Session.State.OK,
                        )
                    )
            with cursor.copy(f"COPY {TURN_TABLE} ({_TURN_COPY}) FROM STDIN") as copy:
                for s, session in enumerate(chunk):
                    for turn, steps in _turns_of(session):
                        streaks = TurnStreaks()
                        for step in steps:
                            usage = templates[step[4]]
                            sig = sigs.get((step[3], step[4]))
                            if sig is None:
                                prompt = (
                                    usage.input_tokens
                                    + usage.cache_read_input_tokens
                                    + usage.cache_creation_input_tokens
                                )
                                sig = sigs[(step[3], step[4])] = step_signature(
                                    step[3], usage.model, prompt
                                )
                            streaks.advance(_RuleStep(step[2], step[3], usage.model, sig))
                        copy.write_row(
                            (
                                turn_ids[(s, turn)],
                                project.pk,
                                session_ids[s],
                                turn,
                                steps[0][2],
                                steps[-1][2],
                                streaks.fail_streak,
                                streaks.fail_peak,
                                streaks.repeat_sig,
                                streaks.repeat_streak,
                                streaks.repeat_peak,
                            )
                        )
            written = 0
            with cursor.copy(f"COPY {STEP_TABLE} ({_STEP_COPY}) FROM STDIN") as copy:
                for s, session in enumerate(chunk):
                    tags = _tags_json(session.tags)
                    session_id = session_ids[s]
                    for turn, event_id, ts, step_type, template, duration in session.steps:
                        usage = templates[template]
                        priced = pricer(template, ts)
                        copy.write_row(
                            (
                                project.pk,
                                session_id,
                                turn_ids[(s, turn)],
                                event_id,
                                ts,
                                step_type,
                                usage.model,
                                priced.family,
                                usage.provider,
                                usage.input_tokens,
                                usage.output_tokens,
                                usage.cache_read_input_tokens,
                                usage.cache_creation_input_tokens,
                                0,
                                usage.reasoning_tokens,
                                duration,
                                True,
                                "",
                                tags,
                                session.user_id,
                                priced.price_id,
                                *priced.costs,
                            )
                        )
                    written += len(session.steps)
                    progress(len(session.steps))
            # each step's event_id once in the project, whatever its month (StepReceipt)
            with cursor.copy(
                f'COPY {RECEIPT_TABLE} (project_id, event_id, "timestamp") FROM STDIN'
            ) as copy:
                for session in chunk:
                    for _, event_id, ts, *_ in session.steps:
                        if event_id is not None:
                            copy.write_row((project.pk, event_id, ts))
        totals[0] += len(chunk)
        totals[1] += len(turn_keys)
        totals[2] += written
        chunk.clear()

    for session in workload.sessions():
        chunk.append(session)
        if len(chunk) == CHUNK_SESSIONS:
            flush()
    if chunk:
        flush()
    return totals[0], totals[1], totals[2]


@dataclass(slots=True)
class _RuleStep:
    """A seeded step as the turn rules read it (turn_rules.RuleStep): they all succeed."""

    ts: datetime
    step_type: str
    model: str
    sig: int
    success: bool = True
    error: str = ""


def _turns_of(session: SeedSession) -> Iterator[tuple[int, list[SeedStep]]]:
    """The session's turns in number order, each with its steps in time order."""
    by_turn: dict[int, list[SeedStep]] = {}
    for step in session.steps:
        by_turn.setdefault(step[0], []).append(step)
    for turn in sorted(by_turn):
        yield turn, sorted(by_turn[turn], key=lambda step: step[2])


# --- the set-based rebuild -------------------------------------------------------------------

_USAGE_SUMS = ", ".join(f"sum(s.{c}) AS {c}" for c in USAGE_COLUMNS)
_USAGE_NAMES = ", ".join(USAGE_COLUMNS)
_DAY = "(s.\"timestamp\" AT TIME ZONE 'UTC')::date"
# a step ingest counts as unpriced: no price row, and not a tool step ($0 by nature)
_UNPRICED = f"s.price_id IS NULL AND lower(btrim(s.model)) <> '{TOOL_MODEL}'"


def _latency_lookup() -> str:
    """latency_bucket of every duration below LATENCY_LOOKUP_MS, as an array literal: the
    buckets are Python's own, not a floating-point log recomputed in SQL."""
    return "{" + ",".join(str(latency_bucket(ms)) for ms in range(LATENCY_LOOKUP_MS)) + "}"


def _rebuild_statements() -> list[tuple[str, str]]:
    """(what, SQL) of each step of the rebuild; every statement takes the project id as
    %(project)s."""
    turn_sums = f"""
        SELECT s.turn_id, count(*) AS steps, count(*) FILTER (WHERE NOT s.success) AS errors,
               min(s."timestamp") AS first, max(s."timestamp") AS last,
               {_USAGE_SUMS},
               -- the largest prompt, the earliest such step's, and its model's window
               max(ARRAY[s.input_tokens + s.cache_read_input_tokens
                         + s.cache_creation_input_tokens,
                         -(extract(epoch FROM s."timestamp") * 1000000)::bigint,
                         -s.id,
                         COALESCE(NULLIF(p.context_window, 0), -1)]) AS largest
        FROM {STEP_TABLE} s LEFT JOIN {PRICE_TABLE} p ON p.id = s.price_id
        WHERE s.project_id = %(project)s AND s.turn_id IS NOT NULL
        GROUP BY s.turn_id
    """
    turn_set = ",\n".join(f"{c} = v.{c}" for c in USAGE_COLUMNS)
    session_set = turn_set
    return [
        (
            "turns",
            f"""
            WITH v AS ({turn_sums})
            UPDATE {TURN_TABLE} t SET
                started_at = LEAST(t.started_at, v.first),
                last_active_at = GREATEST(t.last_active_at, v.last),
                {turn_set},
                step_count = v.steps,
                error_count = v.errors,
                context_tokens = v.largest[1],
                context_window = CASE WHEN v.largest[1] > 0
                                      THEN NULLIF(v.largest[4], -1) END
            FROM v
            WHERE t.id = v.turn_id AND t.project_id = %(project)s
              AND (t.step_count, t.cost_usd, t.input_tokens, t.output_tokens,
                   t.context_tokens, t.started_at, t.last_active_at)
                  IS DISTINCT FROM (v.steps, v.cost_usd, v.input_tokens, v.output_tokens,
                                    v.largest[1], LEAST(t.started_at, v.first),
                                    GREATEST(t.last_active_at, v.last))
            """,
        ),
        (
            "sessions",
            f"""
            WITH v AS (
                SELECT s.session_id, count(*) AS steps,
                       count(*) FILTER (WHERE NOT s.success) AS errors,
                       min(s."timestamp") AS first, max(s."timestamp") AS last,
                       {_USAGE_SUMS}
                FROM {STEP_TABLE} s WHERE s.project_id = %(project)s
                GROUP BY s.session_id
            ), turns AS (
                SELECT session_id, count(*) AS n FROM {TURN_TABLE}
                WHERE project_id = %(project)s GROUP BY session_id
            )
            UPDATE {SESSION_TABLE} t SET
                started_at = LEAST(t.started_at, v.first),
                last_active_at = GREATEST(t.last_active_at, v.last),
                {session_set},
                step_count = v.steps,
                error_count = v.errors,
                turn_count = COALESCE(turns.n, 0)
            FROM v LEFT JOIN turns ON turns.session_id = v.session_id
            WHERE t.id = v.session_id AND t.project_id = %(project)s
              AND (t.step_count, t.cost_usd, t.input_tokens, t.output_tokens, t.turn_count)
                  IS DISTINCT FROM (v.steps, v.cost_usd, v.input_tokens, v.output_tokens,
                                    COALESCE(turns.n, 0))
            """,
        ),
        (
            "daily rollups",
            f"DELETE FROM {DailyRollup._meta.db_table} WHERE project_id = %(project)s",
        ),
        (
            "daily rollups",
            f"""
            INSERT INTO {DailyRollup._meta.db_table}
                (project_id, day, family, model, step_type, {_USAGE_NAMES},
                 calls, errors, unpriced_calls, duration_ms)
            SELECT %(project)s, {_DAY}, s.family, s.model, s.step_type, {_USAGE_SUMS},
                   count(*), count(*) FILTER (WHERE NOT s.success),
                   count(*) FILTER (WHERE {_UNPRICED}), COALESCE(sum(s.duration_ms), 0)
            FROM {STEP_TABLE} s WHERE s.project_id = %(project)s
            GROUP BY 2, 3, 4, 5
            """,
        ),
        (
            "user rollups",
            f"DELETE FROM {UserDailyRollup._meta.db_table} WHERE project_id = %(project)s",
        ),
        (
            "user rollups",
            # by session and day first: the join to sessions (for their user) is then small
            f"""
            INSERT INTO {UserDailyRollup._meta.db_table}
                (project_id, day, user_id, {_USAGE_NAMES}, calls)
            SELECT %(project)s, v.day, COALESCE(u.user_id, ''),
                   {", ".join(f"sum(v.{c})" for c in USAGE_COLUMNS)}, sum(v.calls)
            FROM (
                SELECT s.session_id, {_DAY} AS day, {_USAGE_SUMS}, count(*) AS calls
                FROM {STEP_TABLE} s WHERE s.project_id = %(project)s
                GROUP BY 1, 2
            ) v JOIN {SESSION_TABLE} u ON u.id = v.session_id AND u.project_id = %(project)s
            GROUP BY 2, 3
            """,
        ),
        (
            "tag rollups",
            f"DELETE FROM {TagDailyRollup._meta.db_table} WHERE project_id = %(project)s",
        ),
        (
            "tag rollups",
            # a step's tags as stored are what ingest rolled it up under (step_tags)
            f"""
            INSERT INTO {TagDailyRollup._meta.db_table}
                (project_id, day, key, value, {_USAGE_NAMES}, calls)
            SELECT %(project)s, {_DAY}, tag.key, tag.value, {_USAGE_SUMS}, count(*)
            FROM {STEP_TABLE} s, jsonb_each_text(s.tags) AS tag
            WHERE s.project_id = %(project)s AND s.tags IS NOT NULL
              AND jsonb_typeof(s.tags) = 'object'
            GROUP BY 2, 3, 4
            """,
        ),
        (
            "model usage",
            f"DELETE FROM {SessionModelUsage._meta.db_table} WHERE project_id = %(project)s",
        ),
        (
            "model usage",
            f"""
            INSERT INTO {SessionModelUsage._meta.db_table}
                (project_id, session_id, family, model, calls, tokens_used, cost_usd)
            SELECT %(project)s, s.session_id, s.family, s.model, count(*),
                   sum(s.input_tokens + s.output_tokens), sum(s.cost_usd)
            FROM {STEP_TABLE} s WHERE s.project_id = %(project)s
            GROUP BY 2, 3, 4
            """,
        ),
        (
            "session families",
            f"""
            UPDATE {SESSION_TABLE} s SET families = f.families
            FROM (
                SELECT session_id, jsonb_object_agg(family, true) AS families
                FROM {SessionModelUsage._meta.db_table} WHERE project_id = %(project)s
                GROUP BY session_id
            ) f
            WHERE s.id = f.session_id AND s.project_id = %(project)s
              AND s.families IS DISTINCT FROM f.families
            """,
        ),
        (
            "latency rollups",
            f"DELETE FROM {LatencyRollup._meta.db_table} WHERE project_id = %(project)s",
        ),
        (
            "latency rollups",
            f"""
            INSERT INTO {LatencyRollup._meta.db_table} (project_id, day, step_type, bucket, calls)
            SELECT %(project)s, day, step_type, bucket, count(*)
            FROM (
                SELECT {_DAY} AS day, s.step_type,
                       CASE WHEN s.duration_ms < 1 THEN 0
                            WHEN s.duration_ms < {LATENCY_LOOKUP_MS}
                            THEN (%(buckets)s::int[])[s.duration_ms + 1]
                            ELSE floor(log(s.duration_ms::float8) * 20)::int + 1 END AS bucket
                FROM {STEP_TABLE} s
                WHERE s.project_id = %(project)s AND s.duration_ms IS NOT NULL
            ) b
            GROUP BY 2, 3, 4
            """,
        ),
    ]


def totals_rebuild(*, project: Project, say: Callable[[str], None] = lambda line: None) -> None:
    """Rebuild, set-based from the project's steps, its turns' and sessions' totals and
    counters and its daily, per-user, per-tag, per-session-model and latency rollups (the
    rollups deleted and inserted again; the turns and sessions updated where they differ)."""
    params: dict[str, Any] = {"project": project.pk, "buckets": _latency_lookup()}
    with transaction.atomic(), connection.cursor() as cursor:
        # statistics first: on the row counts of before the COPY (autovacuum is off) the
        # planner joins a million steps to "one" session by a nested loop
        for model in (Session, Turn, Step):
            cursor.execute(f"ANALYZE {model._meta.db_table}")
        # 10M steps make 2M turn groups: hashed in memory rather than spilled in batches
        cursor.execute("SET LOCAL work_mem = '1GB'")
        for what, sql in _rebuild_statements():
            began = time.perf_counter()
            cursor.execute(sql, params)
            if not sql.lstrip().startswith("DELETE"):
                say(f"  {what}: {cursor.rowcount:,} rows in {time.perf_counter() - began:.1f} s")


def tally_add(*, project: Project, accepted: int, sessions: int, day: date) -> None:
    """Count the run's events and the sessions it made in the project's ingest tally, on the
    day they were written, as ingest counts a batch (its steps and session events, accepted)."""
    statement, params = ingest_tally_statement(
        project.pk, day, accepted=accepted, sessions_made=sessions
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def sessions_over_caps(project: Project) -> int:
    """The project's sessions whose totals reach their caps' warning: ingest would have
    flagged them (and recorded a crossing); the seeder leaves every session ok."""
    caps_of = CapsMemo(project)
    over = 0
    rows = Session.objects.filter(project=project).values_list(
        "external_id", "token_cap", "cost_cap_usd", "input_tokens", "output_tokens", "cost_usd"
    )
    for key, token_cap, cost_cap, inp, out, cost in rows.iterator(chunk_size=10_000):
        caps = caps_of(token_cap, cost_cap, key == SYSTEM_SESSION_ID)
        if caps.warned(inp + out, cost):
            over += 1
    return over


def tables_analyze() -> None:
    """ANALYZE what the seeder wrote (autovacuum is off on the benchmark machines): plans on
    stale statistics would time the wrong queries. Outside a transaction VACUUM too, which
    clears the rows the rebuild replaced and sets the visibility map index-only scans need."""
    verb = "ANALYZE" if connection.in_atomic_block else "VACUUM (ANALYZE)"
    with connection.cursor() as cursor:
        for model in WRITTEN:
            cursor.execute(f"{verb} {model._meta.db_table}")


def seed_bulk(
    *,
    steps: int,
    slug: str = "bulk",
    days: int = 90,
    days_ago: int = 0,
    run: str | None = None,
    now: datetime | None = None,
    progress: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> SeedResult:
    """Add `steps` steps to project `slug` (made if missing) and rebuild its totals: over the
    `days` days that end `days_ago` days before `now` (older history: `--days 270
    --days-ago 30` puts nine months behind a month already seeded)."""
    require_postgres("seed_bulk")
    if steps < 1:
        raise ValueError(f"--steps must be a positive number of steps, not {steps}")
    if days < 1:
        raise ValueError(f"--days must be at least 1, not {days}")
    if days_ago < 0:
        raise ValueError(f"--days-ago must be 0 (now) or more, not {days_ago}")
    now = now or timezone.now()
    project, key = project_ensure(slug)
    run = run or f"bulk{int(now.timestamp())}"
    if Session.objects.filter(project=project, external_id=f"{run}-s0").exists():
        raise ValueError(f"run {run} was already seeded into {slug}: give another --run")
    if prices_ensure():
        say("loaded the built-in prices (the rate table was empty)")
    workload = Workload(run=run, steps=steps, days=days, now=now - timedelta(days=days_ago))
    result = SeedResult(project=project, api_key=key)
    partitions_make(workload)

    bar = _bar(steps, progress)
    began = time.perf_counter()
    result.sessions, result.turns, result.steps = sessions_copy(
        project=project, workload=workload, progress=bar.update
    )
    tally_add(
        project=project,
        accepted=result.steps + result.sessions,
        sessions=result.sessions,
        day=now.astimezone(UTC).date(),
    )
    bar.close()
    copied = result.steps + result.sessions + result.turns
    result.phases.append(Phase("copy", copied, time.perf_counter() - began))

    began = time.perf_counter()
    totals_rebuild(project=project, say=say)
    # the sessions' counts just rebuilt: no second scan of the steps
    covered = Session.objects.filter(project=project).aggregate(n=Sum("step_count"))["n"] or 0
    result.phases.append(Phase("rollups", covered, time.perf_counter() - began))

    began = time.perf_counter()
    tables_analyze()
    result.phases.append(Phase("analyze", covered, time.perf_counter() - began))
    result.over_caps = sessions_over_caps(project)
    return result


def _bar(total: int, progress: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=" steps",
        unit_scale=True,
        file=sys.stderr,
        smoothing=0.1,
        disable=not progress,
    )
