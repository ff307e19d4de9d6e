"""The page a locked-out login gets (django-axes' AXES_LOCKOUT_CALLABLE): 429, the time the
lock has left as Retry-After, and what to do about it; and when a (username, address) pair's
lock ends, which the admin's Login lockouts list shows too.

Axes counts a pair's failures in rows of AccessAttempt (one per user agent), each with the
time of its last failure; a row counts while that time is within the cool-off. The pair is
locked while its counting rows hold at least the limit's failures, so the lock ends when the
newest rows that reach the limit together stop counting: the time of the last of them plus
the cool-off. Tries while locked are not counted (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT
off), so that end does not move."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone


def lock_ends(username: str | None, ip_address: str | None, *, now: datetime) -> datetime | None:
    """When the lock of this pair ends, or None if it is not locked at `now`."""
    cool_off: timedelta = settings.AXES_COOLOFF_TIME
    limit: int = settings.AXES_FAILURE_LIMIT
    # axes ships no type hints: its rows are (attempt_time, failures_since_start) by its model
    rows: Iterable[tuple[datetime, int]] = (
        AccessAttempt.objects.filter(
            username=username, ip_address=ip_address, attempt_time__gte=now - cool_off
        )
        .order_by("-attempt_time")
        .values_list("attempt_time", "failures_since_start")
    )
    failures = 0
    for attempt_time, count in rows:
        failures += count
        if failures >= limit:
            return attempt_time + cool_off
    return None


def retry_after_seconds(ends: datetime, now: datetime) -> int:
    """Whole seconds until `ends`, at least 1: a client that waits them finds the lock gone."""
    return max(1, math.ceil((ends - now).total_seconds()))


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: Mapping[str, Any] | None = None,
) -> HttpResponse:
    now = getattr(request, "axes_attempt_time", None) or timezone.now()
    username = get_client_username(request, dict(credentials) if credentials else None)
    cool_off = get_cool_off(request) or timedelta(0)
    # locked a moment ago by this very request, or by earlier failures: the rows say until when
    ends = lock_ends(username, getattr(request, "axes_ip_address", None), now=now) or (
        now + cool_off
    )
    seconds = retry_after_seconds(ends, now)
    response = render(
        request,
        "registration/locked_out.html",
        {
            "username": username or "",
            "failure_limit": get_failure_limit(request, credentials),
            "cool_off_minutes": math.ceil(cool_off.total_seconds() / 60),
            "minutes": math.ceil(seconds / 60),
            "ends": ends,
        },
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response
