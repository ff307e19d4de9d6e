from __future__ import annotations

import io
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection
from genai_prices import Usage, calc_price

from costboard.models import DailyRollup, ModelPrice, PriceAdjustment, Session, Step
from costboard.pricing.explain import price_explanation
from costboard.pricing.names import model_aliases
from costboard.pricing.rates import rate_table
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent, add_price, usd

pytestmark = pytest.mark.django_db


def test_every_token_kind_is_priced_at_its_own_rate(agent: Agent, priced: ModelPrice) -> None:
    agent.events(
        {
            "session_id": "s1",
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 1234,
            "output_tokens": 567,
            "cache_read_input_tokens": 89_000,
            "cache_creation_input_tokens": 4321,
        }
    )
    step = Step.objects.get()
    assert step.price_id == priced.pk
    assert step.cost_input_usd == usd(1234, Decimal("3")) == Decimal("0.003702")
    assert step.cost_output_usd == usd(567, Decimal("15")) == Decimal("0.008505")
    assert step.cost_cache_read_usd == usd(89_000, Decimal("0.3")) == Decimal("0.0267")
    assert step.cost_cache_write_usd == usd(4321, Decimal("3.75")) == Decimal("0.01620375")
    assert step.cost_usd == Decimal("0.003702") + Decimal("0.008505") + Decimal("0.0267") + Decimal(
        "0.01620375"
    )


def test_one_token_is_priced_below_a_cent(agent: Agent, priced: ModelPrice) -> None:
    agent.events({"step_type": "x", "model": "test-sonnet", "cache_read_input_tokens": 1})
    assert Step.objects.get().cost_usd == Decimal("0.0000003")


def test_one_hour_cache_writes_are_priced_at_their_rate(agent: Agent, priced: ModelPrice) -> None:
    agent.events(
        {
            "step_type": "x",
            "model": "test-sonnet",
            "usage": {
                "input_tokens": 10,
                "output_tokens": 1,
                "cache_creation_input_tokens": 3000,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 1000,
                    "ephemeral_1h_input_tokens": 2000,
                },
            },
        }
    )
    step = Step.objects.get()
    assert step.cache_creation_input_tokens == 3000
    assert step.cache_creation_1h_input_tokens == 2000
    assert step.cost_cache_write_usd == usd(1000, Decimal("3.75")) + usd(2000, Decimal("6"))


def test_openai_cached_tokens_are_not_counted_twice(agent: Agent) -> None:
    add_price(
        "test-gpt",
        provider="openai",
        input_mtok=Decimal("2.5"),
        output_mtok=Decimal("10"),
        cache_read_mtok=Decimal("1.25"),
    )
    agent.events(
        {
            "session_id": "s1",
            "step_type": "response",
            "model": "test-gpt",
            "usage": {
                "prompt_tokens": 10_000,
                "completion_tokens": 700,
                "total_tokens": 10_700,
                "prompt_tokens_details": {"cached_tokens": 8_000},
                "completion_tokens_details": {"reasoning_tokens": 300},
            },
        }
    )
    step = Step.objects.get()
    assert (step.input_tokens, step.cache_read_input_tokens) == (2_000, 8_000)
    assert step.output_tokens == 700
    assert step.reasoning_tokens == 300
    assert step.cost_usd == usd(2_000, Decimal("2.5")) + usd(8_000, Decimal("1.25")) + usd(
        700, Decimal("10")
    )
    assert step.cost_usd == Decimal("0.022")
    session = Session.objects.get(external_id="s1")
    assert session.tokens_used == 2_700


def test_a_price_change_applies_from_its_effective_date(agent: Agent) -> None:
    old = add_price("test-dated", input_mtok=Decimal("10"), output_mtok=Decimal("40"))
    new = add_price(
        "test-dated",
        input_mtok=Decimal("2"),
        output_mtok=Decimal("8"),
        effective_from=datetime(2026, 6, 10, tzinfo=UTC),
    )
    agent.events(
        {
            "event_id": "before",
            "step_type": "x",
            "model": "test-dated",
            "input_tokens": 1000,
            "output_tokens": 100,
            "timestamp": "2026-06-09T23:59:59Z",
        },
        {
            "event_id": "after",
            "step_type": "x",
            "model": "test-dated",
            "input_tokens": 1000,
            "output_tokens": 100,
            "timestamp": "2026-06-10T00:00:00Z",
        },
    )
    before = Step.objects.get(event_id="before")
    after = Step.objects.get(event_id="after")
    assert before.price_id == old.pk
    assert before.cost_usd == usd(1000, Decimal("10")) + usd(100, Decimal("40"))
    assert after.price_id == new.pk
    assert after.cost_usd == usd(1000, Decimal("2")) + usd(100, Decimal("8"))
    days = {r.day.isoformat(): r.cost_usd for r in DailyRollup.objects.all()}
    assert days == {"2026-06-09": Decimal("0.014"), "2026-06-10": Decimal("0.0028")}


def test_a_step_before_every_price_of_its_model_is_unpriced(agent: Agent) -> None:
    add_price("test-late", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    agent.events(
        {
            "step_type": "x",
            "model": "test-late",
            "input_tokens": 5,
            "timestamp": "2025-12-31T12:00:00Z",
        }
    )
    assert Step.objects.get().price_id is None
    # positive control: a step a day later is priced by that row
    agent.events(
        {
            "step_type": "x",
            "model": "test-late",
            "input_tokens": 5,
            "timestamp": "2026-01-02T12:00:00Z",
        }
    )
    assert Step.objects.exclude(price=None).get().cost_usd == Decimal("0.000015")


def test_an_unknown_model_is_stored_unpriced_never_guessed(agent: Agent) -> None:
    body = agent.events(
        {
            "session_id": "s1",
            "step_type": "x",
            "model": "acme-finetune-v7",
            "input_tokens": 900,
            "output_tokens": 100,
        }
    )
    step = Step.objects.get()
    assert step.price_id is None
    assert step.cost_usd == 0
    assert body["sessions"]["s1"]["tokens_used"] == 1000
    assert body["sessions"]["s1"]["cost_usd"] == "0.00"
    rollup = DailyRollup.objects.get()
    assert (rollup.calls, rollup.unpriced_calls) == (1, 1)


# test-long's rates past 200,000 input tokens (cache included): twice its base
LONG_TIER = {
    "start": 200_000,
    "input_mtok": "6",
    "output_mtok": "22.5",
    "cache_read_mtok": "0.6",
    "cache_write_mtok": "7.5",
}


def test_long_context_tier_prices_every_token_of_the_call(agent: Agent) -> None:
    add_price(
        "test-long",
        tiers=[LONG_TIER],
    )
    agent.events(
        {
            "event_id": "small",
            "step_type": "x",
            "model": "test-long",
            "input_tokens": 100_000,
            "cache_read_input_tokens": 100_000,
            "output_tokens": 10,
        },
        {
            "event_id": "large",
            "step_type": "x",
            "model": "test-long",
            "input_tokens": 100_000,
            "cache_read_input_tokens": 100_001,
            "output_tokens": 10,
        },
    )
    small = Step.objects.get(event_id="small")
    large = Step.objects.get(event_id="large")
    assert small.cost_usd == usd(100_000, Decimal(3)) + usd(100_000, Decimal("0.3")) + usd(
        10, Decimal(15)
    )
    assert large.cost_usd == usd(100_000, Decimal(6)) + usd(100_001, Decimal("0.6")) + usd(
        10, Decimal("22.5")
    )


def test_a_steps_price_explanation_names_the_rates_that_priced_it(agent: Agent) -> None:
    """A call past a long-context tier's start is explained with that tier's rates (the
    base rates would not give its cost), and 1-hour cache writes with their rate."""
    add_price(
        "test-long",
        tiers=[{**LONG_TIER, "cache_write_1h_mtok": "12"}],
    )
    usage = {
        "input_tokens": 150_000,
        "output_tokens": 10,
        "cache_read_input_tokens": 40_000,
        "cache_creation_input_tokens": 30_000,
        "cache_creation": {
            "ephemeral_5m_input_tokens": 10_000,
            "ephemeral_1h_input_tokens": 20_000,
        },
    }
    agent.events(
        {"event_id": "large", "step_type": "x", "model": "test-long", "usage": usage},
        {"event_id": "small", "step_type": "x", "model": "test-long", "input_tokens": 1000},
    )
    large = Step.objects.get(event_id="large")
    assert (
        large.cost_usd
        == (
            usd(150_000, Decimal(6))
            + usd(10, Decimal("22.5"))
            + usd(40_000, Decimal("0.6"))
            + usd(10_000, Decimal("7.5"))
            + usd(20_000, Decimal(12))
        )
        == Decimal("1.239225")
    )
    explained = price_explanation(large)
    assert (
        "$6 in / $22.5 out / $0.6 cache read / $7.5 cache write / $12 1-hour cache write per "
        "million tokens (its long-context rates: 220,000 input tokens, cache included, are "
        "past 200,000)." in explained
    ), explained
    assert explained.endswith("List cost $1.239225.")
    small = price_explanation(Step.objects.get(event_id="small"))
    assert (
        "$3 in / $15 out / $0.3 cache read / $3.75 cache write per million tokens "
        "(long-context tiers past their start)." in small
    ), small


def test_a_manual_price_of_the_same_date_wins_over_the_builtin_one(agent: Agent) -> None:
    add_price("test-both", provider="anthropic", input_mtok=Decimal(1))
    ModelPrice.objects.filter(model="test-both").update(source=ModelPrice.Source.BUILTIN)
    manual = add_price("test-both", provider="", input_mtok=Decimal("0.5"))
    agent.events({"step_type": "x", "model": "test-both", "input_tokens": 1_000_000})
    step = Step.objects.get()
    assert step.price_id == manual.pk
    assert step.cost_usd == Decimal("0.5")


def test_the_steps_provider_chooses_among_providers_of_one_model(agent: Agent) -> None:
    add_price("test-shared", provider="anthropic", input_mtok=Decimal(3))
    bedrock = add_price("test-shared", provider="aws", input_mtok=Decimal(4))
    agent.events(
        {
            "step_type": "x",
            "model": "test-shared",
            "provider": "aws.bedrock",
            "input_tokens": 1_000_000,
        }
    )
    step = Step.objects.get()
    assert step.price_id == bedrock.pk
    assert step.cost_usd == Decimal(4)


def test_a_regex_row_covers_other_names(agent: Agent) -> None:
    row = add_price("house-model", model_regex=r"^house-model-v\d+$")
    agent.events({"step_type": "x", "model": "House-Model-V3", "input_tokens": 1_000_000})
    assert Step.objects.get().price_id == row.pk


def test_aliases_strip_a_provider_prefix_and_a_snapshot_date() -> None:
    assert model_aliases("anthropic/claude-sonnet-4-5-20250929") == [
        "claude-sonnet-4-5-20250929",
        "anthropic/claude-sonnet-4-5",
        "claude-sonnet-4-5",
    ]
    assert model_aliases("gpt-4o-2024-08-06") == ["gpt-4o"]
    assert model_aliases("openai:gpt-4.1") == ["gpt-4.1"]


def test_an_alias_finds_a_price_by_its_plain_name(agent: Agent) -> None:
    row = add_price("test-alias", input_mtok=Decimal(2))
    agent.events(
        {"step_type": "x", "model": "testco/test-alias-20260101", "input_tokens": 1_000_000}
    )
    assert Step.objects.get().price_id == row.pk


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "provider", "usage"),
    [
        (
            "claude-sonnet-4-5-20250929",
            None,
            {
                "input_tokens": 1200,
                "output_tokens": 340,
                "cache_read_tokens": 50_000,
                "cache_write_tokens": 2_000,
            },
        ),
        ("claude-haiku-4-5", "anthropic", {"input_tokens": 99, "output_tokens": 1}),
        ("gpt-4o", None, {"input_tokens": 3000, "output_tokens": 500, "cache_read_tokens": 1000}),
        ("gpt-4o-mini", "openai", {"input_tokens": 12345, "output_tokens": 678}),
        ("o3", None, {"input_tokens": 1000, "output_tokens": 1000}),
        ("gemini-2.5-pro", "google", {"input_tokens": 50_000, "output_tokens": 2_000}),
    ],
)
def test_builtin_prices_agree_with_genai_prices(
    agent: Agent, model: str, provider: str | None, usage: dict[str, int]
) -> None:
    result = prices_sync()
    assert result.created > 1000
    when = datetime(2026, 11, 1, tzinfo=UTC)
    expected = calc_price(
        Usage(
            input_tokens=usage["input_tokens"]
            + usage.get("cache_read_tokens", 0)
            + usage.get("cache_write_tokens", 0),
            output_tokens=usage["output_tokens"],
            cache_read_tokens=usage.get("cache_read_tokens", 0),
            cache_write_tokens=usage.get("cache_write_tokens", 0),
        ),
        model,
        provider_id=provider,
        genai_request_timestamp=when,
    ).total_price
    cost = rate_table().price(
        model=model,
        provider=provider or "",
        when=when,
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cache_read_input_tokens=usage.get("cache_read_tokens", 0),
        cache_creation_input_tokens=usage.get("cache_write_tokens", 0),
    )
    assert cost.price_id is not None
    assert cost.total == expected.quantize(Decimal("1e-12"))


def test_sync_prices_never_overwrites_an_admin_edit(db: None) -> None:
    prices_sync()
    row = ModelPrice.objects.get(provider="openai", model="gpt-4o", service_tier="standard")
    row.input_mtok = Decimal("1.11")
    row.edited_by_admin = True
    row.save()
    again = prices_sync()
    assert again.created == 0
    assert again.updated == 0
    assert again.kept_admin_edits >= 1
    assert ModelPrice.objects.get(pk=row.pk).input_mtok == Decimal("1.11")


@pytest.mark.slow
def test_sync_prices_refreshes_a_builtin_row_that_drifted(db: None) -> None:
    prices_sync()
    row = ModelPrice.objects.get(provider="openai", model="gpt-4o", service_tier="standard")
    original = row.input_mtok
    ModelPrice.objects.filter(pk=row.pk).update(input_mtok=Decimal("99"))
    result = prices_sync()
    assert result.updated == 1
    assert ModelPrice.objects.get(pk=row.pk).input_mtok == original


def test_sync_prices_reprices_the_steps_a_narrowed_match_no_longer_covers(agent: Agent) -> None:
    """A genai-prices upgrade that narrows a model's match clause: the steps only the old
    clause matched are repriced (here unpriced), not left at the row's price."""
    prices_sync()
    row = ModelPrice.objects.get(provider="openai", model="gpt-4o", service_tier="standard")
    ModelPrice.objects.filter(pk=row.pk).update(model_regex="^gpt-4o")  # an older, broader one
    agent.events(
        {
            "step_type": "x",
            "model": "gpt-4o-zzz-preview",
            "provider": "openai",
            "input_tokens": 1000,
        }
    )
    step = Step.objects.get()
    assert (step.price_id, step.cost_usd) == (row.pk, usd(1000, Decimal("2.5")))

    out = io.StringIO()
    call_command("sync_prices", stdout=out)  # no broker in tests: it dispatches the repricing

    assert "0 created, 1 updated" in out.getvalue()
    step.refresh_from_db()
    assert (step.price_id, step.cost_usd) == (None, Decimal(0))
    rollup = DailyRollup.objects.get(model="gpt-4o-zzz-preview")
    assert (rollup.cost_usd, rollup.unpriced_calls) == (Decimal(0), 1)
    assert Session.objects.get().cost_usd == Decimal(0)


def test_rate_table_notices_a_price_edit(agent: Agent, priced: ModelPrice) -> None:
    rate = rate_table().rate_at("test-sonnet", "", datetime.now(UTC))
    assert rate is not None and rate.base.input == Decimal(3)
    priced.input_mtok = Decimal(5)
    priced.save()
    rate = rate_table().rate_at("test-sonnet", "", datetime.now(UTC))
    assert rate is not None and rate.base.input == Decimal(5)


def test_ingest_prices_in_integer_picodollars_exactly_as_in_decimals(db: None) -> None:
    """The ingest loop prices with ints (pico-dollars); for every built-in rate row, tier and
    token kind that equals the Decimal cost, to the last of the 12 places."""
    import random

    from costboard.money import PICO
    from costboard.pricing.rates import _cost, _cost_pico

    prices_sync()
    table = rate_table()
    rng = random.Random(5)
    for rate in table.rates:
        for _ in range(3):
            tokens = [rng.choice([0, 1, rng.randint(1, 10**6)]) for _ in range(4)]
            input_, output, read, write = tokens
            one_hour = rng.randint(0, write)
            exact = _cost(rate, input_, output, read, write, one_hour)
            price_id, *picos = _cost_pico(rate, input_, output, read, write, one_hour)
            assert price_id == rate.id
            kinds = [exact.input, exact.output, exact.cache_read, exact.cache_write]
            assert [Decimal(p) / PICO for p in picos] == kinds
    assert len(table.rates) > 1000


def test_a_rate_finer_than_a_picodollar_per_token_is_rounded_half_even(agent: Agent) -> None:
    add_price("fine-model", input_mtok=Decimal("0.0000005"), output_mtok=Decimal("1.0000005"))
    agent.events(
        {"step_type": "x", "model": "fine-model", "input_tokens": 3, "output_tokens": 1},
        {"step_type": "x", "model": "fine-model", "input_tokens": 1, "output_tokens": 3},
    )
    first, second = Step.objects.order_by("input_tokens").reverse()
    # 12 places, half-even: 3 × 5e-13 = 1.5e-12 → 2e-12; 1 × 1.0000005e-6 → 1.000000e-6
    assert first.cost_input_usd == Decimal("0.000000000002")
    assert first.cost_output_usd == Decimal("0.000001000000")
    # 1 × 5e-13 → 0; 3 × 1.0000005e-6 = 3.0000015e-6 → 3.000002e-6
    assert second.cost_input_usd == Decimal(0)
    assert second.cost_output_usd == Decimal("0.000003000002")
    assert Session.objects.get(external_id="system").cost_usd == Decimal("0.000004000004")


# --- the cached rate table and its version (migration 0040) -----------------------------------


def rate_version() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT version FROM costboard_rate_version WHERE id = 1")
        return int(cursor.fetchone()[0])


def test_every_change_to_the_prices_or_the_adjustments_moves_the_version(db: None) -> None:
    """Whatever writes them (a save, a queryset's update or delete, a bulk insert), the
    version moves with the change: a cached rate table is never kept past one."""
    seen = [rate_version()]

    def moved() -> bool:
        seen.append(rate_version())
        return seen[-1] > seen[-2]

    price = add_price("test-sonnet")
    assert moved()
    price.input_mtok = Decimal("3.5")
    price.save()
    assert moved()
    ModelPrice.objects.filter(pk=price.pk).update(output_mtok=Decimal("16"))
    assert moved()
    ModelPrice.objects.bulk_create(
        [ModelPrice(model=f"bulk-{n}", provider="testco", input_mtok=Decimal(1)) for n in range(3)]
    )
    assert moved()
    adjustment = PriceAdjustment.objects.create(
        provider="testco", percent=Decimal("-10"), effective_from=date(2026, 1, 1)
    )
    assert moved()
    adjustment.delete()
    assert moved()
    ModelPrice.objects.filter(model__startswith="bulk-").delete()
    assert moved()
    assert rate_table() is rate_table()  # nothing changed since: the same table, kept
    assert not moved()


def test_a_price_edited_between_two_requests_prices_the_second(agent: Agent) -> None:
    price = add_price("test-sonnet")
    agent.events(
        {"session_id": "a", "step_type": "x", "model": "test-sonnet", "input_tokens": 1000}
    )
    kept = rate_table()

    ModelPrice.objects.filter(pk=price.pk).update(input_mtok=Decimal("4"))
    agent.events(
        {"session_id": "b", "step_type": "x", "model": "test-sonnet", "input_tokens": 1000}
    )

    assert rate_table() is not kept
    assert Step.objects.get(session__external_id="a").cost_usd == usd(1000, Decimal("3"))
    assert Step.objects.get(session__external_id="b").cost_usd == usd(1000, Decimal("4"))


def test_without_its_version_row_the_rate_table_is_read_every_time(agent: Agent) -> None:
    """Someone deleted the row: nothing is cached (a table kept under no version could be
    kept past a change), and prices stay right."""
    price = add_price("test-sonnet")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM costboard_rate_version")
    assert rate_table() is not rate_table()
    ModelPrice.objects.filter(pk=price.pk).update(input_mtok=Decimal("4"))
    agent.events(
        {"session_id": "b", "step_type": "x", "model": "test-sonnet", "input_tokens": 1000}
    )
    assert Step.objects.get().cost_usd == usd(1000, Decimal("4"))
