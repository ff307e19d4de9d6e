"""The fair-share benchmark behind `manage.py bench_fairshare` (issue 31).

One key (A) sends eight large OTLP exports at once while another project's key (B) posts
one-event batches in a loop, to a real gunicorn (2 workers × 4 threads) on PostgreSQL, with
the API's limits kept in Redis when a URL is given. Without the requests-in-flight limit the
eight exports held every server thread and B's posts waited minutes; with it, A is answered
429 past its limit and B keeps being served. It prints, per key, what was answered (200, 429,
other), the latency of B's posts, and how long A's admitted exports took; then checks that
what was answered 200 is what was stored.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from costboard.models import ApiKey, Project, Step
from devtools.ingest_bench import (
    BENCH_RATE_LIMIT,
    gunicorn,
    percentile,
    prices_ensure,
    projects_removed,
    require_postgres,
)

PROTOBUF = "application/x-protobuf"
EVENTS_PATH = "/api/v1/events"
TRACES_PATH = "/v1/traces"
MODEL = "gpt-4o-mini"  # priced by the built-in rate table


@dataclass(frozen=True)
class FairshareOptions:
    exports: int = 8  # key A's concurrent OTLP exports
    spans: int = 10_000  # spans per export
    traces: int = 100  # traces per export (a trace is a turn; each its own session)
    workers: int = 2
    threads: int = 4
    max_in_flight: int = 2  # key A's project's own limit (0: none, the "before" run)
    redis: str = ""  # the limits' Redis (the broker's URL); blank: each process counts its own
    retry: bool = False  # A retries a 429 after Retry-After, as OTLP exporters do
    timeout: float = 600.0  # seconds a client waits for one answer
    keep: bool = False


# --- the bodies ---------------------------------------------------------------------------


def _attribute(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def export_body(run: str, number: int, spans: int, traces: int, start: datetime) -> bytes:
    """Export `number` of key A: `spans` GenAI chat spans over `traces` traces (each trace one
    turn of its own session), ids unique to the run, serialized as protobuf."""
    traces = max(1, min(traces, spans))
    t0 = int(start.timestamp() * 1e9) + number * 1_000_000_000
    out = []
    for n in range(spans):
        trace = n % traces
        session = f"{run}-a{number}-t{trace}"
        begin = t0 + n * 1_000_000
        out.append(
            Span(
                trace_id=(number * 1_000_003 + trace + 1).to_bytes(16, "big"),
                span_id=(n + 1).to_bytes(8, "big"),
                name=f"chat {MODEL}",
                kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=begin,
                end_time_unix_nano=begin + 800_000_000,
                attributes=[
                    _attribute("gen_ai.operation.name", "chat"),
                    _attribute("gen_ai.provider.name", "openai"),
                    _attribute("gen_ai.request.model", MODEL),
                    _attribute("gen_ai.response.model", MODEL),
                    _attribute("gen_ai.conversation.id", session),
                    _attribute("gen_ai.usage.input_tokens", 200 + n % 700),
                    _attribute("gen_ai.usage.output_tokens", 20 + n % 300),
                ],
            )
        )
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=out)])]
    )
    body: bytes = request.SerializeToString()  # protobuf's messages are untyped
    return body


def event_body(run: str, number: int, at: datetime) -> bytes:
    event = {
        "event_id": f"{run}-b-{number}",
        "session_id": f"{run}-b",
        "step_type": "response",
        "model": MODEL,
        "timestamp": at.isoformat().replace("+00:00", "Z"),
        "input_tokens": 100,
        "output_tokens": 10,
    }
    return json.dumps({"events": [event]}, separators=(",", ":")).encode()


# --- the clients ----------------------------------------------------------------------------


@dataclass
class Answers:
    """What one key was answered: each status (or the failure), and the time each took."""

    statuses: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)  # of every answer
    admitted: list[float] = field(default_factory=list)  # of the 200s
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, status: str, seconds: float) -> None:
        with self.lock:
            self.statuses[status] += 1
            self.seconds.append(seconds)
            if status == "200":
                self.admitted.append(seconds)

    def count(self, status: str) -> int:
        return self.statuses.get(status, 0)

    @property
    def other(self) -> int:
        return sum(n for status, n in self.statuses.items() if status not in ("200", "429"))


def _send(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[str, int]:
    """One request: its status as text (or the failure's name), and Retry-After (0 if none)."""
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        return type(exc).__name__, 0
    retry_after = response.getheader("Retry-After") or "0"
    return str(response.status), int(retry_after) if retry_after.isdigit() else 0


def exporter(
    port: int,
    key: str,
    body: bytes,
    answers: Answers,
    start: threading.Barrier,
    options: FairshareOptions,
) -> None:
    """Key A's exporter: one export, sent again after Retry-After while refused if `retry`."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": PROTOBUF}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=options.timeout)
    start.wait()
    while True:
        began = time.perf_counter()
        status, retry_after = _send(conn, TRACES_PATH, body, headers)
        answers.add(status, time.perf_counter() - began)
        if status != "429" or not options.retry:
            break
        time.sleep(max(1, retry_after))
    conn.close()


def poster(
    port: int,
    key: str,
    run: str,
    answers: Answers,
    start: threading.Barrier,
    stop: threading.Event,
    timeout: float,
) -> None:
    """Key B: one-event posts one after another on a keep-alive connection until `stop`."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    at = datetime.now(UTC) - timedelta(minutes=10)
    start.wait()
    number = 0
    while not stop.is_set():
        body = event_body(run, number, at + timedelta(milliseconds=number))
        began = time.perf_counter()
        status, _ = _send(conn, EVENTS_PATH, body, headers)
        answers.add(status, time.perf_counter() - began)
        number += 1
    conn.close()


# --- the run --------------------------------------------------------------------------------


@dataclass
class FairshareResult:
    run: str
    options: FairshareOptions
    a: Answers
    b: Answers
    seconds: float  # from the common start until A's last answer
    stored_a: int
    stored_b: int
    database: str

    @property
    def problems(self) -> list[str]:
        found = []
        if self.stored_a != self.a.count("200") * self.options.spans:
            found.append(
                f"key A: {self.stored_a} steps stored, {self.a.count('200')} exports of "
                f"{self.options.spans} spans answered 200"
            )
        if self.stored_b != self.b.count("200"):
            found.append(f"key B: {self.stored_b} steps stored, {self.b.count('200')} posts 200")
        return found


def projects_create(run: str, options: FairshareOptions) -> tuple[Project, str, Project, str]:
    """A with its limit in flight, B with the default; neither held by the rate limit (eight
    requests are far under it anyway, B's loop might not be)."""
    a = Project.objects.create(
        name=f"Fairshare A {run}",
        slug=f"{run}-a",
        api_rate_limit=BENCH_RATE_LIMIT,
        api_max_in_flight=options.max_in_flight,
    )
    b = Project.objects.create(
        name=f"Fairshare B {run}", slug=f"{run}-b", api_rate_limit=BENCH_RATE_LIMIT
    )
    _, key_a = ApiKey.issue(project=a, name="bench_fairshare")
    _, key_b = ApiKey.issue(project=b, name="bench_fairshare")
    return a, key_a, b, key_b


def fairshare_run(options: FairshareOptions, say: Callable[[str], None]) -> FairshareResult:
    require_postgres("bench_fairshare")
    if prices_ensure():
        say("loaded the built-in prices (the rate table was empty)")
    run = datetime.now(UTC).strftime("fair-%Y%m%d-%H%M%S")
    a, key_a, b, key_b = projects_create(run, options)
    with projects_removed([a, b], keep=options.keep, say=say):
        return _measure(run, options, a, key_a, b, key_b, say)


def _measure(
    run: str,
    options: FairshareOptions,
    a: Project,
    key_a: str,
    b: Project,
    key_b: str,
    say: Callable[[str], None],
) -> FairshareResult:
    say(f"building {options.exports} exports of {options.spans:,} spans …")
    start_at = datetime.now(UTC) - timedelta(minutes=30)
    bodies = [
        export_body(run, n, options.spans, options.traces, start_at) for n in range(options.exports)
    ]
    database = str(connection.settings_dict.get("NAME"))
    extra_env = {"CELERY_BROKER_URL": options.redis}  # blank: none, whatever this shell says
    connection.close()
    with gunicorn(workers=options.workers, threads=options.threads, extra_env=extra_env) as server:
        say(
            f"gunicorn on 127.0.0.1:{server.port}: {options.exports} exports from key A at "
            "once, key B posting one event at a time until they are answered …"
        )
        a_answers, b_answers = Answers(), Answers()
        barrier = threading.Barrier(options.exports + 2)
        stop = threading.Event()
        exporters = [
            threading.Thread(
                target=exporter, args=(server.port, key_a, body, a_answers, barrier, options)
            )
            for body in bodies
        ]
        b_thread = threading.Thread(
            target=poster,
            args=(server.port, key_b, run, b_answers, barrier, stop, options.timeout),
        )
        for thread in [*exporters, b_thread]:
            thread.start()
        barrier.wait()
        began = time.perf_counter()
        for thread in exporters:
            thread.join()
        seconds = time.perf_counter() - began
        stop.set()
        b_thread.join()
        if a_answers.other or b_answers.other:
            say(server.log_tail())
    stored_a = Step.objects.filter(project=a).count()
    stored_b = Step.objects.filter(project=b).count()
    return FairshareResult(
        run=run,
        options=options,
        a=a_answers,
        b=b_answers,
        seconds=seconds,
        stored_a=stored_a,
        stored_b=stored_b,
        database=database,
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def report_lines(result: FairshareResult) -> list[str]:
    o, a, b = result.options, result.a, result.b
    limits = f"Redis {o.redis}" if o.redis else "each process's own (no Redis)"
    in_flight = f"at most {o.max_in_flight}" if o.max_in_flight else "no limit of requests"
    admitted = ", ".join(f"{s:.1f} s" for s in sorted(a.admitted)) or "none"
    lines = [
        f"run:        {result.run}",
        f"server:     gunicorn, {o.workers} workers × {o.threads} threads, PostgreSQL "
        f"{result.database}; the API's limits kept in {limits}",
        f"key A:      {o.exports} OTLP exports of {o.spans:,} spans ({o.traces:,} traces) at "
        f"once, {in_flight} in flight"
        + ("; a refused export retried after Retry-After" if o.retry else ""),
        f"  answered: {a.count('200')} × 200, {a.count('429')} × 429, {a.other} other"
        + (f" ({dict(a.statuses)})" if a.other else ""),
        f"  admitted exports took: {admitted}; all answered after {result.seconds:.1f} s",
        f"key B:      {len(b.seconds)} one-event posts, one after another, meanwhile",
        f"  answered: {b.count('200')} × 200, {b.count('429')} × 429, {b.other} other"
        + (f" ({dict(b.statuses)})" if b.other else ""),
    ]
    if b.seconds:
        lines.append(
            f"  latency:  p50 {_ms(percentile(b.seconds, 50))}, p99 "
            f"{_ms(percentile(b.seconds, 99))}, max {_ms(max(b.seconds))}"
        )
    lines.append(f"stored:     key A {result.stored_a:,} steps, key B {result.stored_b:,} steps")
    problems = result.problems
    if problems:
        lines += ["MISMATCH:   " + problem for problem in problems]
    else:
        lines.append("verified:   what was answered 200 is what was stored, for both keys")
    return lines


def options_faults(options: FairshareOptions) -> list[str]:
    """What is wrong with the options, each naming its flag; empty when they can run."""
    from costboard.ingest.otlp import MAX_SPANS

    faults = []
    for name in ("exports", "workers", "threads", "traces"):
        if getattr(options, name) < 1:
            faults.append(f"--{name} must be at least 1")
    if not 1 <= options.spans <= MAX_SPANS:
        faults.append(f"--spans must be 1 to {MAX_SPANS} (the API's limit per export)")
    if options.max_in_flight < 0:
        faults.append("--max-in-flight must be 0 (no limit) or more")
    if options.timeout <= 0:
        faults.append("--timeout must be more than 0 seconds")
    if options.redis and not options.redis.startswith(("redis://", "rediss://")):
        faults.append("--redis must be a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379/0")
    return faults


def env_redis() -> str:
    """The broker's URL when it is Redis, as the server would read it."""
    url = os.environ.get("CELERY_BROKER_URL", "")
    return url if url.startswith(("redis://", "rediss://")) else ""
