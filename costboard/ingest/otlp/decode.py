"""OTLP/HTTP bodies (docs/api.md, "OTLP traces"): a protobuf or OTLP JSON body, maybe gzip,
read into an `ExportTraceServiceRequest`, and the answers (ExportTraceServiceResponse,
google.rpc.Status) written in the request's format; `otlp_read` hands the request to
mapping.py and answers its spans mapped. Pure: no I/O.

The span count is checked before the slow JSON reading, so an export past MAX_SPANS costs
only a count."""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from pydantic import ValidationError

from costboard.ingest.otlp.json_models import (
    ExportTraceServiceRequest as ExportTraceServiceRequestJson,
)
from costboard.ingest.otlp.mapping import OtlpMapping, otlp_spans, without_bad_text
from costboard.ingest.schemas import validation_errors

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

MAX_SPANS = 10_000  # per request (docs/api.md, "Limits")


class OtlpError(Exception):
    """The body as a whole cannot be used: an HTTP status, the field at fault and a message
    naming the fix."""

    def __init__(self, status: int, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def _too_many_spans(spans: int) -> OtlpError:
    return OtlpError(
        413,
        f"{spans} spans: send at most {MAX_SPANS} spans per request; lower the exporter's "
        "max_export_batch_size",
        field="resourceSpans",
    )


def otlp_decode(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest from a protobuf or OTLP JSON body, or OtlpError: 400 if
    undecodable, 413 past MAX_SPANS spans (counted before the slow JSON mapping). A JSON body
    is first checked against the documented shape (_documented_shape): protobuf's JSON
    mapping reads a string where an object belongs as an empty object."""
    request = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            request.ParseFromString(body)
        except (DecodeError, ValueError) as exc:
            raise OtlpError(400, f"undecodable protobuf ExportTraceServiceRequest: {exc}") from None
        spans = sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        if spans > MAX_SPANS:
            raise _too_many_spans(spans)
        return request
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict):
            raise ValueError("the body must be a JSON object with resourceSpans")
        spans = sum(
            len(_list(scope_spans, "spans"))
            for resource_spans in _list(payload, "resourceSpans", "resource_spans")
            for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans")
        )
        if spans > MAX_SPANS:
            raise _too_many_spans(spans)
        _documented_shape(payload)
        _hex_ids_to_base64(payload)
        json_format.ParseDict(payload, request, ignore_unknown_fields=True)
    except (ValueError, UnicodeDecodeError, json_format.ParseError) as exc:
        raise OtlpError(400, f"undecodable OTLP JSON ExportTraceServiceRequest: {exc}") from None
    return request


def _documented_shape(payload: dict[str, Any]) -> None:
    """OTLP JSON as the OpenAPI document describes it (ExportTraceServiceRequest), or
    ValueError naming the first field that is not: a 400, as for undecodable protobuf."""
    try:
        ExportTraceServiceRequestJson.model_validate(payload)
    except ValidationError as exc:
        error = validation_errors(exc)[0]
        raise ValueError(f"{error['field']}: {error['message']}") from None


_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _hex_ids_to_base64(payload: dict[str, Any]) -> None:
    """OTLP JSON spells trace and span ids in hex, where protobuf's JSON mapping expects
    base64: convert them in place (ValueError names a bad id)."""
    for resource_spans in _list(payload, "resourceSpans", "resource_spans"):
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _list(scope_spans, "spans"):
                for item in [span, *_list(span, "links")]:
                    if not isinstance(item, dict):
                        continue
                    for name in _ID_FIELDS:
                        value = item.get(name)
                        if isinstance(value, str) and value:
                            try:
                                raw = bytes.fromhex(value)
                            except ValueError:
                                raise ValueError(f"{name} {value!r} must be a hex string") from None
                            item[name] = base64.b64encode(raw).decode()


def _list(parent: Any, *names: str) -> list[Any]:
    if not isinstance(parent, dict):
        return []
    for name in names:
        value = parent.get(name)
        if isinstance(value, list):
            return value
    return []


def otlp_read(body: bytes, content_type: str) -> OtlpMapping:
    """A body's spans mapped (otlp_spans), those whose text the database would refuse
    rejected too (without_bad_text), or OtlpError (otlp_decode) for a body that cannot be
    used as a whole."""
    export = otlp_decode(body, content_type)
    mapping = otlp_spans(export)
    return without_bad_text(mapping)


def otlp_response(rejected: int, message: str, content_type: str) -> bytes:
    """An ExportTraceServiceResponse, partial success filled in when spans were rejected."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    # protobuf ships no type hints (its calls are Any to mypy): what they return, named
    if content_type == PROTOBUF:
        binary: bytes = response.SerializeToString()
        return binary
    text: str = json_format.MessageToJson(response, indent=None)
    return text.encode()


def otlp_status(code: int, message: str, content_type: str, field: str = "body") -> bytes:
    """A google.rpc.Status (code, message) in the request's format, the body OTLP/HTTP asks
    for with a 400. Encoded by hand: its two scalar fields need no googleapis dependency. In
    JSON it also carries the API's `errors` (docs/api.md, "Errors"), which OTLP readers
    ignore."""
    if content_type != PROTOBUF:
        errors = [{"index": None, "field": field, "message": message}]
        return json.dumps({"code": code, "message": message, "errors": errors}).encode()
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
