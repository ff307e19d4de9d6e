"""Writes to the rate table an admin makes, and the repricing they set off.

A price row saved or deleted in the admin reprices, after commit, every step its model
patterns cover — its old pattern and its new one (a Celery task: a big table takes minutes).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction

from costboard.celery import app as celery_app
from costboard.models import ModelPrice
from costboard.pricing.repricing import PriceMatch

REPRICE_TASK = "costboard.tasks.prices_reprice"


def prices_reprice_later(matches: Iterable[PriceMatch]) -> None:
    """Once the transaction commits, reprice the steps these patterns cover."""
    payload = sorted({(m.model, m.regex) for m in matches})
    if payload:
        as_dicts = [PriceMatch(model=model, regex=regex).as_dict() for model, regex in payload]

        def reprice() -> None:
            # by name: the task lives with the others in costboard.tasks
            celery_app.signature(REPRICE_TASK, args=(as_dicts,)).delay()

        transaction.on_commit(reprice)


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
