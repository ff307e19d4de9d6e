"""The page a locked-out login gets (django-axes' AXES_LOCKOUT_CALLABLE): 429, how long the
lockout lasts as Retry-After, and what to do about it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: Mapping[str, Any] | None = None,
) -> HttpResponse:
    cool_off = settings.AXES_COOLOFF_TIME
    seconds = math.ceil(cool_off.total_seconds())
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    response = render(
        request,
        "registration/locked_out.html",
        {
            "username": username,
            "failure_limit": settings.AXES_FAILURE_LIMIT,
            "minutes": math.ceil(seconds / 60),
        },
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response
