"""Load the `genai-prices` package's bundled data into the rate table (offline).

Each model's match clauses become one regex; each dated price becomes a row effective from its
start date (a price without one applies since PRICE_EPOCH); long-context tiers are kept.
Time-of-day prices (off-peak discounts) and request variants (batch, flex) are not modelled:
the standard price applies. A row an admin edited, or a manual row, is never overwritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import transaction

from costboard.models import PRICE_EPOCH, ModelPrice
from costboard.pricing.repricing import PriceMatch

RATE_KEYS = (
    "input_mtok",
    "output_mtok",
    "cache_read_mtok",
    "cache_write_mtok",
    "cache_write_1h_mtok",
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


def builtin_rows() -> Iterator[dict[str, Any]]:
    """Every price in the bundled data as ModelPrice field values."""
    from genai_prices import types as gp
    from genai_prices.data import providers

    for provider in providers:
        for model in provider.models:
            regex = clause_regex(model.match)
            if regex == f"^{re.escape(model.id.lower())}$":
                regex = ""
            if isinstance(model.prices, gp.ModelPrice):
                dated = [(PRICE_EPOCH, model.prices)]
            else:
                dated = []
                for conditional in model.prices:
                    constraint = conditional.constraint
                    if constraint is None:
                        dated.append((PRICE_EPOCH, conditional.prices))
                    elif isinstance(constraint, gp.StartDateConstraint):
                        start = datetime.combine(
                            constraint.start_date, datetime.min.time(), tzinfo=UTC
                        )
                        dated.append((start, conditional.prices))
                    # time-of-day prices are discounts within a day: not modelled
            for effective_from, prices in dated:
                yield {
                    "provider": provider.id,
                    "model": model.id,
                    "model_regex": regex,
                    "context_window": model.context_window,
                    "effective_from": effective_from,
                    "external_id": model.id,
                    **_flatten(prices),
                }


@dataclass
class SyncResult:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    kept_admin_edits: int = 0
    changed: list[PriceMatch] = field(default_factory=list)


COMPARED = ("model_regex", "context_window", "external_id", "tiers", *RATE_KEYS)


def prices_sync() -> SyncResult:
    """Create or refresh the built-in rows; never touch an admin-edited or manual row."""
    result = SyncResult()
    existing = {(p.provider, p.model, p.effective_from): p for p in ModelPrice.objects.all()}
    to_create: list[ModelPrice] = []
    to_update: list[ModelPrice] = []
    seen: set[tuple[str, str, datetime]] = set()
    for values in builtin_rows():
        key = (values["provider"], values["model"], values["effective_from"])
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
        for name in COMPARED:
            setattr(row, name, values[name])
        to_update.append(row)
        result.changed.append(PriceMatch(values["model"], values["model_regex"]))
    with transaction.atomic():
        ModelPrice.objects.bulk_create(to_create, batch_size=500)
        # bulk_update skips auto_now; set it so running processes reload the table
        now = datetime.now(tz=UTC)
        for row in to_update:
            row.updated_at = now
        ModelPrice.objects.bulk_update(to_update, [*COMPARED, "updated_at"], batch_size=500)
    result.created = len(to_create)
    result.updated = len(to_update)
    return result


def _same(current: Any, new: Any) -> bool:
    if isinstance(current, Decimal) and isinstance(new, Decimal):
        return current == new
    return bool(current == new)
