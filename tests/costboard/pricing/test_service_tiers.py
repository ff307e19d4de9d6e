"""Service tiers: a step's `service_tier` picks its price row's tier (docs/pricing.md,
"Service tiers"), and a flex, priority or batch step costs what genai-prices' own calculator
(`genai_prices.calc_price` with the tier's request context) says, to the last digit."""

from __future__ import annotations

import warnings
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import Usage, calc_price
from genai_prices.data import providers

from costboard.models import PRICE_EPOCH, STANDARD_TIER, ModelPrice, Step
from costboard.models import usd as usd_json
from costboard.outbox import outbox_dispatch
from costboard.pricing.explain import price_explanation
from costboard.pricing.rates import rate_table
from costboard.pricing.services import PriceError, price_save
from costboard.pricing.sync import prices_sync, tier_context, tier_rows, variant_tier
from tests.conftest import Agent, add_price, usd

pytestmark = pytest.mark.django_db

WHEN = datetime(2026, 11, 20, 14, 30, tzinfo=UTC)
CALL = {
    "input_tokens": 123_456,
    "output_tokens": 7_891,
    "cache_read_input_tokens": 45_678,
    "cache_creation_input_tokens": 2_345,
}


def genai_price(model: str, provider: str, tier: str, when: datetime = WHEN) -> Decimal:
    """genai-prices' total for CALL (its input counts the cache) at this tier."""
    context = None
    if tier != STANDARD_TIER:
        info = next(m for p in providers if p.id == provider for m in p.models if m.id == model)
        context = tier_context(info, tier) or {"service_tier": tier}
    usage = Usage(
        input_tokens=CALL["input_tokens"]
        + CALL["cache_read_input_tokens"]
        + CALL["cache_creation_input_tokens"],
        output_tokens=CALL["output_tokens"],
        cache_read_tokens=CALL["cache_read_input_tokens"],
        cache_write_tokens=CALL["cache_creation_input_tokens"],
    )
    return calc_price(
        usage, model, provider_id=provider, genai_request_timestamp=when, price_context=context
    ).total_price


def step_event(model: str, provider: str, **fields: Any) -> dict[str, Any]:
    return {
        "step_type": "response",
        "model": model,
        "provider": provider,
        "timestamp": WHEN.isoformat(),
        **CALL,
        **fields,
    }


@pytest.mark.parametrize(
    ("model", "provider", "tier"),
    [
        ("gpt-5", "openai", "flex"),
        ("gpt-5", "openai", "priority"),
        ("gpt-5", "openai", "batch"),
        ("gpt-4o", "openai", "priority"),
        ("claude-sonnet-4-5", "anthropic", "batch"),
        ("claude-opus-5", "anthropic", "fast"),
    ],
)
def test_a_tier_step_costs_what_genai_prices_says_for_that_tier(
    agent: Agent, model: str, provider: str, tier: str
) -> None:
    prices_sync()
    agent.events(
        step_event(model, provider, event_id="tiered", service_tier=tier),
        step_event(model, provider, event_id="standard"),
    )
    tiered = Step.objects.get(event_id="tiered")
    standard = Step.objects.get(event_id="standard")
    assert tiered.service_tier == tier
    assert standard.service_tier == STANDARD_TIER
    assert tiered.cost_usd == genai_price(model, provider, tier)  # exact, every digit
    assert standard.cost_usd == genai_price(model, provider, STANDARD_TIER)
    assert tiered.cost_usd != standard.cost_usd
    assert tiered.price_id is not None
    row = ModelPrice.objects.get(pk=tiered.price_id)
    assert (row.service_tier, row.model, row.provider) == (tier, model, provider)
    assert f"{provider}/{model}, {tier} tier price from" in price_explanation(tiered)


def test_anthropic_usage_names_the_tier_and_openai_default_is_standard(agent: Agent) -> None:
    prices_sync()
    agent.events(
        {
            "event_id": "anthropic",
            "step_type": "response",
            "model": "claude-sonnet-4-5",
            "timestamp": WHEN.isoformat(),
            "usage": {
                "input_tokens": CALL["input_tokens"],
                "output_tokens": CALL["output_tokens"],
                "cache_read_input_tokens": CALL["cache_read_input_tokens"],
                "cache_creation_input_tokens": CALL["cache_creation_input_tokens"],
                "service_tier": "batch",
            },
        },
        step_event("gpt-5", "openai", event_id="openai", service_tier=" Default "),
        step_event("gpt-5", "openai", event_id="loud", service_tier="FLEX"),
    )
    anthropic = Step.objects.get(event_id="anthropic")
    assert anthropic.service_tier == "batch"
    assert anthropic.cost_usd == genai_price("claude-sonnet-4-5", "anthropic", "batch")
    openai = Step.objects.get(event_id="openai")
    assert openai.service_tier == STANDARD_TIER
    assert openai.cost_usd == genai_price("gpt-5", "openai", STANDARD_TIER)
    assert Step.objects.get(event_id="loud").service_tier == "flex"


def test_a_tier_without_a_row_is_priced_at_standard(agent: Agent) -> None:
    """Anthropic lists no priority price: genai-prices and we both charge standard."""
    prices_sync()
    agent.events(step_event("claude-sonnet-4-5", "anthropic", service_tier="priority"))
    step = Step.objects.get()
    assert step.service_tier == "priority"
    assert step.cost_usd == genai_price("claude-sonnet-4-5", "anthropic", "priority")
    assert step.cost_usd == genai_price("claude-sonnet-4-5", "anthropic", STANDARD_TIER)
    assert step.price_id is not None
    assert ModelPrice.objects.get(pk=step.price_id).service_tier == STANDARD_TIER
    explained = price_explanation(step)
    assert "No priority price for this model then: priced at its standard price." in explained
    assert explained.endswith(f"List cost ${usd_json(step.cost_usd)}.")


def test_before_a_tier_price_starts_the_step_is_priced_at_standard(agent: Agent) -> None:
    prices_sync()
    before = datetime(2026, 10, 13, 12, tzinfo=UTC)  # batch prices start 2026-10-14
    agent.events(
        step_event(
            "claude-sonnet-4-5", "anthropic", service_tier="batch", timestamp=before.isoformat()
        )
    )
    step = Step.objects.get()
    assert step.cost_usd == genai_price("claude-sonnet-4-5", "anthropic", "batch", before)
    assert step.cost_usd == genai_price("claude-sonnet-4-5", "anthropic", "standard", before)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "must be a service tier"),
        ("x" * 33, "at most 32 characters"),
        ("flex tier", "must be a service tier"),
        (7, "must be a service tier"),
    ],
)
def test_a_bad_tier_is_refused_naming_the_field(agent: Agent, value: Any, expected: str) -> None:
    response = agent.post({"step_type": "x", "model": "m", "service_tier": value})
    assert response.status_code == 422
    error = response.json()["errors"][0]
    assert error["field"] == "service_tier"
    assert expected in error["message"]
    assert not Step.objects.exists()


def test_a_bad_usage_tier_is_refused_naming_its_path(agent: Agent) -> None:
    response = agent.post(
        {"step_type": "x", "model": "m", "usage": {"input_tokens": 1, "service_tier": ["a"]}}
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "usage.service_tier"
    assert not Step.objects.exists()


def test_a_manual_tier_row_prices_its_tier_and_repricing_covers_it(agent: Agent) -> None:
    add_price("test-model")
    agent.events(
        {
            "event_id": "b",
            "step_type": "x",
            "model": "test-model",
            "service_tier": "batch",
            "input_tokens": 1_000_000,
            "output_tokens": 10,
        },
        {
            "event_id": "s",
            "step_type": "x",
            "model": "test-model",
            "input_tokens": 1_000_000,
            "output_tokens": 10,
        },
    )
    assert Step.objects.get(event_id="b").cost_usd == Decimal(3) + usd(10, Decimal(15))
    row = ModelPrice(
        provider="testco",
        model="test-model",
        service_tier="batch",
        input_mtok=Decimal("1.5"),
        output_mtok=Decimal("7.5"),
    )
    price_save(price=row, by_admin=False)
    assert outbox_dispatch().kinds["prices.reprice"] == 1
    batch = Step.objects.get(event_id="b")
    assert batch.price_id == row.pk
    assert batch.cost_usd == Decimal("1.5") + usd(10, Decimal("7.5"))
    assert Step.objects.get(event_id="s").cost_usd == Decimal(3) + usd(10, Decimal(15))


@pytest.mark.slow
def test_every_tier_variant_agrees_with_genai_prices() -> None:
    """Every model with tier variants, every tier, at each date its prices change and the
    day before, for each token kind: our tier price equals genai-prices' with that tier's
    request context."""
    prices_sync()
    table = rate_table()
    checked = 0
    failures: list[str] = []
    for provider in providers:
        for model in provider.models:
            rows = tier_rows(model)
            named = {variant_tier(v.when) for v in model.price_variants or ()}
            tiers = sorted(tier for tier in named if tier is not None)
            if not rows:
                continue
            days = {date(2026, 11, 20)}
            for _, effective_from, _ in rows:
                if effective_from > PRICE_EPOCH:  # "always": no day before it
                    days.update((effective_from.date(), effective_from.date() - timedelta(days=1)))
            for tier in tiers:
                assert tier is not None
                for day in sorted(days):
                    when = datetime.combine(day, time(9), tzinfo=UTC)
                    for theirs, ours in _kinds():
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            expected = (
                                model.calc_price(
                                    Usage(**theirs),
                                    provider,
                                    genai_request_timestamp=when,
                                    price_context=tier_context(model, tier),
                                ).total_price
                                - model.calc_price(
                                    Usage(), provider, genai_request_timestamp=when
                                ).total_price
                            )
                        cost = table.price(
                            model=model.id,
                            provider=provider.id,
                            when=when,
                            service_tier=tier,
                            input_tokens=ours["input_tokens"],
                            output_tokens=ours["output_tokens"],
                            cache_read_input_tokens=ours["cache_read_input_tokens"],
                            cache_creation_input_tokens=ours["cache_creation_input_tokens"],
                            cache_creation_1h_input_tokens=ours["cache_creation_1h_input_tokens"],
                            input_audio_tokens=ours["input_audio_tokens"],
                            cache_audio_read_tokens=ours["cache_audio_read_tokens"],
                            output_audio_tokens=ours["output_audio_tokens"],
                        )
                        checked += 1
                        if cost.price_id is None or cost.total != expected:
                            failures.append(
                                f"{provider.id}/{model.id} {tier} {when:%Y-%m-%d} {theirs}: "
                                f"ours {cost.total}, genai-prices {expected}"
                            )
    assert not failures, f"{len(failures)} of {checked}:\n" + "\n".join(failures[:20])
    assert checked > 2_000
    assert ModelPrice.objects.exclude(service_tier=STANDARD_TIER).count() > 150


def _kinds() -> list[tuple[dict[str, int], dict[str, int]]]:
    n = 4_321
    zero = {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
        "input_audio_tokens": 0,
        "cache_audio_read_tokens": 0,
        "output_audio_tokens": 0,
    }
    return [
        # audio: part of its text count here, of genai-prices' input (cache included) there
        (
            {"input_tokens": n, "input_audio_tokens": n},
            {**zero, "input_tokens": n, "input_audio_tokens": n},
        ),
        (
            {
                "input_tokens": n,
                "cache_read_tokens": n,
                "input_audio_tokens": n,
                "cache_audio_read_tokens": n,
            },
            {**zero, "cache_read_input_tokens": n, "cache_audio_read_tokens": n},
        ),
        (
            {"output_tokens": n, "output_audio_tokens": n},
            {**zero, "output_tokens": n, "output_audio_tokens": n},
        ),
        ({"input_tokens": n}, {**zero, "input_tokens": n}),
        ({"output_tokens": n}, {**zero, "output_tokens": n}),
        ({"input_tokens": n, "cache_read_tokens": n}, {**zero, "cache_read_input_tokens": n}),
        (
            {"input_tokens": n, "cache_write_tokens": n},
            {**zero, "cache_creation_input_tokens": n},
        ),
        (
            {"input_tokens": n, "cache_write_tokens": n, "cache_write_1h_tokens": n},
            {**zero, "cache_creation_input_tokens": n, "cache_creation_1h_input_tokens": n},
        ),
        (
            {"input_tokens": 300_000, "output_tokens": n},
            {**zero, "input_tokens": 300_000, "output_tokens": n},
        ),
    ]


def test_a_tier_rows_window_is_checked_against_its_own_tier_only(staff: Any) -> None:
    """Peak hours of a flex price may be those of the standard price: another series."""
    peak = {"window_start": time(0, 30), "window_end": time(16, 30)}
    add_price("test-model", "testco", **peak)
    flex = ModelPrice(provider="testco", model="test-model", service_tier="flex", **peak)
    price_save(price=flex, by_admin=False)
    assert flex.pk is not None
    clash = ModelPrice(provider="testco", model="test-model", service_tier="FLEX", **peak)
    with pytest.raises(PriceError) as refused:
        price_save(price=clash, by_admin=False)
    assert refused.value.field == "window_start"
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {
            "provider": "testco",
            "model": "test-model",
            "service_tier": "Batch",
            "input_mtok": "1",
            "output_mtok": "2",
            "tiers": "[]",
            "effective_from_0": "2000-01-01",
            "effective_from_1": "00:00:00",
            "window_start": "00:30",
            "window_end": "16:30",
            "source": "manual",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert ModelPrice.objects.get(service_tier="batch").window_start == time(0, 30)
