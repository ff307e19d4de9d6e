"""The Costboard Python client (docs/integrations.md, "The Python client"): standard library
only, no Django needed.

    from costboard_client import Costboard, BudgetExceeded

    cb = Costboard("https://costboard.example.com", api_key)
    with cb.step("session-42", "search", "claude-sonnet-4-5", turn=3) as s:
        s.record(anthropic_client.messages.create(...))

Events are buffered and sent by a daemon thread (every `flush_interval` seconds, or as soon as
`flush_at` events wait), by `flush()`, and at interpreter exit. Nothing is stored twice: every
event carries an `event_id`, and every batch an `Idempotency-Key` that its retries reuse (the
server answers a retry of a batch it already stored with that batch's answer). Timeouts,
connection errors, 408, 429, 5xx and a reply that is not a JSON object are retried
`max_retries` times with exponential back-off and jitter, or after the server's Retry-After
(seconds or an HTTP date, at most `max_retry_after`); other 4xx never are. A batch whose
retries ran out while Costboard could not be reached (anything but a 500) is kept in the
buffer for the next round, so a restart of Costboard loses nothing. The agent never
waits on the network inside `step()`: a down or slow server costs it nothing; what could not
be sent is counted in `cb.stats` and logged on the `costboard.client` logger.

The budget check costs no request: every ingest response carries the budgets of the sessions
it touched, and a step of a session last known to be exhausted raises `BudgetExceeded` before
its body runs. `cb.budget(session_id)` asks the server and refreshes that knowledge (after a
cap raise, for instance).
"""

from __future__ import annotations

import atexit
import contextlib
import decimal
import email.utils
import enum
import http.client
import json
import logging
import math
import numbers
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["BudgetExceeded", "ClientStats", "Costboard", "Step"]

# the name it logged under inside the server package: existing logging configs keep working
log = logging.getLogger("costboard.client")

MAX_BATCH = 500  # events per POST; the server takes up to 1000 and 5 MB
MAX_ERROR_CHARS = 20_000  # the server's limit on a step's error text
USER_AGENT = "costboard-python-client/1"
# The sessions whose budgets are kept, the last heard of: a process that reports sessions for
# weeks (a LiteLLM proxy) would otherwise hold every one it ever saw. A session forgotten is
# one not heard of: its next call goes ahead, and that call's answer is kept again.
KNOWN_SESSIONS = 10_000

# The client's clocks and its sleep, looked up at each use so that a test can turn time by hand
_monotonic = time.monotonic
_perf_counter = time.perf_counter
_sleep = time.sleep


class BudgetExceeded(Exception):
    """A step was refused: its session's last known budget state is `exhausted`, by its own
    caps, a runaway rule, or a stop-budget above it (`stopped_by` "budget:<id>"; `period`
    is that budget as the server last reported it, when it did)."""

    def __init__(
        self,
        session_id: str,
        budget: Mapping[str, Any],
        period: Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.budget = dict(budget)
        self.stopped_by = budget.get("stopped_by")
        self.period = dict(period) if period else None
        if isinstance(self.stopped_by, str) and self.stopped_by.startswith("budget:"):
            above = self.period or {}
            name = f" {above['name']!r}" if above.get("name") else ""
            spent = (
                f" (tokens {above.get('tokens_used')}/{above.get('token_limit')}, cost "
                f"{above.get('cost_usd')}/{above.get('cost_limit_usd')} USD this "
                f"{above.get('period')})"
                if above
                else ""
            )
            message = (
                f"session {session_id!r} is stopped by budget{name} "
                f"({self.stopped_by}){spent}; raise its limit or wait for its next period"
            )
        else:
            message = (
                f"session {session_id!r} has exhausted its budget "
                f"(tokens {budget.get('tokens_used')}/{budget.get('token_cap')}, "
                f"cost {budget.get('cost_usd')}/{budget.get('cost_cap_usd')} USD); raise its "
                "cap and call cb.budget(session_id) to refresh, or start a new session"
            )
        super().__init__(message)


@dataclass(frozen=True)
class ClientStats:
    """Counts of events since the client started (a snapshot)."""

    sent: int = 0  # accepted by the server (duplicates included: they are stored once)
    duplicates: int = 0  # replays the server already had (a retry after a lost response)
    dropped: int = 0  # thrown away unsent because the buffer was full (oldest first)
    failed: int = 0  # given up on: refused by the server (4xx), or retries exhausted on a 500
    # (what could not reach Costboard is kept in the buffer, to be sent once it answers)
    retries: int = 0  # requests repeated after a timeout, connection error, 408, 429 or 5xx
    buffered: int = 0  # waiting to be sent, in flight and kept through an outage included
    last_error: str | None = None


class _Outcome(enum.Enum):
    SENT = "sent"
    FAILED = "failed"
    REQUEUE = "requeue"  # out of time (flush deadline, or closing): keep it for later


class _Transient(Exception):
    """A failure worth retrying; `retry_after` is the server's hint in seconds, if any.
    `unreachable`: Costboard was not reached or is restarting (no answer, a proxy's 502/504
    or page, 503, 408, 429), so the batch is kept once its retries run out; a 500 is an
    answer to this batch, which is given up on then."""

    def __init__(
        self, message: str, retry_after: float | None = None, *, unreachable: bool = True
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unreachable = unreachable


class _Refused(Exception):
    """The server refused the batch (a 4xx other than 408/429): retrying cannot help."""

    def __init__(self, status: int, message: str, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _number(value: Any) -> Any:
    """A number of another type (Decimal, numpy's) as JSON has it: a whole one as an int (a
    token count sent as "120" is refused), a Decimal with a fraction as its exact text (USD
    amounts are decimal strings), anything else unchanged."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else str(value)
    if isinstance(value, numbers.Real) and not isinstance(value, float):
        return float(value)
    return value


def _json_default(value: Any) -> Any:
    """What json.dumps cannot write itself: numbers as `_number`, anything else as text."""
    number = _number(value)
    return number if number is not value else str(value)


def _plain(value: Any) -> Any:
    """An SDK object (pydantic model, dict-like or plain object) → JSON-ready dicts and lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, numbers.Number):
        return _number(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return _plain(dump(mode="json", exclude_none=True))
        except TypeError:  # a model_dump without pydantic v2's keywords
            return _plain(dump())
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _plain(to_dict())
    if hasattr(value, "__dict__"):
        return _plain({k: v for k, v in vars(value).items() if not k.startswith("_")})
    return str(value)


def _add_usage(total: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """Two raw usage objects of one call site summed leaf by leaf (normalizing is linear)."""
    merged = dict(total)
    for key, value in more.items():
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            merged[key] = _add_usage(dict(old), value)
        elif (
            isinstance(value, int)
            and isinstance(old, int)
            and not isinstance(value, bool)
            and not isinstance(old, bool)
        ):
            merged[key] = old + value
        else:
            merged[key] = value
    return merged


def _tier_of(response: Any) -> str | None:
    """The service tier a response names: OpenAI's top-level `service_tier` ("default",
    "flex", "priority"; the server reads Anthropic's `usage.service_tier` itself)."""
    if isinstance(response, Mapping):
        tier = response.get("service_tier")
    else:
        tier = getattr(response, "service_tier", None)
    return tier if isinstance(tier, str) and tier.strip() else None


def _provider_of(response: Any) -> str | None:
    module = type(response).__module__ or ""
    for name in ("anthropic", "openai"):
        if module == name or module.startswith(name + "."):
            return name
    if isinstance(response, Mapping):
        kind = response.get("type")
        obj = response.get("object")
    else:
        kind = getattr(response, "type", None)
        obj = getattr(response, "object", None)
    if kind == "message":
        return "anthropic"
    if isinstance(obj, str) and (obj.startswith("chat.completion") or obj == "response"):
        return "openai"
    return None


class Step:
    """One LLM (or tool) call being timed; `record()` attaches its usage."""

    def __init__(
        self,
        client: Costboard,
        *,
        session_id: str | None,
        step_type: str,
        model: str | None,
        turn: int | None,
        provider: str | None,
        metadata: Mapping[str, Any] | None,
        tags: Mapping[str, str] | None = None,
        service_tier: str | None = None,
    ) -> None:
        self._client = client
        self.session_id = session_id
        self.step_type = step_type
        self.model = model
        self.turn = turn
        self.provider = provider
        self.service_tier = service_tier
        self.metadata = dict(metadata) if metadata else None
        self.tags = dict(tags) if tags else None
        self.event_id = uuid.uuid4().hex
        self.usage: dict[str, Any] | None = None
        self.duration_ms: int | None = None
        self.success = True
        self.error: str | None = None
        self._started: float | None = None
        self._timestamp: str | None = None
        self._sent = False

    def record(self, response: Any) -> Any:
        """Attach the usage of `response` and return it unchanged.

        Takes an Anthropic `Message`, an OpenAI `ChatCompletion` or Responses `Response` (or
        their dicts), a bare usage object, or a usage dict in any shape the server normalizes
        (docs/api.md, "Raw provider usage"). Called twice, the usages are summed. Never raises.
        """
        try:
            self._record(response)
        except Exception:  # a surprising object must not break the agent
            log.warning("costboard: could not read usage from %r", type(response), exc_info=True)
        return response

    def _record(self, response: Any) -> None:
        if response is None:
            return
        usage: Any
        model: Any
        if isinstance(response, Mapping):
            if isinstance(response.get("usage"), Mapping) or "usage" in response:
                usage, model = response.get("usage"), response.get("model")
            else:
                usage, model = response, None
        elif hasattr(response, "usage"):
            usage, model = response.usage, getattr(response, "model", None)
        else:  # a usage object itself
            usage, model = response, None
        if not self.model and isinstance(model, str) and model:
            self.model = model
        if not self.provider:
            self.provider = _provider_of(response)
        if not self.service_tier:
            self.service_tier = _tier_of(response)
        if usage is None:
            log.debug("costboard: %s step has a response without usage", self.step_type)
            return
        plain = _plain(usage)
        if not isinstance(plain, dict):
            log.warning("costboard: usage of type %s is not an object", type(usage).__name__)
            return
        self.usage = plain if self.usage is None else _add_usage(self.usage, plain)

    def _begin(self) -> None:
        self._client._refuse_if_exhausted(self.session_id)
        self._timestamp = _now_iso()
        self._started = _perf_counter()

    def _end(self, exc: BaseException | None) -> None:
        if self._sent:
            return
        self._sent = True
        if self._started is not None:
            self.duration_ms = round((_perf_counter() - self._started) * 1000)
        if exc is not None:
            self.success = False
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.error = text[:MAX_ERROR_CHARS]
        self._client._enqueue(self.to_event())

    def to_event(self) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "step",
            "event_id": self.event_id,
            "step_type": self.step_type,
            "model": self.model or "unknown",
            "success": self.success,
        }
        optional = {
            "timestamp": self._timestamp,
            "session_id": self.session_id,
            "turn": self.turn,
            "provider": self.provider,
            "service_tier": self.service_tier,
            "duration_ms": self.duration_ms,
            "error": self.error,
            "usage": self.usage,
            "metadata": self.metadata,
            "tags": self.tags,
        }
        event.update({k: v for k, v in optional.items() if v is not None})
        return event

    def __enter__(self) -> Step:
        self._begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(exc)  # the exception, if any, propagates

    async def __aenter__(self) -> Step:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(exc)


_live_clients: weakref.WeakSet[Costboard] = weakref.WeakSet()


@atexit.register
def _flush_live_clients_at_exit() -> None:
    for client in list(_live_clients):
        with contextlib.suppress(Exception):
            client.close(timeout=client.exit_timeout)


class Costboard:
    """A thread-safe Costboard client. One per process is enough; share it between threads."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 2.0,
        max_buffer: int = 10_000,
        batch_size: int = MAX_BATCH,
        flush_interval: float = 5.0,
        flush_at: int = 100,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        max_retry_after: float = 30.0,
        exit_timeout: float = 5.0,
    ) -> None:
        if not base_url:
            raise ValueError("base_url is required, e.g. Costboard('http://127.0.0.1:8000', key)")
        if urllib.parse.urlsplit(base_url).scheme.lower() not in ("http", "https"):
            # urlopen would follow any scheme it knows (file:, ftp:): only HTTP reaches a server
            raise ValueError(
                f"base_url must start with http:// or https:// (got {base_url!r}), "
                "e.g. Costboard('http://127.0.0.1:8000', key)"
            )
        if max_buffer < 1 or not 1 <= batch_size <= 1000:
            raise ValueError("max_buffer must be >= 1 and batch_size between 1 and 1000")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_buffer = max_buffer
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.flush_at = max(1, flush_at)
        self.max_retries = max(0, max_retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.exit_timeout = exit_timeout
        self._budgets: Recent[str, dict[str, Any]] = Recent(KNOWN_SESSIONS)
        self._periods: dict[str, dict[str, Any]] = {}  # "budget:<id>" → <period budget>
        self._init_runtime()
        self._counts = {"sent": 0, "duplicates": 0, "dropped": 0, "failed": 0, "retries": 0}
        self._last_error: str | None = None
        _live_clients.add(self)
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)

            def reset_in_child() -> None:
                client = ref()
                if client is not None:
                    client._init_runtime()

            os.register_at_fork(after_in_child=reset_in_child)

    def _init_runtime(self) -> None:
        """Locks, buffer and thread; run again in a forked child (threads do not survive a fork)."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._buffer: deque[dict[str, Any]] = deque()
        self._in_flight = 0
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    # --- the agent's side -------------------------------------------------------------------

    def step(
        self,
        session_id: str | None,
        step_type: str,
        model: str | None = None,
        turn: int | None = None,
        *,
        provider: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        service_tier: str | None = None,
    ) -> Step:
        """A context manager timing one call; raises BudgetExceeded on entry if the session
        is known to be exhausted. Without `model`, the response's `.model` is used; without
        `service_tier`, the response's (OpenAI's `service_tier`; the server reads Anthropic's
        from its usage), else standard. `tags` (strings) are merged over the session's."""
        return Step(
            self,
            session_id=session_id,
            step_type=step_type,
            model=model,
            turn=turn,
            provider=provider,
            metadata=metadata,
            tags=tags,
            service_tier=service_tier,
        )

    def session(
        self,
        session_id: str,
        *,
        token_cap: int | None = None,
        cost_cap_usd: str | decimal.Decimal | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        ended: bool | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Announce a session or change it (caps, end, tags merged key by key);
        `cost_cap_usd` is a decimal string or a Decimal."""
        fields = {
            "token_cap": token_cap,
            "cost_cap_usd": None if cost_cap_usd is None else str(cost_cap_usd),
            "user_id": user_id,
            "parent_session_id": parent_session_id,
            "ended": ended,
            "metadata": dict(metadata) if metadata else None,
            "tags": dict(tags) if tags else None,
        }
        self._enqueue({"type": "session", "session_id": session_id, **_present(fields)})

    def turn(
        self,
        session_id: str,
        turn: int,
        *,
        user_message: str | None = None,
        assistant_response: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a turn's text (turn numbers start at 1)."""
        fields = {
            "user_message": user_message,
            "assistant_response": assistant_response,
            "context": dict(context) if context else None,
        }
        self._enqueue({"type": "turn", "session_id": session_id, "turn": turn, **_present(fields)})

    def event(self, event: Mapping[str, Any]) -> None:
        """Queue one raw event (`type` "session", "turn" or "step": docs/api.md, "Events") as it is;
        it gets an `event_id` and a `timestamp` if it has none. For integrations that time
        calls themselves (costboard_client.integrations)."""
        self._enqueue(dict(event))

    def check(self, session_id: str | None) -> None:
        """Raise BudgetExceeded if the session (None: `system`) is known to be exhausted, by
        its own caps, a runaway rule or a stop-budget above it; no request is made."""
        self._refuse_if_exhausted(session_id)

    def budget(self, session_id: str) -> dict[str, Any] | None:
        """The session's `<budget>` from the server (one GET, bounded by `timeout`), which
        also refreshes the cached state; None for an unknown session. When the server cannot
        be reached, the last known budget (or None) and a warning in the log."""
        url = f"{self.base_url}/api/v1/sessions/{urllib.parse.quote(session_id, safe='')}/budget"
        request = urllib.request.Request(url, headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                with self._lock:
                    self._budgets.pop(session_id, None)
                return None
            self._note_error(f"GET budget of {session_id!r}: HTTP {exc.code} {_reason(exc)}")
        except (OSError, ValueError) as exc:
            self._note_error(f"GET budget of {session_id!r}: {exc}")
        else:
            if isinstance(body, dict):
                with self._lock:
                    self._budgets[session_id] = body
                    self._forget_lifted(body)
                return body
        with self._lock:
            cached = self._budgets.get(session_id)
        return dict(cached) if cached is not None else None

    def known_budget(self, session_id: str) -> dict[str, Any] | None:
        """The budget last heard from the server for the session, without a request."""
        with self._lock:
            cached = self._budgets.get(session_id)
        return dict(cached) if cached is not None else None

    @property
    def stats(self) -> ClientStats:
        with self._lock:
            return ClientStats(
                **self._counts,
                buffered=len(self._buffer) + self._in_flight,
                last_error=self._last_error,
            )

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Send everything buffered, waiting at most `timeout` seconds (None: until done).
        True when all of it reached the server; False if some was given up on or is left."""
        deadline = None if timeout is None else _monotonic() + timeout
        failed_before = self.stats.failed
        while True:
            outcome = self._send_one_batch(deadline=deadline, in_worker=False)
            if outcome is None:
                break
            if outcome is _Outcome.REQUEUE:
                return False
        with self._cond:
            while self._in_flight or self._buffer:
                remaining = None if deadline is None else deadline - _monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self._buffer and not self._in_flight:
                    break  # the worker put a batch back: send it ourselves
                self._cond.wait(timeout=remaining)
            done = not self._buffer and not self._in_flight
        if not done:
            return self.flush(None if deadline is None else max(0.0, deadline - _monotonic()))
        return self.stats.failed == failed_before

    def close(self, timeout: float | None = 10.0) -> bool:
        """Flush (at most `timeout` seconds), stop the background thread and report what was
        not sent. Events recorded afterwards are sent synchronously by `flush()` only."""
        sent_all = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._stop.set()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        stats = self.stats
        if stats.buffered or stats.failed or stats.dropped:
            log.warning(
                "costboard: %d events not sent (%d failed, %d dropped from a full buffer, "
                "%d still buffered); last error: %s",
                stats.failed + stats.dropped + stats.buffered,
                stats.failed,
                stats.dropped,
                stats.buffered,
                stats.last_error,
            )
        return sent_all

    def __enter__(self) -> Costboard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the buffer and the background thread -----------------------------------------------

    def _refuse_if_exhausted(self, session_id: str | None) -> None:
        """BudgetExceeded if the session was last heard exhausted (by its own caps, a runaway
        rule, or a stop-budget whose period has not ended since), or if a stop-budget over
        every session of this key (scope project or api_key) was last heard exhausted in its
        current period: the agent's other sessions are refused too, not only the one whose
        answer said so."""
        key = session_id or "system"
        now = datetime.now(timezone.utc)
        with self._lock:
            budget = self._budgets.get(key)
            stopped_by = budget.get("stopped_by") if budget is not None else None
            period = self._period_named(stopped_by) if isinstance(stopped_by, str) else None
            over_all = [
                (name, above)
                for name, above in self._periods.items()
                if above.get("action") == "stop"
                and above.get("state") == "exhausted"
                and above.get("scope") in ("project", "api_key")
                and not _period_over(above, now)
            ]
        # stopped by a budget whose period has ended since: the call goes ahead, and its
        # answer says whether the new period stops it too
        if (
            budget is not None
            and budget.get("state") == "exhausted"
            and not (period is not None and _period_over(period, now))
        ):
            raise BudgetExceeded(key, budget, period)
        if over_all:
            name, above = over_all[0]
            known = dict(budget) if budget is not None else {"session_id": key}
            # named as the server names it ("budget:<id>", without a per-member key's member)
            which = f"budget:{above['id']}" if isinstance(above.get("id"), int) else name
            stopped = {**known, "state": "exhausted", "stopped_by": which}
            raise BudgetExceeded(key, stopped, above)

    def _period_named(self, stopped_by: str) -> dict[str, Any] | None:  # with the lock held
        """The `<period budget>` last heard of a session's `stopped_by` ("budget:<id>"). A
        per-member budget's entries are heard as "budget:<id>" or, when a batch touched
        several members, "budget:<id>:<member>": an exhausted one of its members is taken
        (they share the period, which is what says when the stop ends)."""
        exact = self._periods.get(stopped_by)
        if exact is not None and exact.get("state") == "exhausted":
            return exact
        members = [
            above
            for name, above in self._periods.items()
            if name.startswith(f"{stopped_by}:") and above.get("state") == "exhausted"
        ]
        return members[0] if members else exact

    def _enqueue(self, event: dict[str, Any]) -> None:
        event.setdefault("event_id", uuid.uuid4().hex)
        event.setdefault("timestamp", _now_iso())
        with self._cond:
            if len(self._buffer) >= self.max_buffer:
                self._buffer.popleft()
                self._counts["dropped"] += 1
                if self._counts["dropped"] == 1 or self._counts["dropped"] % 1000 == 0:
                    log.warning(
                        "costboard: buffer full (%d events), dropping the oldest; %d dropped",
                        self.max_buffer,
                        self._counts["dropped"],
                    )
            self._buffer.append(event)
            if not self._closed:
                self._ensure_thread()
                if len(self._buffer) >= self.flush_at:
                    self._cond.notify_all()

    def _ensure_thread(self) -> None:  # with the lock held
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="costboard-client", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._cond:
                    if len(self._buffer) < self.flush_at and not self._stop.is_set():
                        self._cond.wait(timeout=self.flush_interval)
                while not self._stop.is_set():
                    outcome = self._send_one_batch(deadline=None, in_worker=True)
                    if outcome is _Outcome.REQUEUE:  # unreachable: a full interval before
                        self._stop.wait(self.flush_interval)  # the next round
                    if outcome is not _Outcome.SENT:
                        break  # empty, or the server is unwell: wait for the next interval
            except Exception:  # the background thread must never die of a surprise
                log.exception("costboard: unexpected error in the background sender")
                self._stop.wait(self.flush_interval)

    def _send_one_batch(self, *, deadline: float | None, in_worker: bool) -> _Outcome | None:
        """Take up to `batch_size` events and deliver them; None when the buffer is empty."""
        with self._cond:
            if not self._buffer:
                return None
            batch = [self._buffer.popleft() for _ in range(min(self.batch_size, len(self._buffer)))]
            self._in_flight += len(batch)
        outcome = _Outcome.FAILED
        try:
            outcome = self._deliver(batch, deadline=deadline, in_worker=in_worker)
        finally:
            with self._cond:
                self._in_flight -= len(batch)
                if outcome is _Outcome.REQUEUE:
                    room = self.max_buffer - len(self._buffer)
                    if room < len(batch):
                        self._counts["dropped"] += len(batch) - room
                        batch = batch[len(batch) - room :] if room > 0 else []
                    self._buffer.extendleft(reversed(batch))
                self._cond.notify_all()
        return outcome

    def _deliver(
        self, batch: list[dict[str, Any]], *, deadline: float | None, in_worker: bool
    ) -> _Outcome:
        attempt = 0
        key = _idempotency_key()  # the batch's: the same on each of its retries
        while True:
            timeout = self.timeout
            if deadline is not None:
                timeout = min(timeout, deadline - _monotonic())
                if timeout <= 0:
                    return _Outcome.REQUEUE
            try:
                body = self._post(batch, timeout, key)
            except _Refused as exc:
                if exc.status == 413 and len(batch) > 1:  # too large: send it in halves
                    half = len(batch) // 2
                    outcomes = [
                        self._deliver(part, deadline=deadline, in_worker=in_worker)
                        for part in (batch[:half], batch[half:])
                    ]
                    if _Outcome.REQUEUE in outcomes:  # only the unsent half would be safe
                        log.warning("costboard: a split batch ran out of time; resent whole")
                        return _Outcome.REQUEUE
                    return max(outcomes, key=lambda o: o is _Outcome.FAILED)
                batch = self._drop_refused(batch, exc)
                if not batch:
                    return _Outcome.FAILED
                key = _idempotency_key()  # another body: a key of its own
                continue  # the rest of the batch was valid: send it without the bad events
            except _Transient as exc:
                self._note_error(f"POST /api/v1/events: {exc}")
                if attempt >= self.max_retries and exc.unreachable:
                    # a restart outlasts the retries: kept (within max_buffer) for the next
                    # round, at the next flush_interval or flush()
                    log.warning(
                        "costboard: %d events kept to send again after %d attempts: %s",
                        len(batch),
                        attempt + 1,
                        exc,
                    )
                    return _Outcome.REQUEUE
                if attempt >= self.max_retries:
                    with self._lock:
                        self._counts["failed"] += len(batch)
                    log.warning(
                        "costboard: gave up on %d events after %d attempts: %s",
                        len(batch),
                        attempt + 1,
                        exc,
                    )
                    return _Outcome.FAILED
                delay = self._delay(attempt, exc.retry_after)
                if deadline is not None and _monotonic() + delay >= deadline:
                    return _Outcome.REQUEUE
                attempt += 1
                with self._lock:
                    self._counts["retries"] += 1
                if in_worker:
                    if self._stop.wait(delay):
                        return _Outcome.REQUEUE  # closing: close() sends it
                else:
                    _sleep(delay)
                continue
            self._accept(batch, body)
            return _Outcome.SENT

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:  # the server knows best, within reason
            return min(max(retry_after, 0.0), self.max_retry_after)
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 — jitter: not all clients at once

    def _post(self, batch: list[dict[str, Any]], timeout: float, key: str) -> Any:
        data = json.dumps({"events": batch}, default=_json_default).encode()
        headers = {**self._headers(), "Content-Type": "application/json", "Idempotency-Key": key}
        request = urllib.request.Request(
            f"{self.base_url}/api/v1/events", data=data, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            if status in (408, 429) or status >= 500:
                raise _Transient(
                    f"HTTP {status} {_reason(exc)}",
                    _retry_after(exc.headers.get("Retry-After")),
                    unreachable=status in (408, 429, 502, 503, 504),
                ) from None
            try:
                body: Any = json.loads(exc.read() or b"null")
            except (OSError, ValueError):
                body = None
            raise _Refused(status, f"HTTP {status} {_reason(exc, body)}", body) from None
        # URLError, timeouts, resets, a response cut short (IncompleteRead), bad responses
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise _Transient(
                str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            ) from exc
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):  # not Costboard answering (a portal, a proxy's page):
            # retried under the same Idempotency-Key, so a batch it did store is stored once
            raise _Transient(f"HTTP {status}: a reply that is not a JSON object")
        return body

    def _drop_refused(self, batch: list[dict[str, Any]], exc: _Refused) -> list[dict[str, Any]]:
        """The events to send again after a refusal: on a 422 naming the bad events, the
        others; otherwise none (the whole batch is counted failed)."""
        errors = exc.body.get("errors") if isinstance(exc.body, dict) else None
        bad = {
            e["index"]
            for e in errors or []
            if isinstance(e, dict) and isinstance(e.get("index"), int)
        }
        bad &= set(range(len(batch)))
        if exc.status != 422 or not bad:
            bad = set(range(len(batch)))
        self._note_error(f"POST /api/v1/events refused: {exc}")
        log.error("costboard: server refused %d events: %s", len(bad), exc)
        with self._lock:
            self._counts["failed"] += len(bad)
        return [event for i, event in enumerate(batch) if i not in bad]

    def _accept(self, batch: list[dict[str, Any]], body: Any) -> None:
        sessions = body.get("sessions") if isinstance(body, dict) else None
        duplicates = body.get("duplicates", 0) if isinstance(body, dict) else 0
        with self._lock:
            self._counts["sent"] += len(batch)
            if isinstance(duplicates, int):
                self._counts["duplicates"] += duplicates
            if isinstance(sessions, dict):
                for session_id, budget in sessions.items():
                    if isinstance(budget, dict):
                        self._budgets[str(session_id)] = budget
                        self._forget_lifted(budget)
            periods = body.get("budgets") if isinstance(body, dict) else None
            if isinstance(periods, dict):
                for budget_id, period in periods.items():
                    if isinstance(period, dict):
                        self._periods[f"budget:{budget_id}"] = period
        if isinstance(sessions, dict):
            for session_id, budget in sessions.items():
                if isinstance(budget, dict) and budget.get("state") == "exhausted":
                    log.info("costboard: session %r has exhausted its budget", session_id)

    def _forget_lifted(self, budget: Mapping[str, Any]) -> None:  # with the lock held
        """A session the server did not stop: no stop-budget over every session of this key
        is exhausted any more (its limit was raised, or it was deleted), whatever was heard
        of it or of the other sessions it stopped."""
        if budget.get("state") == "exhausted":
            return
        lifted = {
            name
            for name, above in self._periods.items()
            if above.get("scope") in ("project", "api_key") and above.get("state") == "exhausted"
        }
        for name in lifted:
            del self._periods[name]
        for session_id in [
            session_id
            for session_id, known in self._budgets.items()
            if known.get("stopped_by") in lifted
        ]:
            del self._budgets[session_id]  # unknown again: its next answer tells

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "User-Agent": USER_AGENT}

    def _note_error(self, message: str) -> None:
        with self._lock:
            self._last_error = message
        log.debug("costboard: %s", message)


_K = TypeVar("_K")
_V = TypeVar("_V")


class Recent(OrderedDict[_K, _V]):
    """A dict of at most `size` entries: setting one past that forgets the least recently
    set (a session's budget is set on every answer that names it)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def __setitem__(self, key: _K, value: _V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


def _period_over(period: Mapping[str, Any], now: datetime) -> bool:
    """Whether a `<period budget>` as last heard is of a calendar period (day, week, month)
    that has ended by `now`: its exhaustion is then no longer news (a rolling window's and
    a total's are, until the server says otherwise)."""
    if period.get("period") not in ("day", "week", "month"):
        return False
    end = period.get("period_end")
    if not isinstance(end, str):
        return False
    try:
        ends = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return False
    if ends.tzinfo is None:
        ends = ends.replace(tzinfo=timezone.utc)
    return now >= ends


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _idempotency_key() -> str:
    return uuid.uuid4().hex


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: a number of seconds, or an HTTP date (RFC 9110)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: our own back-off
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return (when - datetime.now(timezone.utc)).total_seconds()


def _reason(exc: urllib.error.HTTPError, body: Any = None) -> str:
    """The server's own message when it gave one (the first error), else the HTTP reason."""
    if isinstance(body, dict):
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            first = errors[0]
            where = f" (event {first['index']})" if first.get("index") is not None else ""
            return f"{first.get('field', '')}: {first.get('message', '')}{where}"
    return str(exc.reason)
