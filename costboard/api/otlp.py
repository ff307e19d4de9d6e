"""OTLP/HTTP traces (docs/api.md, "OTLP traces"): spans → steps, one trace = one turn.

Protobuf or OTLP JSON, optionally gzip; the answer is an ExportTraceServiceResponse in the
request's format, spans that cannot be mapped reported as `partial_success.rejected_spans`.
An export of up to 10,000 spans is stored in bounded chunks, each its own transaction, so one
export never holds the locks of its sessions and rollups for all its spans (issue 31); a
chunk the database cannot take is a 503 the exporter retries, its stored spans duplicates.
The mapping, the turns and the chunks live in costboard/ingest/otlp/: this view checks the
encoding and size, decodes, calls `otlp_store` and answers.
"""

from __future__ import annotations

import logging
from typing import cast

from django.http import HttpRequest, HttpResponse

from costboard.api.boundary import ApiError, ApiRequest, Operation, Reply, endpoint
from costboard.api.encoding import BodyRefused, content_length, gunzip
from costboard.api.failures import RETRY_AFTER_SECONDS
from costboard.api.schemas import ExportTraceServiceResponse, RpcStatus
from costboard.ingest.otlp.decode import (
    MAX_SPANS,
    PROTOBUF,
    OtlpError,
    otlp_read,
    otlp_response,
    otlp_status,
)
from costboard.ingest.otlp.json_models import ExportTraceServiceRequest
from costboard.ingest.otlp.store import OtlpUnavailable, otlp_store
from costboard.ingest.schemas import MAX_BODY_BYTES
from costboard.models import Project
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
    "its parent (LiteLLM's raw_gen_ai_request) is not stored, nor is an HTTP, database, RPC or "
    "messaging span with no GenAI attribute (the transport below a step). Spans that cannot be "
    "mapped are "
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


def _body_refused(project: Project, exc: BodyRefused, content_type: str) -> HttpResponse:
    """A body that cannot be read as sent, answered as OTLP answers (and counted refused)."""
    ingest_tally(project.pk, refused=1)
    message = f"{exc.field} {exc.message}"  # a google.rpc.Status has no field of its own
    return _status_response(exc.status, message, content_type, exc.field)


@endpoint(TRACES)
def traces(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    content_type = request.content_type or ""  # one of the two: the boundary answers 415
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip"):
        message = f"unsupported {encoding!r}: send gzip or no encoding"
        raise ApiError(415, "Content-Encoding", message)
    try:
        length = content_length(request)
    except BodyRefused as exc:  # not a size in bytes: Django could not read the body
        return _body_refused(project, exc, content_type)
    if length > MAX_BODY_BYTES:
        ingest_tally(project.pk, refused=1)  # as the events API counts a refused body
        return _status_response(
            413, f"body is {length} bytes; at most {MAX_BODY_BYTES} (5 MB)", content_type
        )
    try:
        # the events API's reading: several gzip members in turn (RFC 1952), a bomb refused
        # as soon as it passes the limit
        body = (
            gunzip(request.body, limit=MAX_BODY_BYTES, what="5 MB: export less")
            if encoding == "gzip"
            else request.body
        )
    except BodyRefused as exc:  # not the whole gzip it claims to be, or past the limit
        return _body_refused(project, exc, content_type)
    try:
        mapping = otlp_read(body, content_type)
    except OtlpError as exc:
        ingest_tally(project.pk, refused=1)
        return _status_response(exc.status, exc.message, content_type, exc.field)
    except RecursionError:
        ingest_tally(project.pk, refused=1)
        return _status_response(400, "the body nests too deep to be OTLP", content_type)

    response = HttpResponse(content_type=content_type)
    if mapping.spans:
        try:
            otlp_store(project, mapping, cast(ApiRequest, request).api_key.prefix)
        except OtlpUnavailable as exc:
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
