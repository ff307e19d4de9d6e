"""The outbox: items written with the data that causes them, carried out once each after the
commit, retried with back-off, failed when their attempts run out; shown in the admin and in
/metrics. Test handlers are registered for the duration of each test only."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models import F
from django.test import Client
from django.utils import timezone

from costboard import outbox
from costboard.models import OutboxItem, Project
from costboard.outbox import Attempt, outbox_add, outbox_dispatch
from tests.conftest import Agent


@pytest.fixture
def handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Register test kinds on a copy of the registry, so nothing outlives the test."""
    monkeypatch.setattr(outbox, "_HANDLERS", dict(outbox._HANDLERS))
    yield


def later(seconds: float) -> None:
    """Make the outbox's clock `seconds` later: every item's due time moves that far back."""
    OutboxItem.objects.update(next_attempt_at=F("next_attempt_at") - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_an_item_goes_out_after_commit_and_never_after_a_rollback(handlers: None) -> None:
    seen: list[Any] = []
    outbox.outbox_handler("test.note")(lambda payload, attempt: seen.append(payload["n"]))

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        outbox_add("test.note", {"n": 1})
        raise Rollback
    with transaction.atomic():
        outbox_add("test.note", {"n": 2})
        assert seen == []  # nothing runs inside the transaction that queued it
    result = outbox_dispatch()
    assert (result.done, result.retried, result.failed) == (1, 0, 0)
    assert seen == [2]
    assert not OutboxItem.objects.exists()  # done items are deleted
    assert outbox_dispatch().claimed == 0


@pytest.mark.django_db
def test_a_failing_item_backs_off_exponentially_then_fails_and_can_be_retried(
    handlers: None, staff: Client
) -> None:
    calls: list[Attempt] = []

    def flaky(payload: dict[str, Any], attempt: Attempt) -> None:
        calls.append(attempt)
        if len(calls) < 5:
            raise ConnectionError("receiver down")

    outbox.outbox_handler("test.flaky", max_attempts=3, retry_seconds=10)(flaky)
    with time_machine.travel(timezone.now(), tick=False) as clock:  # the outbox's, by hand
        outbox_add("test.flaky", {})

        assert outbox_dispatch().retried == 1
        item = OutboxItem.objects.get()
        assert (item.status, item.attempts, item.claimed_until) == ("pending", 1, None)
        assert item.last_error == "ConnectionError: receiver down"
        assert item.next_attempt_at == timezone.now() + timedelta(seconds=10)  # retry_seconds × 2⁰
        clock.shift(9)
        assert outbox_dispatch().claimed == 0  # not due yet
        clock.shift(1)
        assert outbox_dispatch().retried == 1
        item.refresh_from_db()
        assert item.next_attempt_at == timezone.now() + timedelta(seconds=20)  # × 2¹
        clock.shift(20)
        assert outbox_dispatch().failed == 1
        item.refresh_from_db()
        assert (item.status, item.attempts) == ("failed", 3)
        assert [(a.number, a.final) for a in calls] == [(1, False), (2, False), (3, True)]
        clock.shift(3600)
        assert outbox_dispatch().claimed == 0  # a failed item stays failed

        # the admin shows it, with its error, and retries it with fresh attempts
        page = staff.get("/admin/costboard/outboxitem/?status__exact=failed")
        assert page.status_code == 200
        assert b"test.flaky" in page.content and b"ConnectionError: receiver down" in page.content
        response = staff.post(
            "/admin/costboard/outboxitem/",
            {"action": "retry_items", "_selected_action": [item.pk]},
            follow=True,
        )
        assert b"Queued 1 item(s) again" in response.content
        assert outbox_dispatch().retried == 1  # the 4th call fails too: attempt 1 of a new round
        clock.shift(10)
        assert outbox_dispatch().done == 1
    assert len(calls) == 5 and not OutboxItem.objects.exists()


@pytest.mark.django_db
def test_an_atomic_handler_that_fails_leaves_nothing_half_done(handlers: None) -> None:
    def half(payload: dict[str, Any], attempt: Attempt) -> None:
        Project.objects.create(name="half", slug="half")
        if attempt.number == 1:
            raise RuntimeError("after the first write")

    outbox.outbox_handler("test.half", retry_seconds=0)(half)
    outbox_add("test.half", {})
    result = outbox_dispatch()  # retry_seconds 0: the second attempt follows at once
    assert (result.done, result.retried) == (1, 1)
    assert Project.objects.filter(slug="half").count() == 1  # the failed attempt's is gone


@pytest.mark.django_db
def test_an_item_whose_dispatcher_died_is_taken_again_after_its_lease(handlers: None) -> None:
    seen: list[int] = []
    outbox.outbox_handler("test.lease", lease_seconds=60)(
        lambda payload, attempt: seen.append(attempt.number)
    )
    outbox_add("test.lease", {})
    [claimed] = outbox._claim(10, timezone.now())  # a dispatcher takes it, then dies
    assert claimed.attempts == 1
    assert outbox_dispatch().claimed == 0  # leased to the dead dispatcher
    later(61)
    assert outbox_dispatch().done == 1
    assert seen == [2]


@pytest.mark.django_db
def test_an_item_of_an_unknown_kind_fails_saying_why() -> None:
    outbox_add("nobody.handles", {})
    assert outbox_dispatch().failed == 1
    item = OutboxItem.objects.get()
    assert item.status == "failed"
    assert item.last_error == "no handler for kind 'nobody.handles' (is its app installed?)"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_dispatchers_carry_out_each_item_exactly_once(handlers: None) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SKIP LOCKED: PostgreSQL (CI runs it)")
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def note(payload: dict[str, Any], attempt: Attempt) -> None:
        with lock:
            seen[payload["n"]] += 1

    outbox.outbox_handler("test.once")(note)
    for chunk in range(0, 400, 100):
        with transaction.atomic():
            outbox.outbox_add_many(
                outbox.Item("test.once", {"n": n}) for n in range(chunk, chunk + 100)
            )
    results: list[outbox.Dispatched] = []
    barrier = threading.Barrier(4)

    def dispatcher() -> None:
        try:
            barrier.wait()
            results.append(outbox_dispatch(limit=7))
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatcher) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(seen) == list(range(400))
    assert set(seen.values()) == {1}  # none twice
    assert sum(r.done for r in results) == 400
    assert len([r for r in results if r.done]) > 1  # they did share the work
    assert not OutboxItem.objects.exists()


def lanes_noted(seen: list[tuple[int, Any]], lock: threading.Lock, *, patience: float) -> None:
    """Register `test.lane`, in lanes by its payload's "lane", two threads at most: item 1
    waits (up to `patience` seconds) until item 3, of another lane, has run, so one after
    another it could not finish. Each item notes its number and the database connection it
    ran a query on."""
    ran_3 = threading.Event()

    def run(payload: dict[str, Any], attempt: Attempt) -> None:
        OutboxItem.objects.exists()  # on this thread's own connection
        with lock:
            seen.append((payload["n"], connections["default"]))  # this thread's
        if payload["n"] == 1 and not ran_3.wait(timeout=patience):
            raise AssertionError("item 3 did not run while item 1 waited")
        if payload["n"] == 3:
            ran_3.set()

    outbox.outbox_handler(
        "test.lane",
        lanes=lambda payloads: [payload["lane"] for payload in payloads],
        concurrency=lambda: 2,
        atomic=False,  # as alert deliveries: SQLite's write lock is not held while one waits
    )(run)
    items = [(1, "a"), (2, "a"), (3, "b")]
    outbox.outbox_add_many(outbox.Item("test.lane", {"n": n, "lane": lane}) for n, lane in items)


@pytest.mark.django_db(transaction=True)
def test_a_kind_with_lanes_runs_them_at_once_each_in_order(handlers: None) -> None:
    """A lane's items one after another, in order; the lanes in threads of their own, each
    closing its database connection when done."""
    seen: list[tuple[int, Any]] = []
    lock = threading.Lock()
    lanes_noted(seen, lock, patience=30)
    result = outbox_dispatch()
    assert (result.done, result.retried, result.failed, result.kinds) == (
        3,
        0,
        0,
        {"test.lane": 3},
    )
    order = [n for n, _ in seen]  # 1 waited for 3 (it was done, not retried), 2 after 1
    assert order.index(1) < order.index(2) and order.index(3) < order.index(2)
    used = {id(conn): conn for _, conn in seen}
    assert id(connections["default"]) not in used  # not the dispatcher's own
    assert [conn.connection for conn in used.values()] == [None] * len(used)  # all closed
    assert not OutboxItem.objects.exists()


@pytest.mark.django_db
def test_a_dispatcher_inside_a_transaction_carries_every_lane_out_itself(
    handlers: None,
) -> None:
    """Another thread's connection would not see the transaction's writes: every item runs in
    the dispatcher's own thread, one after another (item 1 waits for 3 in vain: retried)."""
    seen: list[tuple[int, Any]] = []
    lanes_noted(seen, threading.Lock(), patience=0.1)
    result = outbox_dispatch()
    assert (result.done, result.retried, result.failed) == (2, 1, 0)
    assert [n for n, _ in seen] == [1, 2, 3]
    assert {id(conn) for _, conn in seen} == {id(connections["default"])}


@pytest.mark.django_db
def test_guard_sweep_carries_out_the_outbox(agent: Agent, priced: Any) -> None:
    agent.events(
        {"type": "turn", "session_id": "s", "turn": 1, "user_message": "I prefer metric units."}
    )
    assert OutboxItem.objects.filter(kind="memory.detect").count() == 1
    out = StringIO()
    call_command("guard_sweep", stdout=out)
    assert "outbox: 1 done, 0 to retry, 0 failed" in out.getvalue()
    assert not OutboxItem.objects.exists()


@pytest.mark.django_db
def test_metrics_show_the_backlog_and_the_failures(staff: Client) -> None:
    outbox_add("alerts.dispatch", {"event_ids": []})
    outbox_add("nobody.handles", {})
    outbox_dispatch()  # the dispatch goes out; the unknown kind fails
    outbox_add("prices.reprice", {"matches": []})
    body = staff.get("/metrics").content.decode()
    assert 'costboard_outbox_items{kind="prices.reprice",status="pending"} 1.0' in body
    assert 'costboard_outbox_items{kind="nobody.handles",status="failed"} 1.0' in body
    assert 'costboard_outbox_items{kind="alerts.dispatch",status="pending"} 0.0' in body


@pytest.mark.django_db
def test_no_request_touches_the_broker(
    agent: Agent, priced: Any, staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a broker configured and unreachable, every request that causes side effects
    (a batch that crosses caps and carries text, a cap change, a price edit) answers as
    usual: the work is in the outbox, not in a message the request had to publish."""
    from celery import Celery

    from costboard.celery import app as celery_app

    published: list[str] = []

    def unreachable(self: Celery, name: str, *args: Any, **kwargs: Any) -> None:
        published.append(name)
        raise ConnectionRefusedError("the broker is down")

    celery_app.conf.task_always_eager = False  # conftest's autouse fixture sets it back
    monkeypatch.setattr(Celery, "send_task", unreachable)
    answer = agent.events(
        {"type": "session", "session_id": "s", "token_cap": 100},
        {"type": "turn", "session_id": "s", "turn": 1, "user_message": "I prefer metric units."},
        {
            "session_id": "s",
            "turn": 1,
            "step_type": "x",
            "model": "test-sonnet",
            "input_tokens": 90,
        },
        {
            "session_id": "s",
            "turn": 1,
            "step_type": "x",
            "model": "test-sonnet",
            "input_tokens": 20,
        },
    )
    assert answer["sessions"]["s"]["state"] == "exhausted"
    project = Project.objects.get(pk=agent.project.pk)
    from costboard.budgets.services import project_caps_set

    project_caps_set(project=project, changes={"token_cap": 5000})
    price = priced
    response = staff.post(
        f"/admin/costboard/modelprice/{price.pk}/delete/", {"post": "yes"}, follow=True
    )
    assert response.status_code == 200
    assert published == []
    assert sorted(OutboxItem.objects.values_list("kind", flat=True)) == [
        "alerts.dispatch",
        "budgets.recheck",
        "memory.detect",
        "prices.reprice",
    ]
    # positive control: a publish would have been seen
    with pytest.raises(ConnectionRefusedError):
        celery_app.send_task("costboard.tasks.outbox_dispatch")
    assert published == ["costboard.tasks.outbox_dispatch"]
