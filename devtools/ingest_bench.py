"""The ingest benchmark behind `manage.py bench_ingest`.

Concurrent HTTP clients post pre-serialized batches of step events to a real gunicorn serving
`/api/v1/events` on PostgreSQL; every response must be 200. Afterwards the stored totals are
checked against what was sent, and the same rows are pushed with a raw psycopg COPY into a bare
table, so the ingest rate can be read as a fraction of what the database takes at best.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum

from costboard.budgets.period_services import period_budget_create
from costboard.models import (
    COST_FIELDS,
    TOKEN_FIELDS,
    ApiKey,
    BudgetDay,
    BudgetEvent,
    DailyRollup,
    LatencyRollup,
    ModelPrice,
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
from costboard.pricing.rates import rate_table
from devtools.replica_lag import LagSampler, lag_line

EVENTS_PATH = "/api/v1/events"
STEPS_PER_TURN = 5
STEPS_PER_SESSION_PER_BATCH = 20
SINGLE_SESSIONS = 10  # the one-step posts go to this many sessions in turn
BATCHES_PER_SESSION = 5  # a session gets 100 steps (20 turns) over 5 of its client's batches
STEP_TYPES = ("intent", "filter", "search", "response", "compress")
# (model, provider as sent): priced models of two providers, two thirds Claude.
MODELS = (("claude-sonnet-4-5", "anthropic"), ("claude-sonnet-4-5", ""), ("gpt-4o-mini", ""))


# --- the workload -----------------------------------------------------------------------------


@dataclass
class Sent:
    """What the clients sent, to check the stored totals against."""

    steps: int = 0
    tokens: Counter[str] = field(default_factory=Counter)
    per_session: Counter[str] = field(default_factory=Counter)
    expected_cost: Decimal = Decimal(0)


@dataclass(frozen=True, slots=True)
class Batch:
    body: bytes
    events: int


@dataclass
class Workload:
    warmup: list[list[Batch]]  # per client
    measured: list[list[Batch]]  # per client
    sent: Sent
    singles: list[Batch] = field(default_factory=list)  # one step each, posted one by one

    @property
    def measured_events(self) -> int:
        return sum(b.events for batches in self.measured for b in batches)

    @property
    def requests(self) -> int:
        return sum(len(batches) for batches in self.measured)


def _step_event(
    rng: random.Random, event_id: str, session: str, turn: int, at: datetime
) -> dict[str, Any]:
    model, provider = rng.choice(MODELS)
    event: dict[str, Any] = {
        "event_id": event_id,
        "session_id": session,
        "turn": turn,
        "step_type": rng.choice(STEP_TYPES),
        "model": model,
        "timestamp": at.isoformat().replace("+00:00", "Z"),
        "input_tokens": rng.randint(50, 900),
        "output_tokens": rng.randint(5, 400),
        "cache_read_input_tokens": rng.choice((0, rng.randint(500, 30_000))),
        "cache_creation_input_tokens": rng.choice((0, 0, rng.randint(100, 3_000))),
        "reasoning_tokens": rng.choice((0, 0, 0, rng.randint(1, 5))),
        "duration_ms": rng.randint(80, 4_000),
    }
    if provider:
        event["provider"] = provider
    return event


def warmup_prefix(run: str) -> str:
    return f"{run}-warmup-"


def single_prefix(run: str) -> str:
    return f"{run}-agent-"


def single_event_prefix(run: str) -> str:
    return f"{run}-single-"


def _batch_events(
    rng: random.Random,
    run: str,
    client: int,
    number: int,
    size: int,
    start: datetime,
    *,
    warmup: bool,
    spread: int | None = None,
    users: int = 0,
) -> list[dict[str, Any]]:
    """Batch `number` of a client: `size` steps spread over its current group of `spread`
    sessions (default: 20 steps each), a few turns further into each (turn numbers keep
    growing across the group's batches). `users`: each session, in the group's first batch,
    first gets a session event naming its end user (one of that many)."""
    spread = min(size, spread or max(1, size // STEPS_PER_SESSION_PER_BATCH))
    per_session = math.ceil(size / spread)
    group, round_ = divmod(number, BATCHES_PER_SESSION)
    ids = warmup_prefix(run) if warmup else f"{run}-"
    events: list[dict[str, Any]] = []
    if users and round_ == 0:
        for j in range(spread):
            user = (client * 7919 + group * spread + j) % users
            session = f"{run}-c{client}-g{group}-s{j}"
            events.append({"type": "session", "session_id": session, "user_id": f"u{user}"})
    for k in range(size):
        j, n = k % spread, k // spread
        step_no = round_ * per_session + n
        at = start + timedelta(milliseconds=number * 1000 + k)
        session = f"{run}-c{client}-g{group}-s{j}"
        event_id = f"{ids}{client}-{number}-{k}"
        events.append(_step_event(rng, event_id, session, step_no // STEPS_PER_TURN + 1, at))
    return events


def _record(sent: Sent, events: list[dict[str, Any]]) -> None:
    table = rate_table()
    for e in events:
        if e.get("type") == "session":
            continue  # a session event names its user: no step
        sent.steps += 1
        sent.per_session[e["session_id"]] += 1
        for name in TOKEN_FIELDS:
            sent.tokens[name] += e.get(name, 0)
        cost = table.price(
            model=e["model"],
            provider=e.get("provider", ""),
            when=datetime.fromisoformat(e["timestamp"]),
            input_tokens=e["input_tokens"],
            output_tokens=e["output_tokens"],
            cache_read_input_tokens=e["cache_read_input_tokens"],
            cache_creation_input_tokens=e["cache_creation_input_tokens"],
        )
        sent.expected_cost += cost.total


def _sizes(total: int, batch: int, clients: int) -> list[list[int]]:
    """`total` events as batches of `batch` (the last may be smaller), dealt to the clients."""
    sizes = [batch] * (total // batch) + ([total % batch] if total % batch else [])
    return [sizes[c::clients] for c in range(clients)]


def workload_build(
    *,
    run: str,
    events: int,
    batch: int,
    clients: int,
    warmup_batches: int,
    spread: int | None = None,
    single: int = 0,
    users: int = 0,
    seed: int = 7,
) -> Workload:
    """Every request body, serialized before the clock starts."""
    rng = random.Random(seed)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    sent = Sent()
    warmup: list[list[Batch]] = []
    measured: list[list[Batch]] = []
    for client, sizes in enumerate(_sizes(events, batch, clients)):
        bodies: list[Batch] = []
        for number, size in enumerate([batch] * warmup_batches + sizes):
            warm = number < warmup_batches
            batch_events = _batch_events(
                rng, run, client, number, size, start, warmup=warm, spread=spread, users=users
            )
            _record(sent, batch_events)
            body = json.dumps({"events": batch_events}, separators=(",", ":")).encode()
            bodies.append(Batch(body=body, events=len(batch_events)))
        warmup.append(bodies[:warmup_batches])
        measured.append(bodies[warmup_batches:])
    singles = []
    for number in range(single):
        # an agent reporting each call as it happens: SINGLE_SESSIONS sessions, turns growing
        at = start + timedelta(minutes=20, milliseconds=number)
        step_no, session = divmod(number, SINGLE_SESSIONS)
        event = _step_event(
            rng,
            f"{single_event_prefix(run)}{number}",
            f"{single_prefix(run)}{session}",
            step_no // STEPS_PER_TURN + 1,
            at,
        )
        _record(sent, [event])
        body = json.dumps({"events": [event]}, separators=(",", ":")).encode()
        singles.append(Batch(body=body, events=1))
    return Workload(warmup=warmup, measured=measured, sent=sent, singles=singles)


# --- the server ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def gunicorn_command(port: int, workers: int, threads: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "--config",
        "python:costboard.gunicorn_conf",
        "costboard.wsgi",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--keep-alive",
        "30",
        "--timeout",
        "120",
    ]


def _answers(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/api/v1/openapi.json")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def database_url() -> str:
    """A URL of the PostgreSQL database this process is connected to."""
    db = connection.settings_dict
    user = quote(db.get("USER") or "", safe="")
    password = f":{quote(str(db['PASSWORD']), safe='')}" if db.get("PASSWORD") else ""
    at = f"{user}{password}@" if user else ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{at}{db.get('HOST') or ''}{port}/{quote(db['NAME'], safe='')}"


@contextmanager
def gunicorn(
    *,
    workers: int,
    threads: int,
    startup_timeout: float = 60.0,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """gunicorn serving this project on a free port with this process's environment (and
    `extra_env`) and its database (the one it is connected to, e.g. a test database), DEBUG
    off; stopped on the way out."""
    port = free_port()
    env = {
        **os.environ,
        **(extra_env or {}),
        "DATABASE_URL": database_url(),
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    }
    env.setdefault("DJANGO_SETTINGS_MODULE", "costboard.settings")
    with tempfile.NamedTemporaryFile(prefix="bench-gunicorn-", suffix=".log", delete=False) as f:
        log = Path(f.name)
    with log.open("wb") as out:
        process = subprocess.Popen(
            gunicorn_command(port, workers, threads),
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(port=port, process=process, log=log)
    try:
        deadline = time.monotonic() + startup_timeout
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        _stop(process)
        log.unlink(missing_ok=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- the clients -----------------------------------------------------------------------------


@dataclass
class ClientResult:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _post(conn: http.client.HTTPConnection, headers: dict[str, str], batch: Batch) -> str | None:
    """Post one batch; None if it was stored whole, else what went wrong."""
    try:
        conn.request("POST", EVENTS_PATH, body=batch.body, headers=headers)
        response = conn.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        return f"{type(exc).__name__}: {exc}"
    if response.status != 200:
        return f"HTTP {response.status}: {data[:300]!r}"
    try:
        body = json.loads(data)
    except ValueError:
        return f"HTTP 200 but not JSON: {data[:300]!r}"
    if body.get("accepted") != batch.events or body.get("duplicates") != 0:
        return f"accepted {body.get('accepted')} duplicates {body.get('duplicates')}"
    return None


def client_run(
    port: int,
    key: str,
    batches: list[Batch],
    result: ClientResult,
    start: threading.Barrier,
    minimal: bool = False,
) -> None:
    """One keep-alive connection posting its batches in order, timing each request."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Connection": "keep-alive",
        **({"Prefer": "return=minimal"} if minimal else {}),
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start.wait()
    for batch in batches:
        began = time.perf_counter()
        failure = _post(conn, headers, batch)
        result.latencies.append(time.perf_counter() - began)
        if failure is not None:
            result.failures.append(failure)
    conn.close()


def clients_run(
    port: int, key: str, per_client: list[list[Batch]], *, minimal: bool = False
) -> tuple[float, ClientResult]:
    """All clients at once; the wall time from the common start to the last response."""
    results = [ClientResult() for _ in per_client]
    barrier = threading.Barrier(len(per_client) + 1)
    threads = [
        threading.Thread(target=client_run, args=(port, key, batches, result, barrier, minimal))
        for batches, result in zip(per_client, results, strict=True)
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    merged = ClientResult()
    for result in results:
        merged.latencies += result.latencies
        merged.failures += result.failures
    return elapsed, merged


def singles_run(
    port: int, key: str, singles: list[Batch], run: str
) -> tuple[ClientResult, ClientResult]:
    """One client posting one step at a time, then reading a session's budget as many times
    (an agent checking before each call): the latency of each, in order, on a quiet server."""
    headers = {"Authorization": f"Bearer {key}", "Connection": "keep-alive"}
    posts, reads = ClientResult(), ClientResult()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for batch in singles:
        began = time.perf_counter()
        failure = _post(conn, {**headers, "Content-Type": "application/json"}, batch)
        posts.latencies.append(time.perf_counter() - began)
        if failure is not None:
            posts.failures.append(failure)
    for number in range(len(singles)):
        path = f"/api/v1/sessions/{single_prefix(run)}{number % SINGLE_SESSIONS}/budget"
        began = time.perf_counter()
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            reads.failures.append(f"budget read: {type(exc).__name__}: {exc}")
            continue
        reads.latencies.append(time.perf_counter() - began)
        if response.status != 200:
            reads.failures.append(f"budget read: HTTP {response.status}: {data[:300]!r}")
    conn.close()
    return posts, reads


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


# --- where the CPU went (Linux /proc; skipped elsewhere) ------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / _CLOCK_TICKS, sum(values) / _CLOCK_TICKS


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def postgres_pids() -> list[int]:
    """The server processes of this database's sessions, and the WAL writer."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND (datname = current_database() OR backend_type = 'walwriter')"
        )
        pids = [row[0] for row in cursor.fetchall()]
    connection.close()
    return pids


@dataclass
class CpuMeter:
    """CPU seconds spent by gunicorn, PostgreSQL, the clients and the machine over a span.
    Each group's processes are looked up at both ends (a connection may open mid-run)."""

    groups: dict[str, Callable[[], list[int]]]
    start: dict[str, dict[int, float]] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def _sample(self) -> dict[str, dict[int, float]]:
        sample = {
            name: {pid: _process_cpu(pid) for pid in find()} for name, find in self.groups.items()
        }
        busy, capacity = _machine_cpu()
        sample["machine"], sample["capacity"] = {0: busy}, {0: capacity}
        sample["wall"] = {0: time.monotonic()}
        return sample

    def __enter__(self) -> CpuMeter:
        if Path("/proc/stat").exists():
            self.start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.start:
            return
        end = self._sample()
        self.seconds = end.pop("wall")[0] - self.start["wall"][0]
        self.used = {
            name: sum(cpu - self.start[name].get(pid, 0.0) for pid, cpu in pids.items())
            for name, pids in end.items()
        }

    def cores(self, name: str) -> float:
        return self.used.get(name, 0.0) / self.seconds if self.seconds else math.nan


def cpu_meter(server: Server) -> CpuMeter:
    master = server.process.pid
    return CpuMeter(
        groups={
            "gunicorn": lambda: [master, *_children(master)],
            "postgres": postgres_pids,
            "clients": lambda: [os.getpid()],
        }
    )


# --- setup, verification and the COPY baseline -----------------------------------------------


def require_postgres(command: str = "bench_ingest") -> None:
    if connection.vendor != "postgresql":
        raise ValueError(
            f"{command} is defined on PostgreSQL, but the configured database is "
            f"{connection.vendor}: set DATABASE_URL=postgres://user@127.0.0.1:5432/dbname "
            "(migrated) and run it again."
        )


def prices_ensure() -> bool:
    """Load the built-in prices if the rate table is empty; True if it was."""
    if ModelPrice.objects.exists():
        return False
    from costboard.pricing.sync import prices_sync

    prices_sync()
    return True


# Requests per second the bench key may make: far above what it sends, so the limiter's check
# (a Redis round trip when the broker is Redis) is timed on every request but never refuses.
BENCH_RATE_LIMIT = 1_000_000
# Requests in flight the bench key may have: more than its clients, so the gate (two more
# round trips with Redis) is timed on every request but never refuses.
BENCH_MAX_IN_FLIGHT = 1_000


def project_create(
    run: str, *, budgets: int = 0, rolling_user_budget: bool = False
) -> tuple[Project, str]:
    """The bench's project and key, with `budgets` period budgets over it (BENCH_BUDGETS in
    turn) and, `rolling_user_budget`, a rolling 24-hour budget per end user ("*"), limits far
    above what the run spends: every batch decides them, none refuses."""
    project = Project.objects.create(
        name=f"Bench {run}",
        slug=run,
        api_rate_limit=BENCH_RATE_LIMIT,
        api_max_in_flight=BENCH_MAX_IN_FLIGHT,
    )
    api_key, key = ApiKey.issue(project=project, name="bench_ingest")
    for n in range(budgets):
        scope, period, action = BENCH_BUDGETS[n % len(BENCH_BUDGETS)]
        period_budget_create(
            project=project,
            fields={
                "name": f"bench {n + 1}: {scope} {period}",
                "scope": scope,
                "scope_value": api_key.prefix if scope == "api_key" else None,
                "period": period,
                "cost_limit_usd": Decimal(10**9),
                "token_limit": 10**15,
                "action": action,
            },
        )
    if rolling_user_budget:
        period_budget_create(
            project=project,
            fields={
                "name": "bench: each user, 24 h",
                "scope": "user",
                "scope_value": "*",
                "period": "rolling",
                "window_hours": 24,
                "cost_limit_usd": Decimal(10**9),
                "warn_at": [Decimal("0.5"), Decimal("0.8"), Decimal("0.95")],
                "action": "stop",
            },
        )
    return project, key


# what `--budgets N` makes, in turn: a project's month and day, the bench key's month
BENCH_BUDGETS = (
    ("project", "month", "stop"),
    ("project", "day", "warn"),
    ("api_key", "month", "stop"),
)


def _sums(queryset: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    totals = queryset.aggregate(**{f: Sum(f) for f in fields})
    return {f: totals[f] or 0 for f in fields}


def verify(project: Project, sent: Sent) -> list[str]:
    """Differences between what was sent and what is stored (empty: all equal)."""
    fields = (*TOKEN_FIELDS, *COST_FIELDS)
    steps = Step.objects.filter(project=project)
    step_sums = _sums(steps, fields)
    problems = []
    if (stored := steps.count()) != sent.steps:
        problems.append(f"steps stored {stored}, sent {sent.steps}")
    for name in TOKEN_FIELDS:
        if step_sums[name] != sent.tokens[name]:
            problems.append(f"{name}: stored {step_sums[name]}, sent {sent.tokens[name]}")
    if step_sums["cost_usd"] != sent.expected_cost:
        problems.append(f"cost: stored {step_sums['cost_usd']}, priced {sent.expected_cost}")
    levels = {
        "sessions": Session.objects.filter(project=project),
        "turns": Turn.objects.filter(project=project),
        "daily rollups": DailyRollup.objects.filter(project=project),
    }
    for level, queryset in levels.items():
        sums = _sums(queryset, fields)
        for name in fields:
            if sums[name] != step_sums[name]:
                problems.append(f"{level} {name}: {sums[name]} != steps {step_sums[name]}")
    return problems + _verify_sessions(project, sent)


def _verify_sessions(project: Project, sent: Sent) -> list[str]:
    counted = dict(Session.objects.filter(project=project).values_list("external_id", "step_count"))
    rows = (
        Step.objects.filter(project=project)
        .values_list("session__external_id")
        .annotate(n=Count("id"))
    )
    stored = dict(rows)
    problems = []
    if counted.keys() != sent.per_session.keys():
        problems.append(f"sessions stored {len(counted)}, sent to {len(sent.per_session)}")
    for session, n in sent.per_session.items():
        if counted.get(session) != n or stored.get(session) != n:
            problems.append(
                f"session {session}: step_count {counted.get(session)}, "
                f"steps stored {stored.get(session)}, sent {n}"
            )
    return problems[:20]


def _step_columns() -> list[str]:
    """The step table's columns as the ingest INSERT writes them (project_id first)."""
    from costboard.ingest.writes.steps import STEP_COLUMN_NAMES

    return ["project_id", *STEP_COLUMN_NAMES]


COPY_TABLES = {"logged": "", "unlogged": "UNLOGGED ", "temp": "TEMPORARY "}


@dataclass(frozen=True)
class CopyResult:
    rows: int
    runs: list[float]  # seconds of each COPY, COPY to commit
    table: str

    @property
    def seconds(self) -> float:
        return statistics.median(self.runs)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else math.nan


def copy_baseline(project: Project, run: str, *, table: str, runs: int = 3) -> CopyResult:
    """The steps of the timed run, read back as stored, then pushed by COPY FROM STDIN into a
    bare table of the same columns (no index, constraint or default), `runs` times: a fresh
    table each time, created before the clock starts and dropped after it stops."""
    columns = ", ".join(_step_columns())
    with psycopg.connect(**connection.get_connection_params()) as conn, conn.cursor() as cur:
        cur.execute(
            f"SELECT {columns} FROM {Step._meta.db_table} "
            "WHERE project_id = %s AND NOT starts_with(event_id, %s) "
            "AND NOT starts_with(event_id, %s)",
            [project.pk, warmup_prefix(run), single_event_prefix(run)],
        )
        rows = cur.fetchall()
        seconds = [_copy_once(conn, rows, columns, COPY_TABLES[table]) for _ in range(runs)]
    return CopyResult(rows=len(rows), runs=seconds, table=table)


def _copy_once(conn: psycopg.Connection[Any], rows: list[Any], columns: str, kind: str) -> float:
    name = f"bench_copy_{os.getpid()}"
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE {kind}TABLE {name} AS SELECT {columns} FROM {Step._meta.db_table} WITH NO DATA"
        )
        conn.commit()
        try:
            began = time.perf_counter()
            with cur.copy(f"COPY {name} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            conn.commit()
            return time.perf_counter() - began
        finally:
            conn.rollback()
            cur.execute(f"DROP TABLE IF EXISTS {name}")
            conn.commit()


# A replica's lag (--replica) is sampled this often, in seconds, while the posts run.
LAG_EVERY = 0.1


# --- the whole run ---------------------------------------------------------------------------


@dataclass
class BenchOptions:
    events: int
    batch: int
    clients: int
    workers: int
    threads: int
    warmup: int
    keep: bool
    copy_table: str
    budgets: int = 0
    spread: int | None = None  # sessions per batch (None: 20 steps a session)
    single: int = 0  # one-step posts (and as many budget reads) before the batches
    minimal: bool = False  # the batches sent with Prefer: return=minimal
    users: int = 0  # sessions' end users, named by a session event (0: none)
    rolling_user_budget: bool = False  # a rolling 24-hour budget per end user
    replica: str = ""  # a streaming replica's URL: its lag sampled while the posts run


@dataclass
class BenchResult:
    run: str
    options: BenchOptions
    events: int
    requests: int
    seconds: float
    latencies: list[float]
    failures: list[str]
    problems: list[str]
    copy: CopyResult
    cpu: CpuMeter
    single_posts: list[float] = field(default_factory=list)
    budget_reads: list[float] = field(default_factory=list)
    replica_lag: list[Decimal] = field(default_factory=list)
    replica_lost: str = ""  # why the replica stopped answering during the run, if it did

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds

    @property
    def ratio(self) -> float:
        return self.events_per_second / self.copy.rate

    @property
    def ok(self) -> bool:
        return not self.failures and not self.problems


def bench_run(options: BenchOptions, say: Callable[[str], None]) -> BenchResult:
    require_postgres()
    if prices_ensure():
        say("loaded the built-in prices (the rate table was empty)")
    run = datetime.now(UTC).strftime("bench-%Y%m%d-%H%M%S")
    project, key = project_create(
        run, budgets=options.budgets, rolling_user_budget=options.rolling_user_budget
    )
    with projects_removed([project], keep=options.keep, say=say):
        return _measure(run, project, key, options, say)


@contextmanager
def projects_removed(
    projects: list[Project], *, keep: bool, say: Callable[[str], None]
) -> Iterator[None]:
    """A bench's own projects deleted after its run, and what they left vacuumed, unless
    `keep` (--keep): then named, to be looked at and deleted in the admin."""
    names = ", ".join(project.slug for project in projects)
    try:
        yield
    finally:
        if keep:
            say(f"kept {names} (--keep): delete them in /admin/ when done")
        else:
            say(f"deleting {names} and vacuuming what they left …")
            for project in projects:
                project.delete()
            vacuum()


# The tables a run writes (and its deletion leaves dead rows in).
WRITTEN = (
    Step,
    StepReceipt,
    Turn,
    Session,
    SessionModelUsage,
    DailyRollup,
    LatencyRollup,
    BudgetEvent,
    UserDailyRollup,
    TagDailyRollup,
    PeriodLedger,
    BudgetDay,
)


def vacuum(*, analyze: bool = False) -> None:
    """VACUUM the tables a run writes: deleted rows of earlier runs would otherwise slow this
    one's inserts (and stay, where autovacuum is off, as on the CI machine). With `analyze`
    only ANALYZE, as autovacuum would once they have rows: plans made on empty tables (a
    sequential scan for each foreign-key check) would otherwise stay for the whole run."""
    with connection.cursor() as cursor:
        for model in WRITTEN:
            cursor.execute(f"{'ANALYZE' if analyze else 'VACUUM'} {model._meta.db_table}")


def _measure(
    run: str, project: Project, key: str, options: BenchOptions, say: Callable[[str], None]
) -> BenchResult:
    say(f"project {run}: building {options.events:,} events in batches of {options.batch} …")
    work = workload_build(
        run=run,
        events=options.events,
        batch=options.batch,
        clients=options.clients,
        warmup_batches=options.warmup,
        spread=options.spread,
        single=options.single,
        users=options.users,
    )
    vacuum()
    with gunicorn(workers=options.workers, threads=options.threads) as server:
        # first, as an agent meets a server just started: each worker's first request is in it
        if work.singles:
            say(
                f"gunicorn on 127.0.0.1:{server.port}; {len(work.singles)} one-step posts one "
                "by one, then budget reads …"
            )
        posts, reads = singles_run(server.port, key, work.singles, run)
        say("warming up …")
        _, warm = clients_run(server.port, key, work.warmup, minimal=options.minimal)
        vacuum(analyze=True)
        connection.close()  # the server's connections are the ones that matter from here on
        say(f"posting {work.measured_events:,} events from {options.clients} clients …")
        lag: AbstractContextManager[object] = (
            LagSampler(options.replica, every=LAG_EVERY) if options.replica else nullcontext()
        )
        with lag, cpu_meter(server) as cpu:
            seconds, measured = clients_run(
                server.port, key, work.measured, minimal=options.minimal
            )
        failures = warm.failures + measured.failures + posts.failures + reads.failures
        if failures:
            say(server.log_tail())
    say("verifying stored totals …")
    problems = verify(project, work.sent)
    say("raw COPY baseline …")
    copy = copy_baseline(project, run, table=options.copy_table)
    return BenchResult(
        run=run,
        options=options,
        events=work.measured_events,
        requests=work.requests,
        seconds=seconds,
        latencies=measured.latencies,
        failures=failures,
        problems=problems,
        copy=copy,
        cpu=cpu,
        single_posts=posts.latencies,
        budget_reads=reads.latencies,
        replica_lag=lag.samples if isinstance(lag, LagSampler) else [],
        replica_lost=lag.lost if isinstance(lag, LagSampler) else "",
    )


def _cpu_line(cpu: CpuMeter, events: int) -> str:
    ours = cpu.used["gunicorn"] + cpu.used["postgres"]
    others = cpu.used["machine"] - ours - cpu.used["clients"]
    return (
        f"cpu:        gunicorn {cpu.cores('gunicorn'):.2f} cores, PostgreSQL "
        f"{cpu.cores('postgres'):.2f}, clients {cpu.cores('clients'):.2f}, other processes "
        f"{others / cpu.seconds:.2f} (of {cpu.cores('capacity'):.0f}); server + database "
        f"{ours / events * 1e6:.0f} µs CPU per event"
    )


def _percentiles(latencies: list[float]) -> str:
    return (
        ", ".join(f"p{pct} {percentile(latencies, pct) * 1000:.1f} ms" for pct in (50, 95, 99))
        + f", max {max(latencies) * 1000:.1f} ms"
    )


def _spread(options: BenchOptions) -> int:
    return min(
        options.batch, options.spread or max(1, options.batch // STEPS_PER_SESSION_PER_BATCH)
    )


def report_lines(result: BenchResult) -> list[str]:
    o = result.options
    p50 = percentile(result.latencies, 50) * 1000
    p99 = percentile(result.latencies, 99) * 1000
    runs = " / ".join(f"{result.copy.rows / s:,.0f}" for s in result.copy.runs)
    lines = [
        f"run:        {result.run}: {result.events:,} step events in {result.requests} requests "
        f"of {o.batch} from {_spread(o)} sessions each ({o.clients} clients, {o.warmup} "
        "warm-up batches each, not timed)"
        + (f"; {o.budgets} period budgets over the project" if o.budgets else "")
        + (f"; sessions of {o.users} end users" if o.users else "")
        + ("; a rolling 24-hour budget per user" if o.rolling_user_budget else "")
        + ("; Prefer: return=minimal" if o.minimal else ""),
        f"server:     gunicorn, {o.workers} workers × {o.threads} threads, PostgreSQL "
        f"{connection.settings_dict.get('NAME')} (its tables vacuumed first, analyzed after the "
        "warm-up, as autovacuum would)",
        f"ingest:     {result.events_per_second:,.0f} events/s over {result.seconds:.2f} s; "
        f"request latency p50 {p50:.1f} ms, p99 {p99:.1f} ms",
        f"raw COPY:   {result.copy.rate:,.0f} rows/s, the same {result.copy.rows:,} rows into "
        f"a bare {result.copy.table} table (no index, constraint or default); median of "
        f"{len(result.copy.runs)} runs: {runs}",
        f"ratio:      {result.ratio:.3f} of raw COPY",
    ]
    if result.single_posts:
        lines.append(
            f"one step:   {len(result.single_posts)} one-step posts in a row on the server "
            "just started, "
            f"{_percentiles(result.single_posts)}"
        )
        lines.append(
            f"budget:     {len(result.budget_reads)} budget reads in a row, "
            f"{_percentiles(result.budget_reads)}"
        )
    if result.replica_lag:
        lines.append(lag_line(result.replica_lag, LAG_EVERY, lost=result.replica_lost))
    if result.cpu.used:
        lines.append(_cpu_line(result.cpu, result.events))
    if result.failures:
        lines.append(f"FAILED:     {len(result.failures)} requests were not 200/all accepted:")
        lines += [f"  {n} × {f}" for f, n in Counter(result.failures).most_common(10)]
    if result.problems:
        lines.append("MISMATCH:   stored totals differ from what was sent:")
        lines += [f"  {p}" for p in result.problems]
    if result.ok:
        lines.append(
            "verified:   every request 200; steps, the five token sums, cost (steps = sessions "
            "= turns = daily rollups = priced client-side) and steps per session all equal"
        )
    return lines
