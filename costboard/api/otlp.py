"""OTLP/HTTP traces (docs/api.md, "OTLP traces"): spans → steps, one trace = one turn.

Protobuf or OTLP JSON, optionally gzip; the answer is an ExportTraceServiceResponse in the
request's format, spans that cannot be mapped reported as `partial_success.rejected_spans`.
An export of up to 10,000 spans is stored in bounded chunks, each its own transaction, so one
export never holds the locks of its sessions and rollups for all its spans (issue 31); a
chunk the database cannot take is a 503 the exporter retries, its stored spans duplicates.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from functools import reduce
from operator import attrgetter, itemgetter, or_
from typing import Any, cast

import psycopg
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Max, Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from pydantic import ValidationError

from costboard.api.boundary import ApiError, ApiRequest, Operation, Reply, endpoint
from costboard.api.failures import RETRY_AFTER_SECONDS, database_outage
from costboard.api.schemas import ExportTraceServiceRequest, ExportTraceServiceResponse, RpcStatus
from costboard.ingest.json_body import bad_text
from costboard.ingest.otlp import (
    MAX_SPANS,
    PROTOBUF,
    OtlpError,
    OtlpMapping,
    OtlpSpan,
    otlp_decode,
    otlp_gunzip,
    otlp_response,
    otlp_spans,
    otlp_status,
)
from costboard.ingest.schemas import (
    MAX_BODY_BYTES,
    MAX_TURN,
    Event,
    SessionEvent,
    StepEvent,
    validation_errors,
)
from costboard.ingest.service import events_ingest, step_months_ready
from costboard.ingest.sql import ingest_settings
from costboard.models import Project, Session, Step, Turn
from costboard.projects import ingest_tally

# google.rpc.Code values for the Status body of an error response.
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
UNAVAILABLE = 14
BINARY = {"type": "string", "format": "binary", "contentMediaType": PROTOBUF}

TRACES = Operation(
    method="POST",
    summary="OTLP/HTTP traces: GenAI spans become steps, one trace one turn",
    description="An ExportTraceServiceRequest (opentelemetry-proto) as protobuf or OTLP JSON, "
    "optionally with Content-Encoding: gzip (at most 5 MB decompressed, at most "
    f"{MAX_SPANS} spans). The key as Authorization: Bearer or x-costboard-key. "
    "gen_ai.usage.input_tokens includes cached tokens: cache reads and writes are subtracted. "
    "A span is a step (event_id otlp:<trace_id>:<span_id>, so a replay is a duplicate); its "
    "session is gen_ai.conversation.id, else session.id (or LiteLLM's metadata.session_id), else "
    "the system session; its end user is user.id, else enduser.id, else gen_ai.user or llm.user; "
    "the LiteLLM proxy's team and key aliases become the tags team and key_alias. A span that "
    "only repeats "
    "its parent (LiteLLM's raw_gen_ai_request) is not stored. Spans that cannot be mapped are "
    "counted in partialSuccess and the rest stored. The spans are stored in chunks of at most "
    "1,000 (COSTBOARD_OTLP_CHUNK_SPANS), each its own transaction; a chunk the database cannot "
    "take (unreachable, or a statement past COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS) is a 503 "
    "with Retry-After and a google.rpc.Status UNAVAILABLE saying how many spans were stored: "
    "send the export again (exporters do), its stored spans are duplicates.",
    tag="usage",
    body=ExportTraceServiceRequest,
    body_alternatives={PROTOBUF: BINARY},
    responses={
        200: Reply(
            "an ExportTraceServiceResponse in the request's format; "
            "partialSuccess.rejectedSpans counts the spans not stored",
            ExportTraceServiceResponse,
            alternatives={PROTOBUF: BINARY},
        ),
        400: Reply(
            "undecodable body: a google.rpc.Status in the request's format",
            RpcStatus,
            alternatives={PROTOBUF: BINARY},
        ),
        413: Reply(
            "body over 5 MB (decompressed), or over 10,000 spans (field resourceSpans): a "
            "google.rpc.Status",
            RpcStatus,
            alternatives={PROTOBUF: BINARY},
        ),
        415: Reply("not application/x-protobuf or application/json, or not gzip"),
    },
)

log = logging.getLogger(__name__)


def _status_response(
    status: int, message: str, content_type: str, field: str = "body"
) -> HttpResponse:
    code = {400: INVALID_ARGUMENT, 503: UNAVAILABLE}.get(status, RESOURCE_EXHAUSTED)
    return HttpResponse(
        otlp_status(code, message, content_type, field), status=status, content_type=content_type
    )


@endpoint(TRACES)
def traces(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    content_type = request.content_type or ""  # one of the two: the boundary answers 415
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip"):
        message = f"unsupported {encoding!r}: send gzip or no encoding"
        raise ApiError(415, "Content-Encoding", message)
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        ingest_tally(project.pk, refused=1)  # as the events API counts a refused body
        return _status_response(
            413, f"body is {length} bytes; at most {MAX_BODY_BYTES} (5 MB)", content_type
        )
    try:
        body = otlp_gunzip(request.body) if encoding == "gzip" else request.body
        export = otlp_decode(body, content_type, check_json=_documented_shape)
    except OtlpError as exc:
        ingest_tally(project.pk, refused=1)
        return _status_response(exc.status, exc.message, content_type, exc.field)
    except RecursionError:
        ingest_tally(project.pk, refused=1)
        return _status_response(400, "the body nests too deep to be OTLP", content_type)

    mapping = _without_bad_text(otlp_spans(export))
    response = HttpResponse(content_type=content_type)
    if mapping.spans:
        try:
            _store(project, mapping, cast(ApiRequest, request).api_key.prefix)
        except _Unavailable as exc:
            # the operator's side of the 503: which project, and what the database did
            log.warning("OTLP export for project %s answered 503: %s", project.slug, exc)
            # OTLP/HTTP's exporters retry a 503 after Retry-After: the whole export again
            response = _status_response(503, str(exc), content_type, "database")
            response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    # The stored spans were counted by the ingest itself; the spans that could not be mapped:
    ingest_tally(project.pk, refused=mapping.rejected)
    if response.status_code == 200:
        response.content = otlp_response(mapping.rejected, mapping.error_message(), content_type)
    return response


class _Unavailable(Exception):
    """The database could not take a chunk (down, or a statement past the ingest timeout):
    the export is to be retried, its stored chunks then duplicates."""


def _store(project: Project, mapping: OtlpMapping, key_prefix: str) -> None:
    """Number the spans' turns, then store them in chunks of at most
    COSTBOARD_OTLP_CHUNK_SPANS spans, each its own transaction, so no export holds one
    transaction (and its sessions' and rollups' locks) for all its spans.

    A retried export stores nothing twice: a step's event_id is `otlp:<trace>:<span>`, so a
    stored span is a duplicate (step receipts), and the turns of its traces are found by those
    steps. The chunks go in the order the turns were numbered (each session's new traces by
    their first span), so the traces a failed export left unstored are numbered on the retry
    as they were the first time. Raises _Unavailable naming what was stored."""
    with transaction.atomic(), connection.cursor() as cursor:
        ingest_settings(cursor)  # the numbering's reads under the ingest's statement timeout
        try:
            steps = _with_turns(project, mapping)
        except OperationalError as exc:
            if not database_outage(exc):
                raise
            raise _Unavailable(f"{_unavailable(exc)}: nothing stored; retry the export") from exc
    if not steps:
        return
    chunks = _chunks(mapping, steps, settings.COSTBOARD_OTLP_CHUNK_SPANS)
    # their months' partitions made first, each in a transaction of its own (step_months_ready)
    now = timezone.now()
    step_months_ready(steps, now)
    done = 0
    for number, chunk in enumerate(chunks, start=1):
        try:
            events_ingest(project=project, events=chunk.events, now=now, key_prefix=key_prefix)
        except OperationalError as exc:
            if not database_outage(exc):
                raise
            raise _Unavailable(
                f"{_unavailable(exc)} in chunk {number} of {len(chunks)}: {done} of "
                f"{len(steps)} spans stored; retry the export (the stored spans are "
                "recognised and not stored again)"
            ) from exc
        done += chunk.spans


def _unavailable(exc: OperationalError) -> str:
    cause = exc.__cause__
    if isinstance(cause, psycopg.errors.QueryCanceled):
        timeout = settings.COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS
        return f"a statement took longer than the ingest's statement timeout ({timeout} ms)"
    return "the database is unavailable"


@dataclass
class _Chunk:
    events: list[Event]
    spans: int


def _chunks(mapping: OtlpMapping, steps: list[StepEvent], size: int) -> list[_Chunk]:
    """The steps (in _with_turns's order) in chunks of at most `size`, each starting with a
    session event naming the end user (_session_users) of each session whose first step it
    holds."""
    users = _session_users(mapping, steps)
    chunks = []
    seen: set[str] = set()
    for start in range(0, len(steps), size):
        part = steps[start : start + size]
        sessions = {step.session_id for step in part if step.session_id is not None} - seen
        seen |= sessions
        named: list[Event] = [user for user in users if user.session_id in sessions]
        chunks.append(_Chunk(events=[*named, *part], spans=len(part)))
    return chunks


def _session_users(mapping: OtlpMapping, steps: list[StepEvent]) -> list[SessionEvent]:
    """A session event setting the end user of each session whose spans name one (`user.id`,
    `llm.user`, …; the latest span's wins). Spans in the `system` session keep their user in
    their step's metadata only: that session is the project's, not one user's."""
    user_of = {span.step.event_id: (span.start_ns, span.user_id) for span in mapping.spans}
    latest: dict[str, tuple[int, str]] = {}
    for step in steps:
        start, user = user_of.get(step.event_id, (0, None))
        if step.session_id is None or not user:
            continue
        if step.session_id not in latest or latest[step.session_id][0] <= start:
            latest[step.session_id] = (start, user)
    return [
        SessionEvent(type="session", session_id=session, user_id=user)
        for session, (_, user) in sorted(latest.items())
    ]


def _documented_shape(payload: dict[str, Any]) -> None:
    """OTLP JSON as the OpenAPI document describes it (ExportTraceServiceRequest), or
    ValueError naming the first field that is not: a 400, as for undecodable protobuf."""
    try:
        ExportTraceServiceRequest.model_validate(payload)
    except ValidationError as exc:
        error = validation_errors(exc)[0]
        raise ValueError(f"{error['field']}: {error['message']}") from None


def _without_bad_text(mapping: OtlpMapping) -> OtlpMapping:
    """Spans whose text PostgreSQL would refuse (NUL: protobuf strings may hold it) are
    rejected like other unmappable spans, with the reason."""
    kept: list[OtlpSpan] = []
    for span in mapping.spans:
        step = span.step
        texts = [step.session_id, step.step_type, step.model, step.provider, step.error]
        found = bad_text({"text": texts, "metadata": step.metadata})
        if found is None:
            kept.append(span)
        else:
            mapping.rejected += 1
            span_id = (step.event_id or "?").rsplit(":", 1)[-1]
            mapping.errors.append(f"span {span_id}: {found[1]}")
    mapping.spans = kept
    return mapping


def _with_turns(project: Project, mapping: OtlpMapping) -> list[StepEvent]:
    """The steps, each numbered with its trace's turn: the turn an earlier export of the same
    trace got (found by its steps' event_ids, `otlp:<trace>:…`), else the session's next
    turns, in order of the traces' first span. A span without a session id joins the session
    of its trace's earlier steps (exporters send a trace's spans as they end, and tool spans
    rarely carry the conversation id), else the `system` session, without a turn.
    Replay-safe; two exporters racing on one new trace of a session can at worst split it
    into two turns. A session already at the last turn number (2^31 − 1) takes no new trace:
    its spans are rejected in `mapping`."""
    spans = mapping.spans
    known: dict[tuple[str, str], int] = {}
    home: dict[str, str] = {}  # trace → session, for spans without one
    for trace, home_session, number in earlier_turns(project, {span.trace_id for span in spans}):
        home.setdefault(trace, home_session)
        known.setdefault((home_session, trace), number)

    sessions = [span.step.session_id or home.get(span.trace_id) for span in spans]
    first_start: dict[tuple[str, str], int] = {}
    for span, span_session in zip(spans, sessions, strict=True):
        if span_session is not None:
            key = (span_session, span.trace_id)
            first_start[key] = min(first_start.get(key, span.start_ns), span.start_ns)
    if not first_start:
        return [span.step for span in sorted(spans, key=attrgetter("start_ns"))]

    session_pks = Session.objects.filter(
        project=project, external_id__in=sorted({s for s, _ in first_start})
    )
    top: dict[str, int] = defaultdict(int)
    for row in (
        Turn.objects.filter(project=project, session__in=session_pks)
        .values("session__external_id")
        .annotate(top=Max("number"))
    ):
        top[row["session__external_id"]] = row["top"] or 0
    full: set[tuple[str, str]] = set()  # (session, trace) without a turn number left
    for (session, trace), _ in sorted(first_start.items(), key=lambda item: (item[1], item[0])):
        if (session, trace) in known:
            continue
        if top[session] >= MAX_TURN:
            full.add((session, trace))
            continue
        top[session] += 1
        known[(session, trace)] = top[session]

    # in the order the turns were numbered, a trace's spans as the export has them; a span
    # outside any turn (the system session) by its own start
    steps: list[tuple[tuple[int, str, str, int], StepEvent]] = []
    for n, (span, span_session) in enumerate(zip(spans, sessions, strict=True)):
        if span_session is None:
            steps.append(((span.start_ns, "", span.trace_id, n), span.step))
        elif (span_session, span.trace_id) in full:
            span_id = (span.step.event_id or "?").rsplit(":", 1)[-1]
            mapping.rejected += 1
            mapping.errors.append(
                f"span {span_id}: session {span_session!r} has reached turn {MAX_TURN}, the "
                "last: start a new session (gen_ai.conversation.id)"
            )
        else:
            key = (span_session, span.trace_id)
            step = span.step.model_copy(update={"session_id": span_session, "turn": known[key]})
            steps.append(((first_start[key], span_session, span.trace_id, n), step))
    return [step for _, step in sorted(steps, key=itemgetter(0))]


# The steps of earlier exports of these traces that have a turn, with their session and turn.
# One statement whatever the number of traces: per trace, a probe of step_otlp_event
# (migration 0009: project_id, event_id varchar_pattern_ops, WHERE event_id LIKE 'otlp:%') for
# the range of its event_ids `otlp:<trace>:…` (';' follows ':'), where one LIKE per trace OR-ed
# together took seconds for 10,000 traces, growing with the table. The lateral subquery is
# ordered as that index is (~<~), so it is run per trace and, with sorting off, by that index
# even where the statistics do not know the project yet (they would take a scan of the
# project's every step per trace: 10,000 traces × 10,000 steps past the statement timeout).
EARLIER_TURNS = f"""
SELECT st.id, t.trace,
    (SELECT external_id FROM {Session._meta.db_table} WHERE id = st.session_id),
    (SELECT number FROM {Turn._meta.db_table} WHERE id = st.turn_id)
FROM unnest(%s::text[]) AS t(trace)
CROSS JOIN LATERAL (
    SELECT id, session_id, turn_id FROM {Step._meta.db_table}
    WHERE project_id = %s AND event_id LIKE 'otlp:%%' AND turn_id IS NOT NULL
      AND event_id ~>=~ ('otlp:' || t.trace || ':') AND event_id ~<~ ('otlp:' || t.trace || ';')
    ORDER BY event_id USING ~<~
) AS st
"""  # noqa: S608 — model tables; the traces are bound parameters
TRACES_PER_QUERY = 200  # SQLite: the traces OR-ed in one statement


def earlier_turns(project: Project, traces: set[str]) -> list[tuple[str, str, int]]:
    """(trace, session, turn number) of each stored step of these traces that has a turn, in
    the order the steps were stored: a trace's first row is its home session, a (trace,
    session) pair's first row its turn. On PostgreSQL inside a transaction (the numbering's:
    SET LOCAL)."""
    if not traces:
        return []
    found: list[tuple[int, str, str, int]] = []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('enable_sort', 'off', true)")
            cursor.execute(EARLIER_TURNS, [sorted(traces), project.pk])
            found = cursor.fetchall()
            cursor.execute("SELECT set_config('enable_sort', 'on', true)")
        return [(trace, session, number) for _, trace, session, number in sorted(found)]
    ordered = sorted(traces)
    for start in range(0, len(ordered), TRACES_PER_QUERY):
        chunk = ordered[start : start + TRACES_PER_QUERY]
        of_traces = reduce(or_, (Q(event_id__startswith=f"otlp:{t}:") for t in chunk))
        found += [
            (pk, (event_id or "").split(":")[1], session, number)
            for pk, event_id, session, number in Step.objects.filter(
                Q(event_id__startswith="otlp:") & of_traces, project=project, turn__isnull=False
            ).values_list("id", "event_id", "session__external_id", "turn__number")
        ]
    return [(trace, session, number) for _, trace, session, number in sorted(found)]
