"""Every built-in price, priced by our rate table, against genai-prices' own calculator.

For every model of every provider in genai-prices' bundled data (all of which sync_prices
imports), at four UTC hours of a recent day (and, for models with dated prices, of each
start date and the day before it), for every token kind — input, output, cache read, cache
write, 1-hour cache write, audio input, cached audio, audio output, and a call mixing them —
and, for long-context tiers, just past each tier's start: our cost (`RateTable.price`,
ingest's own arithmetic) equals genai-prices' to 1e-8 USD.

genai-prices is called on the ModelInfo it lists (`ModelInfo.calc_price`), not by name: a
few dozen model ids are not matched by their own match clauses (`regional.amazon.nova-2-lite-
v1:0`), and the name lookups are tested in test_rates.py. What is left out, and why:
- per-request fees (`requests_kcount`: Perplexity's sonar models) are not token prices and
  the rate table has no column for them: genai-prices' cost of an empty call (the fee) is
  subtracted from its cost before comparing;
- price variants (batch, flex, priority) need a request context the events do not carry:
  genai-prices applies none without one, and neither do we;
- other units (searches, audio seconds, images, pages, characters) and the image and video
  token rates: the usages here have none, so they cost nothing on either side.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pytest
from genai_prices import Usage
from genai_prices import types as gp
from genai_prices.data import providers

from costboard.models import ModelPrice
from costboard.pricing.rates import RateTable, rate_table
from costboard.pricing.sync import prices_sync

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

RECENT = date(2026, 11, 20)
# 00:30 opens DeepSeek's peak window, 06:00 is inside the v4 models' second one, 12:00
# inside deepseek-chat's and outside the v4 models', 18:45 outside every window.
HOURS = (time(0, 30), time(6, 0), time(12, 0), time(18, 45))
TOLERANCE = Decimal("1e-8")
SMALL = 1_234


@dataclass(frozen=True)
class Case:
    """One call: its usage as genai-prices counts it (input includes cache) and as we do."""

    kind: str
    theirs: dict[str, int]
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0
    # each part of the count above it, as the step event's audio fields are
    input_audio: int = 0
    cache_audio_read: int = 0
    output_audio: int = 0


def cases(tokens: int) -> list[Case]:
    third = tokens // 3
    return [
        Case(
            "audio input",
            {"input_tokens": tokens, "input_audio_tokens": tokens},
            input=tokens,
            input_audio=tokens,
        ),
        Case(
            "cached audio",
            {
                "input_tokens": tokens,
                "cache_read_tokens": tokens,
                "input_audio_tokens": tokens,
                "cache_audio_read_tokens": tokens,
            },
            cache_read=tokens,
            cache_audio_read=tokens,
        ),
        Case(
            "audio output",
            {"output_tokens": tokens, "output_audio_tokens": tokens},
            output=tokens,
            output_audio=tokens,
        ),
        Case(  # text and audio of every kind, in and out, some of it cached
            "mixed audio",
            {
                "input_tokens": 3 * tokens,
                "cache_read_tokens": tokens,
                "input_audio_tokens": tokens,
                "cache_audio_read_tokens": third,
                "output_tokens": tokens,
                "output_audio_tokens": third,
            },
            input=2 * tokens,
            cache_read=tokens,
            input_audio=tokens - third,
            cache_audio_read=third,
            output=tokens,
            output_audio=third,
        ),
        Case("input", {"input_tokens": tokens}, input=tokens),
        Case("output", {"output_tokens": tokens}, output=tokens),
        Case(
            "cache read",
            {"input_tokens": tokens, "cache_read_tokens": tokens},
            cache_read=tokens,
        ),
        Case(
            "cache write",
            {"input_tokens": tokens, "cache_write_tokens": tokens},
            cache_write=tokens,
        ),
        Case(
            "1-hour cache write",
            {"input_tokens": tokens, "cache_write_tokens": tokens, "cache_write_1h_tokens": tokens},
            cache_write=tokens,
            cache_write_1h=tokens,
        ),
    ]


def tier_starts(prices: gp.ModelPrice) -> set[int]:
    return {
        tier.start
        for value in prices.__dict__.values()
        if isinstance(value, gp.TieredPrices)
        for tier in value.tiers
    }


def days_of(model: gp.ModelInfo) -> list[date]:
    """The recent day, and each start date of the model's dated prices and the day before."""
    days = {RECENT}
    if isinstance(model.prices, list):
        for conditional in model.prices:
            if isinstance(conditional.constraint, gp.StartDateConstraint):
                start = conditional.constraint.start_date
                days.update((start, start - timedelta(days=1)))
    return sorted(days)


def genai_cost(
    model: gp.ModelInfo, provider: gp.Provider, usage: dict[str, int], when: datetime
) -> Decimal:
    with warnings.catch_warnings():  # units genai-prices warns it prices loosely; not ours
        warnings.simplefilter("ignore")
        return model.calc_price(Usage(**usage), provider, genai_request_timestamp=when).total_price


@dataclass
class Checked:
    calls: int = 0
    models: int = 0
    window_rows_used: set[int] = field(default_factory=set)
    # models priced with an audio rate of their own (`audio_rates`) in an audio case
    audio_models: set[tuple[str, str]] = field(default_factory=set)
    largest_difference: Decimal = Decimal(0)


AUDIO_RATES = ("input_audio_mtok", "cache_audio_read_mtok", "output_audio_mtok")


def audio_rates(prices: gp.ModelPrice) -> set[str]:
    return {key for key in AUDIO_RATES if getattr(prices, key, None) is not None}


def every_builtin_call() -> Iterator[tuple[gp.Provider, gp.ModelInfo, datetime]]:
    for provider in providers:
        for model in provider.models:
            for day in days_of(model):
                for hour in HOURS:
                    yield provider, model, datetime.combine(day, hour, tzinfo=UTC)


def compare(table: RateTable, windowed: dict[int, str], checked: Checked) -> list[str]:
    failures: list[str] = []
    seen_models: set[tuple[str, str]] = set()
    for provider, model, when in every_builtin_call():
        seen_models.add((provider.id, model.id))
        fee = genai_cost(model, provider, {}, when)  # a per-request fee, or 0
        sizes = [SMALL, *sorted(start + 1 for start in tier_starts(model.get_prices(when)))]
        calls = [case for size in sizes for case in cases(size)]
        calls += [  # output at a tier's rate needs the input that reaches the tier
            Case("output past a tier", {"input_tokens": s, "output_tokens": SMALL}, s, SMALL)
            for s in sizes[1:]
        ]
        for case in calls:
            expected = genai_cost(model, provider, case.theirs, when) - fee
            ours = table.price(
                model=model.id,
                provider=provider.id,
                when=when,
                input_tokens=case.input,
                output_tokens=case.output,
                cache_read_input_tokens=case.cache_read,
                cache_creation_input_tokens=case.cache_write,
                cache_creation_1h_input_tokens=case.cache_write_1h,
                input_audio_tokens=case.input_audio,
                cache_audio_read_tokens=case.cache_audio_read,
                output_audio_tokens=case.output_audio,
            )
            checked.calls += 1
            difference = abs(ours.total - expected)
            if ours.price_id is None or difference > TOLERANCE:
                failures.append(
                    f"{provider.id}/{model.id} at {when:%Y-%m-%d %H:%M} {case.kind} "
                    f"{case.theirs}: ours {ours.total} (row {ours.price_id}), "
                    f"genai-prices {expected}"
                )
                continue
            checked.largest_difference = max(checked.largest_difference, difference)
            if "audio" in case.kind and audio_rates(model.get_prices(when)):
                checked.audio_models.add((provider.id, model.id))
            if ours.price_id in windowed:
                checked.window_rows_used.add(ours.price_id)
    checked.models = len(seen_models)
    return failures


def test_every_builtin_price_agrees_with_genai_prices_at_four_hours_of_the_day() -> None:
    prices_sync()
    table = rate_table()
    windowed = dict(
        ModelPrice.objects.filter(window_start__isnull=False).values_list("pk", "model")
    )
    checked = Checked()
    failures = compare(table, windowed, checked)
    assert not failures, f"{len(failures)} of {checked.calls} differ:\n" + "\n".join(failures[:30])
    assert checked.models == sum(len(p.models) for p in providers) > 2000
    assert checked.calls > 40_000
    # the windows were exercised: each model with peak hours was priced by a window row
    assert len(windowed) >= 10  # 14 in genai-prices 0.2.3
    assert {windowed[pk] for pk in checked.window_rows_used} == set(windowed.values())
    # every model with an audio token rate was priced in audio: 21 in genai-prices 0.2.3
    audio_models = {
        (provider.id, model.id)
        for provider, model, when in every_builtin_call()
        if audio_rates(model.get_prices(when))
    }
    assert checked.audio_models == audio_models
    assert len(audio_models) >= 20
    assert ModelPrice.objects.filter(input_audio_mtok__isnull=False).count() >= 25  # 27
    assert checked.largest_difference <= Decimal("1e-12")  # in fact: kept to 12 places


def test_the_deepseek_models_are_charged_by_the_time_of_day_as_genai_prices_does() -> None:
    """Every quarter hour of a day, and a microsecond either side of each window's edges."""
    prices_sync()
    table = rate_table()
    deepseek = next(p for p in providers if p.id == "deepseek")
    windowed: list[tuple[gp.ModelInfo, list[gp.TimeOfDateConstraint]]] = []
    for model in deepseek.models:
        conditions = [c.constraint for c in model.prices] if isinstance(model.prices, list) else []
        windows = [c for c in conditions if isinstance(c, gp.TimeOfDateConstraint)]
        if windows:
            windowed.append((model, windows))
    ids = {model.id for model, _ in windowed}
    assert ids >= {"deepseek-chat", "deepseek-reasoner", "deepseek-v4-flash", "deepseek-v4-pro"}
    day = datetime.combine(RECENT, time.min, tzinfo=UTC)
    for model, windows in windowed:
        instants = [day + timedelta(minutes=15 * quarter) for quarter in range(96)]
        for window in windows:
            for edge in (window.start_time, window.end_time):
                at = datetime.combine(RECENT, edge.replace(tzinfo=None), tzinfo=UTC)
                instants += [at - timedelta(microseconds=1), at]
        for when in instants:
            expected = genai_cost(
                model,
                deepseek,
                {"input_tokens": 50_000, "cache_read_tokens": 40_000, "output_tokens": 3_000},
                when,
            )
            ours = table.price(
                model=model.id,
                provider="deepseek",
                when=when,
                input_tokens=10_000,
                output_tokens=3_000,
                cache_read_input_tokens=40_000,
                cache_creation_input_tokens=0,
            )
            assert ours.total == expected, (model.id, when)
