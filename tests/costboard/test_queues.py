"""Queues that don't block each other (docs/operations.md, "Queues"): each queue's outbox
dispatcher takes only its own kinds, Celery routes each dispatcher (and the billing import) to
its queue, and an alert goes out on its first attempt while a repricing holds the repricing
worker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings

from costboard.budgets.alerts import DELIVER, DISPATCH, DRIFT_DISPATCH
from costboard.budgets.services import RECHECK, session_recheck
from costboard.celery import app as celery_app
from costboard.models import (
    AlertDelivery,
    ModelPrice,
    OutboxItem,
    Session,
    Step,
    WebhookEndpoint,
)
from costboard.outbox import handler_of, outbox_add, outbox_dispatch
from costboard.pricing import repricing
from costboard.pricing.repricing import PriceMatch
from costboard.pricing.services import REPRICE, REPRICE_ADJUSTED, prices_reprice_later
from memory_ui.hooks import DETECT
from tests.conftest import add_price, beating, make_agent, own_queues, usd, worker_on
from tests.servers import Receiver
from tests.waiting import wait_until

QUEUE_OF_KIND = {
    DISPATCH: "alerts",
    DELIVER: "alerts",
    DRIFT_DISPATCH: "alerts",
    DETECT: "memory",
    REPRICE: "repricing",
    REPRICE_ADJUSTED: "repricing",
    RECHECK: "celery",
}


@pytest.mark.parametrize(("kind", "queue"), QUEUE_OF_KIND.items())
def test_each_outbox_kind_is_carried_out_on_its_queue(kind: str, queue: str) -> None:
    handler = handler_of(kind)
    assert handler is not None and handler.queue == queue


@pytest.mark.parametrize(
    ("task", "queue"),
    [
        ("costboard.tasks.outbox_alerts", "alerts"),
        ("costboard.tasks.outbox_memory", "memory"),
        ("costboard.tasks.outbox_repricing", "repricing"),
        ("costboard.tasks.billing_import", "billing"),
        ("costboard.tasks.outbox_dispatch", "celery"),
        ("costboard.tasks.runaway_sweep", "celery"),
        ("memory_ui.lifecycle.memory_ttl_sweep", "celery"),
    ],
)
def test_celery_routes_each_task_to_its_queue(task: str, queue: str) -> None:
    assert task in celery_app.tasks
    assert celery_app.amqp.router.route({}, task)["queue"].name == queue


def test_a_worker_without_q_consumes_every_queue_and_beat_feeds_each() -> None:
    """One box runs `celery -A costboard worker --beat` without -Q: it must take every queue."""
    everything = celery_app.amqp.Queues(settings.CELERY_TASK_QUEUES)  # what it starts with
    assert set(everything.consume_from) == {
        "celery",
        "alerts",
        "memory",
        "repricing",
        "billing",
    }
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {
        "costboard.tasks.outbox_dispatch",
        "costboard.tasks.outbox_alerts",
        "costboard.tasks.outbox_memory",
        "costboard.tasks.outbox_repricing",
        "costboard.tasks.billing_import",
    } <= beat
    assert all(name in celery_app.tasks for name in beat)


@pytest.mark.django_db
def test_each_dispatcher_takes_only_its_queue_s_kinds() -> None:
    outbox_add(DISPATCH, {"event_ids": []})
    outbox_add(DETECT, {"turn_ids": []})
    outbox_add(REPRICE, {"matches": []})
    outbox_add("nobody.knows", {})

    assert outbox_dispatch(queue="repricing").kinds == {REPRICE: 1}
    assert outbox_dispatch(queue="alerts").kinds == {DISPATCH: 1}
    assert outbox_dispatch(queue="alerts").claimed == 0  # nothing else of its own
    # the default queue's takes every kind no other queue does, an unknown one too (it fails)
    default = outbox_dispatch(queue="celery")
    assert (default.done, default.failed) == (0, 1)
    assert list(OutboxItem.objects.values_list("kind", "status")) == [
        (DETECT, "pending"),
        ("nobody.knows", "failed"),
    ]
    assert outbox_dispatch(queue="memory").kinds == {DETECT: 1}
    assert not OutboxItem.objects.filter(status="pending").exists()


@pytest.mark.django_db
def test_without_a_broker_one_pass_carries_every_kind() -> None:
    """guard_sweep (make run, no broker) dispatches with no queue: every kind at once."""
    outbox_add(DISPATCH, {"event_ids": []})
    outbox_add(DETECT, {"turn_ids": []})
    outbox_add(REPRICE, {"matches": []})
    assert outbox_dispatch().kinds == {DISPATCH: 1, DETECT: 1, REPRICE: 1}
    assert not OutboxItem.objects.exists()


def test_an_unknown_queue_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="'alerts', 'memory', 'repricing', 'celery'"):
        outbox_dispatch(queue="alert")


# --- a repricing in progress and an alert ----------------------------------------------------


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]  # a receiver on this machine
    server = Receiver().start()
    try:
        yield server
    finally:
        server.stop()


def step(session_id: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "type": "step",
        "session_id": session_id,
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }


@pytest.mark.slow
def test_an_alert_goes_out_on_its_first_attempt_while_a_repricing_holds_its_worker(
    transactional_db: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repricing worker and an alerts worker, as docs/operations.md runs them. The repricing
    is held part-way (its steps repriced, its sessions not yet rechecked) until the alert has
    been delivered: a million steps' repricing, which takes minutes, is in that state for
    minutes. The alert is delivered on its first attempt, before the repricing ends: its retry
    schedule (COSTBOARD_ALERT_RETRY_SECONDS) never came into it."""
    agent = make_agent("acme")
    price = add_price("test-sonnet")
    agent.events(*[step(f"old-{n}", 1000, 100) for n in range(20)])  # what gets repriced

    holding, release = threading.Event(), threading.Event()

    rechecked: list[int] = []  # the sessions the repricing has rechecked, in order

    def held_recheck(**kwargs: Any) -> Any:
        holding.set()
        release.wait(timeout=60)  # bounded: a failing test never hangs the suite
        result = session_recheck(**kwargs)
        rechecked.append(kwargs["session_id"])
        return result

    monkeypatch.setattr(repricing, "session_recheck", held_recheck)
    endpoint = WebhookEndpoint.objects.create(
        project=agent.project, url=f"{receiver.base_url}/hook", secret="s", kinds=["exhausted"]
    )

    with (
        own_queues() as queues,
        worker_on(queues["repricing"]),
        worker_on(queues["alerts"]),
        beating(),
    ):
        try:
            ModelPrice.objects.filter(pk=price.pk).update(input_mtok=Decimal(6))
            prices_reprice_later([PriceMatch("test-sonnet")])  # autocommit: queued at once
            wait_until(holding.is_set, what="the repricing worker to be part-way through")

            agent.events({"type": "session", "session_id": "capped", "token_cap": 1000})
            agent.events(step("capped", 600, 400))  # exhausted: one alert to the endpoint
            [delivery] = wait_until(
                lambda: list(
                    AlertDelivery.objects.filter(
                        endpoint=endpoint, status=AlertDelivery.Status.DELIVERED
                    )
                ),
                what="the alert delivered while the repricing is held",
            )
            # the order of events: delivered while the repricing still runs…
            assert rechecked == []
            [item] = OutboxItem.objects.filter(kind=REPRICE)
            assert (item.status, item.attempts) == ("pending", 1)  # claimed, not finished
            # …on its first attempt, the only request the receiver saw
            assert (delivery.kind, delivery.attempts) == ("exhausted", 1)
            assert receiver.received() == [str(delivery.pk)]

            release.set()
            wait_until(
                lambda: not OutboxItem.objects.filter(kind=REPRICE).exists(),
                what="the repricing to finish once released",
            )
        finally:
            release.set()  # a failed assertion leaves no worker held

    # the repricing did its whole work after the alert: every old session rechecked, every
    # old step at the new price
    assert len(rechecked) == 20
    expected = usd(1000, Decimal(6)) + usd(100, Decimal(15))
    assert set(
        Step.objects.filter(session__external_id__startswith="old-").values_list(
            "cost_usd", flat=True
        )
    ) == {expected}
    assert set(
        Session.objects.filter(external_id__startswith="old-").values_list("cost_usd", flat=True)
    ) == {expected}
