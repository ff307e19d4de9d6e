"""OTLP/HTTP traces (docs/api.md, "OTLP traces"): spans → steps, one trace = one turn.

Protobuf or OTLP JSON, optionally gzip; the answer is an ExportTraceServiceResponse in the
request's format, spans that cannot be mapped reported as `partial_success.rejected_spans`.
"""

from __future__ import annotations

from collections import defaultdict
from functools import reduce
from operator import or_
from typing import Any, cast

from django.db import transaction
from django.db.models import Max, Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from pydantic import ValidationError

from costboard.api.boundary import ApiError, ApiRequest, Operation, Reply, endpoint
from costboard.api.schemas import ExportTraceServiceRequest, ExportTraceServiceResponse, RpcStatus
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
    MAX_EVENTS,
    MAX_TURN,
    Event,
    SessionEvent,
    StepEvent,
    bad_text,
    validation_errors,
)
from costboard.ingest.service import events_ingest, step_months_ready
from costboard.models import Project, Session, Step, Turn
from costboard.projects import ingest_tally

# google.rpc.Code values for the Status body of an error response.
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
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
    "counted in partialSuccess and the rest stored.",
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


def _status_response(
    status: int, message: str, content_type: str, field: str = "body"
) -> HttpResponse:
    code = INVALID_ARGUMENT if status == 400 else RESOURCE_EXHAUSTED
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
    steps: list[Event] = list(_with_turns(project, mapping)) if mapping.spans else []
    if steps:
        steps = _session_users(mapping, steps) + steps
    if steps:
        # One request is stored all or nothing, in batches of the events API's size; their
        # months' partitions made first, not inside that transaction (step_months_ready).
        now = timezone.now()
        step_months_ready(steps, now)
        with transaction.atomic():
            for start in range(0, len(steps), MAX_EVENTS):
                events_ingest(
                    project=project,
                    events=steps[start : start + MAX_EVENTS],
                    now=now,
                    key_prefix=cast(ApiRequest, request).api_key.prefix,
                )
    # The stored spans were counted by the ingest itself; the spans that could not be mapped:
    ingest_tally(project.pk, refused=mapping.rejected)
    return HttpResponse(
        otlp_response(mapping.rejected, mapping.error_message(), content_type),
        content_type=content_type,
    )


def _session_users(mapping: OtlpMapping, steps: list[Event]) -> list[Event]:
    """A session event setting the end user of each session whose spans name one (`user.id`,
    `llm.user`, …; the latest span's wins). Spans in the `system` session keep their user in
    their step's metadata only: that session is the project's, not one user's."""
    user_of = {span.step.event_id: (span.start_ns, span.user_id) for span in mapping.spans}
    latest: dict[str, tuple[int, str]] = {}
    for step in steps:
        assert isinstance(step, StepEvent)
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
    orphans = {span.trace_id for span in spans if span.step.session_id is None}
    if orphans:
        earlier = (
            Step.objects.filter(_traces_q(orphans), project=project, turn__isnull=False)
            .values_list("event_id", "session__external_id", "turn__number")
            .order_by("id")
        )
        for event_id, home_session, number in earlier:
            trace = (event_id or "").split(":")[1]
            home.setdefault(trace, home_session)
            known.setdefault((home_session, trace), number)

    sessions = [span.step.session_id or home.get(span.trace_id) for span in spans]
    first_start: dict[tuple[str, str], int] = {}
    for span, span_session in zip(spans, sessions, strict=True):
        if span_session is not None:
            key = (span_session, span.trace_id)
            first_start[key] = min(first_start.get(key, span.start_ns), span.start_ns)
    if not first_start:
        return [span.step for span in spans]

    session_pks = Session.objects.filter(
        project=project, external_id__in=sorted(home.values()) + sorted({s for s, _ in first_start})
    )
    unknown = [key for key in first_start if key not in known]
    if unknown:
        seen = reduce(
            or_,
            (
                Q(session__external_id=session, event_id__startswith=f"otlp:{trace}:")
                for session, trace in unknown
            ),
        ) & Q(event_id__startswith="otlp:")
        prior = (
            Step.objects.filter(seen, session__in=session_pks, turn__isnull=False)
            .values_list("session__external_id", "event_id", "turn__number")
            .order_by("id")
        )
        for step_session, step_event_id, number in prior:
            known.setdefault((step_session, (step_event_id or "").split(":")[1]), number)

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

    steps: list[StepEvent] = []
    for span, span_session in zip(spans, sessions, strict=True):
        if span_session is None:
            steps.append(span.step)
        elif (span_session, span.trace_id) in full:
            span_id = (span.step.event_id or "?").rsplit(":", 1)[-1]
            mapping.rejected += 1
            mapping.errors.append(
                f"span {span_id}: session {span_session!r} has reached turn {MAX_TURN}, the "
                "last: start a new session (gen_ai.conversation.id)"
            )
        else:
            turn = known[(span_session, span.trace_id)]
            steps.append(span.step.model_copy(update={"session_id": span_session, "turn": turn}))
    return steps


def _traces_q(traces: set[str]) -> Q:
    """Steps of these traces. The bare `otlp:` prefix repeats the partial index's predicate
    (step_otlp_event, migration 0009), so PostgreSQL can prove the index applies."""
    of_traces = reduce(or_, (Q(event_id__startswith=f"otlp:{t}:") for t in sorted(traces)))
    return Q(event_id__startswith="otlp:") & of_traces
