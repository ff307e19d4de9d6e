"""Budget alerts: signed webhooks and email, sent after commit through the outbox, once,
with retries.

The worker tests run a real Celery worker (tests/conftest.py: Redis when CELERY_BROKER_URL is
set, as in CI; else Celery's in-memory transport inside this process) fed by a beat thread,
against an HTTP receiver started here. The others dispatch the outbox in-process, as
guard_sweep does without a broker, with Django's locmem mail backend.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.db import transaction
from django.test import Client
from django.utils import timezone

from costboard.budgets.alert_messages import (
    SIGNATURE_TOLERANCE_SECONDS,
    alert_headline,
    verify_signature,
)
from costboard.budgets.alerts import DISPATCH, _claim, alert_addresses, alerts_dispatch, announce
from costboard.budgets.engine import Flag
from costboard.budgets.services import session_flag_runaway, session_recheck
from costboard.models import (
    AlertDelivery,
    BudgetEvent,
    OutboxItem,
    Project,
    Session,
    WebhookEndpoint,
)
from costboard.outbox import outbox_add, outbox_dispatch
from tests.conftest import Agent, add_price, make_agent
from tests.waiting import wait_until

SECRET = "whsec-test-0123456789abcdef"


# --- an HTTP receiver ----------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Records every POST; answers 200, or the statuses queued for a path first."""

    base_url: str = ""
    requests: list[Received] = field(default_factory=list)
    queued: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def answer_first(self, path: str, *statuses: int) -> None:
        with self.lock:
            self.queued[path] = list(statuses)

    def answer_always(self, path: str, status: int) -> None:
        self.answer_first(path, *[status] * 100)

    def take(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            statuses = self.queued.get(path) or [200]
            status = statuses.pop(0) if self.queued.get(path) else 200
            self.requests.append(Received(path, headers, body, status))
            return status

    def to(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    # on 127.0.0.1, where webhooks go only when allowed (test_egress.py: refused otherwise)
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = state.take(self.path, dict(self.headers.items()), body)
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def expected_signature(timestamp: str, body: bytes) -> str:
    """The test's own HMAC, independent of costboard.budgets.alerts."""
    digest = hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def step(session_id: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "type": "step",
        "session_id": session_id,
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }


def webhook(project: Project, receiver: Receiver, path: str, **fields: Any) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(
        project=project, url=receiver.url(path), secret=SECRET, **fields
    )


def deliveries_settled(**filters: Any) -> list[AlertDelivery]:
    rows = list(AlertDelivery.objects.filter(**filters).order_by("pk"))
    done = rows and all(d.status != AlertDelivery.Status.PENDING for d in rows)
    return rows if done else []


@pytest.fixture
def quick_retries(settings: Any) -> None:
    settings.COSTBOARD_ALERT_RETRY_SECONDS = 0.05
    settings.COSTBOARD_ALERT_MAX_ATTEMPTS = 3


# --- through a real worker -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_posts_one_signed_webhook_per_crossing(
    outbox_beat: None, receiver: Receiver, quick_retries: None, settings: Any
) -> None:
    settings.COSTBOARD_BASE_URL = "https://costboard.example"
    agent = make_agent("acme")
    add_price("test-sonnet")
    endpoint = webhook(agent.project, receiver, "/hook")
    before = math.floor(time.time())  # the deliveries are stamped after this…
    agent.events({"type": "session", "session_id": "chat-42", "token_cap": 1000})
    agent.events(step("chat-42", 500, 300))  # 800 tokens: 80%
    agent.events(step("chat-42", 100, 100))  # 1000 tokens: the cap

    deliveries = wait_until(
        lambda: len(rows := deliveries_settled(endpoint=endpoint)) == 2 and rows, what="2 sent"
    )
    after = time.time()  # …and before this
    assert deliveries  # (wait_until returns only what is truthy)
    assert [d.status for d in deliveries] == ["delivered", "delivered"]
    requests = receiver.to("/hook")
    assert len(requests) == 2  # one per crossing, nothing twice
    by_kind = {r.payload["kind"]: r for r in requests}
    assert set(by_kind) == {"soft_warned", "exhausted"}

    session = Session.objects.get(external_id="chat-42")
    for kind, tokens, cost in [("soft_warned", 800, "0.006"), ("exhausted", 1000, "0.0078")]:
        request = by_kind[kind]
        headers = request.headers
        timestamp = headers["X-Costboard-Timestamp"]
        assert headers["X-Costboard-Signature"] == expected_signature(timestamp, request.body)
        assert before <= int(timestamp) <= after  # the Unix time of the sending, in seconds
        assert verify_signature(
            SECRET, timestamp, request.body, headers["X-Costboard-Signature"], now=after
        )
        assert not verify_signature(
            "wrong", timestamp, request.body, headers["X-Costboard-Signature"]
        )
        assert headers["Content-Type"] == "application/json"
        assert headers["User-Agent"] == "Costboard"
        assert headers["X-Costboard-Event"] == kind
        event = BudgetEvent.objects.get(session=session, kind=kind)
        delivery = AlertDelivery.objects.get(budget_event=event)
        assert headers["X-Costboard-Delivery"] == str(delivery.pk)
        payload = request.payload
        assert payload["state"] in {"warning", "exhausted"}
        assert {k: v for k, v in payload.items() if k != "state"} == {
            "delivery_id": delivery.pk,
            "event_id": event.pk,
            "kind": kind,
            "at": event.at.isoformat(),
            "project": "acme",
            "session_id": "chat-42",
            "runaway": False,
            "tokens_used": tokens,
            "token_cap": 1000,
            "cost_usd": cost,
            "cost_cap_usd": "5.00",
            "detail": event.detail,
            "session_url": f"https://costboard.example/sessions/{session.pk}/?project=acme",
        }
        assert delivery.attempts == 1
        assert delivery.response_code == 200
        assert delivery.delivered_at is not None
    assert by_kind["exhausted"].payload["state"] == "exhausted"


@pytest.mark.slow
def test_a_receiver_failing_first_gets_the_alert_on_the_retry(
    outbox_beat: None, receiver: Receiver, quick_retries: None
) -> None:
    agent = make_agent("acme")
    add_price("test-sonnet")
    receiver.answer_first("/flaky", 500)
    endpoint = webhook(agent.project, receiver, "/flaky", kinds=["exhausted"])
    agent.events({"type": "session", "session_id": "chat-7", "token_cap": 1000})
    agent.events(step("chat-7", 600, 400))  # warned and exhausted at once; only one is wanted

    [delivery] = wait_until(lambda: deliveries_settled(endpoint=endpoint), what="delivery")
    assert delivery.status == AlertDelivery.Status.DELIVERED
    assert delivery.attempts == 2
    assert delivery.response_code == 200
    assert delivery.kind == "exhausted"
    first, second = receiver.to("/flaky")
    assert (first.status, second.status) == (500, 200)
    assert first.headers["X-Costboard-Delivery"] == second.headers["X-Costboard-Delivery"]
    assert first.body == second.body  # the same alert; signed afresh with its own timestamp
    assert second.headers["X-Costboard-Signature"] == expected_signature(
        second.headers["X-Costboard-Timestamp"], second.body
    )


@pytest.mark.slow
def test_a_receiver_answering_404_fails_at_once(
    outbox_beat: None, receiver: Receiver, quick_retries: None
) -> None:
    agent = make_agent("acme")
    add_price("test-sonnet")
    receiver.answer_always("/gone", 404)
    endpoint = webhook(agent.project, receiver, "/gone", kinds=["exhausted"])
    agent.events({"type": "session", "session_id": "chat-9", "token_cap": 1000})
    agent.events(step("chat-9", 600, 400))

    [delivery] = wait_until(lambda: deliveries_settled(endpoint=endpoint), what="delivery")
    assert delivery.status == AlertDelivery.Status.FAILED
    assert delivery.attempts == 1
    assert delivery.response_code == 404
    assert delivery.error.startswith("HTTP 404")
    assert delivery.delivered_at is None
    assert len(receiver.to("/gone")) == 1


@pytest.mark.slow
def test_a_receiver_failing_every_time_fails_after_the_last_attempt(
    outbox_beat: None, receiver: Receiver, quick_retries: None
) -> None:
    agent = make_agent("acme")
    add_price("test-sonnet")
    receiver.answer_always("/down", 503)
    endpoint = webhook(agent.project, receiver, "/down", kinds=["exhausted"])
    agent.events({"type": "session", "session_id": "chat-3", "token_cap": 1000})
    agent.events(step("chat-3", 600, 400))

    [delivery] = wait_until(lambda: deliveries_settled(endpoint=endpoint), what="delivery")
    assert delivery.status == AlertDelivery.Status.FAILED
    assert delivery.attempts == 3  # COSTBOARD_ALERT_MAX_ATTEMPTS
    assert delivery.response_code == 503
    assert len(receiver.to("/down")) == 3


@pytest.mark.slow
def test_dispatching_an_event_twice_sends_it_once(
    outbox_beat: None, receiver: Receiver, quick_retries: None
) -> None:
    def exhausted_event(slug: str, path: str) -> BudgetEvent:
        project = Project.objects.create(name=slug, slug=slug)
        webhook(project, receiver, path)
        session = Session.objects.create(project=project, external_id="s")
        return BudgetEvent.objects.create(  # no announce: the test dispatches by hand
            project=project, session=session, kind="exhausted", at=timezone.now(), tokens_used=9
        )

    event = exhausted_event("twice", "/twice")
    exhausted_event("other", "/other")  # an event nobody dispatches: nothing is sent for it
    outbox_add(DISPATCH, {"event_ids": [event.pk]})
    outbox_add(DISPATCH, {"event_ids": [event.pk]})
    wait_until(lambda: not OutboxItem.objects.exists(), what="the outbox to empty")

    [delivery] = AlertDelivery.objects.filter(budget_event=event)
    assert delivery.status == AlertDelivery.Status.DELIVERED
    assert delivery.attempts == 1
    assert len(receiver.to("/twice")) == 1
    assert receiver.to("/other") == []


# --- eagerly, in-process -------------------------------------------------------------------------


@pytest.fixture
def emailed(agent: Agent) -> Agent:
    add_price("test-sonnet")
    Project.objects.filter(pk=agent.project.pk).update(
        alert_emails="ops@example.com, not-an-address\nlead@example.com;ops@example.com"
    )
    return agent


def test_alerts_are_emailed_to_the_projects_addresses(
    emailed: Agent,
    mailoutbox: list[mail.EmailMessage],
    caplog: pytest.LogCaptureFixture,
) -> None:
    emailed.events({"type": "session", "session_id": "chat-42", "token_cap": 1000})
    emailed.events(step("chat-42", 500, 300))
    assert mailoutbox == []  # nothing is sent from the request
    with caplog.at_level(logging.WARNING, logger="costboard.budgets.alerts"):
        outbox_dispatch()
    emailed.events(step("chat-42", 100, 100))
    outbox_dispatch()

    assert [(m.subject, m.to) for m in mailoutbox] == [
        ("[Costboard] acme: session chat-42 passed 80% of its token cap", ["ops@example.com"]),
        ("[Costboard] acme: session chat-42 passed 80% of its token cap", ["lead@example.com"]),
        ("[Costboard] acme: session chat-42 exhausted its token cap", ["ops@example.com"]),
        ("[Costboard] acme: session chat-42 exhausted its token cap", ["lead@example.com"]),
    ]
    session = Session.objects.get(external_id="chat-42")
    body = mailoutbox[-1].body
    assert "Session chat-42 of project acme exhausted its token cap." in body
    assert "Tokens used: 1,000 of 1,000" in body
    assert "Cost:        $0.0078 of $5.00" in body
    assert f"/sessions/{session.pk}/?project=acme" in body
    assert "'not-an-address' is not a valid address; skipped" in caplog.text
    deliveries = AlertDelivery.objects.filter(channel="email")
    assert deliveries.count() == 4
    assert {d.status for d in deliveries} == {"delivered"}


def test_a_session_id_with_a_line_break_is_emailed_on_one_subject_line(
    emailed: Agent, mailoutbox: list[mail.EmailMessage]
) -> None:
    """A session id (or a tag value) is any string an agent sent, a line break included; an
    email's subject is one header line: the alert still goes out, its id kept in the body."""
    emailed.events({"type": "session", "session_id": "chat\n42", "token_cap": 1000})
    emailed.events(step("chat\n42", 1000, 0))  # past 80 % and the cap
    outbox_dispatch()
    assert sorted({m.subject for m in mailoutbox}) == [
        "[Costboard] acme: session chat 42 exhausted its token cap",
        "[Costboard] acme: session chat 42 passed 80% of its token cap",
    ]
    assert len(mailoutbox) == 4
    assert "Session chat\n42 of project acme exhausted its token cap." in mailoutbox[-1].body
    assert set(AlertDelivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_cap_change_sends_nothing(emailed: Agent, mailoutbox: list[mail.EmailMessage]) -> None:
    emailed.events({"type": "session", "session_id": "s", "token_cap": 1000}, step("s", 10, 10))
    emailed.events({"type": "session", "session_id": "s", "token_cap": 2000})
    assert BudgetEvent.objects.filter(kind="cap_changed").count() == 1
    assert not OutboxItem.objects.filter(kind=DISPATCH).exists()
    assert outbox_dispatch().claimed == 0
    assert mailoutbox == []
    assert not AlertDelivery.objects.exists()


def test_a_rolled_back_transaction_sends_nothing(
    emailed: Agent, mailoutbox: list[mail.EmailMessage]
) -> None:
    emailed.events(step("s", 10, 10))
    session = Session.objects.get(external_id="s")

    def exhausted() -> BudgetEvent:
        return BudgetEvent.objects.create(
            project=emailed.project,
            session=session,
            kind="exhausted",
            at=timezone.now(),
            tokens_used=1,
        )

    class Rollback(Exception):
        pass

    OutboxItem.objects.all().delete()  # the step's memory detection: not what is tested
    with pytest.raises(Rollback), transaction.atomic():
        announce([exhausted()])
        raise Rollback
    assert not OutboxItem.objects.exists()
    assert outbox_dispatch().claimed == 0
    assert mailoutbox == []

    with transaction.atomic():
        announce([exhausted()])
    assert OutboxItem.objects.get().kind == DISPATCH
    assert outbox_dispatch().done == 3  # the dispatch and a delivery per address
    assert len(mailoutbox) == 2
    assert not OutboxItem.objects.exists()


def test_dispatching_twice_in_process_sends_once(
    emailed: Agent, mailoutbox: list[mail.EmailMessage]
) -> None:
    emailed.events(step("s", 10, 10))
    session = Session.objects.get(external_id="s")
    event = BudgetEvent.objects.create(
        project=emailed.project,
        session=session,
        kind="soft_warned",
        at=timezone.now(),
        tokens_used=1,
    )
    assert alerts_dispatch([event.pk]) == 2  # two addresses: an attempt queued for each
    assert alerts_dispatch([event.pk]) == 0
    assert AlertDelivery.objects.filter(budget_event=event).count() == 2
    assert OutboxItem.objects.filter(kind="alert.deliver").count() == 2
    outbox_dispatch()
    assert len(mailoutbox) == 2


def test_a_runaway_flag_is_announced_once(
    emailed: Agent, mailoutbox: list[mail.EmailMessage]
) -> None:
    emailed.events({"type": "session", "session_id": "loop"}, step("loop", 600, 400))
    session = Session.objects.get(external_id="loop")
    session_flag_runaway(
        session_id=session.pk, flag=Flag(timezone.now(), "retry_loop", "retry_loop")
    )
    session_flag_runaway(
        session_id=session.pk, flag=Flag(timezone.now(), "retry_loop", "retry_loop")
    )
    outbox_dispatch()
    runaway = "[Costboard] acme: session loop looks runaway (retry_loop)"
    assert [m.subject for m in mailoutbox].count(runaway) == 2  # once per address
    alerted = BudgetEvent.objects.filter(session=session).exclude(kind="cap_changed")
    assert len(mailoutbox) == 2 * alerted.count()  # and a stop (exhausted), if the project stops


def test_a_recheck_is_announced(emailed: Agent, mailoutbox: list[mail.EmailMessage]) -> None:
    emailed.events({"type": "session", "session_id": "s", "token_cap": 10_000}, step("s", 600, 400))
    session = Session.objects.get(external_id="s")
    Session.objects.filter(pk=session.pk).update(token_cap=1000)
    session_recheck(session_id=session.pk, at=timezone.now())
    outbox_dispatch()
    assert sorted(m.subject for m in mailoutbox) == [
        "[Costboard] acme: session s exhausted its token cap",
        "[Costboard] acme: session s exhausted its token cap",
        "[Costboard] acme: session s passed 80% of its token cap",
        "[Costboard] acme: session s passed 80% of its token cap",
    ]


@pytest.mark.parametrize(
    ("kind", "detail", "headline"),
    [
        ("exhausted", {}, "exhausted its token and cost caps"),
        (
            "exhausted",
            {"reason": "runaway", "runaway": "burn rate"},
            "was stopped as runaway (burn rate)",
        ),
        ("soft_warned", {"warn_at_pct": "0.5"}, "passed 50% of its token and cost caps"),
        (
            "runaway",
            {"rule": "retry_loop", "reason": "7 failed steps in a row"},
            "looks runaway (7 failed steps in a row)",
        ),
    ],
)
def test_the_headline_says_what_happened(kind: str, detail: dict[str, Any], headline: str) -> None:
    payload = {
        "kind": kind,
        "detail": detail,
        "tokens_used": 1000,
        "token_cap": 1000,
        "cost_usd": "5.00",
        "cost_cap_usd": "5.00",
    }
    assert alert_headline(payload) == headline


def test_without_a_broker_a_failed_webhook_is_retried_with_back_off(
    agent: Agent, receiver: Receiver, settings: Any
) -> None:
    settings.COSTBOARD_ALERT_RETRY_SECONDS = 30
    settings.COSTBOARD_ALERT_MAX_ATTEMPTS = 3
    add_price("test-sonnet")
    receiver.answer_first("/down", 500, 503)
    endpoint = webhook(agent.project, receiver, "/down", kinds=["soft_warned"])
    with time_machine.travel(timezone.now(), tick=False) as clock:  # turned by hand below
        agent.events({"type": "session", "session_id": "s", "token_cap": 1000})
        agent.events(step("s", 500, 300))
        assert receiver.requests == []  # the request never waits on the receiver

        outbox_dispatch()  # guard_sweep's pass
        [delivery] = AlertDelivery.objects.filter(endpoint=endpoint)
        assert (delivery.status, delivery.attempts, delivery.response_code) == ("pending", 1, 500)
        assert delivery.error.startswith("HTTP 500")
        item = OutboxItem.objects.get(kind="alert.deliver")
        assert item.attempts == 1 and item.last_error.startswith("DeliveryFailed: HTTP 500")
        # COSTBOARD_ALERT_RETRY_SECONDS × 2⁰
        assert item.next_attempt_at == timezone.now() + timedelta(seconds=30)
        clock.shift(29)
        outbox_dispatch()  # not yet due: nothing is sent
        assert len(receiver.to("/down")) == 1
        clock.shift(1)
        outbox_dispatch()
        item.refresh_from_db()
        assert item.next_attempt_at == timezone.now() + timedelta(seconds=60)  # × 2¹
        clock.shift(60)
        outbox_dispatch()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("delivered", 3, 200)
    assert [r.status for r in receiver.to("/down")] == [500, 503, 200]
    assert not OutboxItem.objects.exists()


def test_an_endpoint_gets_only_the_kinds_it_asked_for(agent: Agent, receiver: Receiver) -> None:
    add_price("test-sonnet")
    webhook(agent.project, receiver, "/runaway-only", kinds=["runaway"])
    webhook(agent.project, receiver, "/off", active=False)
    agent.events({"type": "session", "session_id": "s", "token_cap": 1000})
    agent.events(step("s", 600, 400))
    outbox_dispatch()
    assert receiver.requests == []
    assert not AlertDelivery.objects.exists()
    # positive control: the kind it asked for reaches it, and only it
    session = Session.objects.get(external_id="s")
    session_flag_runaway(session_id=session.pk, flag=Flag(timezone.now(), "loop", "loop"))
    outbox_dispatch()
    assert [r.path for r in receiver.requests] == ["/runaway-only"]
    assert json.loads(receiver.requests[0].body)["kind"] == "runaway"


def test_a_delivery_in_flight_is_not_claimed_twice(emailed: Agent) -> None:
    emailed.events(step("s", 10, 10))
    session = Session.objects.get(external_id="s")
    event = BudgetEvent.objects.create(
        project=emailed.project, session=session, kind="exhausted", at=timezone.now(), tokens_used=1
    )
    delivery = AlertDelivery.objects.create(
        project=emailed.project, budget_event=event, channel="email", target="ops@example.com"
    )
    now = timezone.now()
    assert _claim(delivery.pk, now) == 1
    assert _claim(delivery.pk, now) is None  # in flight
    AlertDelivery.objects.filter(pk=delivery.pk).update(error="HTTP 500")
    assert _claim(delivery.pk, now) == 2  # the last attempt finished: a retry may claim it
    assert _claim(delivery.pk, now + timedelta(minutes=10)) == 3  # its worker died: lease over
    AlertDelivery.objects.filter(pk=delivery.pk).update(status="delivered")
    assert _claim(delivery.pk, now + timedelta(hours=1)) is None


def test_signatures_are_checked_in_constant_time_and_refuse_replays() -> None:
    body = b'{"kind":"exhausted"}'
    now = 1_767_268_800  # the receiver's clock, given: 2026-01-01 12:00 UTC
    timestamp = str(now)
    header = expected_signature(timestamp, body)
    assert verify_signature(SECRET, timestamp, body, header, now=now)
    assert verify_signature(SECRET, timestamp, body.decode(), f"sha256=old, {header}", now=now)
    assert not verify_signature(SECRET, timestamp, body + b" ", header, now=now)
    assert not verify_signature(SECRET, str(now + 1), body, header, now=now)
    assert not verify_signature(SECRET, "soon", body, header, now=now)
    limit = SIGNATURE_TOLERANCE_SECONDS
    for age, fresh in [(limit, True), (limit + 1, False)]:  # the tolerance, to the second
        sent = str(now - age)
        signed = expected_signature(sent, body)
        assert verify_signature(SECRET, sent, body, signed, now=now) is fresh
    old = str(now - 3600)
    assert not verify_signature(SECRET, old, body, expected_signature(old, body), now=now)
    assert verify_signature(
        SECRET, old, body, expected_signature(old, body), tolerance_seconds=None, now=now
    )
    with time_machine.travel(now, tick=False):  # without `now`: the machine's clock
        assert verify_signature(SECRET, timestamp, body, header)
        assert not verify_signature(SECRET, old, body, expected_signature(old, body))


def test_alert_addresses_are_split_validated_and_deduplicated() -> None:
    text = " a@example.com,b@example.com\n\nnope  c@example.com;a@example.com "
    assert alert_addresses(text) == ["a@example.com", "b@example.com", "c@example.com"]
    # one mailbox in another case is one recipient, not a second mail (the first spelling)
    assert alert_addresses("Ann@Example.com\nann@example.com ANN@EXAMPLE.COM") == [
        "Ann@Example.com"
    ]
    assert alert_addresses("") == []


# --- the admin -----------------------------------------------------------------------------------


def test_the_delivery_log_retries_failed_deliveries(
    staff: Client,
    emailed: Agent,
    mailoutbox: list[mail.EmailMessage],
) -> None:
    emailed.events(step("s", 10, 10))
    session = Session.objects.get(external_id="s")
    event = BudgetEvent.objects.create(
        project=emailed.project, session=session, kind="exhausted", at=timezone.now(), tokens_used=1
    )
    failed = AlertDelivery.objects.create(
        project=emailed.project,
        budget_event=event,
        channel="email",
        target="ops@example.com",
        status="failed",
        attempts=6,
        error="SMTPServerDisconnected: gone",
    )
    done = AlertDelivery.objects.create(
        project=emailed.project,
        budget_event=event,
        channel="email",
        target="lead@example.com",
        status="delivered",
        attempts=1,
    )
    page = staff.get("/admin/costboard/alertdelivery/")
    assert page.status_code == 200
    assert b"ops@example.com" in page.content
    assert b"Retry selected deliveries" in page.content
    assert staff.get(f"/admin/costboard/alertdelivery/{failed.pk}/change/").status_code == 200

    response = staff.post(
        "/admin/costboard/alertdelivery/",
        {"action": "retry_deliveries", "_selected_action": [failed.pk, done.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert mailoutbox == []  # queued: the dispatcher sends it, not the admin's request
    outbox_dispatch()
    failed.refresh_from_db()
    assert (failed.status, failed.attempts, failed.error) == ("delivered", 7, "")
    assert [m.to for m in mailoutbox] == [["ops@example.com"]]
    done.refresh_from_db()
    assert done.attempts == 1


def test_webhook_endpoints_are_edited_with_a_write_only_secret(staff: Client, agent: Agent) -> None:
    add = staff.post(
        "/admin/costboard/webhookendpoint/add/",
        {
            "project": agent.project.pk,
            "name": "pager",
            "url": "https://hooks.example.com/costboard",
            "secret": SECRET,
            "kinds": ["exhausted", "runaway"],
            "active": "on",
        },
    )
    assert add.status_code == 302, add.content
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.secret, endpoint.kinds) == (SECRET, ["exhausted", "runaway"])

    page = staff.get(f"/admin/costboard/webhookendpoint/{endpoint.pk}/change/")
    assert SECRET.encode() not in page.content
    assert SECRET[-4:].encode() in page.content  # masked: ••••cdef
    edit = staff.post(
        f"/admin/costboard/webhookendpoint/{endpoint.pk}/change/",
        {
            "project": agent.project.pk,
            "name": "pager",
            "url": "https://hooks.example.com/costboard",
            "secret": "",
            "kinds": ["exhausted"],
            "active": "on",
        },
    )
    assert edit.status_code == 302, edit.content
    endpoint.refresh_from_db()
    assert (endpoint.secret, endpoint.kinds) == (SECRET, ["exhausted"])
    assert staff.get("/admin/costboard/webhookendpoint/").status_code == 200
    project_page = staff.get(f"/admin/costboard/project/{agent.project.pk}/change/")
    assert project_page.status_code == 200
    assert b"Webhook endpoint" in project_page.content


# --- settings -------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]


def _settings_value(name: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EMAIL_", "DJANGO_EMAIL"))}
    code = (
        f"import django; django.setup(); from django.conf import settings; print(settings.{name})"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "costboard.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_without_an_email_host_mail_goes_to_the_console() -> None:
    assert _settings_value("EMAIL_BACKEND").stdout.strip() == (
        "django.core.mail.backends.console.EmailBackend"
    )
    smtp = _settings_value("EMAIL_BACKEND", EMAIL_HOST="smtp.example.com")
    assert smtp.stdout.strip() == "django.core.mail.backends.smtp.EmailBackend"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COSTBOARD_ALERT_MAX_ATTEMPTS", "0"),
        ("COSTBOARD_ALERT_CONCURRENCY", "0"),
        ("COSTBOARD_BASE_URL", "costboard.example.com"),
    ],
)
def test_a_bad_alert_setting_stops_startup_naming_it(name: str, value: str) -> None:
    result = _settings_value("COSTBOARD_BASE_URL", **{name: value})
    assert result.returncode != 0
    assert name in result.stderr
