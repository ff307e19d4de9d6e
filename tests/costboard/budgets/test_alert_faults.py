"""Faults across process boundaries, with the real thing stopped: a Redis broker this test
started goes down mid-stream and comes back; a webhook receiver is slow. Ingest answers every
batch, stores each once, never waits, and every alert goes out once when it can."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import pytest
import time_machine
from celery import Celery
from django.db import connection
from django.utils import timezone

from costboard.models import AlertDelivery, OutboxItem, Session, Step, WebhookEndpoint
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent
from tests.servers import HOLD_AT_MOST, Receiver, RedisServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]

QUIET = ["--loglevel", "WARNING", "--without-gossip", "--without-mingle"]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]  # the worker process reads what we commit


# Beat's outbox dispatchers (costboard/tasks.py) and their queues (settings.CELERY_TASK_ROUTES)
BEAT_TASKS = [
    ("costboard.tasks.outbox_dispatch", "celery"),
    ("costboard.tasks.outbox_alerts", "alerts"),
    ("costboard.tasks.outbox_memory", "memory"),
    ("costboard.tasks.outbox_repricing", "repricing"),
]


def worker_database_url() -> str:
    """This test's database as the worker process is told it: the same PostgreSQL database,
    or the same SQLite file (a test process's own: `make test` without DATABASE_URL)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def crossing_batch(n: int) -> dict[str, Any]:
    """A session of cap 1000 that passes 80% and then the cap: two alerts."""
    session = f"s-{n}"
    steps = [
        {"session_id": session, "step_type": "x", "model": "test-sonnet", "input_tokens": tokens}
        for tokens in (800, 200)
    ]
    for number, step in enumerate(steps):
        step["event_id"] = f"{session}-{number}"
    return {"events": [{"type": "session", "session_id": session, "token_cap": 1000}, *steps]}


def setup_project(receiver: Receiver) -> Agent:
    agent = make_agent("faults")
    add_price("test-sonnet")
    WebhookEndpoint.objects.create(
        project=agent.project, url=f"{receiver.base_url}/hook", secret="whsec-faults"
    )
    return agent


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]  # a receiver on this machine
    server = Receiver().start()
    try:
        yield server
    finally:
        server.stop()


def test_a_broker_outage_mid_stream_loses_nothing_and_sends_each_alert_once(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = setup_project(receiver)
    broker = RedisServer()
    broker.start()
    # Celery prefers the environment's broker to the one it is given: make it this test's.
    monkeypatch.setenv("CELERY_BROKER_URL", broker.url)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "costboard.settings",
        "CELERY_BROKER_URL": broker.url,
        "DATABASE_URL": worker_database_url(),
        "COSTBOARD_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    }
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "costboard", "worker", "--pool", "solo", *QUIET],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    # Celery beat's part: send the dispatcher every 200 ms; while the broker is down the
    # sends fail, and that is all (the items wait in PostgreSQL).
    beat_app = Celery(broker=broker.url, set_as_current=False)  # shared tasks keep our app
    stop = threading.Event()
    refused = Counter[str]()

    def beat() -> None:
        while not stop.is_set():
            try:
                for task, queue in BEAT_TASKS:  # each to its queue: the worker takes all
                    beat_app.send_task(task, queue=queue, expires=10, retry=False)
            except Exception as exc:  # the broker is down
                refused[type(exc).__name__] += 1
            stop.wait(0.2)

    beat_thread = threading.Thread(target=beat, daemon=True)
    beat_thread.start()
    try:
        statuses = []
        for n in range(12):
            if n == 4:
                broker.stop()  # mid-stream
            if n == 8:
                broker.start()  # back, empty: whatever was queued in it is gone
            response = agent.post(crossing_batch(n))
            statuses.append(response.status_code)
            if n == 7:  # the outage lasts until the beat has failed to send (some seconds)
                wait_until(lambda: bool(refused), what="the beat to meet the outage")
        assert statuses == [200] * 12  # every batch answered, the outage invisible to agents
        wait_until(
            lambda: len(receiver.received()) >= 24 and not OutboxItem.objects.exists(),
            timeout=90,
            what=f"24 alerts (have {len(receiver.received())}); worker log {tmp_path}",
        )
    finally:
        stop.set()
        beat_thread.join(timeout=5)
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        broker.stop()

    # every acknowledged event stored once
    assert Step.objects.filter(project=agent.project).count() == 24
    for session in Session.objects.filter(project=agent.project, external_id__startswith="s-"):
        assert (session.input_tokens, session.state) == (1000, "exhausted")
    # every alert delivered, each once (the receiver saw each delivery id one time)
    deliveries = AlertDelivery.objects.filter(project=agent.project)
    assert deliveries.count() == 24
    assert set(deliveries.values_list("status", flat=True)) == {"delivered"}
    assert Counter(receiver.received()) == {
        str(pk): 1 for pk in deliveries.values_list("pk", flat=True)
    }


def test_a_slow_receiver_never_slows_ingest(receiver: Receiver, settings: Any) -> None:
    """Without a broker (make run): guard_sweep's dispatcher sends alerts while the agent
    keeps sending. The receiver holds its replies until every batch has been answered: a batch
    that waited on a webhook could not have been."""
    settings.COSTBOARD_ALERT_TIMEOUT_SECONDS = 2 * HOLD_AT_MOST  # the dispatcher waits it out
    receiver.hold()
    agent = setup_project(receiver)
    stop = threading.Event()

    def sweep() -> None:  # guard_sweep's outbox loop
        try:
            while not stop.is_set():
                outbox_dispatch()
                stop.wait(0.1)
        finally:
            connection.close()

    dispatcher = threading.Thread(target=sweep, daemon=True)
    dispatcher.start()
    try:
        statuses = [agent.post(crossing_batch(0)).status_code]
        wait_until(lambda: receiver.held() == 1, what="the dispatcher waiting on the receiver")
        statuses += [agent.post(crossing_batch(n)).status_code for n in (1, 2)]  # mid-send
        assert statuses == [200] * 3
        assert (receiver.held(), receiver.received()) == (1, [])  # still held, nothing answered
        receiver.release()
        wait_until(
            lambda: len(receiver.received()) == 6 and not OutboxItem.objects.exists(),
            what=f"6 alerts (have {len(receiver.received())})",
        )
    finally:
        receiver.release()
        stop.set()
        dispatcher.join(timeout=30)
    assert AlertDelivery.objects.filter(status="delivered").count() == 6
    assert Step.objects.filter(project=agent.project).count() == 6


def guard_sweep_started(log: IO[bytes], *args: str, **more: str) -> subprocess.Popen[bytes]:
    """`manage.py guard_sweep` in its own process, without a broker, on the test's database,
    its output into `log`; `more`: more of its environment."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "CELERY_BROKER_URL"},  # no broker
        "DJANGO_SETTINGS_MODULE": "costboard.settings",
        "DATABASE_URL": worker_database_url(),
        "COSTBOARD_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
        **more,
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "guard_sweep", *args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def test_a_dispatcher_killed_mid_send_leaves_the_alert_to_the_next_one(
    receiver: Receiver, tmp_path: Path
) -> None:
    """guard_sweep is killed while a receiver holds its request: the alert is neither lost
    nor left pending for good. The next dispatcher takes the item when its lease runs out,
    and the delivery, whose attempt never finished, goes out (at least once)."""
    agent = setup_project(receiver)
    assert agent.post(crossing_batch(0)).status_code == 200  # soft_warned and exhausted
    receiver.hold()
    with (tmp_path / "sweep.log").open("wb") as log:
        sweep = guard_sweep_started(log)
        try:
            wait_until(lambda: receiver.held() == 1, what=f"the send held; log {tmp_path}")
        finally:
            sweep.kill()  # mid-send: the attempt is never recorded
            sweep.wait(timeout=30)
    receiver.release()
    [held] = AlertDelivery.objects.filter(attempts=1)
    assert (held.status, held.response_code, held.error) == ("pending", None, "")

    # the next dispatcher, when the dead one's lease on the item runs out
    item = OutboxItem.objects.get(payload__delivery_id=held.pk)
    with time_machine.travel(item.next_attempt_at, tick=False) as clock:
        outbox_dispatch()
        clock.shift(3600)
        outbox_dispatch()
    deliveries = AlertDelivery.objects.filter(project=agent.project)
    assert set(deliveries.values_list("status", flat=True)) == {"delivered"}
    assert not OutboxItem.objects.exists()
    assert Counter(receiver.received()) == {str(held.pk): 2, str(held.pk + 1): 1}


def test_a_receiver_that_hangs_holds_up_one_send_not_the_others(
    receiver: Receiver, settings: Any
) -> None:
    """One dispatcher sends a target's deliveries one after another. A project whose
    receiver hangs costs its lane one timeout: that host's other deliveries are put off
    (retried on their schedule) instead of each waiting out the timeout, and another
    project's alerts go out in the same pass."""
    settings.COSTBOARD_ALERT_TIMEOUT_SECONDS = 1
    hanging = setup_project(receiver)
    other = Receiver().start()
    try:
        answering = make_agent("answers")
        WebhookEndpoint.objects.create(
            project=answering.project, url=f"{other.base_url}/hook", secret="whsec-other"
        )
        receiver.hold()
        for n in range(3):  # six alerts to the receiver that hangs, queued first
            assert hanging.post(crossing_batch(n)).status_code == 200
        assert answering.post(crossing_batch(9)).status_code == 200
        outbox_dispatch()
        receiver.release()
        wait_until(lambda: receiver.held() == 0, what="the held request let go")
        assert len(receiver.received()) == 1  # one timeout, then put off
        assert len(other.received()) == 2
        put_off = AlertDelivery.objects.filter(project=hanging.project, status="pending")
        assert put_off.count() == 6
        errors = sorted(put_off.values_list("error", flat=True))
        assert sum("not asked again before" in error for error in errors) == 5, errors
        delivered = AlertDelivery.objects.filter(project=answering.project, status="delivered")
        assert delivered.count() == 2

        # the hanging host is asked again once its minute is over, and everything goes out
        with time_machine.travel(timezone.now() + timedelta(hours=1), tick=False):
            outbox_dispatch()
        assert set(
            AlertDelivery.objects.filter(project=hanging.project).values_list("status", flat=True)
        ) == {"delivered"}
    finally:
        other.stop()


def slow_and_answering(receiver: Receiver, other: Receiver) -> tuple[Agent, Agent]:
    """A project whose receiver is slow (`receiver`), its alerts queued first, and another
    project's webhook at `other`."""
    slow = setup_project(receiver)
    answering = make_agent("answers")
    WebhookEndpoint.objects.create(
        project=answering.project, url=f"{other.base_url}/hook", secret="whsec-other"
    )
    return slow, answering


def delivery_ids(agent: Agent) -> list[str]:
    deliveries = AlertDelivery.objects.filter(project=agent.project).order_by("pk")
    return [str(pk) for pk in deliveries.values_list("pk", flat=True)]


def test_a_slow_receiver_holds_up_its_own_alerts_not_another_project_s(
    receiver: Receiver, settings: Any
) -> None:
    """A receiver that answers slowly but within its timeout (a webhook having a bad minute)
    holds up only its own lane: the deliveries a pass claims go out concurrently
    (COSTBOARD_ALERT_CONCURRENCY), so another project's alerts arrive while it is still held,
    a target's own alerts go one after another in order, and each goes out once. Before,
    the pass sent them one after another and the other project heard nothing until the slow
    receiver answered."""
    settings.COSTBOARD_ALERT_TIMEOUT_SECONDS = 2 * HOLD_AT_MOST  # slow, never timed out
    other = Receiver().start()
    try:
        slow, answering = slow_and_answering(receiver, other)
        receiver.hold()
        assert slow.post(crossing_batch(0)).status_code == 200  # two alerts, queued first
        assert answering.post(crossing_batch(1)).status_code == 200  # two more
        results: list[Any] = []
        dispatcher = threading.Thread(target=lambda: results.append(sweep_once()), daemon=True)
        dispatcher.start()
        try:
            wait_until(
                lambda: receiver.held() == 1 and len(other.received()) == 2,
                what="the other project's alerts while the slow receiver holds one",
            )
            assert receiver.received() == []  # the slow one still held: nothing answered
            assert other.received() == delivery_ids(answering)
        finally:
            receiver.release()
            dispatcher.join(timeout=30)
        assert not dispatcher.is_alive()
    finally:
        other.stop()
    # the run's counts: two dispatches, four deliveries, each done once
    [result] = results
    assert (result.done, result.retried, result.failed) == (6, 0, 0)
    assert result.kinds == {"alerts.dispatch": 2, "alert.deliver": 4}
    assert receiver.received() == delivery_ids(slow)  # in order: soft_warned, exhausted
    deliveries = AlertDelivery.objects.all()
    assert sorted(deliveries.values_list("status", "attempts")) == [("delivered", 1)] * 4
    assert not OutboxItem.objects.exists()
    if connection.vendor == "postgresql":  # the sending threads closed their connections
        wait_until(lambda: not backends_of_others(), what="the threads' connections closed")


OUTBOX_LINE = re.compile(r"^outbox: (\d+) done, (\d+) to retry, (\d+) failed$", re.M)


def sweep_once() -> Any:
    """One outbox_dispatch in this thread, as guard_sweep's loop runs it, its database
    connection closed after."""
    try:
        return outbox_dispatch()
    finally:
        connection.close()


def test_two_dispatchers_with_a_slow_receiver_send_every_alert_once(
    receiver: Receiver, tmp_path: Path
) -> None:
    """Two guard_sweep processes at once, each sending its deliveries concurrently: while the
    slow receiver holds its replies the other project's alerts arrive, and once it answers
    every delivery has gone out once — none twice, none lost — and the two runs' counts add
    up to every item once."""
    other = Receiver().start()
    try:
        slow, answering = slow_and_answering(receiver, other)
        receiver.hold()
        for n in range(3):
            assert slow.post(crossing_batch(n)).status_code == 200
            assert answering.post(crossing_batch(10 + n)).status_code == 200
        logs = [(tmp_path / f"sweep-{n}.log").open("wb") for n in (1, 2)]
        sweeps = [
            guard_sweep_started(log, COSTBOARD_ALERT_TIMEOUT_SECONDS=str(2 * int(HOLD_AT_MOST)))
            for log in logs
        ]
        try:
            wait_until(
                lambda: receiver.held() >= 1 and len(other.received()) == 6,
                what=f"the other project's alerts while the slow receiver holds; logs {tmp_path}",
            )
            assert receiver.received() == []  # the slow one still held: nothing answered
            receiver.release()
            for sweep in sweeps:
                assert sweep.wait(timeout=60) == 0, f"logs {tmp_path}"
        finally:
            receiver.release()
            for sweep in sweeps:
                sweep.kill()
                sweep.wait(timeout=30)
            for log in logs:
                log.close()
    finally:
        other.stop()
    assert Counter(other.received()) == dict.fromkeys(delivery_ids(answering), 1)
    assert Counter(receiver.received()) == dict.fromkeys(delivery_ids(slow), 1)
    deliveries = AlertDelivery.objects.all()
    assert sorted(deliveries.values_list("status", "attempts")) == [("delivered", 1)] * 12
    assert not OutboxItem.objects.exists()
    # each run's counts (guard_sweep prints them): together every item once, six dispatches
    # and twelve deliveries
    runs = [
        [int(n) for n in found.groups()]
        for n in (1, 2)
        for found in OUTBOX_LINE.finditer((tmp_path / f"sweep-{n}.log").read_text())
    ]
    assert len(runs) == 2, runs
    assert [sum(column) for column in zip(*runs, strict=True)] == [18, 0, 0], runs


def backends_of_others() -> list[int]:
    """The PostgreSQL backends of this test's database other than this process's own: the
    subprocess's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return [pid for (pid,) in cursor.fetchall()]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL ends the connection")
def test_guard_sweep_outlives_its_database_connection_ended_mid_send(
    receiver: Receiver, tmp_path: Path
) -> None:
    """`guard_sweep --every 60` (make run, or a deployment without a broker) has its database
    connection ended under it mid-turn, as a PostgreSQL restart or a failover does: the
    attempt it was recording fails, and the loop goes on with a new connection, carrying out
    the alerts of the batches that come after (before: the process exited with the
    OperationalError, and no alert went out again until someone restarted it)."""
    agent = setup_project(receiver)
    receiver.hold()
    assert agent.post(crossing_batch(0)).status_code == 200
    with (tmp_path / "sweep.log").open("wb") as log:
        sweep = guard_sweep_started(log, "--every", "60")
        try:
            wait_until(lambda: receiver.held() == 1, what=f"the send held; log {tmp_path}")
            ended = backends_of_others()
            assert ended  # the sweep's connection, idle while it waits on the receiver
            with connection.cursor() as cursor:
                for pid in ended:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            receiver.release()  # the sweep records the attempt: its connection is gone
            wait_until(lambda: receiver.received(), what="the held send answered")

            assert agent.post(crossing_batch(1)).status_code == 200  # after the fault
            later = AlertDelivery.objects.filter(budget_event__session__external_id="s-1")
            wait_until(
                lambda: later.filter(status="delivered").count() == 2 or sweep.poll() is not None,
                what=f"the alerts of s-1 delivered; log {tmp_path}",
            )
            assert sweep.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
        finally:
            sweep.terminate()
            sweep.wait(timeout=30)
    assert later.filter(status="delivered").count() == 2
    assert set(backends_of_others()).isdisjoint(ended)
