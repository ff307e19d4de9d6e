"""OTLP spans → step events (docs/api.md, "OTLP traces"). Pure: no I/O.

`otlp_spans` maps a request's spans to `OtlpSpan`s (a StepEvent without its turn, plus the
trace it belongs to) and counts the spans that cannot be mapped; the turns are numbered and
the steps stored by `store` (one trace = one turn of its session).

OpenTelemetry's GenAI conventions count cached tokens inside `gen_ai.usage.input_tokens`;
Costboard's (Anthropic's) do not, so cache reads and writes are subtracted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from pydantic import ValidationError

from costboard.ingest.json_body import bad_text
from costboard.ingest.normalize import UsageError, audio_split
from costboard.ingest.schemas import MAX_TOKENS, StepEvent
from costboard.input_limits import digit_count
from costboard.models import TOOL_MODEL, TOOL_STEP_TYPE

# A span without a model (a tool call, a retrieval) is a tool step: stored under this model
# name, $0 by nature, never unpriced.
NO_MODEL = TOOL_MODEL

INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_KEYS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
)
# The underscore spellings are OpenLLMetry's before opentelemetry-semantic-conventions-ai
# 0.5.0 (its input_tokens includes them too): unread, the cache was priced as fresh input.
CACHE_READ_KEYS = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "llm.token_count.prompt_details.cache_read",
)
CACHE_WRITE_KEYS = (
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.cache_creation_input_tokens",
    "llm.token_count.prompt_details.cache_write",
)
REASONING_KEYS = (
    "gen_ai.usage.reasoning.output_tokens",
    "llm.token_count.completion_details.reasoning",
)
# Audio tokens, part of the input (cache included) and of the output totals: OpenTelemetry's
# GenAI conventions have no attribute for them; OpenInference's prompt_details.audio and
# completion_details.audio, and the gen_ai.usage.input_audio_tokens / output_audio_tokens of
# LiveKit Agents' spans (which Langfuse reads), say them (docs/integrations.md).
INPUT_AUDIO_KEYS = ("gen_ai.usage.input_audio_tokens", "llm.token_count.prompt_details.audio")
OUTPUT_AUDIO_KEYS = (
    "gen_ai.usage.output_audio_tokens",
    "llm.token_count.completion_details.audio",
)
MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name")
PROVIDER_KEYS = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
# The tier the provider answered with, before the one asked for ("auto" asks for the
# project's default: standard, docs/pricing.md "Service tiers").
SERVICE_TIER_KEYS = (
    "openai.response.service_tier",
    "gen_ai.openai.response.service_tier",
    "gen_ai.request.service_tier",
)
SESSION_KEYS = (
    "gen_ai.conversation.id",
    "session.id",
    "metadata.session_id",  # LiteLLM: the call's metadata, when its logger exports it
    "traceloop.association.properties.session_id",  # OpenLLMetry's association properties
)
# The end user: OTel's `user.id` (OpenInference too), the older `enduser.id`, the request's
# `user` as OpenLLMetry (`gen_ai.user`) and LiteLLM (`llm.user`) record it, the LiteLLM
# proxy's end user.
USER_KEYS = (
    "user.id",
    "enduser.id",
    "gen_ai.user",
    "llm.user",
    "metadata.user_api_key_end_user_id",
    "traceloop.association.properties.user_id",
)
# Gateway attributes that become tags (tag key ← attribute): the LiteLLM proxy's team and key.
ALIAS_TAGS = (
    ("team", "metadata.user_api_key_team_alias"),
    ("key_alias", "metadata.user_api_key_alias"),
)
TAG_PREFIX = "costboard.tag."
# Spans that only repeat their parent LLM span (no usage, no model): not steps. LiteLLM's
# child span holding the provider's raw response is one.
DUPLICATE_SPAN_NAMES = frozenset({"raw_gen_ai_request"})
# The attributes OpenTelemetry's HTTP, database, RPC and messaging instrumentations set (the
# current and the older names): a span with one and no attribute of the GenAI conventions is
# the transport under a step (the provider SDK's POST below its chat span, a tool's query),
# not a step of its own. Stored, each doubled a call's steps, and five failed requests in a row
# (a 404 retried) read as a retry loop that ended the session.
TRANSPORT_KEYS = (
    "http.request.method",
    "http.method",
    "db.system.name",
    "db.system",
    "rpc.system",
    "messaging.system",
)
STEP_PREFIXES = ("gen_ai.", "llm.", "openinference.", "traceloop.", TAG_PREFIX)
MAX_TAG_VALUE = 128
STEP_TYPE_KEYS = ("gen_ai.operation.name",)
# OpenTelemetry's operation names stored as Costboard's step types, so a tool call is one type
# whichever way it arrives (the events API and the client send `tool`); the name as sent is
# kept in the step's metadata.otlp.operation.
STEP_TYPES = {"execute_tool": TOOL_STEP_TYPE}


@dataclass(frozen=True)
class OtlpSpan:
    """A mapped span: its step (turn still unset) and the trace that makes its turn."""

    trace_id: str
    start_ns: int
    step: StepEvent
    user_id: str | None = None


@dataclass
class OtlpMapping:
    spans: list[OtlpSpan] = field(default_factory=list)
    rejected: int = 0
    # duplicates of their parent span (DUPLICATE_SPAN_NAMES) and transport spans
    # (TRANSPORT_KEYS): not stored
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    def error_message(self) -> str:
        shown = "; ".join(self.errors[:5])
        more = len(self.errors) - 5
        return shown + (f"; and {more} more" if more > 0 else "")


def without_bad_text(mapping: OtlpMapping) -> OtlpMapping:
    """Spans whose text PostgreSQL would refuse (NUL: protobuf strings may hold it) are
    rejected like other unmappable spans, with the reason and the field (a tag's value too:
    jsonb refuses \\u0000, which failed the whole export with a 500)."""
    kept: list[OtlpSpan] = []
    for span in mapping.spans:
        step = span.step
        texts = {
            "session_id": step.session_id,
            "step_type": step.step_type,
            "model": step.model,
            "provider": step.provider,
            "error": step.error,
            "tags": step.tags,
            "metadata": step.metadata,
        }
        found = bad_text(texts)
        if found is None:
            kept.append(span)
        else:
            mapping.rejected += 1
            span_id = (step.event_id or "?").rsplit(":", 1)[-1]
            mapping.errors.append(f"span {span_id}: {found[0]} {found[1]}")
    mapping.spans = kept
    return mapping


class _SpanError(ValueError):
    pass


def otlp_spans(request: ExportTraceServiceRequest) -> OtlpMapping:
    """Every span of the request as a step, or counted as rejected with its reason. A span
    without a session id takes the one of another span of its trace in this request."""
    mapping = OtlpMapping()
    raw: list[tuple[Span, dict[str, Any], dict[str, Any]]] = []
    trace_sessions: dict[bytes, str] = {}
    for resource_spans in request.resource_spans:
        resource_attrs = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attrs = _attributes(span.attributes)
                raw.append((span, attrs, resource_attrs))
                session = _session_of(attrs, resource_attrs)
                if session and span.trace_id not in trace_sessions:
                    trace_sessions[span.trace_id] = session
    for span, attrs, resource_attrs in raw:
        if _duplicates_its_parent(span, attrs) or _transport(attrs):
            mapping.skipped += 1
            continue
        try:
            session = _session_of(attrs, resource_attrs) or trace_sessions.get(span.trace_id)
            tags = _tags_of(attrs, resource_attrs)
            user = _text(attrs, USER_KEYS) or _text(resource_attrs, USER_KEYS)
            mapping.spans.append(_span_step(span, attrs, session, tags, user))
        except _SpanError as exc:
            mapping.rejected += 1
            mapping.errors.append(f"span {span.span_id.hex() or '?'}: {exc}")
    return mapping


def _duplicates_its_parent(span: Span, attrs: dict[str, Any]) -> bool:
    """A child span that only repeats its parent LLM call: named so, with no usage or model of
    its own (were it to carry them, it would be stored like any span)."""
    if span.name not in DUPLICATE_SPAN_NAMES or not span.parent_span_id:
        return False
    keys = (*INPUT_KEYS, *OUTPUT_KEYS, *CACHE_READ_KEYS, *CACHE_WRITE_KEYS, *MODEL_KEYS)
    return all(attrs.get(key) in (None, "") for key in keys)


def _transport(attrs: dict[str, Any]) -> bool:
    """An HTTP, database, RPC or messaging span with nothing of a model call or a tool: the
    transport below a step (TRANSPORT_KEYS)."""
    if not any(key in attrs for key in TRANSPORT_KEYS):
        return False
    return not any(key.startswith(STEP_PREFIXES) for key in attrs)


def _session_of(attrs: dict[str, Any], resource_attrs: dict[str, Any]) -> str | None:
    for source in (attrs, resource_attrs):
        for key in SESSION_KEYS:
            value = source.get(key)
            if value is not None and str(value).strip():
                return str(value).strip()
    return None


def _tags_of(attrs: dict[str, Any], resource_attrs: dict[str, Any]) -> dict[str, Any] | None:
    """`costboard.tag.<key>` attributes as tags: the resource's, the span's over them, over a
    gateway's team and key aliases (ALIAS_TAGS). A number or boolean becomes its text; the
    step's checks refuse what is not a tag."""
    tags: dict[str, Any] = {}
    for source in (resource_attrs, attrs):
        for tag, key in ALIAS_TAGS:
            alias = _text(source, (key,))
            if alias:
                tags[tag] = alias[:MAX_TAG_VALUE]
    for source in (resource_attrs, attrs):
        for key, value in source.items():
            if key.startswith(TAG_PREFIX):
                if isinstance(value, bool):
                    value = "true" if value else "false"
                elif isinstance(value, int | float | Decimal):
                    value = str(value)
                tags[key[len(TAG_PREFIX) :]] = value
    return tags or None


def _span_step(
    span: Span,
    attrs: dict[str, Any],
    session: str | None,
    tags: dict[str, Any] | None = None,
    user: str | None = None,
) -> OtlpSpan:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise _SpanError("trace_id must be 16 bytes, not all zero")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise _SpanError("span_id must be 8 bytes, not all zero")
    trace_hex, span_hex = span.trace_id.hex(), span.span_id.hex()

    total_input = _tokens(attrs, INPUT_KEYS)
    output = _tokens(attrs, OUTPUT_KEYS)
    cache_read = _tokens(attrs, CACHE_READ_KEYS)
    cache_write = _tokens(attrs, CACHE_WRITE_KEYS)
    reasoning = _tokens(attrs, REASONING_KEYS)
    has_usage = any(v is not None for v in (total_input, output, cache_read, cache_write))
    input_tokens = None
    if total_input is not None:
        input_tokens = total_input - (cache_read or 0) - (cache_write or 0)
        if input_tokens < 0:
            raise _SpanError(
                f"gen_ai.usage.input_tokens ({total_input}) must include the cache reads "
                f"({cache_read or 0}) and cache writes ({cache_write or 0}) it is charged for"
            )

    audio = _audio(attrs, input_tokens, cache_read, output)

    if not span.start_time_unix_nano:
        raise _SpanError("start_time_unix_nano is required")
    duration_ms: Decimal | None = None
    if span.end_time_unix_nano:
        if span.end_time_unix_nano < span.start_time_unix_nano:
            raise _SpanError("end_time_unix_nano is before start_time_unix_nano")
        duration_ms = Decimal(span.end_time_unix_nano - span.start_time_unix_nano) / 10**6
    failed = span.status.code == Status.STATUS_CODE_ERROR
    error = None
    if failed:
        error = span.status.message or _text(attrs, ("error.type",)) or "error"

    operation = _text(attrs, STEP_TYPE_KEYS)
    step_type = STEP_TYPES.get(operation or "", operation) or span.name.strip() or "span"
    fields: dict[str, Any] = {
        "event_id": f"otlp:{trace_hex}:{span_hex}",
        "timestamp": _time(span.start_time_unix_nano),
        "step_type": step_type[:64],
        "model": (_text(attrs, MODEL_KEYS) or NO_MODEL)[:200],
        "session_id": session,
        "provider": (_text(attrs, PROVIDER_KEYS) or "")[:64] or None,
        "service_tier": _text(attrs, SERVICE_TIER_KEYS),
        "duration_ms": duration_ms,
        "success": not failed,
        "error": error[:20_000] if error else None,
        "tags": tags,
        "metadata": {
            "otlp": {
                "trace_id": trace_hex,
                "span_id": span_hex,
                "parent_span_id": span.parent_span_id.hex() or None,
                "name": span.name[:200],
                **({"operation": operation[:64]} if operation else {}),
                **({"user_id": user[:128]} if user else {}),
            }
        },
    }
    if has_usage:
        fields.update(
            input_tokens=input_tokens or 0,
            output_tokens=output or 0,
            cache_read_input_tokens=cache_read or 0,
            cache_creation_input_tokens=cache_write or 0,
            reasoning_tokens=reasoning or 0,
        )
        if audio is not None:
            fields.update(
                input_audio_tokens=audio[0],
                cache_audio_read_tokens=audio[1],
                output_audio_tokens=audio[2],
            )
    try:
        step = StepEvent.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "span"
        raise _SpanError(f"{where}: {first['msg']}") from None
    return OtlpSpan(
        trace_id=trace_hex,
        start_ns=span.start_time_unix_nano,
        step=step,
        user_id=user[:128] if user else None,
    )


def _audio(
    attrs: dict[str, Any], uncached: int | None, cache_read: int | None, output: int | None
) -> tuple[int, int, int] | None:
    """A span's audio tokens as the step's (audio input, cached audio, audio output); None
    when it names none. Audio past the uncached input was read from the cache."""
    audio_in = _tokens(attrs, INPUT_AUDIO_KEYS)
    audio_out = _tokens(attrs, OUTPUT_AUDIO_KEYS)
    if audio_in is None and audio_out is None:
        return None
    try:
        uncached_audio, cached_audio = audio_split(
            audio_in or 0,
            0,
            uncached or 0,
            cache_read or 0,
            _first_key(attrs, INPUT_AUDIO_KEYS),
            "gen_ai.usage.input_tokens less its cache writes",
        )
    except UsageError as exc:
        raise _SpanError(str(exc)) from None
    if (audio_out or 0) > (output or 0):
        raise _SpanError(
            f"{_first_key(attrs, OUTPUT_AUDIO_KEYS)} ({audio_out}) exceeds "
            f"gen_ai.usage.output_tokens ({output or 0}); the audio tokens are part of it"
        )
    return uncached_audio, cached_audio, audio_out or 0


def _first_key(attrs: dict[str, Any], keys: tuple[str, ...]) -> str:
    return next((key for key in keys if key in attrs), keys[0])


def _time(unix_nano: int) -> datetime:
    seconds, nanos = divmod(unix_nano, 10**9)
    return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=nanos // 1000)


def _attributes(attributes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for kv in attributes:
        assert isinstance(kv, KeyValue)  # noqa: S101 — narrows the type of protobuf's repeated field
        values[kv.key] = _value(kv.value)
    return values


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None or kind in {"array_value", "kvlist_value", "bytes_value"}:
        return None  # none of the attributes read here are structured
    return getattr(value, kind)


def _text(attrs: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _tokens(attrs: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of `keys` present, as a token count (ints; whole doubles or digit strings,
    as some exporters send them); _SpanError for anything else."""
    for key in keys:
        if key not in attrs or attrs[key] is None:
            continue
        value = attrs[key]
        count: int | None = None
        if isinstance(value, bool):
            count = None
        elif isinstance(value, int):
            count = value
        elif isinstance(value, float) and value.is_integer():
            count = int(value)
        elif isinstance(value, str):
            count = digit_count(value.strip(), MAX_TOKENS)
        if count is None or not 0 <= count <= MAX_TOKENS:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise _SpanError(
                f"{key} must be a whole number from 0 to 10^12 (an int, or a string of digits "
                f"0-9), got {shown}"
            )
        return count
    return None
