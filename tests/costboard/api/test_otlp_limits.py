"""OTLP's limits (docs/api.md, "OTLP traces"): at most 10,000 spans a request, counted before any
span is mapped; a session out of turn numbers takes no new trace; error bodies in JSON carry the
API's `errors` beside google.rpc.Status's code and message."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from django.test import Client
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from costboard.ingest.otlp import MAX_SPANS
from costboard.ingest.otlp import decode as ingest_decode
from costboard.ingest.schemas import MAX_TURN
from costboard.models import Session, Step, Turn
from tests.conftest import Agent

pytestmark = pytest.mark.django_db

PROTOBUF = "application/x-protobuf"
START = "1763805600000000000"
FIX = "send at most 10000 spans per request; lower the exporter's max_export_batch_size"


def json_span(n: int, session: str = "s1", trace: str = "5b8efff798038103d269b633813fc60c") -> Any:
    return {
        "traceId": trace,
        "spanId": f"{n + 1:016x}",
        "name": "chat",
        "startTimeUnixNano": START,
        "attributes": [{"key": "session.id", "value": {"stringValue": session}}],
    }


def export(*spans: Any) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()


def post(
    agent: Agent,
    body: bytes,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> Any:
    client = Client(raise_request_exception=False)
    return client.post(
        "/v1/traces",
        body,
        content_type=content_type,
        headers={"Authorization": f"Bearer {agent.key}", **(headers or {})},
    )


@pytest.mark.slow
def test_more_than_10000_json_spans_are_413_naming_resource_spans_before_any_work(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    work: list[str] = []  # each step of the slow span-by-span reading, as it is called

    def watch(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            work.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, watched)

    watch(ingest_decode, "_documented_shape")
    watch(ingest_decode, "_hex_ids_to_base64")
    watch(json_format, "ParseDict")  # the module decode.py calls

    response = post(agent, export(*(json_span(n) for n in range(MAX_SPANS + 1))))
    assert response.status_code == 413
    assert work == []  # counted, not checked or mapped span by span
    answer = response.json()
    assert answer["code"] == 8  # RESOURCE_EXHAUSTED
    (error,) = answer["errors"]
    assert error["field"] == "resourceSpans"
    assert error["message"] == f"{MAX_SPANS + 1} spans: {FIX}"
    assert not Step.objects.exists()

    assert post(agent, export(json_span(0))).status_code == 200  # one span is read in full
    assert work == ["_documented_shape", "_hex_ids_to_base64", "ParseDict"]
    assert Step.objects.count() == 1


def test_more_than_10000_protobuf_spans_are_413_with_a_protobuf_status(agent: Agent) -> None:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for n in range(MAX_SPANS + 1):
        span = scope.spans.add()
        span.trace_id, span.span_id = b"\x01" * 16, (n + 1).to_bytes(8, "big")
        span.start_time_unix_nano, span.name = int(START), "chat"
    response = post(agent, request.SerializeToString(), PROTOBUF)
    assert response.status_code == 413
    status = status_pb2.Status.FromString(response.content)
    assert FIX in status.message
    assert not Step.objects.exists()


def test_an_undecodable_json_body_is_400_with_errors_naming_the_body(agent: Agent) -> None:
    response = post(agent, b"[" * 5000 + b"]" * 5000)
    assert response.status_code == 400
    answer = response.json()
    assert answer["code"] == 3
    assert answer["errors"][0]["field"] == "body"


def test_a_session_at_the_last_turn_number_takes_no_new_trace(agent: Agent) -> None:
    agent.events({"type": "turn", "session_id": "s1", "turn": MAX_TURN})
    response = post(agent, export(json_span(0)))
    assert response.status_code == 200, response.content
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert f"has reached turn {MAX_TURN}" in partial["errorMessage"]
    assert "start a new session" in partial["errorMessage"]
    assert not Step.objects.exists()
    assert list(Turn.objects.values_list("number", flat=True)) == [MAX_TURN]


def test_other_sessions_of_the_request_are_stored_beside_a_full_one(agent: Agent) -> None:
    agent.events({"type": "turn", "session_id": "full", "turn": MAX_TURN})
    other = "6b8efff798038103d269b633813fc60c"
    response = post(agent, export(json_span(0, "full"), json_span(1, "s2", trace=other)))
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert list(Step.objects.values_list("session__external_id", "turn__number")) == [("s2", 1)]


def protobuf_export(count: int, first: int = 0) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for n in range(first, first + count):
        span = scope.spans.add()
        span.trace_id, span.span_id = b"\x01" * 16, (n + 1).to_bytes(8, "big")
        span.start_time_unix_nano, span.name = int(START) + n, "chat"
        for key, value in (("session.id", "s1"), ("gen_ai.usage.input_tokens", 10)):
            attribute = span.attributes.add()
            attribute.key = key
            if isinstance(value, int):
                attribute.value.int_value = value
            else:
                attribute.value.string_value = value
    return request


@pytest.mark.slow
def test_exactly_10000_protobuf_spans_are_all_stored_and_a_replay_counted_once(
    agent: Agent,
) -> None:
    body = protobuf_export(MAX_SPANS).SerializeToString()
    for _ in range(2):  # the export, then the exporter's retry of it
        response = post(agent, body, PROTOBUF)
        assert response.status_code == 200, response.content
        assert not ExportTraceServiceResponse.FromString(response.content).HasField(
            "partial_success"
        )
    assert Step.objects.count() == MAX_SPANS
    assert Session.objects.get(external_id="s1").tokens_used == 10 * MAX_SPANS


def test_every_member_of_a_multi_member_gzip_export_is_stored(agent: Agent) -> None:
    """RFC 1952 lets a gzip body be several members one after the other (the events API reads
    them all): the spans of the second member were dropped, answered 200 without a word."""
    first, second = protobuf_export(2), protobuf_export(3, first=2)
    body = gzip.compress(first.SerializeToString()) + gzip.compress(second.SerializeToString())
    response = post(agent, body, PROTOBUF, {"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.content
    assert Step.objects.count() == 5


def test_bytes_after_the_gzip_stream_are_400_and_nothing_is_stored(agent: Agent) -> None:
    body = gzip.compress(protobuf_export(2).SerializeToString()) + b"\x00\x00"
    response = post(agent, body, PROTOBUF, {"Content-Encoding": "gzip"})
    assert response.status_code == 400
    status = status_pb2.Status.FromString(response.content)
    assert status.code == 3  # INVALID_ARGUMENT
    assert "gzip" in status.message
    assert not Step.objects.exists()
