"""OTLP JSON as the OpenAPI document describes it (docs/api.md, "OTLP traces"): the request's
model, which the decoder checks a JSON body against before protobuf's JSON mapping reads it
(that mapping takes a string where an object belongs for an empty object), and which the API
names as the endpoint's body."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class OtlpJson(BaseModel):
    """OTLP JSON, checked before protobuf's JSON mapping reads it (decode.py):
    strict, as the document's types say (no true for an integer); other fields ignored."""

    model_config = ConfigDict(strict=True)


class OtlpAnyValue(OtlpJson):
    stringValue: str | None = None
    intValue: int | str | None = None
    doubleValue: float | str | None = Field(default=None, description='a number, or "NaN"…')
    boolValue: bool | None = None


class OtlpKeyValue(OtlpJson):
    key: str
    value: OtlpAnyValue


class OtlpSpanStatus(OtlpJson):
    code: int | str | None = Field(default=None, description="2 (or STATUS_CODE_ERROR): error")
    message: str | None = None


class OtlpSpanJson(OtlpJson):
    """A span. Every field is optional, as in protobuf; a span without its ids or start time
    is not stored but counted in partialSuccess."""

    traceId: str | None = Field(default=None, description="32 hex digits")
    spanId: str | None = Field(default=None, description="16 hex digits")
    parentSpanId: str | None = None
    name: str | None = None
    startTimeUnixNano: str | int | None = Field(default=None, description="nanoseconds, UTC")
    endTimeUnixNano: str | int | None = None
    attributes: list[OtlpKeyValue] | None = Field(
        default=None,
        description="gen_ai.usage.*, gen_ai.request.model / gen_ai.response.model, "
        "gen_ai.provider.name, gen_ai.conversation.id or session.id, gen_ai.operation.name",
    )
    status: OtlpSpanStatus | None = None


class OtlpScopeSpans(OtlpJson):
    spans: list[OtlpSpanJson] | None = None


class OtlpResource(OtlpJson):
    attributes: list[OtlpKeyValue] | None = None


class OtlpResourceSpans(OtlpJson):
    resource: OtlpResource | None = None
    scopeSpans: list[OtlpScopeSpans] | None = None


class ExportTraceServiceRequest(OtlpJson):
    """OTLP JSON (the parts Costboard reads; other fields are ignored)."""

    resourceSpans: list[OtlpResourceSpans] | None = None
