"""The OTLP benchmark behind `manage.py bench_otlp` (docs/benchmarks.md, "OTLP exports").

Issue 31 found one 10,000-span export taking 13–34 s on one server thread. This times such
exports, serialized before the clock starts, posted one after another to a real gunicorn serving
`/v1/traces` on PostgreSQL, in two shapes: `trace` (one agent run: one trace, one session, its
chat spans with usage and its tool spans without a conversation id) and `traces` (a gateway's
batch: every span its own trace, so its own turn, spread over `--sessions` sessions). Every
export must answer 200 with nothing rejected, and the stored steps and cost must equal what was
sent, priced client-side.
"""

from __future__ import annotations

import http.client
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from django.db import connection
from django.db.models import Sum
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from costboard.models import Project, Step
from costboard.pricing.rates import rate_table
from devtools.ingest_bench import (
    gunicorn,
    prices_ensure,
    project_create,
    projects_removed,
    require_postgres,
    vacuum,
)

SHAPES = ("trace", "traces")
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
MODEL = ("claude-sonnet-4-5", "anthropic")
MS = 1_000_000


@dataclass(frozen=True)
class Export:
    shape: str
    body: bytes
    spans: int
    cost: Decimal  # of its chat spans, priced as ingest prices them


def _attribute(key: str, value: str | int) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value
    return kv


def export_build(
    *, shape: str, spans: int, run: str, number: int, sessions: int = 100, seed: int = 7
) -> Export:
    """Export `number` of a run in `shape`, with ids of its own (a later export is no replay)."""
    rng = random.Random(f"{seed}-{shape}-{number}")
    table = rate_table()
    start = int(datetime.now(UTC).timestamp()) * 10**9 - 3600 * 10**9
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.append(_attribute("service.name", "bench-agent"))
    scope = resource.scope_spans.add()
    cost = Decimal(0)
    trace_of_run = rng.getrandbits(128).to_bytes(16, "big")
    for k in range(spans):
        span = Span()
        if shape == "trace":
            span.trace_id = trace_of_run
            session = f"{run}-{shape}-{number}"
            tool = k % 3 == 2  # a tool call after every two chat calls
        else:
            span.trace_id = rng.getrandbits(128).to_bytes(16, "big")
            session = f"{run}-{shape}-{number}-s{k % sessions}"
            tool = False
        span.span_id = (k + 1 + (number << 32)).to_bytes(8, "big")
        at = start + k * 2 * MS
        span.start_time_unix_nano = at
        span.end_time_unix_nano = at + rng.randint(80, 4000) * MS
        if tool:
            span.name = "execute_tool search"
            span.attributes.extend(
                [
                    _attribute("gen_ai.operation.name", "execute_tool"),
                    _attribute("gen_ai.tool.name", "search"),
                ]
            )
        else:
            fresh, output = rng.randint(50, 900), rng.randint(5, 400)
            read, written = rng.choice((0, rng.randint(500, 30_000))), rng.randint(0, 300)
            span.name = f"chat {MODEL[0]}"
            span.attributes.extend(
                [
                    _attribute("gen_ai.operation.name", "chat"),
                    _attribute("gen_ai.provider.name", MODEL[1]),
                    _attribute("gen_ai.request.model", MODEL[0]),
                    _attribute("gen_ai.conversation.id", session),
                    _attribute("user.id", f"user-{k % 7}"),
                    _attribute("gen_ai.usage.input_tokens", fresh + read + written),
                    _attribute("gen_ai.usage.cache_read.input_tokens", read),
                    _attribute("gen_ai.usage.cache_creation.input_tokens", written),
                    _attribute("gen_ai.usage.output_tokens", output),
                ]
            )
            cost += table.price(
                model=MODEL[0],
                provider=MODEL[1],
                when=datetime.fromtimestamp(at // 10**9, tz=UTC),
                input_tokens=fresh,
                output_tokens=output,
                cache_read_input_tokens=read,
                cache_creation_input_tokens=written,
            ).total
        scope.spans.append(span)
    return Export(shape=shape, body=request.SerializeToString(), spans=spans, cost=cost)


@dataclass
class BenchOptions:
    spans: int = 10_000
    shapes: tuple[str, ...] = SHAPES
    runs: int = 3
    sessions: int = 100
    keep: bool = False


@dataclass
class BenchResult:
    run: str
    options: BenchOptions
    seconds: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.problems


def export_post(port: int, key: str, export: Export) -> tuple[float, str | None]:
    """Seconds the export took to be answered, and what went wrong (None: 200, none rejected)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Content-Type": PROTOBUF, "Authorization": f"Bearer {key}"}
    try:
        began = time.perf_counter()
        conn.request("POST", TRACES_PATH, body=export.body, headers=headers)
        response = conn.getresponse()
        body = response.read()
        seconds = time.perf_counter() - began
    finally:
        conn.close()
    if response.status != 200:
        return seconds, f"{export.shape}: HTTP {response.status}: {body[:300]!r}"
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(body)
    if answer.partial_success.rejected_spans:
        return seconds, (
            f"{export.shape}: {answer.partial_success.rejected_spans} spans rejected: "
            f"{answer.partial_success.error_message}"
        )
    return seconds, None


def verify(project: Project, exports: list[Export]) -> list[str]:
    """Differences between the spans sent and the steps stored (empty: equal)."""
    steps = Step.objects.filter(project=project)
    problems = []
    sent = sum(e.spans for e in exports)
    if (stored := steps.count()) != sent:
        problems.append(f"steps stored {stored}, spans sent {sent}")
    cost = steps.aggregate(total=Sum("cost_usd"))["total"] or Decimal(0)
    if cost != (expected := sum((e.cost for e in exports), Decimal(0))):
        problems.append(f"cost stored {cost}, priced client-side {expected}")
    return problems


def bench_run(options: BenchOptions, say: Callable[[str], None]) -> BenchResult:
    require_postgres("bench_otlp")
    if prices_ensure():
        say("loaded the built-in prices (the rate table was empty)")
    run = datetime.now(UTC).strftime("otlp-%Y%m%d-%H%M%S")
    project, key = project_create(run)
    with projects_removed([project], keep=options.keep, say=say):
        return _measure(run, project, key, options, say)


def _measure(
    run: str, project: Project, key: str, options: BenchOptions, say: Callable[[str], None]
) -> BenchResult:
    result = BenchResult(run=run, options=options)
    say(f"project {run}: building the exports ({options.spans:,} spans each) …")
    warmup = export_build(shape="traces", spans=20, run=run, number=0, sessions=2)
    exports = [
        export_build(
            shape=shape, spans=options.spans, run=run, number=n + 1, sessions=options.sessions
        )
        for n in range(options.runs)
        for shape in options.shapes
    ]
    vacuum()
    with gunicorn(workers=1, threads=1) as server:
        _, failure = export_post(server.port, key, warmup)  # the worker's first request
        if failure:
            result.failures.append(f"warm-up: {failure}")
        connection.close()
        for export in exports:
            seconds, failure = export_post(server.port, key, export)
            say(f"{export.shape}: {seconds:.2f} s")
            result.seconds.setdefault(export.shape, []).append(seconds)
            if failure:
                result.failures.append(failure)
        if result.failures:
            say(server.log_tail())
    say("verifying stored steps and cost …")
    result.problems = verify(project, [warmup, *exports])
    return result


SHAPE_TEXT = {
    "trace": "one trace (an agent run: 2 chat spans to 1 tool span, one session)",
    "traces": "one span per trace (a gateway's batch: each its own turn)",
}


def report_lines(result: BenchResult) -> list[str]:
    o = result.options
    lines = [
        f"run:        {result.run}: {o.runs} exports of {o.spans:,} spans per shape, protobuf, "
        "posted one after another to gunicorn (1 worker × 1 thread), PostgreSQL "
        f"{connection.settings_dict.get('NAME')}",
    ]
    for shape, seconds in result.seconds.items():
        detail = SHAPE_TEXT[shape] + (f", {o.sessions} sessions" if shape == "traces" else "")
        lines.append(
            f"{shape + ':':<11} median {statistics.median(seconds):.2f} s, "
            f"runs {' / '.join(f'{s:.2f}' for s in seconds)} s — {detail}"
        )
    if result.failures:
        lines.append(f"FAILED:     {len(result.failures)} exports were not 200 with none rejected:")
        lines += [f"  {f}" for f in result.failures[:10]]
    if result.problems:
        lines.append("MISMATCH:   stored steps differ from the spans sent:")
        lines += [f"  {p}" for p in result.problems]
    if result.ok:
        lines.append(
            "verified:   every export 200, none rejected; steps stored = spans sent, cost = "
            "priced client-side"
        )
    return lines
