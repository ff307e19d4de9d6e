"""USD from tokens: the dated rate table, looked up by model and time.

A step is priced by one ModelPrice row: among the rows whose model matches the step's model
(exact name first, then a row's regex, then common aliases: a provider prefix, a dated
snapshot suffix), those of one provider (the step's, else the model's home provider) and
provider-less manual rows, the row with the latest `effective_from` at or before the step's
time. A row may carry a daily UTC window (DeepSeek's peak hours): it applies only to steps
whose UTC time of day is inside it, and there it beats a row of the same `effective_from`
without one; a window that does not hold the step's time leaves the row out. On a remaining
tie a manual row wins, then the newer row. No match means unpriced: cost 0 and listed for
admins. Ingest, `RateTable.price()` and repricing all choose the row with `rate_at`.
A step's audio tokens, each part of a text count, are priced at the row's audio rates
(docs/pricing.md, "Audio tokens"), the cost in the column of the count they are part of.

Each row prices one service tier (standard, batch, flex, priority, …): a step is priced by
its tier's series, and by the standard series when its model has no row of that tier then.
A negotiated adjustment (PriceAdjustment) then scales the list cost: of those in effect for
the step's project, the provider billing it (`names.billing_provider`) and its family, the
most specific (project and family, project, family, provider), then the latest; each part
of the cost × (1 + pct/100), kept to 12 places half-even as every cost is.

The table, the adjustments with it, lives in memory per process (a few thousand rows) and
is reloaded when the `(count, max(updated_at))` of the price or the adjustment table
changes, checked once per ingest request.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from decimal import ROUND_HALF_EVEN, Context, Decimal
from functools import lru_cache
from threading import Lock
from typing import Any

from django.db import connection

from costboard.models import STANDARD_TIER, ModelPrice, PriceAdjustment
from costboard.money import pico_usd
from costboard.pricing.adjustments import Adjustment, adjustment_from_row
from costboard.pricing.names import (
    billing_provider,
    canonical_provider,
    home_provider,
    model_aliases,
)

MILLION = Decimal(1_000_000)
CENT_FRACTION = Decimal("1e-12")  # costs are kept to 12 places (see models.COST)
ZERO = Decimal(0)
_CTX = Context(prec=60, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per million tokens for each token kind (the audio ones resolved: a blank one is
    already what genai-prices charges in its place, `_rates`)."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    cache_write_1h: Decimal
    input_audio: Decimal
    cache_audio_read: Decimal
    output_audio: Decimal
    # The same per token, so a cost is one multiply (exact: dividing by 10**6 only moves the
    # decimal point).
    per_token: tuple[Decimal, ...] = field(init=False, repr=False, compare=False)
    # The same in pico-dollars (10**-12 USD) per token as ints, when every rate has at most 6
    # decimals per million (all but a few dozen built-in rows): a cost is one int multiply.
    pico_per_token: tuple[int, ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rates = (
            self.input,
            self.output,
            self.cache_read,
            self.cache_write,
            self.cache_write_1h,
            self.input_audio,
            self.cache_audio_read,
            self.output_audio,
        )
        object.__setattr__(self, "per_token", tuple(_CTX.divide(r, MILLION) for r in rates))
        picos = [_CTX.multiply(r, MILLION) for r in rates]
        exact = all(p == p.to_integral_value() for p in picos)
        object.__setattr__(self, "pico_per_token", tuple(int(p) for p in picos) if exact else None)


MICROS_PER_DAY = 86_400 * 10**6


def micros_of_day(value: time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 + value.microsecond


def _utc_micros_of_day(when: datetime) -> int:
    """The UTC time of day of an instant, in microseconds (a naive time is taken as UTC)."""
    if when.tzinfo is not None and when.tzinfo is not UTC:
        when = when.astimezone(UTC)
    return ((when.hour * 60 + when.minute) * 60 + when.second) * 10**6 + when.microsecond


def _spans(window: tuple[int, int]) -> list[tuple[int, int]]:
    start, end = window
    return [(start, end)] if start <= end else [(start, MICROS_PER_DAY), (0, end)]


def windows_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two daily windows (microseconds of the day, wrapping midnight) share a time."""
    return any(s1 < e2 and s2 < e1 for s1, e1 in _spans(a) for s2, e2 in _spans(b))


@dataclass(frozen=True, slots=True)
class Rate:
    """One ModelPrice row, ready to price with."""

    id: int
    provider: str
    model: str
    manual: bool
    effective_from: datetime
    context_window: int | None
    base: Rates
    tiers: tuple[tuple[int, Rates], ...] = ()
    service_tier: str = STANDARD_TIER
    # A daily UTC window, [start, end) in microseconds of the day, wrapping midnight when the
    # end comes first (genai-prices' TimeOfDateConstraint); None: all day.
    window: tuple[int, int] | None = None

    def holds(self, micros: int) -> bool:
        """Whether this row applies at this UTC time of day (in microseconds)."""
        if self.window is None:
            return True
        start, end = self.window
        if start <= end:
            return start <= micros < end
        return micros >= start or micros < end

    @property
    def rank(self) -> tuple[datetime, bool, bool, int]:
        """Among rows that apply, the highest wins: latest date, then a window, then manual,
        then the newer row."""
        return (self.effective_from, self.window is not None, self.manual, self.id)

    def rates_for(self, prompt_tokens: int) -> Rates:
        """The rates for a call with this many input tokens (cache reads and writes included):
        past a tier's start, every token of the call is at that tier's rates."""
        for start, rates in reversed(self.tiers):
            if prompt_tokens > start:
                return rates
        return self.base


@dataclass(frozen=True, slots=True)
class StepCost:
    price_id: int | None
    input: Decimal = ZERO
    output: Decimal = ZERO
    cache_read: Decimal = ZERO
    cache_write: Decimal = ZERO
    total: Decimal = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "total", self.input + self.output + self.cache_read + self.cache_write
        )


UNPRICED = StepCost(price_id=None)


def _usd(tokens: int, rate_per_token: Decimal) -> Decimal:
    """tokens × rate, exact, then kept to 12 places (half-even)."""
    if not tokens:
        return ZERO
    return _CTX.multiply(tokens, rate_per_token).quantize(CENT_FRACTION, context=_CTX)


PicoCost = tuple[int | None, int, int, int, int]  # price id; input, output, cache read, write
# A step's audio tokens: of its input, of its cache reads, of its output (docs/pricing.md).
Audio = tuple[int, int, int]
NO_AUDIO: Audio = (0, 0, 0)


def audio_of(input_audio: int, cache_audio_read: int, output_audio: int) -> Audio:
    """A step's audio counts as `RateTable.price_pico` takes them: NO_AUDIO itself when all
    are 0 (the common case, priced without the audio arithmetic)."""
    if input_audio or cache_audio_read or output_audio:
        return (input_audio, cache_audio_read, output_audio)
    return NO_AUDIO


UNPRICED_PICO: PicoCost = (None, 0, 0, 0, 0)


def step_cost(cost: PicoCost) -> StepCost:
    """A cost in pico-dollars (`RateTable.price_pico`) as USD Decimals."""
    price_id, *picos = cost
    if price_id is None:
        return UNPRICED
    return StepCost(price_id, *(pico_usd(amount) for amount in picos))


def pico(amount: Decimal) -> int:
    """A USD amount of at most 12 decimals as pico-dollars."""
    return int(amount.scaleb(12, context=_CTX))


def _cost_pico(
    rate: Rate,
    input_: int,
    output: int,
    cache_read: int,
    cache_write: int,
    cache_write_1h: int,
    audio: Audio = NO_AUDIO,
) -> PicoCost:
    """`_cost` in pico-dollars; the same numbers, in ints (the ingest loop)."""
    per = rate.rates_for(input_ + cache_read + cache_write).pico_per_token
    if per is None:  # a rate with more than 6 decimals per million: the Decimal way, rounded
        c = _cost(rate, input_, output, cache_read, cache_write, cache_write_1h, audio)
        return (rate.id, pico(c.input), pico(c.output), pico(c.cache_read), pico(c.cache_write))
    one_hour = min(cache_write_1h, cache_write)
    write = (cache_write - one_hour) * per[3] + one_hour * per[4]
    if audio is NO_AUDIO:  # nearly every step: one identity test
        return (rate.id, input_ * per[0], output * per[1], cache_read * per[2], write)
    # each audio count is part of its text count: the rest of that count at the text rate
    audio_in, audio_read, audio_out = audio
    return (
        rate.id,
        (input_ - audio_in) * per[0] + audio_in * per[5],
        (output - audio_out) * per[1] + audio_out * per[7],
        (cache_read - audio_read) * per[2] + audio_read * per[6],
        write,
    )


def cost_of(
    rate: Rate,
    *,
    input_tokens: int,
    output_tokens: int,
    cache_read_input_tokens: int,
    cache_creation_input_tokens: int,
    cache_creation_1h_input_tokens: int = 0,
    input_audio_tokens: int = 0,
    cache_audio_read_tokens: int = 0,
    output_audio_tokens: int = 0,
) -> StepCost:
    return _cost(
        rate,
        input_tokens,
        output_tokens,
        cache_read_input_tokens,
        cache_creation_input_tokens,
        cache_creation_1h_input_tokens,
        audio_of(input_audio_tokens, cache_audio_read_tokens, output_audio_tokens),
    )


def _cost(
    rate: Rate,
    input_: int,
    output: int,
    cache_read: int,
    cache_write: int,
    cache_write_1h: int,
    audio: Audio = NO_AUDIO,
) -> StepCost:
    prompt = input_ + cache_read + cache_write
    per = rate.rates_for(prompt).per_token
    audio_in, audio_read, audio_out = audio
    one_hour = min(cache_write_1h, cache_write)
    write_usd = _usd(cache_write - one_hour, per[3])
    if one_hour:
        write_usd += _usd(one_hour, per[4])
    return StepCost(
        rate.id,
        _usd(input_ - audio_in, per[0]) + _usd(audio_in, per[5]),
        _usd(output - audio_out, per[1]) + _usd(audio_out, per[7]),
        _usd(cache_read - audio_read, per[2]) + _usd(audio_read, per[6]),
        write_usd,
    )


def _rates(
    input_: Any,
    output: Any,
    cache_read: Any,
    cache_write: Any,
    cw1h: Any,
    input_audio: Any = None,
    cache_audio_read: Any = None,
    output_audio: Any = None,
) -> Rates:
    inp = Decimal(input_ or 0)
    out = Decimal(output or 0)
    cr = inp if cache_read is None else Decimal(cache_read)
    cw = inp if cache_write is None else Decimal(cache_write)
    cw_1h = cw if cw1h is None else Decimal(cw1h)
    # A blank audio rate is what genai-prices charges in its place: audio without an input
    # (output) audio rate is input (output) at the text rate; cached audio without its own
    # rate is counted both as audio input and as a cache read (its calculator subtracts each
    # priced part from the input once), which is the audio rate plus the cache read rate less
    # the input rate, and simply the audio rate for a row without a cache read rate.
    ia = inp if input_audio is None else Decimal(input_audio)
    car = max(ia + cr - inp, ZERO) if cache_audio_read is None else Decimal(cache_audio_read)
    oa = out if output_audio is None else Decimal(output_audio)
    return Rates(inp, out, cr, cw, cw_1h, ia, car, oa)


def rate_from_row(row: ModelPrice) -> Rate:
    base = _rates(
        row.input_mtok,
        row.output_mtok,
        row.cache_read_mtok,
        row.cache_write_mtok,
        row.cache_write_1h_mtok,
        row.input_audio_mtok,
        row.cache_audio_read_mtok,
        row.output_audio_mtok,
    )
    tiers = []
    for tier in sorted(row.tiers or [], key=lambda t: int(t["start"])):
        # A cache rate the row leaves blank follows the tier's input (or cache write) rate.
        tiers.append(
            (
                int(tier["start"]),
                _rates(
                    tier.get("input_mtok", base.input),
                    tier.get("output_mtok", base.output),
                    tier.get("cache_read_mtok", row.cache_read_mtok),
                    tier.get("cache_write_mtok", row.cache_write_mtok),
                    tier.get("cache_write_1h_mtok", row.cache_write_1h_mtok),
                    tier.get("input_audio_mtok", row.input_audio_mtok),
                    tier.get("cache_audio_read_mtok", row.cache_audio_read_mtok),
                    tier.get("output_audio_mtok", row.output_audio_mtok),
                ),
            )
        )
    window = None
    if row.window_start is not None and row.window_end is not None:
        window = (micros_of_day(row.window_start), micros_of_day(row.window_end))
    return Rate(
        id=row.pk,
        provider=row.provider.lower(),
        model=row.model.lower(),
        manual=row.source == ModelPrice.Source.MANUAL,
        effective_from=row.effective_from,
        context_window=row.context_window,
        base=base,
        tiers=tuple(tiers),
        service_tier=row.service_tier or STANDARD_TIER,
        window=window,
    )


@dataclass(frozen=True, slots=True)
class _Series:
    """A model's candidate rows for one provider, in rank order, with their start times."""

    starts: tuple[datetime, ...]
    rates: tuple[Rate, ...]
    windowed: bool  # any row with a daily window


@dataclass
class RateTable:
    rates: Sequence[Rate]
    regexes: dict[int, re.Pattern[str]] = field(default_factory=dict)
    adjustments: Sequence[Adjustment] = ()
    _exact: dict[str, list[Rate]] = field(default_factory=dict)
    _by_regex: list[tuple[re.Pattern[str], Rate]] = field(default_factory=list)
    _memo: dict[tuple[str, str, str], _Series] = field(default_factory=dict)
    # (project, provider, family) → its adjustments, most specific then latest first
    _adjusting: dict[tuple[int | None, str, str], tuple[Adjustment, ...]] = field(
        default_factory=dict
    )
    # context window (tokens) by price row id, for the rows that know it
    windows: dict[int, int] = field(default_factory=dict)
    by_id: dict[int, Rate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rate in self.rates:
            self.by_id[rate.id] = rate
            if rate.context_window:
                self.windows[rate.id] = rate.context_window
            self._exact.setdefault(rate.model, []).append(rate)
            if (pattern := self.regexes.get(rate.id)) is not None:
                self._by_regex.append((pattern, rate))

    def _regex_matches(self, name: str, tiers: set[str]) -> list[Rate]:
        return [
            rate
            for pattern, rate in self._by_regex
            if rate.service_tier in tiers and pattern.search(name)
        ]

    def candidates(
        self, model: str, provider: str = "", tier: str = STANDARD_TIER
    ) -> tuple[Rate, ...]:
        """Rows of this service tier that may price this model for this provider, lowest
        `Rate.rank` first. The model's series and provider are chosen among the rows of the
        tier and of standard, so a tier row never moves a step to another provider."""
        name = model.strip().lower()
        hint = canonical_provider(provider) if provider else ""
        exact: list[Rate] = []
        regex: list[Rate] = []
        tiers = {STANDARD_TIER, tier}
        for candidate in [name, *model_aliases(name)]:
            exact = [r for r in self._exact.get(candidate, ()) if r.service_tier in tiers]
            has_hint = not hint or any(r.provider == hint for r in exact)
            regex = [] if exact and has_hint else self._regex_matches(candidate, tiers)
            if exact or regex:
                break
        else:
            return ()
        present = {r.provider for r in exact + regex if r.provider}
        wanted = self._choose_provider(name, hint, present, exact + regex)
        pool = [r for r in exact if r.provider in (wanted, "")]
        if not pool:
            by_regex = [r for r in regex if r.provider in (wanted, "")]
            if not by_regex:
                return ()
            # One series: a manual one first, else the first in the data's order, as
            # genai-prices picks the first matching model of a provider.
            best = min(by_regex, key=lambda r: (not r.manual, r.id))
            pool = [r for r in by_regex if (r.provider, r.model) == (best.provider, best.model)]
        pool = [r for r in pool if r.service_tier == tier]
        pool.sort(key=lambda r: r.rank)
        return tuple(pool)

    @staticmethod
    def _choose_provider(name: str, hint: str, present: set[str], rows: list[Rate]) -> str:
        if not present:
            return ""
        if hint in present:
            return hint
        prefix = canonical_provider(name.split("/", 1)[0]) if "/" in name else ""
        if prefix in present:
            return prefix
        home = home_provider(name)
        if home in present:
            return home or ""
        manual = {r.provider for r in rows if r.manual and r.provider}
        return min(manual or present)

    def rate_at(
        self, model: str, provider: str, when: datetime, tier: str = STANDARD_TIER
    ) -> Rate | None:
        """The row that prices a step of this model, provider and service tier at this
        instant: of the candidates from `effective_from` on whose window (if any) holds
        `when`'s UTC time of day, the highest `Rate.rank`; for a tier with no such row, the
        standard row. The one rule for ingest, `price()` and repricing."""
        key = (model, provider, tier)
        series = self._memo.get(key)
        if series is None:
            chosen = self.candidates(model, provider, tier)
            series = _Series(
                tuple(r.effective_from for r in chosen),
                chosen,
                any(r.window is not None for r in chosen),
            )
            self._memo[key] = series
        index = bisect.bisect_right(series.starts, when)
        if not series.windowed:  # the common case: the latest row in effect
            if index:
                return series.rates[index - 1]
        else:
            micros = _utc_micros_of_day(when)
            for i in range(index - 1, -1, -1):  # highest rank first
                if series.rates[i].holds(micros):
                    return series.rates[i]
        if tier != STANDARD_TIER:  # no row of the tier then: the standard price
            return self.rate_at(model, provider, when)
        return None

    def price(
        self,
        *,
        model: str,
        provider: str,
        when: datetime,
        input_tokens: int,
        output_tokens: int,
        cache_read_input_tokens: int,
        cache_creation_input_tokens: int,
        cache_creation_1h_input_tokens: int = 0,
        service_tier: str = STANDARD_TIER,
        input_audio_tokens: int = 0,
        cache_audio_read_tokens: int = 0,
        output_audio_tokens: int = 0,
    ) -> StepCost:
        """A step's list cost in USD: ingest's pico-dollar arithmetic, as Decimals (a step's
        price explanation and the benchmarks' checks use this, so they price as ingest did;
        a negotiated adjustment is `families.step_classify`'s, which ingest and repricing
        call)."""
        return step_cost(
            self.price_pico(
                model,
                provider,
                when,
                input_tokens,
                output_tokens,
                cache_read_input_tokens,
                cache_creation_input_tokens,
                cache_creation_1h_input_tokens,
                service_tier,
                audio_of(input_audio_tokens, cache_audio_read_tokens, output_audio_tokens),
            )
        )

    def price_pico(
        self,
        model: str,
        provider: str,
        when: datetime,
        input_tokens: int,
        output_tokens: int,
        cache_read_input_tokens: int,
        cache_creation_input_tokens: int,
        cache_creation_1h_input_tokens: int,
        service_tier: str = STANDARD_TIER,
        audio: Audio = NO_AUDIO,
    ) -> PicoCost:
        """`price` in pico-dollars, positional, at list (the ingest loop; `adjust` then
        applies a negotiated adjustment). `audio`: `audio_of` the step's audio counts."""
        rate = self.rate_at(model, provider, when, service_tier)
        if rate is None:
            return UNPRICED_PICO
        return _cost_pico(
            rate,
            input_tokens,
            output_tokens,
            cache_read_input_tokens,
            cache_creation_input_tokens,
            cache_creation_1h_input_tokens,
            audio,
        )

    def adjust(
        self, cost: PicoCost, project_id: int, provider: str, family: str, when: datetime
    ) -> PicoCost:
        """A list cost with the negotiated adjustment of its project, the provider billing
        it (`billing_provider`: its price row's, or the reseller's it was sent through) and
        family at `when` applied, if any."""
        price_id = cost[0]
        if price_id is None or not self.adjustments:
            return cost
        rate = self.by_id[price_id]
        adjustment = self.adjustment_at(
            project_id, billing_provider(rate.provider, provider), family, when
        )
        if adjustment is None:
            return cost
        scale = adjustment.scale
        return (price_id, scale(cost[1]), scale(cost[2]), scale(cost[3]), scale(cost[4]))

    def adjustment_at(
        self, project_id: int, provider: str, family: str, when: datetime
    ) -> Adjustment | None:
        """The negotiated adjustment for a step of this project, the provider billing it
        (`billing_provider`) and family, at this instant: of those in effect, the most
        specific, then the latest (docs/pricing.md, "Negotiated rates"); None: list price."""
        key = (project_id, provider, family)
        found = self._adjusting.get(key)
        if found is None:
            found = tuple(
                sorted(
                    (
                        a
                        for a in self.adjustments
                        if a.provider == provider
                        and a.family in ("", family)
                        and a.project_id in (None, project_id)
                    ),
                    key=lambda a: (a.specificity, a.effective_from, a.id),
                    reverse=True,
                )
            )
            self._adjusting[key] = found
        for adjustment in found:
            if adjustment.effective_from <= when:
                return adjustment
        return None


def build_rate_table(
    rows: Iterable[ModelPrice], adjustments: Iterable[PriceAdjustment] = ()
) -> RateTable:
    rates = []
    regexes: dict[int, re.Pattern[str]] = {}
    for row in rows:
        rates.append(rate_from_row(row))
        if row.model_regex:
            try:
                regexes[row.pk] = compiled_pattern(row.model_regex)
            except re.error:
                continue  # the admin form refuses a bad regex; never fail ingest on one
    return RateTable(
        rates=rates,
        regexes=regexes,
        adjustments=tuple(adjustment_from_row(row) for row in adjustments),
    )


@lru_cache(maxsize=8192)
def compiled_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_lock = Lock()
_cached: tuple[int, RateTable] | None = None


# One row, counted up by triggers on every change to either table (migration 0040).
_VERSION_SQL = "SELECT version FROM costboard_rate_version WHERE id = 1"


def _version() -> int | None:
    """The prices' and the adjustments' version: a new number with any insert, edit or delete
    of either, committed with it. A key lookup (it was a count of both tables, ~1 ms on every
    request). None if the row is gone: no table is kept then."""
    with connection.cursor() as cursor:
        cursor.execute(_VERSION_SQL)
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def rate_table() -> RateTable:
    """The current rate table (one cheap query to check it is current), read from the primary
    on every page (costboard/replicas.py): it is one table for the whole process."""
    global _cached
    version = _version()
    cached = _cached
    if cached is not None and cached[0] == version:  # never kept under None
        return cached[1]
    with _lock:
        if _cached is not None and _cached[0] == version:
            return _cached[1]
        # from the primary, as the version is: on a page that reads a replica, a table built
        # there could be older than the version it is kept under, and kept for good
        table = build_rate_table(
            ModelPrice.objects.using(connection.alias).all(),
            PriceAdjustment.objects.using(connection.alias).all(),
        )
        _cached = None if version is None else (version, table)
        return table


def forget_rate_table() -> None:
    global _cached
    _cached = None
