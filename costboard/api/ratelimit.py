"""The API's rate limit per key (docs/api.md, "Rate limit"): at most N requests
in any one second per API key, N from the key's project (admin) or the setting, 0 for none.
Beyond it the boundary answers 429 with Retry-After before the view runs: nothing is stored.

A sliding-window log: each admitted request's time is kept one second, and a request is
admitted while fewer than N are kept (a refused one is not kept, so a client that backs off
gets in again). With Redis (the broker's URL) the log is a sorted set per key, checked and
written by one Lua script — one round trip — so every gunicorn worker and machine shares the
limit; the script also counts refusals per project for /metrics. Without Redis, the same log
lives in each process's memory (`make run`: per worker).

If Redis cannot be reached the limit still holds, in this process: its share of it (N ÷ the
gunicorn workers, at least 1 a second; `worker_share`), so the workers of a machine together
admit about N while the one they share is away. A warning is logged when an outage begins
(once per outage, and a line when Redis answers again); Redis is not asked again for a second,
so a dead Redis costs at most one timeout per process per second. The requests-in-flight gate
(costboard/api/inflight.py) shares this module's Redis client and outage.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from costboard.models import ApiKey, Project

log = logging.getLogger(__name__)

WINDOW_SECONDS = 1
REDIS_TIMEOUT_SECONDS = 0.25  # connect and reply: a slow limiter must not stall ingest
REDIS_PAUSE_SECONDS = 1.0  # after a failure, serve without asking Redis this long
LOG_PREFIX = "costboard:ratelimit:key:"  # + the first 32 hex of the key's SHA-256
REFUSED_KEY = "costboard:ratelimit:refused"  # hash: project id → 429s answered

# KEYS[1] the key's log (member: a unique id, score: µs), KEYS[2] refusals per project
# ARGV: limit, window in µs, a unique member, the project's id; and, from tests only, the
# time in µs (without it: Redis' TIME, the one clock every process shares).
# Returns 0 when admitted, else the µs until the oldest kept request leaves the window.
# Both Lua scripts (this one and costboard/api/inflight.py's) begin by reading the time:
# ARGV[5] when a test gives it, else Redis' TIME.
LUA_NOW = """
local now
if ARGV[5] then
    now = tonumber(ARGV[5])
else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
"""

_ADMIT = (
    LUA_NOW
    + """
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
    if not ARGV[5] then  -- PEXPIRE counts on Redis' clock: only a log kept on it expires by it
        redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
    end
    return 0
end
redis.call('HINCRBY', KEYS[2], ARGV[4], 1)
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(oldest[2]) + window - now)
"""
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request over its key's limit: the limit and the whole seconds to wait (≥ 1); with
    `share`, this process's part of it, held while Redis is away."""

    limit: int
    retry_after: int
    share: int | None = None


def limit_for(project: Project) -> int:
    """Requests per second allowed per key of `project`; 0: no limit."""
    if project.api_rate_limit is not None:
        return project.api_rate_limit
    return int(settings.COSTBOARD_API_RATE_LIMIT)


def rate_limit_check(*, raw_key: str, project: Project) -> Refusal | None:
    """Admit one request of this key (recording it), or say how long to wait."""
    limit = limit_for(project)
    if limit <= 0:
        return None
    key_id = key_id_of(raw_key)
    url = settings.COSTBOARD_RATE_LIMIT_REDIS_URL
    share = None
    if url:
        wait, share = _shared_admit(url, key_id, project.pk, limit)
    else:
        wait = _LOCAL.admit(key_id, project.pk, limit)
    if not wait:
        return None
    return Refusal(limit=limit, retry_after=max(1, math.ceil(wait)), share=share)


def key_id_of(raw_key: str) -> str:
    """What a limit keeps of a key: the first 32 hex of its SHA-256, never the key."""
    return ApiKey.hash_of(raw_key)[:32]


def web_workers() -> int:
    """The gunicorn workers of this machine: gunicorn's own count when it serves us through
    costboard/gunicorn_conf.py, else COSTBOARD_WEB_WORKERS (WEB_CONCURRENCY, default 2)."""
    return _STATE.workers or int(settings.COSTBOARD_WEB_WORKERS)


def workers_set(count: int) -> None:
    """gunicorn's number of workers, told to each (costboard/gunicorn_conf.py)."""
    _STATE.workers = max(1, int(count))


def worker_share(limit: int) -> int:
    """This process's part of a limit while Redis is away: limit ÷ workers, at least 1."""
    return max(1, limit // web_workers())


def rate_limited_counts() -> dict[int, int] | None:
    """429s answered per project id since the store began (Redis: every worker's; else this
    process's). None when Redis cannot be read: the scrape leaves the counter out."""
    url = settings.COSTBOARD_RATE_LIMIT_REDIS_URL
    if not url:
        return _LOCAL.refused_counts()
    return redis_counts(url, REFUSED_KEY)


def redis_counts(url: str, key: str) -> dict[int, int] | None:
    """A hash of counts per project id in Redis; None when Redis cannot be read."""
    try:
        raw: dict[bytes, bytes] = redis_client(url).hgetall(key)
    except Exception as exc:  # redis' errors, and OSErrors under them
        redis_failed(exc)
        return None
    redis_answered()
    return {int(project_id): int(count) for project_id, count in raw.items()}


# --- Redis ------------------------------------------------------------------------------------


class _RedisState:
    """One client (a connection pool) per URL per process, its scripts, and the outage: when
    Redis failed, until when it is left alone, and whether the outage was told in the log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self._scripts: dict[tuple[str, str], Any] = {}
        self.paused_until = 0.0
        self.down = False  # an outage is under way (and was logged)
        self.workers = 0  # gunicorn's count, set by costboard/gunicorn_conf.py; 0: the setting
        # Tests turn these by hand: the clock of the pause, and the window's (None: Redis' TIME).
        self.clock: Callable[[], float] = time.monotonic
        self.window_clock: Callable[[], float] | None = None

    def client(self, url: str) -> Any:
        client = self._clients.get(url)
        if client is None:
            import redis  # only where a Redis limiter is configured
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            with self._lock:
                client = self._clients.get(url)
                if client is None:
                    client = redis.Redis.from_url(
                        url,
                        socket_timeout=REDIS_TIMEOUT_SECONDS,
                        socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
                        retry=Retry(NoBackoff(), 0),  # fail fast; the next request tries again
                    )
                    self._clients[url] = client
        return client

    def script(self, url: str, source: str) -> Any:
        script = self._scripts.get((url, source))
        if script is None:
            script = self._scripts[(url, source)] = self.client(url).register_script(source)
        return script

    def failed(self, exc: BaseException) -> None:
        self.paused_until = self.clock() + REDIS_PAUSE_SECONDS
        with self._lock:
            began, self.down = not self.down, True
        if began:
            log.warning(
                "Redis (%s) cannot be reached (%s: %s): each process holds its share of the "
                "API's limits per key (the limit ÷ %d workers, at least 1) until it answers; "
                "asked again every %g s (this warning: once per outage)",
                _redacted(settings.COSTBOARD_RATE_LIMIT_REDIS_URL),
                type(exc).__name__,
                exc,
                web_workers(),
                REDIS_PAUSE_SECONDS,
            )

    def answered(self) -> None:
        if not self.down:
            return
        with self._lock:
            ended, self.down = self.down, False
        if ended:
            log.warning(
                "Redis (%s) answers again: the API's limits are shared by every process",
                _redacted(settings.COSTBOARD_RATE_LIMIT_REDIS_URL),
            )


_STATE = _RedisState()


def redis_client(url: str) -> Any:
    return _STATE.client(url)


def redis_script(url: str, source: str) -> Any:
    """`source` registered on the client of `url` (EVALSHA, loaded again if Redis lost it)."""
    return _STATE.script(url, source)


def redis_asking() -> bool:
    """Whether to ask Redis now: not within a second of its last failure."""
    return _STATE.clock() >= _STATE.paused_until


def redis_failed(exc: BaseException) -> None:
    """Redis failed a request: leave it alone a second; warn if an outage begins."""
    _STATE.failed(exc)


def redis_answered() -> None:
    """Redis answered: an outage, if there was one, is over."""
    _STATE.answered()


def redis_now_us() -> int | None:
    """The tests' own time for Redis scripts, in µs; None: the script reads Redis' TIME."""
    clock = _STATE.window_clock
    return None if clock is None else round(clock() * 1_000_000)


def _redacted(url: str) -> str:
    """The URL without its credentials, for the log."""
    return re.sub(r"://[^@/]*@", "://***@", url)


def _shared_admit(
    url: str, key_id: str, project_id: int, limit: int
) -> tuple[float | None, int | None]:
    """Through Redis; while it is away, this process's share of the limit in its own log:
    the seconds to wait (None: admitted), and the share if it was the one applied."""
    if redis_asking():
        try:
            return _redis_admit(url, key_id, project_id, limit), None
        except Exception as exc:  # ConnectionError, TimeoutError, a Redis that refuses scripts…
            redis_failed(exc)
    share = worker_share(limit)
    return _FALLBACK.admit(key_id, project_id, share), share


def _redis_admit(url: str, key_id: str, project_id: int, limit: int) -> float | None:
    """Seconds to wait, or None: admitted. Raises what the Redis client raises."""
    args: list[int | str] = [limit, WINDOW_SECONDS * 1_000_000, os.urandom(8).hex(), project_id]
    now = redis_now_us()
    if now is not None:
        args.append(now)
    wait_us = redis_script(url, _ADMIT)(keys=[LOG_PREFIX + key_id, REFUSED_KEY], args=args)
    redis_answered()
    return int(wait_us) / 1_000_000 or None


# --- in process -------------------------------------------------------------------------------


class _LocalLimiter:
    """The same sliding-window log in this process's memory, for a deployment without Redis."""

    MAX_KEYS = 10_000  # past this many logs, the idle ones are dropped

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # a test's own turns time by hand
        self._lock = threading.Lock()
        self._logs: dict[str, deque[float]] = {}
        self._refused: Counter[int] = Counter()

    def admit(self, key_id: str, project_id: int, limit: int) -> float | None:
        now = self._clock()
        with self._lock:
            log_ = self._logs.get(key_id)
            if log_ is None:
                if len(self._logs) >= self.MAX_KEYS:
                    self._forget_idle(now)
                log_ = self._logs[key_id] = deque()
            while log_ and log_[0] <= now - WINDOW_SECONDS:
                log_.popleft()
            if len(log_) < limit:
                log_.append(now)
                return None
            self._refused[project_id] += 1
            return max(log_[0] + WINDOW_SECONDS - now, 1e-6)

    def _forget_idle(self, now: float) -> None:
        for key_id in [k for k, v in self._logs.items() if not v or v[-1] <= now - WINDOW_SECONDS]:
            del self._logs[key_id]

    def refused_counts(self) -> dict[int, int]:
        with self._lock:
            return dict(self._refused)


_LOCAL = _LocalLimiter()  # no Redis configured: the whole limit, in each process
_FALLBACK = _LocalLimiter()  # Redis configured but away: this process's share
