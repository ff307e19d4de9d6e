"""The outbox: side effects written in the transaction that causes them, carried out after it.

A request never waits on a webhook or a broker. Whatever has work to do once its data is
committed — alerts to send, turns to read for memories, steps to reprice, sessions to
recheck — adds an `OutboxItem` inside its own transaction (`outbox_add`): a rollback leaves
no item, a commit always leaves one. A dispatcher carries the items out:

- with a broker, the Celery task `costboard.tasks.outbox_dispatch` (beat runs it every
  second; any number of workers may run it at once);
- without one, `manage.py guard_sweep` (which `make run` starts) every second.

`outbox_dispatch` claims due items with `SELECT … FOR UPDATE SKIP LOCKED` and pushes their
next attempt a lease ahead in the same statement's transaction, so two dispatchers never take
the same item; a dispatcher that dies mid-item leaves it to be taken again when the lease runs
out. A handler that returns is done (its item is deleted, in the handler's own transaction
when the handler is `atomic`); one that raises is retried after `retry_seconds × 2ⁿ`, and
its item is marked failed when its attempts run out (the admin shows the backlog, the
failures and their last error, and can retry them).

Delivery is at least once: an item whose dispatcher died after the work and before the
delete runs again. Handlers are written so that a second run changes nothing (alerts are
deduplicated per event and target, and receivers dedupe on X-Costboard-Delivery).

Handlers register by kind at import time (`outbox_handler`); the cost app's are in the modules
that own the work, memory_ui's in memory_ui/hooks.py, so the cost app never imports memory_ui.

A kind whose handler names `lanes` (alert deliveries: costboard/budgets/alerts.py) is carried
out concurrently within a pass: its items claimed together are put in lanes — the items of
one lane one after another, in order — and up to `concurrency()` threads take a lane each, so
one slow receiver holds its own lane, not the others. Each thread closes its own database
connections when done (Django's are per thread). A dispatcher called inside a transaction
(a test's) carries every item out itself: another thread's connection would not see what
that transaction wrote.

Each kind names the Celery queue that carries it out (docs/operations.md, "Queues"): alerts,
memory detection and repricing have their own, so a worker busy with an hour's repricing never
holds up an alert. `outbox_dispatch(queue=…)` takes only that queue's kinds (the default
queue's takes every kind no other queue claims, an unknown kind included, which fails there);
without a queue it takes every kind, as guard_sweep does without a broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from queue import Empty, SimpleQueue
from typing import Any

from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from costboard.models import OutboxItem

log = logging.getLogger(__name__)

_ERROR_CHARS = 300

# The Celery queues of the outbox's work (costboard/settings.py routes a task to each)
ALERTS_QUEUE = "alerts"
MEMORY_QUEUE = "memory"
REPRICING_QUEUE = "repricing"
DEFAULT_QUEUE = "celery"
QUEUES = (ALERTS_QUEUE, MEMORY_QUEUE, REPRICING_QUEUE, DEFAULT_QUEUE)


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a handler is told about the attempt it is making."""

    number: int  # 1 for the first
    final: bool  # no retry follows if this one fails


Run = Callable[[dict[str, Any], Attempt], None]
# the lane of each payload, in order: a lane's items go one after another, lanes concurrently
Lanes = Callable[[list[dict[str, Any]]], list[Hashable]]


@dataclass(frozen=True, slots=True)
class Handler:
    kind: str
    run: Run
    # callables, so a test's settings override applies to items already queued
    max_attempts: Callable[[], int]
    retry_seconds: Callable[[], float]
    lease_seconds: int  # longer than the work can take, so a live attempt is never taken over
    atomic: bool  # the work and the item's delete commit together (exactly once)
    queue: str  # the Celery queue whose dispatcher carries it out
    lanes: Lanes | None = None  # None: one after another in the dispatcher's own thread
    concurrency: Callable[[], int] = lambda: 1  # threads at most, a lane each (with `lanes`)


_HANDLERS: dict[str, Handler] = {}


def outbox_handler(
    kind: str,
    *,
    max_attempts: int | Callable[[], int] = 8,
    retry_seconds: float | Callable[[], float] = 10.0,
    lease_seconds: int = 300,
    atomic: bool = True,
    queue: str = DEFAULT_QUEUE,
    lanes: Lanes | None = None,
    concurrency: Callable[[], int] = lambda: 1,
) -> Callable[[Run], Run]:
    """Register `run(payload, attempt)` as what carries out items of `kind`, on `queue`; with
    `lanes`, the items claimed together go out in `concurrency()` threads (the module
    docstring)."""
    if queue not in QUEUES:
        raise ValueError(f"outbox kind {kind!r}: queue {queue!r} is not one of {QUEUES}")

    def register(run: Run) -> Run:
        _HANDLERS[kind] = Handler(
            kind=kind,
            run=run,
            max_attempts=max_attempts if callable(max_attempts) else (lambda: max_attempts),
            retry_seconds=retry_seconds if callable(retry_seconds) else (lambda: retry_seconds),
            lease_seconds=lease_seconds,
            atomic=atomic,
            queue=queue,
            lanes=lanes,
            concurrency=concurrency,
        )
        return run

    return register


def handler_of(kind: str) -> Handler | None:
    return _HANDLERS.get(kind)


def outbox_kinds() -> set[str]:
    return set(_HANDLERS)


# --- adding: inside the transaction that causes the work ------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    kind: str
    payload: dict[str, Any]
    project_id: int | None = None


def outbox_add(kind: str, payload: dict[str, Any], *, project_id: int | None = None) -> None:
    """Queue one side effect; it goes out once the surrounding transaction commits."""
    outbox_add_many([Item(kind, payload, project_id)])


def outbox_add_many(items: Iterable[Item]) -> None:
    rows = [OutboxItem(kind=i.kind, payload=i.payload, project_id=i.project_id) for i in items]
    if rows:
        OutboxItem.objects.bulk_create(rows)


# --- dispatching: after the commit, outside any request -------------------------------------


@dataclass(slots=True)
class Dispatched:
    done: int = 0
    retried: int = 0
    failed: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, other: Dispatched) -> None:
        self.done += other.done
        self.retried += other.retried
        self.failed += other.failed
        for kind, count in other.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + count

    @property
    def claimed(self) -> int:
        return self.done + self.retried + self.failed

    def __str__(self) -> str:
        return f"outbox: {self.done} done, {self.retried} to retry, {self.failed} failed"


def _lease(kind: str) -> int:
    handler = _HANDLERS.get(kind)
    return handler.lease_seconds if handler else 60


def _kinds_of(queue: str | None) -> Q:
    """The items a dispatcher of `queue` takes (None: every one)."""
    if queue is None:
        return Q()
    if queue not in QUEUES:
        raise ValueError(f"no outbox queue {queue!r}; use one of {QUEUES}")
    if queue == DEFAULT_QUEUE:  # every kind no other queue takes, one without a handler too
        others = [k for k, h in _HANDLERS.items() if h.queue != DEFAULT_QUEUE]
        return ~Q(kind__in=others)
    return Q(kind__in=[k for k, h in _HANDLERS.items() if h.queue == queue])


def _claim(limit: int, now: datetime, kinds: Q | None = None) -> list[OutboxItem]:
    """Take up to `limit` due items for this dispatcher (others skip them)."""
    with transaction.atomic():
        items = list(
            OutboxItem.objects.select_for_update(skip_locked=True)
            .filter(kinds or Q(), status=OutboxItem.Status.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "pk")[:limit]
        )
        for item in items:
            item.attempts += 1
            item.claimed_until = now + timedelta(seconds=_lease(item.kind))
            item.next_attempt_at = item.claimed_until
        OutboxItem.objects.bulk_update(items, ["attempts", "claimed_until", "next_attempt_at"])
    return items


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_ERROR_CHARS]


def _carry_out(item: OutboxItem, result: Dispatched) -> None:
    handler = _HANDLERS.get(item.kind)
    mine = OutboxItem.objects.filter(pk=item.pk, attempts=item.attempts)  # unless taken over
    error: str
    final = True
    if handler is None:
        error = f"no handler for kind {item.kind!r} (is its app installed?)"
    else:
        final = item.attempts >= handler.max_attempts()
        attempt = Attempt(number=item.attempts, final=final)
        try:
            if handler.atomic:
                with transaction.atomic():
                    handler.run(item.payload, attempt)
                    mine.delete()
            else:
                handler.run(item.payload, attempt)
                mine.delete()
            result.done += 1
            result.kinds[item.kind] = result.kinds.get(item.kind, 0) + 1
            return
        except Exception as exc:  # recorded on the item and retried: never lost
            error = _describe(exc)
            log.warning(
                "outbox %s #%s: attempt %s failed: %s", item.kind, item.pk, item.attempts, error
            )
    now = timezone.now()
    if final:
        mine.update(status=OutboxItem.Status.FAILED, claimed_until=None, last_error=error)
        result.failed += 1
        log.error("outbox %s #%s: failed after %s attempts", item.kind, item.pk, item.attempts)
        return
    assert handler is not None  # noqa: S101 — narrows the type: not final means a handler
    delay = handler.retry_seconds() * 2 ** (item.attempts - 1)
    mine.update(
        next_attempt_at=now + timedelta(seconds=delay), claimed_until=None, last_error=error
    )
    result.retried += 1


def _carry_out_all(items: list[OutboxItem], result: Dispatched) -> None:
    """Carry out the items claimed together: those of a kind with lanes concurrently
    (_carry_out_lanes), after the others, which go one after another in this thread — as
    every item does inside a transaction, whose writes another connection would not see."""
    in_lanes: dict[str, list[OutboxItem]] = {}
    inside_transaction = connections["default"].in_atomic_block
    for item in items:
        handler = _HANDLERS.get(item.kind)
        if handler is None or handler.lanes is None or inside_transaction:
            _carry_out(item, result)
        else:
            in_lanes.setdefault(item.kind, []).append(item)
    for kind, batch in in_lanes.items():
        _carry_out_lanes(_HANDLERS[kind], batch, result)


def _carry_out_lanes(handler: Handler, items: list[OutboxItem], result: Dispatched) -> None:
    """Items of one kind in their lanes (`handler.lanes`): a lane's items one after another,
    in order, and up to `handler.concurrency()` lanes at once, each thread taking the next
    lane when done and closing its database connections at the end. The first error a thread
    met outside a handler (the database gone) is raised here once all have stopped: that
    thread's lane is left to the leases, as this thread's rest of the pass would be."""
    assert handler.lanes is not None  # noqa: S101 — only a kind with lanes comes here
    lanes: dict[Hashable, list[OutboxItem]] = {}
    keys = handler.lanes([item.payload for item in items])
    for item, key in zip(items, keys, strict=True):
        lanes.setdefault(key, []).append(item)
    count = min(max(handler.concurrency(), 1), len(lanes))
    if count <= 1:
        for item in items:
            _carry_out(item, result)
        return
    todo: SimpleQueue[list[OutboxItem]] = SimpleQueue()
    for lane in lanes.values():
        todo.put(lane)
    results = [Dispatched() for _ in range(count)]
    errors: list[BaseException] = []

    def work(mine: Dispatched) -> None:
        try:
            while True:
                try:
                    lane = todo.get_nowait()
                except Empty:
                    return
                for item in lane:
                    _carry_out(item, mine)
        except BaseException as exc:  # raised in the dispatcher's thread below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's own

    threads = [
        threading.Thread(target=work, args=(mine,), name=f"outbox {handler.kind} {n}")
        for n, mine in enumerate(results, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for mine in results:
        result.add(mine)
    if errors:
        raise errors[0]


def outbox_dispatch(
    *, limit: int = 20, seconds: float | None = None, queue: str | None = None
) -> Dispatched:
    """Carry out due items (of `queue`'s kinds; None: of every kind), `limit` claimed at a
    time, until none is due or `seconds` have passed. Safe to run in any number of processes
    at once."""
    result = Dispatched()
    started = time.monotonic()
    kinds = _kinds_of(queue)
    while True:
        items = _claim(limit, timezone.now(), kinds)
        if not items:
            return result
        _carry_out_all(items, result)  # may queue more (an alert's deliveries): the next pass
        if seconds is not None and time.monotonic() - started > seconds:
            return result


def outbox_retry(*, item_ids: list[int]) -> int:
    """Queue failed items again with fresh attempts (the admin's action). Returns how many."""
    return OutboxItem.objects.filter(pk__in=item_ids, status=OutboxItem.Status.FAILED).update(
        status=OutboxItem.Status.PENDING,
        attempts=0,
        next_attempt_at=timezone.now(),
        claimed_until=None,
    )


def outbox_dispatch_without_broker() -> Dispatched | None:
    """For a command that queued work and then ends (sync_prices, seed_demo): without a
    broker, carry the due items out now rather than leave them to guard_sweep; with one,
    the workers do (None)."""
    from costboard.celery import app as celery_app

    if not celery_app.conf.task_always_eager:
        return None
    return outbox_dispatch()
