"""Load the `genai-prices` package's bundled data into the rate table (offline).

Each model's match clauses become one regex; each dated price becomes a row effective from its
start date (a price without one applies since PRICE_EPOCH); long-context tiers are kept; a
time-of-day price becomes a row with a daily UTC window. A model's service-tier variants
(genai-prices' `price_variants`: batch, flex, priority, fast) become rows of that tier
(`tier_rows`). The audio token rates are kept beside the text ones. Other request variants
(a route, a search type), non-token units (requests, searches, audio seconds, images) and the
image and video token rates are not modelled. A row an admin edited, or a manual row, is
never overwritten; a built-in row the data no longer lists for a model it still has is
removed (its steps are repriced).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from copy import copy
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from django.db import transaction

from costboard.models import PRICE_EPOCH, STANDARD_TIER, ModelPrice, service_tier_word
from costboard.pricing.repricing import PriceMatch

RATE_KEYS = (
    "input_mtok",
    "output_mtok",
    "cache_read_mtok",
    "cache_write_mtok",
    "cache_write_1h_mtok",
    "input_audio_mtok",
    "cache_audio_read_mtok",
    "output_audio_mtok",
)
RATE_QUANTUM = Decimal("1e-10")


def clause_regex(clause: Any) -> str:
    """A genai-prices match clause as one regex, searched in the lower-cased model name."""
    from genai_prices import types as gp

    if isinstance(clause, gp.ClauseEquals):
        return f"^{re.escape(clause.equals.lower())}$"
    if isinstance(clause, gp.ClauseStartsWith):
        return f"^{re.escape(clause.starts_with.lower())}"
    if isinstance(clause, gp.ClauseEndsWith):
        return f"{re.escape(clause.ends_with.lower())}$"
    if isinstance(clause, gp.ClauseContains):
        return re.escape(clause.contains.lower())
    if isinstance(clause, gp.ClauseRegex):
        return f"(?:{clause.regex})"
    if isinstance(clause, gp.ClauseOr):
        return "(?:" + "|".join(clause_regex(c) for c in clause.or_) + ")"
    if isinstance(clause, gp.ClauseAnd):
        return "^" + "".join(f"(?=.*?{clause_regex(c)})" for c in clause.and_)
    raise ValueError(f"unknown genai-prices clause {clause!r}")


def _rate(value: Any) -> Decimal:
    return Decimal(value).quantize(RATE_QUANTUM)


def _flatten(prices: Any) -> dict[str, Any]:
    """A genai-prices ModelPrice → our rate fields and tiers."""
    from genai_prices import types as gp

    fields: dict[str, Any] = {}
    starts: set[int] = set()
    tiered: dict[str, Any] = {}
    for key in RATE_KEYS:
        value = getattr(prices, key, None)
        if isinstance(value, gp.TieredPrices):
            fields[key] = _rate(value.base)
            tiered[key] = value
            starts.update(t.start for t in value.tiers)
        else:
            fields[key] = None if value is None else _rate(value)
    tiers = []
    for start in sorted(starts):
        tier: dict[str, Any] = {"start": start}
        for key in RATE_KEYS:
            if key in tiered:
                applicable = tiered[key].base
                for t in tiered[key].tiers:
                    if t.start <= start:
                        applicable = t.price
                tier[key] = str(_rate(applicable))
            elif fields[key] is not None:
                tier[key] = str(fields[key])
        tiers.append(tier)
    fields["input_mtok"] = fields["input_mtok"] or Decimal(0)
    fields["output_mtok"] = fields["output_mtok"] or Decimal(0)
    fields["tiers"] = tiers
    return fields


Window = tuple[time, time] | None  # a daily UTC window, or None: all day


def _utc_time(value: time) -> time:
    """A constraint's time of day in UTC, naive (a naive time is UTC already)."""
    if value.tzinfo is None:
        return value
    return datetime.combine(date(2000, 1, 1), value).astimezone(UTC).time()


def _day_start(when: date) -> datetime:
    return datetime.combine(when, time.min, tzinfo=UTC)


def price_rows(prices: Any) -> list[tuple[datetime, Window, Any]]:
    """A model's genai-prices prices as (effective_from, window, prices) rows that our rule
    (pricing/rates.py: latest date, then a window holding the time, then all day) prices
    exactly as genai-prices does.

    genai-prices tries its conditional prices last to first and takes the first active one:
    an unconstrained price is always active, a start date from that UTC day, a time of day
    inside its window. So from each start date on, the last price active all day is the
    all-day row, and every time-of-day price listed after it is a window row of that date; a
    time-of-day price has no date of its own, so it is repeated at each later start date
    it still beats. (Where no price is active all day genai-prices falls back to the first;
    we leave that date unpriced outside windows, as before: the data has no such model.)
    """
    from genai_prices import types as gp

    if isinstance(prices, gp.ModelPrice):
        return [(PRICE_EPOCH, None, prices)]
    conditionals = list(prices)
    dates = {
        _day_start(c.constraint.start_date)
        for c in conditionals
        if isinstance(c.constraint, gp.StartDateConstraint)
    }
    rows: list[tuple[datetime, Window, Any]] = []
    for effective_from in sorted({PRICE_EPOCH, *dates}):
        all_day = -1
        for index, conditional in enumerate(conditionals):
            constraint = conditional.constraint
            if constraint is None or (
                isinstance(constraint, gp.StartDateConstraint)
                and _day_start(constraint.start_date) <= effective_from
            ):
                all_day = index
        if all_day >= 0:
            rows.append((effective_from, None, conditionals[all_day].prices))
        for conditional in conditionals[all_day + 1 :]:
            constraint = conditional.constraint
            if isinstance(constraint, gp.TimeOfDateConstraint):
                window = (_utc_time(constraint.start_time), _utc_time(constraint.end_time))
                rows.append((effective_from, window, conditional.prices))
    return rows


# genai-prices' request-context keys that name a service tier, and how: the variant
# `{"processing": "batch"}` is the batch tier, `{"service_tier": "flex"}` the flex tier,
# Anthropic's `{"speed": "fast"}` the fast tier. Others (a route, a search type) are not tiers.
TIER_KEYS = ("processing", "service_tier", "speed")


def variant_tier(when: dict[str, str]) -> str | None:
    """The service tier a price variant's `when` names, or None (not a tier, or standard)."""
    if len(when) != 1:
        return None
    (key, value), *_ = when.items()
    if key not in TIER_KEYS:
        return None
    tier = service_tier_word(value)
    return None if tier == STANDARD_TIER else tier


def tier_context(model: Any, tier: str) -> dict[str, str]:
    """The request context under which genai-prices prices `model` at this tier (what a step
    of that tier asks of `calc_price`)."""
    context: dict[str, str] = {}
    for variant in model.price_variants or ():
        if variant_tier(variant.when) == tier:
            context.update(variant.when)
    return context


def tier_rows(model: Any) -> list[tuple[str, datetime, Any]]:
    """A model's service-tier prices as (tier, effective_from, prices) all-day rows, priced as
    genai-prices prices a request with that tier's context.

    genai-prices resolves a variant per price key: of the variants whose `when` the context
    matches and whose start date has come, the first listed gives that key's price; keys no
    variant gives keep the standard price of the time. Standard prices and variant start
    dates change that only at their dates, so a row at each such date (from the first date a
    variant of the tier is in effect) prices every later day exactly until the next.
    Before it, a step of the tier is priced at standard, as genai-prices does. A variant
    bound to a time of day, and the tiers of a model with time-of-day prices, are not
    modelled (the data has neither): such steps are priced at standard.
    """
    from genai_prices import types as gp

    variants: dict[str, list[tuple[datetime, Any]]] = {}
    for variant in model.price_variants or ():
        tier = variant_tier(variant.when)
        constraint = variant.constraint
        if tier is None or isinstance(constraint, gp.TimeOfDateConstraint):
            continue
        start = PRICE_EPOCH
        if isinstance(constraint, gp.StartDateConstraint):
            start = _day_start(constraint.start_date)
        variants.setdefault(tier, []).append((start, variant.prices))
    standard = price_rows(model.prices)
    if not variants or any(window is not None for _, window, _ in standard):
        return []
    rows: list[tuple[str, datetime, Any]] = []
    for tier, listed in sorted(variants.items()):
        first = min(start for start, _ in listed)
        dates = sorted({first, *(start for start, _ in listed), *(eff for eff, _, _ in standard)})
        for effective_from in dates:
            if effective_from < first:
                continue
            base = [prices for eff, _, prices in standard if eff <= effective_from]
            if not base:
                continue  # no standard price yet: unpriced, as the standard series
            overrides: dict[str, Any] = {}
            for start, prices in listed:
                if start <= effective_from:
                    for key, value in prices.__dict__.items():
                        if value is not None:
                            overrides.setdefault(key, value)
            resolved = copy(base[-1])
            resolved.__dict__.update(overrides)
            rows.append((tier, effective_from, resolved))
    return rows


def builtin_rows() -> Iterator[dict[str, Any]]:
    """Every price in the bundled data as ModelPrice field values."""
    from genai_prices.data import providers

    for provider in providers:
        for model in provider.models:
            regex = clause_regex(model.match)
            if regex == f"^{re.escape(model.id.lower())}$":
                regex = ""
            shared = {
                "provider": provider.id,
                "model": model.id,
                "model_regex": regex,
                "context_window": model.context_window,
                "external_id": model.id,
            }
            for effective_from, window, prices in price_rows(model.prices):
                yield {
                    **shared,
                    "service_tier": STANDARD_TIER,
                    "effective_from": effective_from,
                    "window_start": window[0] if window else None,
                    "window_end": window[1] if window else None,
                    **_flatten(prices),
                }
            for tier, effective_from, prices in tier_rows(model):
                yield {
                    **shared,
                    "service_tier": tier,
                    "effective_from": effective_from,
                    "window_start": None,
                    "window_end": None,
                    **_flatten(prices),
                }


@dataclass
class SyncResult:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    kept_admin_edits: int = 0
    changed: list[PriceMatch] = field(default_factory=list)


COMPARED = ("model_regex", "context_window", "external_id", "tiers", "window_end", *RATE_KEYS)

# provider, model, service tier, effective_from, window_start
RowKey = tuple[str, str, str, datetime, time | None]


def prices_sync() -> SyncResult:
    """Create or refresh the built-in rows and remove those the data no longer lists for a
    model it still has (a moved start date or window would otherwise go on pricing); never
    touch an admin-edited or manual row."""
    result = SyncResult()
    existing: dict[RowKey, ModelPrice] = {
        (p.provider, p.model, p.service_tier, p.effective_from, p.window_start): p
        for p in ModelPrice.objects.all()
    }
    to_create: list[ModelPrice] = []
    to_update: list[ModelPrice] = []
    seen: set[RowKey] = set()
    for values in builtin_rows():
        key: RowKey = (
            values["provider"],
            values["model"],
            values["service_tier"],
            values["effective_from"],
            values["window_start"],
        )
        if key in seen:  # the data lists a few models twice; the first wins, as in lookups
            continue
        seen.add(key)
        row = existing.get(key)
        if row is None:
            to_create.append(ModelPrice(source=ModelPrice.Source.BUILTIN, **values))
            result.changed.append(PriceMatch(values["model"], values["model_regex"]))
            continue
        if row.edited_by_admin or row.source == ModelPrice.Source.MANUAL:
            result.kept_admin_edits += 1
            continue
        if all(_same(getattr(row, name), values[name]) for name in COMPARED):
            result.unchanged += 1
            continue
        if row.model_regex != values["model_regex"]:
            # the names only the old clause matched are repriced too
            result.changed.append(PriceMatch(row.model, row.model_regex))
        for name in COMPARED:
            setattr(row, name, values[name])
        to_update.append(row)
        result.changed.append(PriceMatch(values["model"], values["model_regex"]))
    # Only rows of series the data still has: a model it dropped keeps its last prices.
    series = {(provider, model) for provider, model, _, _, _ in seen}
    stale = [
        row
        for key, row in existing.items()
        if key not in seen
        and (row.provider, row.model) in series
        and row.source == ModelPrice.Source.BUILTIN
        and not row.edited_by_admin
    ]
    result.changed.extend(PriceMatch(row.model, row.model_regex) for row in stale)
    with transaction.atomic():
        ModelPrice.objects.filter(pk__in=[row.pk for row in stale]).delete()
        ModelPrice.objects.bulk_create(to_create, batch_size=500)
        # bulk_update skips auto_now; set it so running processes reload the table
        now = datetime.now(tz=UTC)
        for row in to_update:
            row.updated_at = now
        ModelPrice.objects.bulk_update(to_update, [*COMPARED, "updated_at"], batch_size=500)
    result.created = len(to_create)
    result.updated = len(to_update)
    result.removed = len(stale)
    return result


def _same(current: Any, new: Any) -> bool:
    if isinstance(current, Decimal) and isinstance(new, Decimal):
        return current == new
    return bool(current == new)
