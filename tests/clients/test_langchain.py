"""The LangChain handler (docs/integrations.md, "From LangChain") with langchain-core's fake chat
models carrying usage, against a live test server: a chain's model and tool runs land in the session
its metadata names, with its user and tags, cache tokens counted once, priced as genai-prices prices
them."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from costboard_client import BudgetExceeded, integrations
from costboard_client.integrations.langchain import CostboardCallbackHandler
from genai_prices import Usage, calc_price
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool

from costboard.models import TOOL_MODEL, Session, Step
from costboard.pricing.sync import prices_sync
from tests.clients.conftest import Clock, assert_one_hour_writes_priced_apart
from tests.conftest import Agent, make_agent
from tests.servers import Relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def acme(transactional_db: None) -> Agent:
    prices_sync()
    return make_agent("acme")


@pytest.fixture
def costboard(live_server: Any, acme: Agent) -> Iterator[CostboardCallbackHandler]:
    handler = CostboardCallbackHandler(live_server.url, acme.key, flush_interval=60)
    yield handler
    handler.client.close(timeout=5)


def answer(text: str, input_tokens: int, output_tokens: int, **details: int) -> AIMessage:
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    if details:
        usage["input_token_details"] = details
    return AIMessage(
        content=text,
        usage_metadata=usage,
        response_metadata={"model_name": "gpt-4o", "model_provider": "openai"},
    )


def gpt_4o(**tokens: int) -> Decimal:
    return calc_price(Usage(**tokens), "gpt-4o", provider_id="openai").total_price


def test_a_chains_calls_land_in_their_session_with_user_tags_and_cost(
    costboard: CostboardCallbackHandler,
) -> None:
    model = GenericFakeChatModel(
        messages=iter([answer("Two dollars.", 1200, 20, cache_read=1000), answer("Yes.", 50, 5)])
    )
    chain = ChatPromptTemplate.from_messages([("user", "{question}")]) | model | StrOutputParser()
    config: Any = {
        "callbacks": [costboard],
        "metadata": {
            "session_id": "lc-1",
            "user_id": "carol",
            "turn": 1,
            "tags": ["feature:qa"],
        },
    }
    assert chain.invoke({"question": "What did we spend?"}, config=config) == "Two dollars."
    assert chain.invoke({"question": "Sure?"}, config=config) == "Yes."
    assert costboard.flush(timeout=10)

    session = Session.objects.get(external_id="lc-1")
    assert session.user_id == "carol"
    first, second = Step.objects.filter(session=session).order_by("input_tokens")
    assert (first.input_tokens, first.output_tokens) == (50, 5)
    assert (second.input_tokens, second.cache_read_input_tokens, second.output_tokens) == (
        200,
        1000,
        20,
    )
    assert second.cost_usd == gpt_4o(input_tokens=1200, cache_read_tokens=1000, output_tokens=20)
    assert first.cost_usd == gpt_4o(input_tokens=50, output_tokens=5)
    assert session.cost_usd == first.cost_usd + second.cost_usd
    assert all(s.model == "gpt-4o" and s.provider == "openai" for s in (first, second))
    assert all(s.tags == {"feature": "qa"} and s.step_type == "chat" for s in (first, second))
    assert Step.objects.count() == 2  # one step per model call, none for the prompt or parser
    run_ids = set(Step.objects.values_list("event_id", flat=True))
    assert all(r is not None and len(r) == 36 for r in run_ids)  # the run ids


def test_a_tool_run_is_a_tool_step(costboard: CostboardCallbackHandler) -> None:
    @tool
    def lookup(query: str) -> str:
        """Look a number up."""
        return "42"

    assert (
        lookup.invoke(
            "spend", config={"callbacks": [costboard], "metadata": {"session_id": "lc-t"}}
        )
        == "42"
    )
    assert costboard.flush(timeout=10)
    step = Step.objects.get(session__external_id="lc-t")
    assert (step.model, step.step_type, step.cost_usd) == (TOOL_MODEL, "tool", 0)
    assert step.metadata == {"tool": "lookup"}


class BrokenModel(BaseChatModel):
    @property
    def _llm_type(self) -> str:
        return "broken"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise TimeoutError("upstream took too long")


def test_a_failed_model_run_is_a_failed_step(costboard: CostboardCallbackHandler) -> None:
    with pytest.raises(TimeoutError):
        BrokenModel().invoke(
            "hi", config={"callbacks": [costboard], "metadata": {"session_id": "lc-f"}}
        )
    assert costboard.flush(timeout=10)
    step = Step.objects.get(session__external_id="lc-f")
    assert (step.success, step.error) == (False, "TimeoutError: upstream took too long")


def test_an_exhausted_session_refuses_the_next_model_run(
    costboard: CostboardCallbackHandler, acme: Agent
) -> None:
    acme.events({"type": "session", "session_id": "lc-cap", "token_cap": 100})
    replies = iter([answer("Long answer.", 90, 20), answer("Never sent.", 1, 1)])
    model = GenericFakeChatModel(messages=replies)
    config: Any = {"callbacks": [costboard], "metadata": {"session_id": "lc-cap"}}
    model.invoke("first", config=config)  # its step is buffered, sent before the next run
    with pytest.raises(BudgetExceeded) as refused:
        model.invoke("second", config=config)
    assert refused.value.session_id == "lc-cap"
    assert next(replies).content == "Never sent."  # the model was not called
    assert Step.objects.filter(session__external_id="lc-cap").count() == 1


def test_with_costboard_down_model_runs_wait_on_it_at_most_once_per_pause(
    live_server: Any, acme: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail open, as the LiteLLM logger does (docs/integrations.md, "From LiteLLM"): a run's
    check sends the steps buffered before it, but once that found Costboard unreachable the
    runs of the next pause go ahead without waiting on it (each run waited up to the client's
    timeout, all the while Costboard was down); the steps are stored once it is back."""
    clock = Clock()  # the pause's clock
    monkeypatch.setattr(integrations, "_monotonic", clock)
    relay = Relay(live_server.url).start()
    acme.events({"type": "session", "session_id": "lc-cap", "token_cap": 100})
    handler = CostboardCallbackHandler(
        relay.url,
        acme.key,
        flush_interval=60,
        flush_at=1000,
        timeout=0.5,
        max_retries=10_000,  # nothing given up on while cut off
        backoff=0.05,
        max_backoff=0.2,
    )
    flushes: list[bool] = []
    flush = handler.client.flush

    def counted_flush(timeout: float | None = 10.0) -> bool:
        flushes.append(sent_all := flush(timeout))
        return sent_all

    monkeypatch.setattr(handler.client, "flush", counted_flush)
    model = GenericFakeChatModel(messages=iter([answer(f"Reply {n}.", 90, 20) for n in range(6)]))
    config: Any = {"callbacks": [handler], "metadata": {"session_id": "lc-cap"}}
    try:
        model.invoke("first", config=config)
        with pytest.raises(BudgetExceeded):  # heard exhausted before the cut
            model.invoke("second", config=config)
        flushes.clear()

        relay.stop()  # Costboard unreachable: connections refused
        other: Any = {"callbacks": [handler], "metadata": {"session_id": "lc-open"}}
        model.invoke("a", config=other)  # nothing buffered: nothing to wait for
        model.invoke("b", config=other)  # its check tried to send the first step
        assert flushes == [False]
        model.invoke("c", config=other)  # within the pause: no wait
        model.invoke("d", config=other)
        assert flushes == [False]
        with pytest.raises(BudgetExceeded):  # what was heard still holds
            model.invoke("e", config=config)
        assert handler.client.stats.buffered == 4

        clock.now += integrations.UNREACHABLE_PAUSE
        relay.start()
        model.invoke("f", config=other)  # the pause is over: its check sends the four
        assert flushes == [False, True]
        assert handler.flush(timeout=10)
    finally:
        handler.client.close(timeout=1)
        relay.stop()
    steps = Step.objects.filter(session__external_id="lc-open")
    assert [(s.input_tokens, s.output_tokens) for s in steps] == [(90, 20)] * 5
    assert Step.objects.filter(session__external_id="lc-cap").count() == 1


def test_the_service_tier_in_the_response_metadata_prices_the_step(
    costboard: CostboardCallbackHandler,
) -> None:
    """langchain-openai puts the response's `service_tier` in its response metadata."""
    answered = answer("Two dollars.", 1200, 20, cache_read=1000)
    answered.response_metadata["service_tier"] = "priority"
    model = GenericFakeChatModel(messages=iter([answered]))
    config: Any = {"callbacks": [costboard], "metadata": {"session_id": "lc-tier"}}
    model.invoke("What did we spend?", config=config)
    assert costboard.flush(timeout=10)
    step = Step.objects.get(session__external_id="lc-tier")
    assert step.service_tier == "priority"
    assert (
        step.cost_usd
        == calc_price(
            Usage(input_tokens=1200, cache_read_tokens=1000, output_tokens=20),
            "gpt-4o",
            provider_id="openai",
            genai_request_timestamp=step.timestamp,
            price_context={"service_tier": "priority"},
        ).total_price
    )
    assert step.cost_usd > gpt_4o(input_tokens=1200, cache_read_tokens=1000, output_tokens=20)


def test_anthropic_one_hour_cache_writes_are_priced_at_their_own_rate(
    costboard: CostboardCallbackHandler,
) -> None:
    """langchain-anthropic adds the writes' split by cache lifetime to input_token_details:
    the 1-hour ones were priced as 5-minute ones."""
    reply = AIMessage(
        content="Three flights found.",
        usage_metadata={
            "input_tokens": 7 + 1301 + 503,  # LangChain's input includes the cache
            "output_tokens": 11,
            "total_tokens": 7 + 1301 + 503 + 11,
            "input_token_details": {
                "cache_read": 1301,
                "cache_creation": 503,
                "ephemeral_5m_input_tokens": 102,
                "ephemeral_1h_input_tokens": 401,
            },
        },
        response_metadata={"model_name": "claude-sonnet-4-5", "model_provider": "anthropic"},
    )
    model = GenericFakeChatModel(messages=iter([reply]))
    model.invoke(
        "Find flights", config={"callbacks": [costboard], "metadata": {"session_id": "lc-1h"}}
    )
    assert costboard.flush(timeout=10)
    step = Step.objects.get(session__external_id="lc-1h")
    assert_one_hour_writes_priced_apart(step)
