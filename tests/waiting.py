"""Waiting for something another thread or process does: a liveness bound, never a speed one."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], *, timeout: float = 30.0, what: str) -> None:
    """Return once `predicate()` is true; fail naming `what` if it never was within `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout:.0f} s")
        time.sleep(0.01)
