"""The LiteLLM integration (docs/integrations.md, "From LiteLLM") with the real `litellm` package,
offline (`mock_response` calls), against a live test server: one step per call in the session its
metadata names, with its user, tags and a cost equal to genai-prices'; an exhausted session's or
stop-budget's next call refused before it is made, a plain `await litellm.acompletion(...)` too;
and with Costboard cut off (a relay stopped, or answering garbage), calls go ahead on the budgets
last heard."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import litellm
import pytest
from costboard_client import BudgetExceeded, integrations
from costboard_client.integrations.litellm import CostboardLogger, openai_usage
from genai_prices import Usage, calc_price
from litellm.llms.anthropic.chat.transformation import AnthropicConfig

from costboard.models import PeriodBudget, Session, Step
from costboard.pricing.sync import prices_sync
from tests.clients.conftest import Clock, assert_one_hour_writes_priced_apart
from tests.conftest import Agent, make_agent
from tests.servers import Relay
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
MESSAGES = [{"role": "user", "content": "What did we spend?"}]


@pytest.fixture
def acme(transactional_db: None) -> Agent:
    prices_sync()
    return make_agent("acme")


@contextlib.contextmanager
def registered(logger: CostboardLogger) -> Iterator[CostboardLogger]:
    """`litellm.callbacks = [logger]` for the block."""
    before = list(litellm.callbacks)
    litellm.callbacks = [logger]
    try:
        yield logger
    finally:
        litellm.callbacks = before
        # LiteLLM copies a callback into its success and failure lists: take it out of them
        litellm.logging_callback_manager.remove_callback_from_all_lists(logger)
        logger.client.close(timeout=5)


@pytest.fixture
def costboard(live_server: Any, acme: Agent) -> Iterator[CostboardLogger]:
    with registered(
        CostboardLogger(live_server.url, acme.key, flush_interval=60, flush_at=1000)
    ) as logger:
        yield logger


@pytest.fixture
def mock_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models LiteLLM's mock provider answered: a refused call never reaches it."""
    calls: list[str] = []
    answer = litellm.main.mock_completion

    def counted(model: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(model)
        return answer(model, *args, **kwargs)

    monkeypatch.setattr(litellm.main, "mock_completion", counted)
    return calls


def plain_acompletion(session: str) -> Any:
    """`await litellm.acompletion(...)` as an agent writes it, no wrapper: 10 + 20 tokens."""

    async def in_a_loop() -> Any:
        response = await litellm.acompletion(
            model="gpt-4o",
            messages=MESSAGES,
            mock_response="About two dollars.",
            metadata={"session_id": session},
        )
        await asyncio.sleep(0.3)  # LiteLLM logs from a task: the loop must outlive it
        return response

    return asyncio.run(in_a_loop())


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


def claude_answers_with(usage: Any, metadata: dict[str, Any]) -> None:
    """A litellm.completion of Claude answered with this usage (LiteLLM's translation of an
    Anthropic usage), the call's metadata as given."""
    mocked = litellm.ModelResponse(
        model="claude-sonnet-4-5",
        choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant"}}],
    )
    # a field the response takes at run time; its class declares no `usage`
    mocked.usage = usage  # type: ignore[attr-defined]
    litellm.completion(
        model="anthropic/claude-sonnet-4-5",
        messages=MESSAGES,
        mock_response=mocked,
        metadata=metadata,
    )


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
    claude_answers_with(usage, {"session_id": "s-cache", "user_id": "bob"})
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


def test_anthropic_one_hour_cache_writes_are_priced_at_their_own_rate(
    costboard: CostboardLogger,
) -> None:
    """A 1-hour cache write costs more than a 5-minute one: the split LiteLLM keeps
    (prompt_tokens_details.cache_creation_token_details) was dropped, every write priced as
    a 5-minute one."""
    usage = AnthropicConfig().calculate_usage(
        usage_object={
            "input_tokens": 7,
            "output_tokens": 11,
            "cache_read_input_tokens": 1301,
            "cache_creation_input_tokens": 503,
            "cache_creation": {"ephemeral_5m_input_tokens": 102, "ephemeral_1h_input_tokens": 401},
        },
        reasoning_content=None,
    )
    claude_answers_with(usage, {"session_id": "s-1h"})
    [step] = stored(costboard, 1, session__external_id="s-1h")
    assert_one_hour_writes_priced_apart(step)


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


def test_a_plain_acompletion_is_recorded_with_its_exact_tokens_and_cost(
    costboard: CostboardLogger, mock_calls: list[str]
) -> None:
    response = plain_acompletion("s-plain")
    [step] = stored(costboard, 1, session__external_id="s-plain")
    assert mock_calls == ["gpt-4o"]
    assert step.event_id == response.id
    assert (step.input_tokens, step.output_tokens, step.step_type) == (10, 20, "chat")
    assert step.cost_usd == Decimal("0.000225")  # 10 × $2.50/M + 20 × $10/M
    assert step.cost_usd == genai_cost("gpt-4o", "openai", input_tokens=10, output_tokens=20)
    assert Session.objects.get(external_id="s-plain").cost_usd == step.cost_usd


def test_a_plain_acompletion_of_an_exhausted_session_is_refused_before_the_call(
    costboard: CostboardLogger, acme: Agent, mock_calls: list[str]
) -> None:
    acme.events({"type": "session", "session_id": "s-cap", "token_cap": 25})
    plain_acompletion("s-cap")  # 30 tokens of 25: exhausted by this call
    stored(costboard, 1, session__external_id="s-cap")

    with pytest.raises(BudgetExceeded) as refused:  # LiteLLM re-raises the hook's own
        plain_acompletion("s-cap")
    assert refused.value.session_id == "s-cap"
    assert "session 's-cap' has exhausted its budget (tokens 30/25" in str(refused.value)
    assert mock_calls == ["gpt-4o"]  # the second call never reached the provider
    plain_acompletion("s-elsewhere")  # another session is not refused
    assert mock_calls == ["gpt-4o", "gpt-4o"]
    stored(costboard, 1, session__external_id="s-elsewhere")
    assert Step.objects.filter(session__external_id="s-cap").count() == 1
    assert Session.objects.get(external_id="s-cap").tokens_used == 30


def test_a_plain_acompletion_under_an_exhausted_stop_budget_is_refused(
    costboard: CostboardLogger, acme: Agent, mock_calls: list[str]
) -> None:
    budget = PeriodBudget.objects.create(
        project=acme.project, name="daily tokens", period="day", token_limit=50, action="stop"
    )
    plain_acompletion("s-team")
    plain_acompletion("s-team")  # 60 tokens of the budget's 50
    stored(costboard, 2, session__external_id="s-team")
    known = costboard.client.known_budget("s-team")
    assert known is not None
    assert (known["state"], known["stopped_by"]) == ("exhausted", f"budget:{budget.pk}")

    with pytest.raises(BudgetExceeded) as refused:
        plain_acompletion("s-team")
    assert refused.value.stopped_by == f"budget:{budget.pk}"
    assert "stopped by budget 'daily tokens'" in str(refused.value)
    assert "tokens 60/50" in str(refused.value)
    assert mock_calls == ["gpt-4o", "gpt-4o"]
    assert Step.objects.filter(session__external_id="s-team").count() == 2


def test_with_costboard_cut_off_calls_go_ahead_on_the_budgets_last_heard(
    live_server: Any, acme: Agent, mock_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented policy (docs/integrations.md, "From LiteLLM"): fail open. A session
    known to be exhausted stays refused; any other call goes ahead, the checks waiting on a
    flush at most once per pause, and its step is sent once Costboard answers again."""
    clock = Clock()  # the pause's clock; the client keeps its own
    monkeypatch.setattr(integrations, "_monotonic", clock)
    relay = Relay(live_server.url).start()
    acme.events({"type": "session", "session_id": "s-cap", "token_cap": 25})
    # a client that keeps retrying, so that nothing is given up on while cut off
    logger = CostboardLogger(
        relay.url,
        acme.key,
        flush_interval=60,
        flush_at=1000,
        timeout=0.5,
        max_retries=10_000,
        backoff=0.05,
        max_backoff=0.2,
    )
    flushes: list[bool] = []
    flush = logger.client.flush

    def counted_flush(timeout: float | None = 10.0) -> bool:
        flushes.append(sent_all := flush(timeout))
        return sent_all

    monkeypatch.setattr(logger.client, "flush", counted_flush)
    try:
        with registered(logger):
            plain_acompletion("s-cap")  # exhausted, and the logger hears of it
            stored(logger, 1, session__external_id="s-cap")
            flushes.clear()

            relay.stop()  # Costboard unreachable: connections refused
            with pytest.raises(BudgetExceeded):
                plain_acompletion("s-cap")  # what was heard still holds
            plain_acompletion("s-open")  # unknown: goes ahead
            assert flushes == []  # nothing was buffered: nothing to wait for
            plain_acompletion("s-open")  # its check tried to send the first s-open step
            assert flushes == [False]
            plain_acompletion("s-open")  # within the pause: the check does not wait
            assert flushes == [False]
            assert mock_calls == ["gpt-4o"] * 4
            assert logger.client.stats.buffered == 3 and logger.client.stats.sent == 1

            relay.start()
            relay.garbage()  # up, but not Costboard answering
            clock.now += integrations.UNREACHABLE_PAUSE
            plain_acompletion("s-open")  # goes ahead; its check's flush got garbage
            assert flushes == [False, False]
            assert mock_calls == ["gpt-4o"] * 5
            assert logger.client.stats.sent == 1  # a page of HTML stored nothing
            assert "not a JSON object" in (logger.client.stats.last_error or "")

            relay.garbage(False)
            steps = stored(logger, 4, session__external_id="s-open")
    finally:
        relay.stop()
    assert len(steps) == 4  # every call that went ahead, stored once
    assert [(s.input_tokens, s.output_tokens) for s in steps] == [(10, 20)] * 4
    assert sum(s.cost_usd for s in steps) == 4 * Decimal("0.000225")
    assert Step.objects.filter(session__external_id="s-cap").count() == 1


def test_the_service_tier_asked_for_prices_the_step_at_that_tier(
    costboard: CostboardLogger,
) -> None:
    litellm.completion(
        model="gpt-4o",
        messages=MESSAGES,
        mock_response="About two dollars.",
        service_tier="priority",
        metadata={"session_id": "s-tier"},
    )
    [step] = stored(costboard, 1, session__external_id="s-tier")
    assert step.service_tier == "priority"
    assert (step.input_tokens, step.output_tokens) == (10, 20)
    priority = calc_price(
        Usage(input_tokens=10, output_tokens=20),
        "gpt-4o",
        provider_id="openai",
        genai_request_timestamp=step.timestamp,
        price_context={"service_tier": "priority"},
    ).total_price
    assert step.cost_usd == priority
    assert priority > genai_cost("gpt-4o", "openai", input_tokens=10, output_tokens=20)
