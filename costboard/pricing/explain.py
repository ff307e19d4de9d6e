"""Why a step costs what it does, in words: the price row that priced it (its tier, and the
standard row when its tier had none), its rates, the list cost, and the negotiated
adjustment that scaled it (docs/pricing.md). Reads the current rate table, which every
repricing brings the steps in line with; writes nothing."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from costboard.models import STANDARD_TIER, Step, usd
from costboard.pricing.families import is_tool_model
from costboard.pricing.names import billing_provider
from costboard.pricing.rates import Rate, RateTable, rate_table

PER_MILLION = ("in", "out", "cache read", "cache write")
AUDIO_NAMES = ("audio in", "cached audio", "audio out")


def usd_text(amount: Decimal) -> str:
    """Exact: every significant digit, at least cents ($0.000123, $1.50)."""
    return f"${usd(amount)}"


def _rate_text(amount: Decimal) -> str:
    return f"${amount.normalize():f}"


def _row_text(
    rate: Rate, prompt: int = 0, one_hour: int = 0, audio: tuple[int, int, int] = (0, 0, 0)
) -> str:
    """The row, and the rates it priced this call at: a long-context tier's once the call's
    `prompt` input tokens (cache reads and writes included) are past its start, the 1-hour
    cache write rate when the call wrote any, and each audio rate of the audio it had."""
    used = rate.rates_for(prompt)
    rates = (used.input, used.output, used.cache_read, used.cache_write)
    listed = " / ".join(
        f"{_rate_text(r)} {name}" for r, name in zip(rates, PER_MILLION, strict=True)
    )
    if one_hour:
        listed += f" / {_rate_text(used.cache_write_1h)} 1-hour cache write"
    audio_rates = (used.input_audio, used.cache_audio_read, used.output_audio)
    for count, audio_rate, name in zip(audio, audio_rates, AUDIO_NAMES, strict=True):
        if count:
            listed += f" / {_rate_text(audio_rate)} {name}"
    who = f"{rate.provider}/" if rate.provider else ""
    tier = "" if rate.service_tier == STANDARD_TIER else f", {rate.service_tier} tier"
    past = [start for start, _ in rate.tiers if prompt > start]
    if past:
        tiers = (
            f" (its long-context rates: {prompt:,} input tokens, cache included, are past "
            f"{past[-1]:,})"
        )
    else:
        tiers = " (long-context tiers past their start)" if rate.tiers else ""
    return (
        f"{who}{rate.model}{tier} price from {rate.effective_from:%Y-%m-%d}: "
        f"{listed} per million tokens{tiers}"
    )


def price_explanation(step: Step, table: RateTable | None = None) -> str:
    """One step's price explained (its cost as stored, which the current table gives)."""
    if is_tool_model(step.model):
        return "A tool step: never priced ($0)."
    if step.price_id is None:
        return f"No price for {step.model}: unpriced, stored at $0 until a price is added."
    table = table or rate_table()
    rate = table.by_id.get(step.price_id)
    if rate is None:
        return f"Priced by price row #{step.price_id}, since removed; a repricing follows."
    prompt = step.input_tokens + step.cache_read_input_tokens + step.cache_creation_input_tokens
    one_hour = min(step.cache_creation_1h_input_tokens, step.cache_creation_input_tokens)
    parts = [_row_text(rate, prompt, one_hour, step.audio) + "."]
    if step.service_tier != rate.service_tier:
        parts.append(
            f"No {step.service_tier} price for this model then: priced at its standard price."
        )
    listed = table.price(
        model=step.model,
        provider=step.provider,
        when=step.timestamp,
        input_tokens=step.input_tokens,
        output_tokens=step.output_tokens,
        cache_read_input_tokens=step.cache_read_input_tokens,
        cache_creation_input_tokens=step.cache_creation_input_tokens,
        cache_creation_1h_input_tokens=step.cache_creation_1h_input_tokens,
        service_tier=step.service_tier,
        input_audio_tokens=step.audio[0],
        cache_audio_read_tokens=step.audio[1],
        output_audio_tokens=step.audio[2],
    )
    adjustment = None
    if table.adjustments:
        adjustment = table.adjustment_at(
            step.project_id,
            billing_provider(rate.provider, step.provider),
            step.family,
            step.timestamp,
        )
    if adjustment is None:
        parts.append(f"List cost {usd_text(listed.total)}.")
    else:
        parts.append(
            f"List cost {usd_text(listed.total)}; {adjustment.describe()}: "
            f"{usd_text(step.cost_usd)}."
        )
    return " ".join(parts)


def price_explanations(steps: Iterable[Step]) -> dict[int, str]:
    """Each step's explanation by its id, one rate table for all."""
    table = rate_table()
    return {step.pk: price_explanation(step, table) for step in steps}
