"""Waiting for what another thread or process does: a liveness timeout, never a measure of
speed. A test asserts what happened (counts, order, states), and waits here for it to happen;
the timeout only turns "never" into a failure that names what did not happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Generous: the suite runs several workers on a two-core machine, and a timeout that trips on
# a slow moment is a flake, not a finding.
TIMEOUT_SECONDS = 30.0


def wait_until(
    predicate: Callable[[], T],
    *,
    what: str,
    timeout: float = TIMEOUT_SECONDS,
    every: float = 0.05,
) -> T:
    """Call `predicate` until it returns something truthy, and return that. AssertionError
    naming `what` (and the last value seen) if it has not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {result!r})")
        time.sleep(every)


def blocked_on_a_lock(query_like: str) -> int:
    """How many sessions of this test's PostgreSQL database wait on a lock in a statement
    whose text is LIKE `query_like`: what a test waits for to know another thread is queued
    behind a lock it holds, whatever the machine's speed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one snapshot per transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s",
            [query_like],
        )
        (count,) = cursor.fetchone()
    return int(count)
