"""Login lockouts lifted: the one module that writes django-axes' AccessAttempt rows. The
admin's action (costboard/admin/lockout.py) logs the rows it lifts, then calls this; a lifted
(username, address) pair's failures are forgotten, so it may log in at once."""

from __future__ import annotations

from collections.abc import Iterable

from axes.models import AccessAttempt
from django.db.models import Q, QuerySet

Pair = tuple[str | None, str | None]  # (username, client address), as axes stores them


def pairs_filter(pairs: Iterable[Pair]) -> Q:
    """The AccessAttempt rows of these (username, address) pairs; none for no pairs."""
    condition = Q(pk__in=[])
    for username, address in pairs:
        condition |= Q(username=username, ip_address=address)
    return condition


def lockout_rows(pairs: Iterable[Pair]) -> QuerySet[AccessAttempt]:
    # axes ships no type hints: its manager is Any to mypy, the queryset named here
    rows: QuerySet[AccessAttempt] = AccessAttempt.objects.filter(pairs_filter(pairs))
    return rows


def lockouts_lift(rows: QuerySet[AccessAttempt]) -> None:
    """Forget these failed logins: their pairs are no longer locked out."""
    rows.delete()
