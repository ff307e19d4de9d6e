"""Writes to the rate table an admin makes, and the repricing they set off.

A price row saved or deleted in the admin reprices, after commit, every step its model
patterns cover — its old pattern and its new one (through the outbox: a big table takes
minutes, and the save never waits for it or for a broker). A row's daily window is checked
here, whoever saves it: the admin's form shows the same fault on its field. A negotiated
adjustment (PriceAdjustment) saved or deleted reprices the same way the steps its old and
new scope cover: its provider's family (or every family), its project (or every one), from
its date on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Q

from costboard.input_limits import FIRST_DAY, FIRST_YEAR, LAST_DAY, LAST_YEAR, text_fault
from costboard.models import (
    PRICE_EPOCH,
    STANDARD_TIER,
    TIER_WORD,
    DailyRollup,
    ModelPrice,
    PriceAdjustment,
    service_tier_word,
)
from costboard.outbox import REPRICING_QUEUE, Attempt, outbox_add, outbox_handler
from costboard.pricing.families import is_tool_model
from costboard.pricing.names import canonical_provider
from costboard.pricing.rates import micros_of_day, windows_overlap
from costboard.pricing.repricing import PriceMatch, models_affected, steps_reprice

log = logging.getLogger(__name__)

REPRICE = "prices.reprice"
REPRICE_ADJUSTED = "prices.reprice_adjusted"


def prices_reprice_later(matches: Iterable[PriceMatch]) -> None:
    """Queue, in the current transaction, the repricing of the steps these patterns cover."""
    payload = sorted({(m.model, m.regex) for m in matches})
    if payload:
        as_dicts = [PriceMatch(model=model, regex=regex).as_dict() for model, regex in payload]
        outbox_add(REPRICE, {"matches": as_dicts})


# Not atomic: it commits chunk by chunk, and a second run recomputes the same costs.
@outbox_handler(REPRICE, lease_seconds=3600, atomic=False, queue=REPRICING_QUEUE)
def _reprice_item(payload: dict[str, Any], attempt: Attempt) -> None:
    models = models_affected([PriceMatch.from_dict(m) for m in payload["matches"]])
    result = steps_reprice(models=models)
    log.info(
        "repriced %s of %s steps of %s; cost changed by %s",
        result.steps_changed,
        result.steps_seen,
        models,
        result.cost_delta,
    )


class PriceError(ValueError):
    """A refused price row: the field and what to send instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# a price row's rates, USD per million tokens (the cache ones may be blank: the input rate)
RATE_FIELDS = (
    "input_mtok",
    "output_mtok",
    "cache_read_mtok",
    "cache_write_mtok",
    "cache_write_1h_mtok",
    "input_audio_mtok",
    "cache_audio_read_mtok",
    "output_audio_mtok",
)


def price_rate_fault(rates: Mapping[str, Decimal | None]) -> PriceError | None:
    """The first of these rates (field → value) below 0, None if none is: a token never pays
    the buyer (a long-context tier's rates are held to the same, in the admin's form)."""
    for field in RATE_FIELDS:
        rate = rates.get(field)
        if rate is not None and Decimal(rate) < 0:
            return PriceError(
                field,
                f"must be 0 or more USD per million tokens, got {Decimal(rate).normalize():f}: "
                'a price is what a token costs, e.g. "3" (a discount is a price adjustment)',
            )
    return None


# A price row's start day: from PRICE_EPOCH (the day a price that has always applied starts:
# genai-prices' rows, and a row given no date), to this many years from today, as far as a
# published price change is announced; 0001-01-01 or 9999-12-31 is a typing slip.
PRICE_YEARS_AHEAD = 2
PRICE_RANGE_SAYS = (
    "a price starts on a day from {first} (a price that has always applied) to {last} "
    "(two years from today), e.g. {today}"
)


def _years_on(day: date, years: int) -> date:
    try:
        return day.replace(year=day.year + years)
    except ValueError:  # 29 February, into a year without one
        return day.replace(year=day.year + years, day=28)


def price_day_fault(
    effective_from: datetime | None, *, today: date | None = None
) -> PriceError | None:
    """What is wrong with a price row's start (a moment; its UTC day counts), None if
    nothing: before PRICE_EPOCH's day, or more than PRICE_YEARS_AHEAD years after `today`
    (UTC, by default now's)."""
    if effective_from is None:
        return None  # that field's own error is shown
    today = today or datetime.now(UTC).date()
    first, last = PRICE_EPOCH.date(), _years_on(today, PRICE_YEARS_AHEAD)
    day = effective_from.astimezone(UTC).date() if effective_from.tzinfo else effective_from.date()
    says = PRICE_RANGE_SAYS.format(first=first, last=last, today=today)
    if day < first:
        return PriceError("effective_from", f"{day} is before {first}: {says}")
    if day > last:
        return PriceError("effective_from", f"{day} is more than two years from today: {says}")
    return None


def price_window_fault(
    *,
    provider: str,
    model: str,
    effective_from: datetime | None,
    window_start: time | None,
    window_end: time | None,
    pk: int | None = None,
    service_tier: str = STANDARD_TIER,
) -> PriceError | None:
    """What is wrong with a row's daily UTC window (docs/pricing.md), None if nothing: both
    ends or neither, two different ends, and no time shared with the window of another
    price of the same model from the same date (`pk`: the row itself, when edited); an
    all-day row, no other all-day row of the model from that date. The same model is the
    same provider and model in any letter case, as the rate table reads them. The admin's
    form shows the fault on its field; `price_save` refuses it."""
    if window_start is not None and window_start == window_end:
        return PriceError(
            "window_end", "must differ from window start (22:00–06:00 wraps midnight)"
        )
    if (window_start is None) != (window_end is None):
        return PriceError(
            "window_start" if window_start is None else "window_end",
            "set both window start and window end (UTC times of day), or neither for a "
            "price that applies all day",
        )
    if effective_from is None:
        return None  # that field's own error is shown
    series = ModelPrice.objects.filter(
        provider__iexact=provider,
        model__iexact=model,
        service_tier=service_tier,
        effective_from=effective_from,
    )
    if pk is not None:
        series = series.exclude(pk=pk)
    if window_start is None or window_end is None:
        # the same names exactly are the database's unique constraint's to refuse
        twin = series.filter(window_start__isnull=True).exclude(provider=provider, model=model)
        other = twin.first()
        if other is None:
            return None
        return PriceError(
            "model",
            f"another all-day price of this model from the same date is {other} (names are "
            "the same in any letter case): edit that row, or give this one another date",
        )
    window = (micros_of_day(window_start), micros_of_day(window_end))
    for other in series.filter(window_start__isnull=False):
        if other.window_start is None or other.window_end is None:
            continue  # the database refuses half a window; the filter leaves none
        if windows_overlap(
            window, (micros_of_day(other.window_start), micros_of_day(other.window_end))
        ):
            return PriceError(
                "window_start",
                f"overlaps the {other.window_start:%H:%M}–{other.window_end:%H:%M} UTC "
                "window of another price of this model from the same date; make the "
                "windows of one date disjoint",
            )
    return None


def stored_window_fault(price: ModelPrice) -> PriceError | None:
    """`price_window_fault` of a row as it stands (its own fields, itself excluded)."""
    return price_window_fault(
        provider=price.provider,
        model=price.model,
        effective_from=price.effective_from,
        window_start=price.window_start,
        window_end=price.window_end,
        pk=price.pk,
        service_tier=price.service_tier,
    )


def price_save(*, price: ModelPrice, by_admin: bool = True) -> None:
    """Save an added or edited price row (an edit is marked so sync_prices keeps it) and
    reprice what its old and new model patterns cover. PriceError, nothing saved, for a
    window `price_window_fault` refuses, a rate below 0 (`price_rate_fault`) or a start day out
    of range (`price_day_fault`)."""
    with transaction.atomic():
        tier = price.service_tier or ""
        if not TIER_WORD.fullmatch(tier.strip()):
            raise PriceError(
                "service_tier",
                "a service tier: standard, flex, priority, batch or the provider's word "
                "(letters, digits, _ . - :)",
            )
        price.service_tier = service_tier_word(tier)
        fault = price_day_fault(price.effective_from)
        if fault is not None:
            raise fault
        fault = stored_window_fault(price)
        if fault is not None:
            raise fault
        fault = price_rate_fault({field: getattr(price, field) for field in RATE_FIELDS})
        if fault is not None:
            raise fault
        matches = [PriceMatch(model=price.model, regex=price.model_regex)]
        if price.pk is not None:
            old = (
                ModelPrice.objects.select_for_update()
                .filter(pk=price.pk)
                .values_list("model", "model_regex")
                .first()
            )
            if old is not None:
                matches.append(PriceMatch(model=old[0], regex=old[1]))
                price.edited_by_admin = price.edited_by_admin or by_admin
        price.save()
        prices_reprice_later(matches)


def prices_delete(*, prices: Iterable[ModelPrice]) -> int:
    """Delete price rows and reprice what they covered (now priced by another row, or
    unpriced). Returns how many were deleted."""
    with transaction.atomic():
        ids = [price.pk for price in prices]
        rows = list(ModelPrice.objects.select_for_update().filter(pk__in=ids))
        matches = [PriceMatch(model=p.model, regex=p.model_regex) for p in rows]
        deleted, _ = ModelPrice.objects.filter(pk__in=[p.pk for p in rows]).delete()
        prices_reprice_later(matches)
        return deleted


# --- negotiated adjustments ---------------------------------------------------------------

MIN_PERCENT, MAX_PERCENT = Decimal(-100), Decimal(1000)
MAX_PROVIDER = PriceAdjustment._meta.get_field("provider").max_length or 64
MAX_FAMILY = PriceAdjustment._meta.get_field("family").max_length or 200


def _scope(adjustment: PriceAdjustment) -> dict[str, Any]:
    return {
        "provider": adjustment.provider,
        "family": adjustment.family,
        "project_id": adjustment.project_id,
        "since": adjustment.effective_from.isoformat(),
    }


def adjustment_fault(adjustment: PriceAdjustment) -> PriceError | None:
    """What is wrong with an adjustment (docs/pricing.md, "Negotiated rates"), None if
    nothing: a provider of at most 64 characters, a family of at most 200, neither (nor the
    note) holding NUL or an unpaired surrogate, a percent from -100 to +1000 with at most 4
    decimals, a day from 1970 to 2999."""
    for field in ("provider", "family", "note"):
        fault = text_fault(getattr(adjustment, field) or "")
        if fault is not None:
            return PriceError(field, fault)
    if not adjustment.provider.strip():
        return PriceError("provider", "name the provider, as the rate table does: openai, …")
    if len(adjustment.provider.strip()) > MAX_PROVIDER:
        return PriceError(
            "provider",
            f"at most {MAX_PROVIDER} characters, got {len(adjustment.provider.strip())}: name "
            "the provider as the rate table does (openai, …)",
        )
    family = (adjustment.family or "").strip().lower()
    if len(family) > MAX_FAMILY:
        return PriceError(
            "family",
            f"at most {MAX_FAMILY} characters, got {len(family)}: one model family as pages "
            "show it (claude-sonnet-4-5), or blank for every model of the provider",
        )
    percent = adjustment.percent
    if percent is None or not isinstance(percent, Decimal) or not percent.is_finite():
        return PriceError("percent", "a percentage on list: -12 for 12 % off, 5 for 5 % on")
    if not MIN_PERCENT <= percent <= MAX_PERCENT:
        return PriceError("percent", f"from {MIN_PERCENT} (free) to {MAX_PERCENT}, got {percent}")
    if percent != percent.quantize(Decimal("0.0001")):
        return PriceError("percent", f"at most 4 decimal places, got {percent}")
    if not isinstance(adjustment.effective_from, date):
        return PriceError("effective_from", "the day it starts, e.g. 2026-10-01")
    if not FIRST_DAY <= adjustment.effective_from <= LAST_DAY:
        return PriceError(
            "effective_from",
            f"{adjustment.effective_from} is outside the years {FIRST_YEAR}–{LAST_YEAR}: the "
            f"day it starts, from {FIRST_DAY} to {LAST_DAY}, e.g. 2026-10-01",
        )
    return None


def adjustment_save(*, adjustment: PriceAdjustment) -> None:
    """Save an added or edited adjustment (its provider as the rate table names it, its
    family lower case) and reprice, after commit, what its old and new scopes cover.
    PriceError, nothing saved, for a fault `adjustment_fault` finds."""
    fault = adjustment_fault(adjustment)
    if fault is not None:
        raise fault
    adjustment.provider = canonical_provider(adjustment.provider)
    adjustment.family = adjustment.family.strip().lower()
    with transaction.atomic():
        scopes = [_scope(adjustment)]
        if adjustment.pk is not None:
            # unordered: the model's ordering joins the project, which FOR UPDATE refuses
            old = (
                PriceAdjustment.objects.select_for_update()
                .filter(pk=adjustment.pk)
                .order_by()
                .first()
            )
            if old is not None:
                scopes.append(_scope(old))
        adjustment.save()
        outbox_add(REPRICE_ADJUSTED, {"scopes": scopes})


def adjustment_set(
    *,
    provider: str,
    family: str,
    project_id: int | None,
    percent: Decimal,
    effective_from: date,
    note: str = "",
) -> PriceAdjustment:
    """Record the adjustment of this scope from this day — the one already there edited,
    else a new one — and reprice as `adjustment_save` does (a proposal applied from
    /reconciliation/, docs/billing.md "Proposed adjustments"). PriceError, nothing saved,
    for a fault."""
    candidate = PriceAdjustment(
        provider=provider,
        family=family,
        project_id=project_id,
        percent=percent,
        effective_from=effective_from,
        note=note[:200],
    )
    fault = adjustment_fault(candidate)  # before the lookup: PostgreSQL refuses NUL there too
    if fault is not None:
        raise fault
    with transaction.atomic():
        adjustment = (
            PriceAdjustment.objects.filter(
                provider=canonical_provider(provider),
                family=family.strip().lower(),
                effective_from=effective_from,
            )
            .filter(Q(project__isnull=True) if project_id is None else Q(project_id=project_id))
            .order_by("pk")
            .first()
        ) or candidate
        adjustment.percent = percent
        adjustment.note = note[:200]
        adjustment_save(adjustment=adjustment)
    return adjustment


def adjustments_delete(*, adjustments: Iterable[PriceAdjustment]) -> int:
    """Delete adjustments and reprice what they covered (at list, or by another one)."""
    with transaction.atomic():
        ids = [adjustment.pk for adjustment in adjustments]
        rows = list(PriceAdjustment.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
        deleted, _ = PriceAdjustment.objects.filter(pk__in=[a.pk for a in rows]).delete()
        if rows:
            outbox_add(REPRICE_ADJUSTED, {"scopes": [_scope(a) for a in rows]})
        return deleted


def adjusted_models(*, family: str, project_id: int | None, since: date) -> list[str]:
    """The step models (from the daily rollups) an adjustment of this scope may reprice."""
    rollups = DailyRollup.objects.filter(day__gte=since)
    if family:
        rollups = rollups.filter(family=family)
    if project_id is not None:
        rollups = rollups.filter(project_id=project_id)
    models = rollups.values_list("model", flat=True).distinct().order_by()
    return sorted(m for m in models if not is_tool_model(m))


# Not atomic: it commits chunk by chunk, and a second run recomputes the same costs.
@outbox_handler(REPRICE_ADJUSTED, lease_seconds=3600, atomic=False, queue=REPRICING_QUEUE)
def _reprice_adjusted(payload: dict[str, Any], attempt: Attempt) -> None:
    for scope in payload["scopes"]:
        since = date.fromisoformat(scope["since"])
        models = adjusted_models(
            family=scope["family"], project_id=scope["project_id"], since=since
        )
        result = steps_reprice(
            models=models,
            project_id=scope["project_id"],
            since=datetime.combine(since, time.min, tzinfo=UTC),
        )
        log.info(
            "adjustment of %s: repriced %s of %s steps; cost changed by %s",
            scope["provider"],
            result.steps_changed,
            result.steps_seen,
            result.cost_delta,
        )
