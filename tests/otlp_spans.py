"""OTLP spans as the real OpenTelemetry SDK makes them, and their posting: shared by the tests
of /v1/traces, of gateways' spans, of tags and of partitions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, Status, StatusCode, Tracer, set_span_in_context

from tests.conftest import TEST_RATES, Agent, usd

PROTOBUF = "application/x-protobuf"
T0 = 1_760_000_000_000_000_000  # a fixed start time, in ns since the epoch
MS = 1_000_000

CHAT = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "testco",
    "gen_ai.request.model": "test-sonnet-latest",
    "gen_ai.response.model": "test-sonnet",
    "gen_ai.conversation.id": "conv-1",
    "gen_ai.usage.input_tokens": 1200,
    "gen_ai.usage.cache_read.input_tokens": 1000,
    "gen_ai.usage.cache_creation.input_tokens": 100,
    "gen_ai.usage.output_tokens": 50,
}
# 100 input (1200 less the 1000 read and the 100 written), 50 output, 1000 read, 100 written
CHAT_COST = (
    usd(100, TEST_RATES["input_mtok"])
    + usd(50, TEST_RATES["output_mtok"])
    + usd(1000, TEST_RATES["cache_read_mtok"])
    + usd(100, TEST_RATES["cache_write_mtok"])
)


def spans_of(build: Callable[[Tracer], object]) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("test"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def span(
    tracer: Tracer,
    name: str,
    attributes: dict[str, Any],
    *,
    start: int = T0,
    ms: int = 1500,
    parent: Span | None = None,
    error: str | None = None,
) -> Span:
    context = set_span_in_context(parent) if parent is not None else None
    s = tracer.start_span(name, context=context, attributes=attributes, start_time=start)
    if error is not None:
        s.set_status(Status(StatusCode.ERROR, error))
    s.end(end_time=start + ms * MS)
    return s


def chat_trace(tracer: Tracer, *, start: int = T0, **attrs: Any) -> None:
    """An agent turn: a root span, a chat span with usage and a tool span without."""
    root = tracer.start_span("invoke_agent", start_time=start)
    span(tracer, "chat test-sonnet", {**CHAT, **attrs}, start=start, parent=root)
    span(
        tracer,
        "execute_tool search",
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
        start=start + 1500 * MS,
        ms=250,
        parent=root,
    )
    root.end(end_time=start + 2000 * MS)


def post_spans(agent: Agent, spans: list[ReadableSpan], **headers: str) -> Any:
    return agent.client.post(
        "/v1/traces",
        encode_spans(spans).SerializeToString(),
        content_type=PROTOBUF,
        headers={"Authorization": f"Bearer {agent.key}", **headers},
    )


def parsed(response: Any) -> ExportTraceServiceResponse:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == PROTOBUF
    message = ExportTraceServiceResponse()
    message.ParseFromString(response.content)
    return message
