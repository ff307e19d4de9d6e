"""The LiteLLM integration (docs/integrations.md, "From LiteLLM") with the real `litellm` package,
offline (`mock_response` calls), against a live test server: one step per call in the session its
metadata names, with its user, tags and a cost equal to genai-prices'; an exhausted session's next
call refused before it is made."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import litellm
import pytest
from costboard_client import BudgetExceeded
from costboard_client.integrations.litellm import CostboardLogger, openai_usage
from genai_prices import Usage, calc_price
from litellm.llms.anthropic.chat.transformation import AnthropicConfig

from costboard.models import Session, Step
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent, make_agent
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
MESSAGES = [{"role": "user", "content": "What did we spend?"}]


@pytest.fixture
def acme(transactional_db: None) -> Agent:
    prices_sync()
    return make_agent("acme")


@pytest.fixture
def costboard(live_server: Any, acme: Agent) -> Iterator[CostboardLogger]:
    logger = CostboardLogger(live_server.url, acme.key, flush_interval=60, flush_at=1000)
    before = list(litellm.callbacks)
    litellm.callbacks = [logger]
    yield logger
    litellm.callbacks = before
    # LiteLLM copies a callback into its success and failure lists: take it out of them
    litellm.logging_callback_manager.remove_callback_from_all_lists(logger)
    logger.client.close(timeout=5)


def stored(logger: CostboardLogger, count: int, **filters: Any) -> list[Step]:
    """The steps matching `filters` once `count` are stored: LiteLLM logs a sync call from a
    thread of its own, so the step may be queued a moment after the call returns."""

    def sent() -> list[Step]:
        logger.flush(timeout=5)
        steps = list(Step.objects.filter(**filters).order_by("id"))
        return steps if len(steps) >= count else []

    steps = wait_until(sent, what=f"{count} steps matching {filters} stored")
    assert logger.client.stats.failed == 0, logger.client.stats.last_error
    return steps


def genai_cost(model: str, provider: str, **tokens: int) -> Decimal:
    return calc_price(Usage(**tokens), model, provider_id=provider).total_price


def test_a_call_lands_in_its_session_with_user_tags_and_the_genai_prices_cost(
    costboard: CostboardLogger, acme: Agent
) -> None:
    response = litellm.completion(
        model="gpt-4o",
        messages=MESSAGES,
        mock_response="About two dollars.",
        user="alice",
        metadata={
            "session_id": "s-lite",
            "turn": 2,
            "step_type": "answer",
            "tags": ["feature:search", "env:prod"],
        },
    )
    [step] = stored(costboard, 1, session__external_id="s-lite")
    assert step.event_id == response.id  # the response id: logged twice, stored once
    assert (step.model, step.provider, step.step_type, step.turn.number) == (  # type: ignore[union-attr]
        "gpt-4o",
        "openai",
        "answer",
        2,
    )
    assert (step.input_tokens, step.output_tokens) == (10, 20)
    assert step.cost_usd == genai_cost("gpt-4o", "openai", input_tokens=10, output_tokens=20)
    assert step.cost_usd == Decimal("0.000225")
    assert step.tags == {"feature": "search", "env": "prod"}
    assert step.success is True and step.duration_ms is not None
    assert Session.objects.get(external_id="s-lite").user_id == "alice"
    assert Step.objects.count() == 1  # one step per call


@pytest.mark.parametrize(
    ("kwargs", "session"),
    [
        ({"litellm_session_id": "ls-1"}, "ls-1"),
        ({"litellm_trace_id": "lt-1"}, "lt-1"),
        ({"metadata": {"session_id": "md-1"}, "litellm_session_id": "ls-2"}, "md-1"),
        ({}, "system"),  # LiteLLM's own generated trace id is no session
    ],
)
def test_the_session_comes_from_metadata_then_litellm_ids(
    costboard: CostboardLogger, kwargs: dict[str, Any], session: str
) -> None:
    litellm.completion(model="gpt-4o", messages=MESSAGES, mock_response="ok", **kwargs)
    [step] = stored(costboard, 1)
    assert step.session.external_id == session


def test_anthropic_cache_tokens_are_counted_once_and_priced_as_genai_prices(
    costboard: CostboardLogger,
) -> None:
    # LiteLLM's own translation of an Anthropic usage: prompt_tokens includes both cache parts
    usage = AnthropicConfig().calculate_usage(
        usage_object={
            "input_tokens": 50,
            "output_tokens": 20,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 100,
        },
        reasoning_content=None,
    )
    assert usage.prompt_tokens == 1150
    mocked = litellm.ModelResponse(
        model="claude-sonnet-4-5",
        choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant"}}],
    )
    mocked.usage = usage
    litellm.completion(
        model="anthropic/claude-sonnet-4-5",
        messages=MESSAGES,
        mock_response=mocked,
        metadata={"session_id": "s-cache", "user_id": "bob"},
    )
    [step] = stored(costboard, 1, session__external_id="s-cache")
    assert (step.model, step.provider) == ("claude-sonnet-4-5", "anthropic")
    assert (step.input_tokens, step.cache_read_input_tokens) == (50, 1000)
    assert (step.cache_creation_input_tokens, step.output_tokens) == (100, 20)
    assert step.cost_usd == genai_cost(
        "claude-sonnet-4-5",
        "anthropic",
        input_tokens=1150,
        cache_read_tokens=1000,
        cache_write_tokens=100,
        output_tokens=20,
    )
    assert Session.objects.get(external_id="s-cache").user_id == "bob"


def test_openai_cached_tokens_are_taken_out_of_the_prompt_once() -> None:
    usage = litellm.Usage(
        prompt_tokens=1200, completion_tokens=5, prompt_tokens_details={"cached_tokens": 1000}
    )
    assert openai_usage(usage) == {
        "prompt_tokens": 1200,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1000},
    }


def test_a_stream_is_recorded_once_by_its_final_usage(costboard: CostboardLogger) -> None:
    chunks = litellm.completion(
        model="gpt-4o",
        messages=MESSAGES,
        mock_response="About two dollars, give or take.",
        stream=True,
        stream_options={"include_usage": True},
        metadata={"session_id": "s-stream"},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "About two dollars, give or take."
    steps = stored(costboard, 1, session__external_id="s-stream")
    time.sleep(0.3)
    assert len(stored(costboard, 1, session__external_id="s-stream")) == len(steps) == 1
    step = steps[0]
    assert step.output_tokens > 0 and step.input_tokens > 0
    assert step.cost_usd == genai_cost(
        "gpt-4o", "openai", input_tokens=step.input_tokens, output_tokens=step.output_tokens
    )


def test_the_async_path_records_each_call(costboard: CostboardLogger) -> None:
    async def two_calls() -> None:
        for _ in range(2):
            await litellm.acompletion(
                model="gpt-4o",
                messages=MESSAGES,
                mock_response="ok",
                metadata={"session_id": "s-async", "tags": {"feature": "async"}},
            )
        await asyncio.sleep(0.3)  # LiteLLM logs from a task: the loop must outlive it

    asyncio.run(two_calls())
    steps = stored(costboard, 2, session__external_id="s-async")
    assert len(steps) == 2
    assert all(s.tags == {"feature": "async"} and s.output_tokens == 20 for s in steps)


def test_a_failed_call_is_a_failed_step(costboard: CostboardLogger) -> None:
    with pytest.raises(litellm.RateLimitError):
        litellm.completion(
            model="gpt-4o",
            messages=MESSAGES,
            mock_response=litellm.RateLimitError("slow down", "openai", "gpt-4o"),
            metadata={"session_id": "s-fail"},
        )
    [step] = stored(costboard, 1, session__external_id="s-fail")
    assert step.success is False
    assert "slow down" in (step.error or "")
    assert step.cost_usd == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_exhausted_session_refuses_the_next_call_before_it_is_made(
    costboard: CostboardLogger, acme: Agent, mode: str
) -> None:
    acme.events({"type": "session", "session_id": "s-cap", "token_cap": 25})
    calls: list[str] = []

    def call() -> Any:
        calls.append(mode)
        kwargs = {
            "model": "gpt-4o",
            "messages": MESSAGES,
            "mock_response": "ok",
            "metadata": {"session_id": "s-cap"},
        }
        if mode == "sync":
            return costboard.completion(**kwargs)

        async def in_a_loop() -> Any:
            response = await costboard.acompletion(**kwargs)
            await asyncio.sleep(0.3)  # LiteLLM logs from a task: the loop must outlive it
            return response

        return asyncio.run(in_a_loop())

    call()  # 30 tokens of 25: the session is exhausted by this call
    assert len(stored(costboard, 1, session__external_id="s-cap")) == 1
    assert costboard.client.known_budget("s-cap")["state"] == "exhausted"  # type: ignore[index]

    with pytest.raises(BudgetExceeded) as refused:
        call()
    assert calls == [mode, mode]
    assert refused.value.session_id == "s-cap"
    assert "tokens 30/25" in str(refused.value)
    time.sleep(0.3)  # had LiteLLM made the call, its step would be logged by now
    assert len(stored(costboard, 1, session__external_id="s-cap")) == 1


def test_the_proxys_team_and_key_aliases_and_end_user_become_tags_and_user(
    costboard: CostboardLogger,
) -> None:
    # what the proxy puts in a call's metadata for a virtual key of a team
    gateway = {
        "session_id": "s-team",
        "user_api_key_team_alias": "growth",
        "user_api_key_alias": "ci-key",
        "user_api_key_end_user_id": "erin",
        "tags": ["feature:search"],
    }
    litellm.completion(model="gpt-4o", messages=MESSAGES, mock_response="ok", metadata=gateway)
    [step] = stored(costboard, 1, session__external_id="s-team")
    assert step.tags == {"feature": "search", "team": "growth", "key_alias": "ci-key"}
    assert Session.objects.get(external_id="s-team").user_id == "erin"
