"""Typed readers for environment variables.

Each raises ImproperlyConfigured naming the variable and the fix, so a bad value stops
start-up instead of surfacing later as a wrong cap or a crash in a request.
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no.")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not an integer; use e.g. {default}."
        ) from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}.")
    return value


def env_decimal(name: str, default: str, *, minimum: Decimal = Decimal(0)) -> Decimal:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return Decimal(default)
    try:
        value = Decimal(raw.strip())
    except InvalidOperation:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a decimal number; use e.g. {default}."
        ) from None
    if not value.is_finite() or value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be a finite number >= {minimum}.")
    return value


def env_fraction(name: str, default: str) -> Decimal:
    """A fraction in (0, 1], e.g. 0.8 for 80%."""
    value = env_decimal(name, default)
    if not (Decimal(0) < value <= Decimal(1)):
        raise ImproperlyConfigured(
            f"{name}={os.environ.get(name)!r} must be a fraction above 0 and at most 1 "
            f"(0.8 means warn at 80%)."
        )
    return value


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]
