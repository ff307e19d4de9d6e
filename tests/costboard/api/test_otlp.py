"""POST /v1/traces: OTLP/HTTP from the real OpenTelemetry SDK, protobuf and JSON."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import Tracer

from costboard.models import TOOL_MODEL, DailyRollup, IngestTally, Session, Step
from tests.conftest import TEST_RATES, Agent, add_price, make_agent, usd
from tests.otlp_spans import (
    CHAT,
    CHAT_COST,
    MS,
    PROTOBUF,
    T0,
    chat_trace,
    parsed,
    post_spans,
    span,
    spans_of,
)


def otlp_of(step: Step) -> Any:
    """What a span's step keeps of it in its metadata."""
    assert step.metadata is not None, step.event_id
    return step.metadata["otlp"]


def turn_of(step: Step) -> int:
    assert step.turn is not None, step.event_id
    return step.turn.number


@pytest.fixture
def otel_agent(transactional_db: None) -> Agent:
    add_price("test-sonnet")
    return make_agent("otel")


@pytest.fixture
def agent_priced(agent: Agent) -> Agent:
    add_price("test-sonnet")
    return agent


@pytest.mark.parametrize(
    ("compression", "auth"),
    [(Compression.Gzip, "x-costboard-key"), (Compression.NoCompression, "Authorization")],
)
def test_the_sdk_exporter_stores_a_turn_with_cache_tokens_counted_once(
    live_server: Any, otel_agent: Agent, compression: Compression, auth: str
) -> None:
    key = otel_agent.key if auth == "x-costboard-key" else f"Bearer {otel_agent.key}"
    exporter = OTLPSpanExporter(
        endpoint=live_server.url + "/v1/traces", headers={auth: key}, compression=compression
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    chat_trace(provider.get_tracer("agent"))
    assert provider.force_flush()
    provider.shutdown()

    session = Session.objects.get(project=otel_agent.project, external_id="conv-1")
    chat = Step.objects.get(session=session, step_type="chat")
    assert (chat.input_tokens, chat.output_tokens) == (100, 50)
    assert (chat.cache_read_input_tokens, chat.cache_creation_input_tokens) == (1000, 100)
    assert (chat.model, chat.provider, chat.duration_ms, chat.success) == (
        "test-sonnet",
        "testco",
        1500,
        True,
    )
    assert chat.cost_usd == CHAT_COST
    assert session.tokens_used == 150  # cache tokens are not counted as input again
    assert session.cost_usd == CHAT_COST
    tool = Step.objects.get(session=session, step_type="tool")  # OTel's execute_tool
    assert (tool.input_tokens, tool.output_tokens, tool.duration_ms) == (0, 0, 250)
    assert otlp_of(tool)["operation"] == "execute_tool"
    # one trace = one turn: the chat, the tool and the root span
    assert {turn_of(s) for s in Step.objects.filter(session=session)} == {1}
    assert session.turns.get().step_count == 3


def test_the_sdk_exporter_without_a_key_is_refused(live_server: Any, otel_agent: Agent) -> None:
    exporter = OTLPSpanExporter(endpoint=live_server.url + "/v1/traces", timeout=5)
    assert exporter.export(spans_of(chat_trace)) == SpanExportResult.FAILURE
    exporter = OTLPSpanExporter(
        endpoint=live_server.url + "/v1/traces", headers={"x-costboard-key": otel_agent.key}
    )
    assert exporter.export(spans_of(chat_trace)) == SpanExportResult.SUCCESS
    assert Step.objects.filter(project=otel_agent.project).count() == 3


def test_it_answers_401_without_a_key(agent: Agent) -> None:
    response = Client().post(
        "/v1/traces", encode_spans(spans_of(chat_trace)).SerializeToString(), PROTOBUF
    )
    assert response.status_code == 401
    assert not Step.objects.exists()


def test_a_replayed_export_is_a_duplicate(agent_priced: Agent) -> None:
    spans = spans_of(chat_trace)
    assert not parsed(post_spans(agent_priced, spans)).HasField("partial_success")
    assert not parsed(post_spans(agent_priced, spans)).HasField("partial_success")
    session = Session.objects.get(external_id="conv-1")
    assert session.step_count == 3
    assert session.tokens_used == 150
    assert session.cost_usd == CHAT_COST
    assert DailyRollup.objects.get(model="test-sonnet").cost_usd == CHAT_COST
    assert session.turns.count() == 1
    tally = IngestTally.objects.get(project=agent_priced.project)
    assert (tally.accepted, tally.duplicates) == (3, 3)  # counted once, by the ingest


def test_tool_and_root_spans_are_tool_steps_not_unpriced(agent_priced: Agent) -> None:
    """Spans without a model cost $0 by nature: no price is missing, none is listed."""
    post_spans(agent_priced, spans_of(chat_trace))
    tools = Step.objects.filter(model=TOOL_MODEL)
    assert tools.count() == 2  # the tool span and the root span
    assert all(s.is_tool and s.price_id is None and s.cost_usd == 0 for s in tools)
    assert {s.family for s in tools} == {"none"}
    rollups = DailyRollup.objects.filter(family="none")
    assert sum(r.calls for r in rollups) == 2
    assert sum(r.unpriced_calls for r in rollups) == 0


def test_an_otlp_tool_call_and_an_events_tool_call_are_one_step_type(
    agent_priced: Agent, staff: Client
) -> None:
    """OTel's `execute_tool` is stored as `tool`, the type the events API and the client send:
    the steps page and its rollups show one row for tool calls, not two."""
    from costboard.dashboards.selectors.steps import latency_by_step_type, steps_by_type_and_model

    post_spans(agent_priced, spans_of(chat_trace))
    agent_priced.events(
        {
            "session_id": "conv-1",
            "timestamp": "2025-10-09T08:53:25Z",  # beside T0's trace
            "step_type": "tool",
            "model": "none",
            "duration_ms": 250,
        }
    )
    steps = Step.objects.filter(session__external_id="conv-1")
    chat = steps.get(step_type="chat")
    assert otlp_of(chat)["operation"] == "chat"
    tools = steps.filter(step_type="tool")
    assert tools.count() == 2
    assert sorted(str((s.metadata or {}).get("otlp", {}).get("operation")) for s in tools) == [
        "None",
        "execute_tool",
    ]
    assert not steps.filter(step_type="execute_tool").exists()
    day = chat.timestamp.date()
    rows = steps_by_type_and_model(project_ids=[agent_priced.project.pk], since=day, until=day)
    tool_rows = [r for r in rows if r.family == TOOL_MODEL]
    # the tool calls in one row; the root span (no operation) is its own type, by its name
    assert sorted((r.step_type, r.calls) for r in tool_rows) == [("invoke_agent", 1), ("tool", 2)]
    latency = latency_by_step_type(project_ids=[agent_priced.project.pk], since=day, until=day)
    assert {lat.step_type: lat.calls for lat in latency}["tool"] == 2
    page = staff.get("/steps/", {"since": day.isoformat(), "until": day.isoformat()})
    assert page.status_code == 200
    assert b"invoke_agent" in page.content
    assert b"execute_tool" not in page.content


def test_a_second_trace_is_turn_2_and_a_late_span_joins_its_trace(agent_priced: Agent) -> None:
    later = T0 + 60_000 * MS
    first = spans_of(chat_trace)
    second = spans_of(lambda tracer: chat_trace(tracer, start=later))
    post_spans(agent_priced, first[:1])  # the chat span alone, as a batching exporter may
    post_spans(agent_priced, second)
    post_spans(agent_priced, first[1:])  # the rest of trace 1 arrives after trace 2
    turns = {
        (otlp_of(s)["trace_id"], turn_of(s))
        for s in Step.objects.filter(session__external_id="conv-1")
    }
    trace_1 = format(first[0].context.trace_id, "032x")
    trace_2 = format(second[0].context.trace_id, "032x")
    assert turns == {(trace_1, 1), (trace_2, 2)}
    session = Session.objects.get(external_id="conv-1")
    assert session.turn_count == 2
    assert session.tokens_used == 300


def test_two_new_traces_in_one_request_are_numbered_by_start(agent_priced: Agent) -> None:
    late = spans_of(lambda tracer: chat_trace(tracer, start=T0 + 10_000 * MS))
    early = spans_of(chat_trace)
    post_spans(agent_priced, late + early)
    by_trace = {
        otlp_of(s)["trace_id"]: turn_of(s)
        for s in Step.objects.filter(session__external_id="conv-1")
    }
    assert by_trace == {
        format(early[0].context.trace_id, "032x"): 1,
        format(late[0].context.trace_id, "032x"): 2,
    }


def test_an_error_span_is_a_failed_step(agent_priced: Agent) -> None:
    spans = spans_of(lambda tracer: span(tracer, "chat", CHAT, error="rate limited"))
    parsed(post_spans(agent_priced, spans))
    step = Step.objects.get()
    assert (step.success, step.error) == (False, "rate limited")
    assert Session.objects.get(external_id="conv-1").error_count == 1


def test_http_and_database_spans_under_a_step_are_not_steps(agent_priced: Agent) -> None:
    """OpenTelemetry's HTTP and database instrumentations put their spans under the agent's:
    the provider SDK's POST below the chat span, a tool's requests and query. Stored as steps,
    they doubled a call's steps, and five failed requests in a row (a 404 retried) read as a
    retry loop that ended the session. They are the transport, not steps; a span with a GenAI
    attribute stays a step, whatever else it carries."""

    def build(tracer: Tracer) -> None:
        root = tracer.start_span("invoke_agent", start_time=T0)
        chat = span(tracer, "chat test-sonnet", CHAT, parent=root)
        span(
            tracer, "POST", {"http.request.method": "POST", "url.full": "https://x/v1"}, parent=chat
        )
        tool = span(
            tracer,
            "execute_tool fetch",
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch"},
            start=T0 + 1500 * MS,
            parent=root,
        )
        for n in range(5):
            gone = {"http.method": "GET", "http.status_code": 404}
            span(tracer, "GET", gone, start=T0 + (1600 + n) * MS, ms=1, parent=tool, error="404")
        span(tracer, "SELECT", {"db.system.name": "postgresql"}, start=T0 + 1700 * MS, parent=tool)
        # an LLM call that is also an HTTP span (one instrumentation for both): a step
        both = {**CHAT, "http.request.method": "POST", "gen_ai.usage.input_tokens": 1100}
        span(tracer, "chat again", both, start=T0 + 1800 * MS, parent=root)
        root.end(end_time=T0 + 2000 * MS)

    answer = parsed(post_spans(agent_priced, spans_of(build)))
    assert not answer.HasField("partial_success")
    session = Session.objects.get(external_id="conv-1")
    steps = Step.objects.filter(session=session)
    assert sorted(s.step_type for s in steps) == ["chat", "chat", "invoke_agent", "tool"]
    assert (session.step_count, session.error_count) == (4, 0)
    assert session.runaway_reason == ""
    again = steps.get(metadata__otlp__name="chat again")
    assert (again.input_tokens, again.cache_read_input_tokens) == (0, 1000)
    assert again.cost_usd == CHAT_COST - usd(100, TEST_RATES["input_mtok"])
    assert session.cost_usd == CHAT_COST + again.cost_usd


def test_older_and_openinference_token_attributes_are_read(agent_priced: Agent) -> None:
    older = {
        "gen_ai.system": "testco",
        "gen_ai.request.model": "test-sonnet",
        "gen_ai.usage.prompt_tokens": 300,
        "gen_ai.usage.completion_tokens": 20,
        "session.id": "s-old",
    }
    openinference = {
        "llm.model_name": "test-sonnet",
        "llm.provider": "testco",
        "llm.token_count.prompt": 400,
        "llm.token_count.prompt_details.cache_read": 100,
        "llm.token_count.completion": 30,
        "session.id": "s-oi",
    }

    def build(tracer: Tracer) -> None:
        span(tracer, "ChatCompletion", older)
        span(tracer, "llm", openinference)

    parsed(post_spans(agent_priced, spans_of(build)))
    old = Step.objects.get(session__external_id="s-old")
    assert (old.step_type, old.provider, old.input_tokens, old.output_tokens) == (
        "ChatCompletion",
        "testco",
        300,
        20,
    )
    assert old.cost_usd == usd(300, TEST_RATES["input_mtok"]) + usd(20, TEST_RATES["output_mtok"])
    oi = Step.objects.get(session__external_id="s-oi")
    assert (oi.input_tokens, oi.cache_read_input_tokens, oi.output_tokens) == (300, 100, 30)
    assert oi.cost_usd == (
        usd(300, TEST_RATES["input_mtok"])
        + usd(100, TEST_RATES["cache_read_mtok"])
        + usd(30, TEST_RATES["output_mtok"])
    )


def test_openllmetrys_older_cache_attributes_are_not_priced_as_fresh_input(
    agent_priced: Agent,
) -> None:
    """OpenLLMetry built on opentelemetry-semantic-conventions-ai before 0.5.0 names the cache
    gen_ai.usage.cache_read_input_tokens / cache_creation_input_tokens, its input_tokens
    including them (1200 = 100 + 1000 + 100): unread, all 1200 were priced as input."""
    older = {k: v for k, v in CHAT.items() if ".input_tokens" not in k or "usage.input" in k}
    older |= {
        "gen_ai.usage.cache_read_input_tokens": 1000,
        "gen_ai.usage.cache_creation_input_tokens": 100,
    }
    assert "gen_ai.usage.cache_read.input_tokens" not in older
    parsed(post_spans(agent_priced, spans_of(lambda tracer: span(tracer, "chat", older))))
    step = Step.objects.get()
    assert (step.input_tokens, step.cache_read_input_tokens) == (100, 1000)
    assert (step.cache_creation_input_tokens, step.output_tokens) == (100, 50)
    assert step.cost_usd == CHAT_COST  # 100 × 3 + 50 × 15 + 1000 × 0.3 + 100 × 3.75 per MTok


def test_a_span_without_a_session_goes_to_the_system_session(agent_priced: Agent) -> None:
    attrs = {k: v for k, v in CHAT.items() if k != "gen_ai.conversation.id"}
    parsed(post_spans(agent_priced, spans_of(lambda tracer: span(tracer, "chat", attrs))))
    step = Step.objects.get()
    assert step.session.external_id == "system"
    assert step.turn is None


def test_a_bad_span_is_rejected_and_the_rest_stored(agent_priced: Agent) -> None:
    bad = {**CHAT, "gen_ai.usage.cache_read.input_tokens": 5000}  # more than the input

    def build(tracer: Tracer) -> None:
        span(tracer, "chat", CHAT)
        span(tracer, "chat", bad)

    response = parsed(post_spans(agent_priced, spans_of(build)))
    assert response.partial_success.rejected_spans == 1
    assert "cache reads (5000)" in response.partial_success.error_message
    assert Step.objects.count() == 1
    assert Session.objects.get(external_id="conv-1").tokens_used == 150


def test_a_nul_in_a_tag_rejects_its_span_and_the_rest_is_stored(agent_priced: Agent) -> None:
    """PostgreSQL's jsonb refuses \\u0000: a tag holding one failed the whole export with a 500
    (no span stored, and OTLP exporters do not retry a 500); now only its span is rejected."""

    def build(tracer: Tracer) -> None:
        span(tracer, "chat", {**CHAT, "costboard.tag.feature": "se\x00arch"})
        span(tracer, "chat", {**CHAT, "costboard.tag.feature": "search"}, start=T0 + 1)

    response = parsed(post_spans(agent_priced, spans_of(build)))
    assert response.partial_success.rejected_spans == 1
    assert "tags.feature must not contain NUL" in response.partial_success.error_message
    step = Step.objects.get()
    assert step.tags == {"feature": "search"}
    assert step.cost_usd == CHAT_COST


def test_when_every_span_is_bad_it_answers_200_and_stores_nothing(agent: Agent) -> None:
    bad = {**CHAT, "gen_ai.usage.output_tokens": -1}
    spans = spans_of(lambda tracer: [span(tracer, "chat", bad) for _ in range(2)])
    response = parsed(post_spans(agent, spans))
    assert response.partial_success.rejected_spans == 2
    assert "gen_ai.usage.output_tokens" in response.partial_success.error_message
    assert not Step.objects.exists()


def test_a_gzip_body_is_decompressed(agent_priced: Agent) -> None:
    body = gzip.compress(encode_spans(spans_of(chat_trace)).SerializeToString())
    response = agent_priced.client.post(
        "/v1/traces",
        body,
        content_type=PROTOBUF,
        headers={"x-costboard-key": agent_priced.key, "Content-Encoding": "gzip"},
    )
    parsed(response)
    assert Step.objects.count() == 3


def otlp_json(trace_id: str = "5b8efff798038103d269b633813fc60c", **attrs: Any) -> bytes:
    attributes = [
        {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
        for k, v in {**CHAT, **attrs}.items()
    ]
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [{"key": "service.name", "value": {"stringValue": "a"}}]
                    },
                    "scopeSpans": [
                        {
                            "scope": {"name": "agent"},
                            "spans": [
                                {
                                    "traceId": trace_id,
                                    "spanId": "eee19b7ec3c1b174",
                                    "parentSpanId": "",
                                    "name": "chat test-sonnet",
                                    "kind": 3,
                                    "startTimeUnixNano": str(T0),
                                    "endTimeUnixNano": str(T0 + 800 * MS),
                                    "attributes": attributes,
                                    "status": {"code": 0},
                                    "someFutureField": True,
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    ).encode()


def test_otlp_json_is_read_and_answered_in_json(agent_priced: Agent) -> None:
    response = agent_priced.client.post(
        "/v1/traces",
        otlp_json(),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent_priced.key}"},
    )
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json() == {}
    step = Step.objects.get()
    assert step.event_id == "otlp:5b8efff798038103d269b633813fc60c:eee19b7ec3c1b174"
    assert (step.input_tokens, step.cache_read_input_tokens, step.duration_ms) == (100, 1000, 800)
    assert step.cost_usd == CHAT_COST
    assert turn_of(step) == 1


def test_otlp_json_partial_success_is_json(agent: Agent) -> None:
    response = agent.client.post(
        "/v1/traces",
        otlp_json(**{"gen_ai.usage.input_tokens": "many"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "gen_ai.usage.input_tokens must be a whole number" in partial["errorMessage"]


@pytest.mark.parametrize(
    ("key", "tokens"),
    [
        ("gen_ai.usage.input_tokens", "²"),
        ("gen_ai.usage.input_tokens", " ³ "),
        ("gen_ai.usage.output_tokens", "١٢"),  # Arabic-Indic 12
        pytest.param("gen_ai.usage.cache_read.input_tokens", "9" * 5000, id="5000-digits"),
    ],
)
def test_a_token_string_that_is_not_digits_0_9_rejects_its_span(
    agent: Agent, key: str, tokens: str
) -> None:
    """str.isdigit() takes '²' and Arabic-Indic digits; int() refuses '²' and 5000 digits (a
    500 before): the span is rejected with the reason, as any span that cannot be mapped."""
    response = agent.client.post(
        "/v1/traces",
        otlp_json(**{key: tokens}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert response.status_code == 200, response.content
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    message = partial["errorMessage"]
    assert f"{key} must be a whole number from 0 to 10^12" in message
    assert "a string of digits 0-9" in message
    assert len(message) < 200  # the 5000 digits are not echoed back
    assert not Step.objects.exists()


def test_an_undecodable_body_is_400_with_a_status(agent: Agent) -> None:
    headers = {"Authorization": f"Bearer {agent.key}"}
    response = agent.client.post("/v1/traces", b"\xff\xff\xff", PROTOBUF, headers=headers)
    assert response.status_code == 400
    status = status_pb2.Status()
    status.ParseFromString(response.content)
    assert status.code == 3
    assert "protobuf" in status.message

    response = agent.client.post("/v1/traces", b"{nope", "application/json", headers=headers)
    assert response.status_code == 400
    assert response.json()["code"] == 3

    bad_id = otlp_json(trace_id="not-hex")
    response = agent.client.post("/v1/traces", bad_id, "application/json", headers=headers)
    assert response.status_code == 400
    assert "traceId" in response.json()["message"]
    # each refused body counts once in /metrics' refused events, as on the events API
    assert IngestTally.objects.get(project=agent.project).refused == 3


def test_another_content_type_is_415(agent: Agent) -> None:
    response = agent.client.post(
        "/v1/traces", b"x", "text/plain", headers={"Authorization": f"Bearer {agent.key}"}
    )
    assert response.status_code == 415
    assert response.json()["errors"][0]["field"] == "Content-Type"


def test_a_body_over_5_mb_once_decompressed_is_413(agent: Agent) -> None:
    bomb = gzip.compress(b"\0" * (6 * 1024 * 1024))
    assert len(bomb) < 100_000
    response = agent.client.post(
        "/v1/traces",
        bomb,
        content_type=PROTOBUF,
        headers={"Authorization": f"Bearer {agent.key}", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 413
    status = status_pb2.Status()
    status.ParseFromString(response.content)
    assert "5 MB" in status.message


def test_a_body_over_5_mb_is_413(agent: Agent) -> None:
    response = agent.client.post(
        "/v1/traces",
        b"\0" * (5 * 1024 * 1024 + 1),
        content_type=PROTOBUF,
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert response.status_code == 413
    assert IngestTally.objects.get(project=agent.project).refused == 1


def test_durations_are_exact_to_the_millisecond(agent_priced: Agent) -> None:
    spans = spans_of(lambda tracer: span(tracer, "chat", CHAT, ms=42))
    parsed(post_spans(agent_priced, spans))
    assert Step.objects.get().duration_ms == 42


def test_the_service_tier_attributes_pick_the_tier_price(agent_priced: Agent) -> None:
    """The response's tier wins over the request's ("auto" asks for the default: standard)."""
    add_price("test-sonnet", service_tier="flex", input_mtok=Decimal("1.5"))
    spans = {
        "s-flex": {"openai.response.service_tier": "flex", "gen_ai.request.service_tier": "auto"},
        "s-gen": {"gen_ai.openai.response.service_tier": "Priority"},
        "s-auto": {"gen_ai.request.service_tier": "auto"},
    }

    def build(tracer: Tracer) -> None:
        for session, attrs in spans.items():
            span(tracer, "chat", {**CHAT, "gen_ai.conversation.id": session, **attrs})

    parsed(post_spans(agent_priced, spans_of(build)))
    tiers = dict(Step.objects.values_list("session__external_id", "service_tier"))
    assert tiers == {"s-flex": "flex", "s-gen": "priority", "s-auto": "standard"}
    flex = Step.objects.get(session__external_id="s-flex")
    standard = Step.objects.get(session__external_id="s-auto")
    assert flex.cost_input_usd == usd(flex.input_tokens, Decimal("1.5"))
    assert standard.cost_input_usd == usd(standard.input_tokens, TEST_RATES["input_mtok"])
    # no priority row: the standard price
    assert Step.objects.get(session__external_id="s-gen").cost_usd == standard.cost_usd
