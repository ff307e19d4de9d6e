"""POST /v1/traces from gateways and SDKs: the real LiteLLM OpenTelemetry callback's spans
(offline `mock_response` calls) land one step per call, with their end user, team and key
aliases as tags, priced as genai-prices prices them; OpenInference's and OpenLLMetry's OpenAI
instrumentations (the real OpenAI SDK answered by a mock transport) with their session, user
and cache reads; a Pydantic AI agent run (its TestModel) in its conversation."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx2
import litellm
import openai
import pytest
from genai_prices import Usage, calc_price
from litellm.integrations.opentelemetry import OpenTelemetry, OpenTelemetryConfig
from openinference.instrumentation import using_attributes
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.instrumentation.openai import OpenAIInstrumentor as OpenLLMetryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.test import TestModel

from costboard.models import TOOL_MODEL, Session, Step, UserDailyRollup
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent
from tests.otlp_spans import parsed, post_spans, span, spans_of
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def genai_priced(agent: Agent) -> Agent:
    prices_sync()
    return agent


@pytest.fixture(scope="module")
def litellm_otel() -> tuple[OpenTelemetry, InMemorySpanExporter]:
    """One LiteLLM OpenTelemetry callback for the module: its first instance installs the
    global tracer provider, which later instances would share without their exporter."""
    memory = InMemorySpanExporter()
    return OpenTelemetry(config=OpenTelemetryConfig(exporter=memory)), memory


@pytest.fixture
def litellm_spans(
    litellm_otel: tuple[OpenTelemetry, InMemorySpanExporter],
) -> Iterator[Callable[[int], list[ReadableSpan]]]:
    """LiteLLM's own OpenTelemetry callback, exporting to memory; yields a function waiting
    for `count` spans (LiteLLM logs a sync call from a thread of its own) and returning, and
    clearing, them."""
    callback, memory = litellm_otel
    memory.clear()
    before = list(litellm.callbacks)
    litellm.callbacks = [callback]

    def finished(count: int) -> list[ReadableSpan]:
        wait_until(
            lambda: len(memory.get_finished_spans()) >= count,
            what=f"{count} spans from LiteLLM",
            every=0.02,
        )
        time.sleep(0.1)  # and nothing more comes
        spans = list(memory.get_finished_spans())
        memory.clear()
        return spans

    yield finished
    litellm.callbacks = before


def gpt_4o_cost(input_tokens: int, output_tokens: int) -> Decimal:
    price = calc_price(
        Usage(input_tokens=input_tokens, output_tokens=output_tokens),
        "gpt-4o",
        provider_id="openai",
    )
    return price.total_price


def completion(**kwargs: Any) -> Any:
    return litellm.completion(
        model="gpt-4o",
        messages=[{"role": "user", "content": "What did we spend?"}],
        mock_response="About two dollars.",
        **kwargs,
    )


def test_litellm_spans_are_one_step_per_call_with_user_and_aliases(
    genai_priced: Agent, litellm_spans: Callable[[int], list[ReadableSpan]]
) -> None:
    gateway = {"user_api_key_team_alias": "growth", "user_api_key_alias": "ci-key"}
    response = completion(user="alice", metadata=gateway)
    spans = litellm_spans(2)
    # LiteLLM exports the call and a raw-request child span that repeats it
    assert sorted(s.name for s in spans) == ["litellm_request", "raw_gen_ai_request"]

    assert not parsed(post_spans(genai_priced, spans)).HasField("partial_success")
    step = Step.objects.get()
    assert (step.model, step.step_type, step.input_tokens, step.output_tokens) == (
        "gpt-4o",
        "chat",
        response.usage.prompt_tokens,
        response.usage.completion_tokens,
    )
    assert (step.input_tokens, step.output_tokens) == (10, 20)
    assert step.cost_usd == gpt_4o_cost(10, 20) == Decimal("0.000225")
    assert step.tags == {"team": "growth", "key_alias": "ci-key"}
    assert step.metadata is not None and step.metadata["otlp"]["user_id"] == "alice"
    # no session id on LiteLLM's spans: the project's system session, which is no one's
    assert step.session.external_id == "system"
    assert step.session.user_id == ""


@pytest.mark.slow
def test_litellm_calls_inside_an_app_span_with_a_session_join_it_with_their_user(
    genai_priced: Agent,
    litellm_spans: Callable[[int], list[ReadableSpan]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A span per call under the app's span (LiteLLM's default annotates the app's span instead)
    monkeypatch.setenv("USE_OTEL_LITELLM_REQUEST_SPAN", "true")
    memory = InMemorySpanExporter()
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(memory))
    tracer = app.get_tracer("agent")
    with tracer.start_as_current_span("agent turn", attributes={"session.id": "conv-7"}):
        completion(user="bob")
        completion(user="bob")
    app.shutdown()
    spans = litellm_spans(4) + list(memory.get_finished_spans())
    assert len(spans) == 5  # two calls, their two raw-request spans, the app's span

    parsed(post_spans(genai_priced, spans))
    session = Session.objects.get(external_id="conv-7")
    assert session.user_id == "bob"
    calls = Step.objects.filter(session=session, model="gpt-4o")
    assert calls.count() == 2  # one step per call
    assert Step.objects.filter(session=session, model=TOOL_MODEL).count() == 1  # the app span
    assert not Step.objects.filter(step_type="raw_gen_ai_request").exists()
    assert session.cost_usd == 2 * gpt_4o_cost(10, 20)
    assert session.tokens_used == 60
    rollup = UserDailyRollup.objects.get(project=genai_priced.project, user_id="bob")
    assert (rollup.cost_usd, rollup.calls) == (2 * gpt_4o_cost(10, 20), 3)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("attributes", "session", "user"),
    [
        ({"session.id": "s-1", "user.id": "u-1"}, "s-1", "u-1"),
        ({"gen_ai.conversation.id": "s-2", "enduser.id": "u-2"}, "s-2", "u-2"),
        ({"metadata.session_id": "s-3", "llm.user": "u-3"}, "s-3", "u-3"),
        (
            {
                "traceloop.association.properties.session_id": "s-4",
                "traceloop.association.properties.user_id": "u-4",
            },
            "s-4",
            "u-4",
        ),
        ({"session.id": "s-5", "metadata.user_api_key_end_user_id": "u-5"}, "s-5", "u-5"),
    ],
)
def test_each_session_and_user_attribute_is_read(
    genai_priced: Agent, attributes: dict[str, str], session: str, user: str
) -> None:
    chat = {
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.system": "openai",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 20,
        **attributes,
    }
    parsed(post_spans(genai_priced, spans_of(lambda tracer: span(tracer, "chat", chat))))
    stored = Session.objects.get(external_id=session)
    assert stored.user_id == user
    assert stored.cost_usd == gpt_4o_cost(10, 20)


@pytest.mark.slow
def test_a_raw_request_span_with_usage_of_its_own_is_kept(genai_priced: Agent) -> None:
    def build(tracer: Any) -> None:
        root = tracer.start_span("litellm_request", start_time=1)
        usage = {"gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 5}
        span(tracer, "raw_gen_ai_request", usage, parent=root)
        span(tracer, "raw_gen_ai_request", {}, parent=root)  # repeats its parent: dropped
        root.end(end_time=2)

    parsed(post_spans(genai_priced, spans_of(build)))
    assert sorted(Step.objects.values_list("step_type", "input_tokens")) == [
        ("litellm_request", 0),
        ("raw_gen_ai_request", 5),
    ]


def openai_client(usage: dict[str, Any]) -> Any:
    """The real OpenAI SDK, answered offline by a mock transport of its HTTP client (httpx2)."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200,
            json={
                "id": "chatcmpl-offline",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-4o-2024-08-06",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            },
        )

    return openai.OpenAI(
        api_key="sk-never-used", http_client=httpx2.Client(transport=httpx2.MockTransport(answer))
    )


@pytest.mark.slow
def test_openinference_spans_carry_session_user_and_cache_reads(genai_priced: Agent) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        client = openai_client(
            {
                "prompt_tokens": 1200,
                "completion_tokens": 20,
                "total_tokens": 1220,
                "prompt_tokens_details": {"cached_tokens": 1000},
            }
        )
        with using_attributes(session_id="oi-1", user_id="frank"):
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        instrumentor.uninstrument()
    spans = list(memory.get_finished_spans())
    assert [(s.attributes or {}).get("llm.token_count.prompt") for s in spans] == [1200]

    parsed(post_spans(genai_priced, spans))
    step = Step.objects.get()
    assert (step.session.external_id, step.session.user_id) == ("oi-1", "frank")
    assert (step.model, step.provider) == ("gpt-4o-2024-08-06", "openai")
    assert (step.input_tokens, step.cache_read_input_tokens, step.output_tokens) == (200, 1000, 20)
    expected = calc_price(
        Usage(input_tokens=1200, cache_read_tokens=1000, output_tokens=20),
        "gpt-4o-2024-08-06",
        provider_id="openai",
    ).total_price
    assert step.cost_usd == expected


@pytest.mark.slow
def test_openllmetry_spans_carry_the_user_and_cache_reads(genai_priced: Agent) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = OpenLLMetryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        client = openai_client(
            {
                "prompt_tokens": 1200,
                "completion_tokens": 20,
                "total_tokens": 1220,
                "prompt_tokens_details": {"cached_tokens": 1000},
            }
        )
        # OpenLLMetry's session is traceloop-sdk's association property; here an app span's
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span("turn", attributes={"session.id": "ol-1"}):
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}], user="gina"
            )
    finally:
        instrumentor.uninstrument()
    spans = list(memory.get_finished_spans())
    assert sorted(s.name for s in spans) == ["openai.chat", "turn"]

    parsed(post_spans(genai_priced, spans))
    step = Step.objects.get(step_type="chat")
    assert (step.session.external_id, step.session.user_id) == ("ol-1", "gina")
    assert (step.model, step.provider) == ("gpt-4o-2024-08-06", "openai")
    assert (step.input_tokens, step.cache_read_input_tokens, step.output_tokens) == (200, 1000, 20)
    expected = calc_price(
        Usage(input_tokens=1200, cache_read_tokens=1000, output_tokens=20),
        "gpt-4o-2024-08-06",
        provider_id="openai",
    ).total_price
    assert step.cost_usd == expected


def test_a_pydantic_ai_run_is_its_conversations_turn_with_one_model_step(agent: Agent) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    pydantic_agent = PydanticAgent(TestModel(), name="planner")
    pydantic_agent.instrument = InstrumentationSettings(tracer_provider=provider)
    result = pydantic_agent.run_sync("What did we spend?", conversation_id="pa-1")
    spans = list(memory.get_finished_spans())
    assert sorted(s.name for s in spans) == ["chat test", "invoke_agent planner"]

    parsed(post_spans(agent, spans))
    chat = Step.objects.get(step_type="chat")
    assert chat.session.external_id == "pa-1"
    usage = result.usage
    assert (chat.model, chat.input_tokens, chat.output_tokens) == (
        "test",
        usage.input_tokens,
        usage.output_tokens,
    )
    # the run's span carries the aggregated usage under other names: a $0 step, not a second
    run = Step.objects.get(step_type="invoke_agent")
    assert (run.model, run.input_tokens, run.output_tokens) == (TOOL_MODEL, 0, 0)
    assert Session.objects.get(external_id="pa-1").tokens_used == (
        usage.input_tokens + usage.output_tokens
    )
