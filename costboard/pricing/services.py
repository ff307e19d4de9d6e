"""Writes to the rate table an admin makes, and the repricing they set off.

A price row saved or deleted in the admin reprices, after commit, every step its model
patterns cover — its old pattern and its new one (through the outbox: a big table takes
minutes, and the save never waits for it or for a broker).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from costboard.models import ModelPrice
from costboard.outbox import Attempt, outbox_add, outbox_handler
from costboard.pricing.repricing import PriceMatch, models_affected, steps_reprice

log = logging.getLogger(__name__)

REPRICE = "prices.reprice"


def prices_reprice_later(matches: Iterable[PriceMatch]) -> None:
    """Queue, in the current transaction, the repricing of the steps these patterns cover."""
    payload = sorted({(m.model, m.regex) for m in matches})
    if payload:
        as_dicts = [PriceMatch(model=model, regex=regex).as_dict() for model, regex in payload]
        outbox_add(REPRICE, {"matches": as_dicts})


# Not atomic: it commits chunk by chunk, and a second run recomputes the same costs.
@outbox_handler(REPRICE, lease_seconds=3600, atomic=False)
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


def price_save(*, price: ModelPrice, by_admin: bool = True) -> None:
    """Save an added or edited price row (an edit is marked so sync_prices keeps it) and
    reprice what its old and new model patterns cover."""
    with transaction.atomic():
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
