"""Requests in flight per API key (docs/api.md, "Requests in flight"): at most N of a key's
requests are being answered at once, N from the key's project (admin) or the setting
COSTBOARD_API_MAX_IN_FLIGHT (default 2), 0 for none. One more is answered 429 with
Retry-After before the view runs: nothing is read or stored.

Why: the rate limit counts requests, not their work. Eight 10,000-span OTLP exports from one
key held all eight threads of a 2 × 4 gunicorn for minutes, and another project's one-event
post got no answer (issue 31); they were eight requests, far under 50 a second.

With Redis (the broker's URL, as the rate limit): a lease per request, in a sorted set per
key — member a random token, score the lease's expiry on Redis' clock. One Lua script drops
the expired leases and takes one if fewer than N are left (and counts a refusal per project
for /metrics); the release, in a `finally`, removes its member in one call. A worker killed
mid-request (gunicorn's timeout, the OOM killer) never releases: its lease expires after
LEASE_SECONDS and the slot comes back, so no slot leaks for ever. Without Redis: a counter
per key in this process (`make run`: per worker). While Redis is away: a counter in this
process at its share, N ÷ the workers, at least 1 (costboard/api/ratelimit.py's outage, one
warning for both limits).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings

from costboard.api.ratelimit import (
    LUA_NOW,
    key_id_of,
    redis_answered,
    redis_asking,
    redis_client,
    redis_counts,
    redis_failed,
    redis_now_us,
    redis_script,
    worker_share,
)
from costboard.models import Project

# A lease outlasts any request worth serving (gunicorn's own timeout is 30 s by default; an
# export of 10,000 spans took 34 s at worst alone); a killed worker's slot is back after it.
LEASE_SECONDS = 120
RETRY_AFTER_SECONDS = 1  # when a request in flight ends is unknown: ask again soon
LEASE_PREFIX = "costboard:inflight:key:"  # + the first 32 hex of the key's SHA-256
REFUSED_KEY = "costboard:inflight:refused"  # hash: project id → 429s answered

# KEYS[1] the key's leases (member: a unique token, score: the lease's expiry in µs),
# KEYS[2] refusals per project. ARGV: limit, lease in µs, the token, the project's id; and,
# from tests only, the time in µs (without it: Redis' TIME, the clock every process shares).
# Returns 1 when the lease is taken, 0 when the key already has `limit`.
_ACQUIRE = (
    LUA_NOW
    + """
local lease = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
    if not ARGV[5] then  -- no lease outlives the set: it goes when its last lease would
        redis.call('PEXPIRE', KEYS[1], math.ceil(lease / 1000))
    end
    return 1
end
redis.call('HINCRBY', KEYS[2], ARGV[4], 1)
return 0
"""
)


@dataclass(frozen=True, slots=True)
class Busy:
    """A request over its key's requests in flight: the limit, and the seconds to wait; with
    `share`, this process's part of the limit, held while Redis is away."""

    limit: int
    retry_after: int = RETRY_AFTER_SECONDS
    share: int | None = None


def max_in_flight_for(project: Project) -> int:
    """Requests per key of `project` answered at once; 0: no limit."""
    if project.api_max_in_flight is not None:
        return project.api_max_in_flight
    return int(settings.COSTBOARD_API_MAX_IN_FLIGHT)


@contextmanager
def in_flight(*, raw_key: str, project: Project) -> Iterator[Busy | None]:
    """Hold one of the key's slots while the block runs (None), or yield why not (Busy). The
    slot is given back however the block ends, an exception included."""
    limit = max_in_flight_for(project)
    if limit <= 0:
        yield None
        return
    lease, share = _acquire(key_id_of(raw_key), project.pk, limit)
    if lease is None:
        yield Busy(limit=limit, share=share)
        return
    try:
        yield None
    finally:
        lease.release()


def in_flight_refused_counts() -> dict[int, int] | None:
    """429s for requests in flight per project id (Redis: every worker's; else this
    process's). None when Redis cannot be read: the scrape leaves the counter out."""
    url = settings.COSTBOARD_RATE_LIMIT_REDIS_URL
    if not url:
        return _LOCAL.refused_counts()
    return redis_counts(url, REFUSED_KEY)


# --- leases ---------------------------------------------------------------------------------


class _Lease(Protocol):
    def release(self) -> None: ...


def _acquire(key_id: str, project_id: int, limit: int) -> tuple[_Lease | None, int | None]:
    """A lease (None: the key has `limit`), and this process's share if it was the one
    applied (Redis away)."""
    url = settings.COSTBOARD_RATE_LIMIT_REDIS_URL
    if not url:
        return _LOCAL.acquire(key_id, project_id, limit), None
    if redis_asking():
        try:
            return _redis_acquire(url, key_id, project_id, limit), None
        except Exception as exc:  # ConnectionError, TimeoutError, a Redis that refuses scripts…
            redis_failed(exc)
    share = worker_share(limit)
    return _FALLBACK.acquire(key_id, project_id, share), share


@dataclass(frozen=True, slots=True)
class _RedisLease:
    url: str
    key: str
    token: str

    def release(self) -> None:
        try:
            redis_client(self.url).zrem(self.key, self.token)
        except Exception as exc:  # the lease expires on its own: nothing else to do
            redis_failed(exc)


def _redis_acquire(url: str, key_id: str, project_id: int, limit: int) -> _Lease | None:
    """A lease in Redis, or None: the key has `limit` already. Raises what the client raises."""
    key, token = LEASE_PREFIX + key_id, os.urandom(8).hex()
    args: list[int | str] = [limit, LEASE_SECONDS * 1_000_000, token, project_id]
    now = redis_now_us()
    if now is not None:
        args.append(now)
    taken = redis_script(url, _ACQUIRE)(keys=[key, REFUSED_KEY], args=args)
    redis_answered()
    return _RedisLease(url=url, key=key, token=token) if int(taken) else None


@dataclass(frozen=True, slots=True)
class _LocalLease:
    gate: _LocalGate
    key_id: str

    def release(self) -> None:
        self.gate.release(self.key_id)


class _LocalGate:
    """Requests in flight per key in this process's memory. A process that dies takes its
    counts with it, so nothing here needs an expiry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}  # only keys with a request in flight
        self._refused: Counter[int] = Counter()

    def acquire(self, key_id: str, project_id: int, limit: int) -> _Lease | None:
        with self._lock:
            count = self._counts.get(key_id, 0)
            if count >= limit:
                self._refused[project_id] += 1
                return None
            self._counts[key_id] = count + 1
        return _LocalLease(gate=self, key_id=key_id)

    def release(self, key_id: str) -> None:
        with self._lock:
            count = self._counts.get(key_id, 0) - 1
            if count > 0:
                self._counts[key_id] = count
            else:
                self._counts.pop(key_id, None)

    def in_flight(self, key_id: str) -> int:
        with self._lock:
            return self._counts.get(key_id, 0)

    def refused_counts(self) -> dict[int, int]:
        with self._lock:
            return dict(self._refused)


_LOCAL = _LocalGate()  # no Redis configured: the whole limit, in each process
_FALLBACK = _LocalGate()  # Redis configured but away: this process's share
