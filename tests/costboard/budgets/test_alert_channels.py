"""Alert channels (docs/budgets.md, "Alerts"): Slack and PagerDuty beside webhooks and email,
chosen per budget or by the project's defaults, sent through the outbox with the webhooks'
retries, and PagerDuty's incidents resolved when what paged is over.

The receivers are one real local HTTP server (`Hook`) standing in for Slack's incoming
webhook and PagerDuty's Events API (COSTBOARD_PAGERDUTY_EVENTS_URL points at it); it can be
stopped and started again on its port, and told to answer a status or garbage. The outbox is
dispatched in-process, as guard_sweep does without a broker, under an injected clock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from costboard.budgets.alert_senders import email_send, message_id
from costboard.budgets.alerts import alerts_dispatch, incidents_resolve
from costboard.budgets.period_services import (
    BudgetInputError,
    period_budget_create,
    period_budget_update,
)
from costboard.budgets.sweep import runaway_sweep
from costboard.models import (
    AlertDelivery,
    ApiKey,
    BudgetEvent,
    OutboxItem,
    PeriodBudget,
    PeriodLedger,
    Project,
    Session,
    WebhookEndpoint,
)
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent, project_admin_fields, run_in_threads
from tests.servers import free_port, wait_for_port

KEY = "R0" + "abcdefghij0123456789ABCDEF1234"[:30]  # 32 letters and digits
SLACK = "/services/T000/B000/slacksecret"
EVENTS = "/v2/enqueue"
NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
GARBAGE = -1  # a status that means: answer bytes that are no HTTP reply


# --- Slack's and PagerDuty's stand-in ----------------------------------------------------------


@dataclass
class Hook:
    """A local HTTP server on a port of its own: records each POST (path and JSON body) and
    answers the statuses queued for its path first (GARBAGE: not HTTP at all), then 200 for
    Slack's path and 202 for PagerDuty's. `stop()` closes the port; `start()` opens it again."""

    port: int = field(default_factory=free_port)
    requests: list[tuple[str, Any]] = field(default_factory=list)
    queued: dict[str, list[int]] = field(default_factory=dict)
    location: str = ""  # the Location a 3xx answer names
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer_first(self, path: str, *statuses: int) -> None:
        with self.lock:
            self.queued[path] = list(statuses)

    def to(self, path: str) -> list[Any]:
        with self.lock:
            return [body for p, body in self.requests if p == path]

    def start(self) -> Hook:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with state.lock:
                    queued = state.queued.get(self.path) or []
                    status = queued.pop(0) if queued else (202 if self.path == EVENTS else 200)
                    state.requests.append((self.path, json.loads(body)))
                if status == GARBAGE:
                    self.wfile.write(b"this is not HTTP\r\n\r\n")
                    return
                reply = b'{"status":"success"}' if status < 300 else b'{"status":"invalid"}'
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", state.location)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        wait_for_port(self.port, up=True)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        wait_for_port(self.port, up=False)


@pytest.fixture
def hook(settings: Any) -> Iterator[Hook]:
    # on 127.0.0.1, where Slack URLs go only when allowed (as webhooks: test_egress.py)
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    settings.COSTBOARD_BASE_URL = "https://costboard.example"
    settings.COSTBOARD_ALERT_RETRY_SECONDS = 30
    settings.COSTBOARD_ALERT_MAX_ATTEMPTS = 4
    server = Hook().start()
    settings.COSTBOARD_PAGERDUTY_EVENTS_URL = f"{server.url}{EVENTS}"
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(NOW, tick=False) as traveller:  # turned by hand
        yield traveller


def set_up(project: Project, hook: Hook, *, channels: list[str]) -> None:
    project.slack_webhook_url = f"{hook.url}{SLACK}"
    project.pagerduty_routing_key = KEY
    project.alert_channels = channels
    project.runaway_burn_factor = 0  # spends of a million tokens a minute are these tests' own
    project.full_clean()  # what the admin checks, and it passes
    project.save()


def spend(agent: Agent, session: str, input_tokens: int, **caps: Any) -> None:
    """A step of `input_tokens` at $3 per million (add_price's rate) in a session with
    generous caps unless `caps` say otherwise."""
    agent.events(
        {
            "type": "session",
            "session_id": session,
            "token_cap": caps.get("token_cap", 10**9),
            "cost_cap_usd": caps.get("cost_cap_usd", "1000.00"),
        },
        {
            "type": "step",
            "session_id": session,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": input_tokens,
            "output_tokens": 0,
        },
    )


def budget(project: Project, **fields: Any) -> PeriodBudget:
    values = {"name": "monthly", "cost_limit_usd": "5.00", "action": "stop", **fields}
    return period_budget_create(project=project, fields=values, now=timezone.now())


def exhausted_budget(agent: Agent, **fields: Any) -> PeriodBudget:
    """A $5 monthly stop budget spent to $6 in two steps: soft_warned and exhausted."""
    add_price("test-sonnet")
    made = budget(agent.project, **fields)
    spend(agent, "s-1", 1_000_000)  # $3.00
    spend(agent, "s-2", 1_000_000)  # $6.00: past 80 % and the limit in one step
    return made


def dedup_of(made: PeriodBudget) -> str:
    return f"costboard:acme:budget:{made.pk}::2026-11-01T00:00:00+00:00"


def actions(hook: Hook) -> list[tuple[str, str]]:
    return [(event["event_action"], event["dedup_key"]) for event in hook.to(EVENTS)]


# --- the payloads --------------------------------------------------------------------------


def test_slack_and_pagerduty_get_the_documented_payloads(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["webhook", "email"])
    made = exhausted_budget(agent, channels=["slack", "pagerduty"])
    assert hook.requests == []  # nothing from the request: the outbox sends
    outbox_dispatch()

    slack = hook.to(SLACK)
    assert len(slack) == 2  # soft_warned and exhausted, once each
    link = f"https://costboard.example/budgets/{made.pk}/"
    exhausted = slack[1]
    assert exhausted == {
        "text": "acme: budget 'monthly' (month from 2026-11-01T00:00:00+00:00) exhausted its "
        f"cost cap {link}",
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": "*acme: budget 'monthly' (month from 2026-11-01T00:00:00+00:00) "
                    "exhausted its cost cap*",
                },
            },
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*Budget*\nmonthly (id {made.pk})"},
                    {"type": "mrkdwn", "text": "*Scope*\nproject"},
                    {"type": "mrkdwn", "text": "*Spend / limit*\n$6.00 / $5.00"},
                    # $6 by noon of the 10th: $12 a day for the 20.5 days left, and the $6
                    {"type": "mrkdwn", "text": "*Forecast*\n$252.00 by the period's end"},
                    {
                        "type": "mrkdwn",
                        "text": "*Period*\nmonth from 2026-11-01T00:00:00+00:00",
                    },
                    {"type": "mrkdwn", "text": "*Project*\nacme"},
                ],
            },
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": "Costboard · exhausted at 2026-11-10T12:00:00+00:00 · "
                        f"<{link}|Open in Costboard>",
                    }
                ],
            },
        ],
    }
    assert "passed 80% of its cost cap" in slack[0]["text"]

    [trigger] = hook.to(EVENTS)  # the warning pages no one
    assert trigger == {
        "routing_key": KEY,
        "event_action": "trigger",
        "dedup_key": dedup_of(made),
        "payload": {
            "summary": "acme: budget 'monthly' (month from 2026-11-01T00:00:00+00:00) "
            "exhausted its cost cap",
            "source": "costboard.example",
            "severity": "critical",  # a stop budget: agents are told to stop
            "timestamp": "2026-11-10T12:00:00+00:00",
            "component": "monthly",
            "group": "acme",
            "class": "exhausted",
            "custom_details": {
                "Budget": f"monthly (id {made.pk})",
                "Scope": "project",
                "Spend / limit": "$6.00 / $5.00",
                "Forecast": "$252.00 by the period's end",
                "Period": "month from 2026-11-01T00:00:00+00:00",
                "Project": "acme",
            },
        },
        "client": "Costboard",
        "client_url": "https://costboard.example",
        "links": [{"href": link, "text": "Open in Costboard"}],
    }
    deliveries = AlertDelivery.objects.order_by("pk")
    assert [(d.channel, d.action, d.status, d.response_code) for d in deliveries] == [
        ("slack", "trigger", "delivered", 200),
        ("slack", "trigger", "delivered", 200),
        ("pagerduty", "trigger", "delivered", 202),
    ]
    assert not OutboxItem.objects.exists()


def test_a_per_member_budget_names_its_member_in_the_dedup_key(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])
    add_price("test-sonnet")
    made = budget(agent.project, scope="user", scope_value="*", action="warn")
    agent.events(
        {
            "type": "session",
            "session_id": "u",
            "user_id": "u-7",
            "token_cap": 10**9,
            "cost_cap_usd": "1000",
        },
        {
            "type": "step",
            "session_id": "u",
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 2_000_000,
        },
    )
    outbox_dispatch()
    [trigger] = hook.to(EVENTS)
    assert trigger["dedup_key"] == f"costboard:acme:budget:{made.pk}:u-7:2026-11-01T00:00:00+00:00"
    assert trigger["payload"]["severity"] == "error"  # a warn budget stops nothing
    assert trigger["payload"]["custom_details"]["Scope"] == "user * (member u-7)"


# --- resolves: trigger, then resolve with the same dedup_key -----------------------------------


def test_the_period_rolling_over_resolves_the_incident_once(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])
    made = exhausted_budget(agent)
    outbox_dispatch()
    runaway_sweep()  # the same period: nothing to resolve
    outbox_dispatch()
    assert actions(hook) == [("trigger", dedup_of(made))]

    clock.move_to(datetime(2026, 12, 1, 0, 0, 30, tzinfo=UTC))  # the month rolled over
    runaway_sweep()
    runaway_sweep()  # a second pass makes no second resolve
    outbox_dispatch()
    assert actions(hook) == [("trigger", dedup_of(made)), ("resolve", dedup_of(made))]
    assert hook.to(EVENTS)[1] == {
        "routing_key": KEY,
        "event_action": "resolve",
        "dedup_key": dedup_of(made),
    }
    resolve = AlertDelivery.objects.get(action="resolve")
    assert (resolve.status, resolve.attempts, resolve.channel) == ("delivered", 1, "pagerduty")


def test_a_rolling_budget_s_incident_is_resolved_once_its_window_moves_past_the_spend(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])
    add_price("test-sonnet")
    made = budget(agent.project, name="day", period="rolling", window_hours=24)
    spend(agent, "s-1", 1_000_000)  # $3.00 at NOW (12:00)
    spend(agent, "s-2", 1_000_000)  # $6.00 of $5 in the last 24 hours: exhausted
    outbox_dispatch()
    dedup = f"costboard:acme:budget:{made.pk}::1970-01-01T00:00:00+00:00"
    assert actions(hook) == [("trigger", dedup)]

    # 11:00 the next day: the spend's hour is still in the window
    clock.move_to(NOW + timedelta(hours=23))
    runaway_sweep(now=NOW + timedelta(hours=23))
    outbox_dispatch()
    assert actions(hook) == [("trigger", dedup)]

    # 12:00: it has left the window, with nothing sent since: the ledger still holds the
    # window's totals at its last batch, the window now is empty
    later = NOW + timedelta(hours=24)
    clock.move_to(later)
    ledger = PeriodLedger.objects.get(budget=made)
    assert (ledger.state, ledger.cost_usd) == ("exhausted", Decimal("6.00"))
    runaway_sweep(now=later)
    runaway_sweep(now=later)  # a second pass makes no second resolve
    outbox_dispatch()
    assert actions(hook) == [("trigger", dedup), ("resolve", dedup)]
    assert hook.to(EVENTS)[1] == {"routing_key": KEY, "event_action": "resolve", "dedup_key": dedup}
    assert sorted(AlertDelivery.objects.values_list("action", "status", "attempts")) == [
        ("resolve", "delivered", 1),
        ("trigger", "delivered", 1),
    ]


def test_a_rolling_budget_s_next_episode_pages_an_incident_its_last_resolve_leaves_open(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    """Exhausted, then under (the window moved past the spend: resolved), then exhausted
    again: a second incident. The first one's resolve, retried after PagerDuty answered 500,
    goes out after the second trigger: it must not close the second incident."""
    set_up(agent.project, hook, channels=["pagerduty"])
    add_price("test-sonnet")
    made = budget(agent.project, name="day", period="rolling", window_hours=24)
    spend(agent, "s-1", 2_000_000)  # $6.00 of $5 in the last 24 hours: exhausted
    outbox_dispatch()
    first = f"costboard:acme:budget:{made.pk}::1970-01-01T00:00:00+00:00"
    assert actions(hook) == [("trigger", first)]

    later = NOW + timedelta(hours=24)  # the spend has left the window: resolved
    clock.move_to(later)
    runaway_sweep(now=later)
    hook.answer_first(EVENTS, 500)  # the resolve's first attempt fails
    outbox_dispatch()
    spend(agent, "s-2", 2_000_000)  # $6.00 again: the next episode, exhausted
    outbox_dispatch()
    clock.shift(30)  # the resolve's back-off
    outbox_dispatch()
    sent = actions(hook)
    assert [action for action, _ in sent] == ["trigger", "resolve", "trigger", "resolve"]
    assert sent[1] == sent[3] == ("resolve", first)
    second = sent[2][1]
    assert second == f"{first}:episode:1"  # its own incident, still open
    assert PeriodLedger.objects.get(budget=made).state == "exhausted"

    clock.move_to(later + timedelta(hours=24))  # and it is resolved in its turn
    runaway_sweep(now=later + timedelta(hours=24))
    outbox_dispatch()
    assert actions(hook)[4:] == [("resolve", second)]


def test_raising_the_limit_resolves_after_the_trigger_went_out(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])
    hook.answer_first(EVENTS, 500)  # the trigger's first attempt fails
    made = exhausted_budget(agent)
    outbox_dispatch()
    trigger = AlertDelivery.objects.get(action="trigger")
    assert (trigger.status, trigger.response_code) == ("pending", 500)

    period_budget_update(made, changes={"cost_limit_usd": "10.00"})  # $6 of $10: not exhausted
    assert PeriodLedger.objects.get(budget=made).state == "ok"
    outbox_dispatch()  # the resolve waits: its trigger is still to go out
    assert actions(hook) == [("trigger", dedup_of(made))]
    assert AlertDelivery.objects.get(action="resolve").attempts == 0

    clock.shift(30)  # the trigger's back-off and the resolve's wait
    outbox_dispatch()
    clock.shift(30)
    outbox_dispatch()
    assert actions(hook) == [
        ("trigger", dedup_of(made)),
        ("trigger", dedup_of(made)),
        ("resolve", dedup_of(made)),
    ]
    assert sorted(AlertDelivery.objects.values_list("action", "status", "attempts")) == [
        ("resolve", "delivered", 1),
        ("trigger", "delivered", 2),
    ]
    assert not OutboxItem.objects.exists()


def test_acknowledging_a_session_resolves_its_incident(
    agent: Agent, hook: Hook, staff: Client, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])  # session alerts: the defaults
    add_price("test-sonnet")
    spend(agent, "chat-9", 1000, token_cap=1000)
    outbox_dispatch()
    session = Session.objects.get(external_id="chat-9")
    dedup = f"costboard:acme:session:{session.pk}"
    assert actions(hook) == [("trigger", dedup)]
    assert (
        hook.to(EVENTS)[0]["payload"]["summary"] == "acme: session chat-9 exhausted its token cap"
    )

    assert staff.post(f"/flagged/{session.pk}/acknowledge/").status_code == 303
    outbox_dispatch()
    assert actions(hook) == [("trigger", dedup), ("resolve", dedup)]
    # acknowledged again (here: in the admin), nothing more to resolve
    staff.post(
        "/admin/costboard/session/",
        {"action": "acknowledge", "_selected_action": [session.pk]},
    )
    runaway_sweep()
    outbox_dispatch()
    assert len(actions(hook)) == 2


def test_the_admin_acknowledges_and_resolves(
    agent: Agent, hook: Hook, staff: Client, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])
    add_price("test-sonnet")
    spend(agent, "chat-10", 1000, token_cap=1000)
    outbox_dispatch()
    session = Session.objects.get(external_id="chat-10")
    response = staff.post(
        "/admin/costboard/session/",
        {"action": "acknowledge", "_selected_action": [session.pk]},
    )
    assert response.status_code == 302
    assert Session.objects.get(pk=session.pk).acknowledged_by == "root"
    outbox_dispatch()
    assert [action for action, _ in actions(hook)] == ["trigger", "resolve"]


# --- retries ------------------------------------------------------------------------------------


def test_a_receiver_down_gets_the_alert_once_when_it_is_back(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["slack"])
    hook.stop()
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)  # $3 of $1: soft_warned and exhausted
    outbox_dispatch()
    deliveries = list(AlertDelivery.objects.order_by("pk"))
    assert [(d.status, d.attempts, d.response_code) for d in deliveries] == [
        ("pending", 1, None)
    ] * 2
    assert all(d.error.startswith("cannot connect") for d in deliveries)

    hook.start()
    clock.shift(29)
    outbox_dispatch()  # not due yet
    assert hook.to(SLACK) == []
    clock.shift(1)
    outbox_dispatch()
    outbox_dispatch()
    assert len(hook.to(SLACK)) == 2  # each once
    assert [(d.status, d.attempts) for d in AlertDelivery.objects.order_by("pk")] == [
        ("delivered", 2),
        ("delivered", 2),
    ]
    assert not OutboxItem.objects.exists()


def test_a_rolling_budget_s_alert_sent_late_shows_the_window_its_spend_is_of(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    """Slack down for three hours: the alert, sent when it is back, names the window its
    $6.00 was counted in (11:00 to 13:00), not the window at the send, which holds none of it."""
    set_up(agent.project, hook, channels=["slack"])
    hook.stop()
    add_price("test-sonnet")
    budget(agent.project, name="day", period="rolling", window_hours=2)
    spend(agent, "s", 2_000_000)  # $6.00 of $5 at 12:00: soft_warned and exhausted
    outbox_dispatch()
    clock.shift(3 * 3600)
    hook.start()
    outbox_dispatch()
    messages = hook.to(SLACK)
    assert len(messages) == 2
    for message in messages:
        assert "(rolling from 2026-11-10T11:00:00+00:00)" in message["text"]
        assert [f["text"] for f in message["blocks"][1]["fields"]][2:4] == [
            "*Spend / limit*\n$6.00 / $5.00",
            "*Period*\nrolling from 2026-11-10T11:00:00+00:00",
        ]


def test_garbage_and_500_are_retried_and_400_fails_at_once(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["pagerduty"])
    hook.answer_first(EVENTS, GARBAGE, 500)
    exhausted_budget(agent)
    outbox_dispatch()
    trigger = AlertDelivery.objects.get()
    assert (trigger.status, trigger.error) == ("pending", "bad HTTP reply (BadStatusLine)")
    clock.shift(30)
    outbox_dispatch()
    trigger.refresh_from_db()
    assert (trigger.status, trigger.response_code, trigger.error) == (
        "pending",
        500,
        "HTTP 500 Internal Server Error",
    )
    clock.shift(60)
    outbox_dispatch()
    trigger.refresh_from_db()
    assert (trigger.status, trigger.attempts, trigger.response_code) == ("delivered", 3, 202)
    assert len(hook.to(EVENTS)) == 3

    # a Slack receiver refusing the message (400 invalid_payload): failed, not retried
    other = make_agent("other")
    set_up(other.project, hook, channels=["slack"])
    hook.answer_first(SLACK, 400, 400)
    budget(other.project, cost_limit_usd="1.00")
    spend(other, "s", 1_000_000)
    outbox_dispatch()
    failed = list(AlertDelivery.objects.filter(project=other.project))
    assert [(d.status, d.attempts, d.response_code, d.error) for d in failed] == [
        ("failed", 1, 400, "HTTP 400 Bad Request")
    ] * 2
    assert not OutboxItem.objects.exists()


# --- which channels -----------------------------------------------------------------------------


def test_a_budget_picks_its_channels_and_the_others_use_the_projects(
    agent: Agent,
    hook: Hook,
    clock: time_machine.Traveller,
    mailoutbox: list[mail.EmailMessage],
) -> None:
    set_up(agent.project, hook, channels=["slack"])
    Project.objects.filter(pk=agent.project.pk).update(alert_emails="ops@example.com")
    WebhookEndpoint.objects.create(project=agent.project, url=f"{hook.url}/hook", secret="s" * 16)
    add_price("test-sonnet")
    by_default = budget(agent.project, name="defaults", cost_limit_usd="1.00", action="warn")
    own = budget(agent.project, name="own", cost_limit_usd="1.00", channels=["email"])
    spend(agent, "s", 1_000_000, token_cap=1_000_000)  # both budgets and the session
    outbox_dispatch()
    by_source = sorted(
        (name or "session", kind, channel)
        for name, kind, channel in AlertDelivery.objects.values_list(
            "budget_event__ledger__budget__name", "budget_event__kind", "channel"
        )
    )
    assert by_source == [
        ("defaults", "exhausted", "slack"),
        ("defaults", "soft_warned", "slack"),
        ("own", "exhausted", "email"),
        ("own", "soft_warned", "email"),
        ("session", "exhausted", "slack"),
        ("session", "soft_warned", "slack"),
    ]
    assert hook.to("/hook") == []  # the project's webhook is not among the channels
    assert len(hook.to(SLACK)) == 4 and len(mailoutbox) == 2
    assert PeriodBudget.objects.get(pk=by_default.pk).channels is None
    assert PeriodBudget.objects.get(pk=own.pk).channels == ["email"]


def test_budget_channels_are_checked_and_shown_by_the_api(agent: Agent, hook: Hook) -> None:
    agent.project.alert_channels = ["webhook"]
    agent.project.save()
    with pytest.raises(BudgetInputError) as refused:
        budget(agent.project, channels=["slack"])
    assert refused.value.field == "channels"
    assert "Slack incoming-webhook URL" in refused.value.message

    _, admin_key = ApiKey.issue(project=agent.project, role="admin")
    headers = {"Authorization": f"Bearer {admin_key}"}

    def post(body: dict[str, Any]) -> Any:
        return agent.client.post(
            "/api/v1/budgets", json.dumps(body), content_type="application/json", headers=headers
        )

    bad = post({"name": "m", "cost_limit_usd": "5", "channels": ["sms"]})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "channels.0"  # the first item
    twice = post({"name": "m", "cost_limit_usd": "5", "channels": ["email", "email"]})
    assert twice.status_code == 422
    assert twice.json()["errors"][0] == {
        "index": None,
        "field": "channels",
        "message": "names a channel twice: list each once",
    }
    set_up(agent.project, hook, channels=["webhook"])
    made = post({"name": "m", "cost_limit_usd": "5", "channels": ["pagerduty", "slack"]})
    assert made.status_code == 201, made.content
    assert made.json()["channels"] == ["slack", "pagerduty"]
    budget_id = made.json()["id"]
    cleared = agent.client.patch(
        f"/api/v1/budgets/{budget_id}",
        json.dumps({"channels": []}),
        content_type="application/json",
        headers=headers,
    )
    assert cleared.status_code == 200 and cleared.json()["channels"] is None
    # the Slack URL removed later: the budget that names slack can still be renamed
    again = period_budget_update(
        PeriodBudget.objects.get(pk=budget_id), changes={"channels": ["slack"]}
    )
    Project.objects.filter(pk=agent.project.pk).update(slack_webhook_url="")
    renamed = period_budget_update(again, changes={"name": "renamed"})
    assert (renamed.name, renamed.channels) == ("renamed", ["slack"])


# --- the project's fields -----------------------------------------------------------------------


def test_the_project_fields_are_checked_naming_the_field_and_fix(settings: Any, db: None) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = []
    project = Project(name="P", slug="p", slack_webhook_url="http://10.1.2.3/services/x")
    project.pagerduty_routing_key = "not-a-key"
    project.alert_channels = ["slack", "sms"]
    with pytest.raises(ValidationError) as refused:
        project.full_clean()
    errors = refused.value.message_dict
    assert errors["slack_webhook_url"] == [
        "This URL is refused: 10.1.2.3 is a private address; allow it with "
        "COSTBOARD_WEBHOOK_ALLOW_HOSTS. Use the https://hooks.slack.com/… URL of the Slack "
        "app's incoming webhook."
    ]
    assert "32-letter-and-digit Integration Key" in errors["pagerduty_routing_key"][0]
    assert errors["alert_channels"] == [
        '\'sms\' is not a channel: use any of "webhook", "email", "slack", "pagerduty"'
    ]
    # named channels need their setup
    fine = Project(name="Q", slug="q", alert_channels=["pagerduty"])
    with pytest.raises(ValidationError) as missing:
        fine.full_clean()
    assert "PagerDuty routing key" in missing.value.message_dict["alert_channels"][0]
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["10.1.2.3"]  # an intranet relay, allowed
    Project(
        name="R",
        slug="r",
        slack_webhook_url="http://10.1.2.3/services/x",
        pagerduty_routing_key=KEY,
    ).full_clean()


def test_a_slack_url_refused_at_send_fails_at_once(
    agent: Agent, hook: Hook, settings: Any, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["slack"])  # allowed when saved…
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = []  # …and no longer when sent
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)
    outbox_dispatch()
    failed = list(AlertDelivery.objects.all())
    assert [(d.status, d.attempts) for d in failed] == [("failed", 1)] * 2
    assert failed[0].error == (
        "refused: 127.0.0.1 is a loopback address; allow it with COSTBOARD_WEBHOOK_ALLOW_HOSTS"
    )
    assert hook.requests == []


# --- the admin ----------------------------------------------------------------------------------


def test_the_project_admin_keeps_the_routing_key_write_only_and_sends_tests(
    agent: Agent, hook: Hook, staff: Client, mailoutbox: list[mail.EmailMessage]
) -> None:
    project = agent.project
    page = f"/admin/costboard/project/{project.pk}/change/"
    form = staff.get(page)
    assert form.status_code == 200
    fields = project_admin_fields(
        project,
        alert_channels=["email", "pagerduty"],
        alert_emails="ops@example.com",
        slack_webhook_url=f"{hook.url}{SLACK}",
        pagerduty_routing_key=KEY,
    )
    saved = staff.post(page, fields)
    assert saved.status_code == 302, saved.content.decode()[:3000]
    project.refresh_from_db()
    assert (project.pagerduty_routing_key, project.alert_channels) == (KEY, ["email", "pagerduty"])
    shown = staff.get(page).content.decode()
    assert KEY not in shown and f"Current: …{KEY[-4:]}." in shown

    kept = staff.post(page, {**fields, "pagerduty_routing_key": ""})  # blank keeps it
    assert kept.status_code == 302
    project.refresh_from_db()
    assert project.pagerduty_routing_key == KEY
    bad = staff.post(page, {**fields, "pagerduty_routing_key": "short"})
    assert bad.status_code == 200 and "32-letter-and-digit Integration Key" in bad.content.decode()

    response = staff.post(
        "/admin/costboard/project/",
        {"action": "send_test_alert", "_selected_action": [project.pk]},
        follow=True,
    )
    notes = [str(m) for m in response.context["messages"]]
    assert notes == [
        "acme: email ops@example.com: sent.",
        f"acme: slack {hook.url}/…: sent (HTTP 200).",
        f"acme: pagerduty routing key …{KEY[-4:]}: sent (HTTP 202).",
    ]
    assert mailoutbox[0].subject == "[Costboard] acme: a test alert"
    [message] = hook.to(SLACK)
    assert message["text"] == "acme: a test alert from Costboard"
    trigger, resolve = hook.to(EVENTS)
    assert (trigger["event_action"], trigger["payload"]["severity"]) == ("trigger", "info")
    assert (resolve["event_action"], resolve["dedup_key"]) == ("resolve", trigger["dedup_key"])
    assert not AlertDelivery.objects.exists()  # a test records nothing

    hook.answer_first(SLACK, 404)
    again = staff.post(
        "/admin/costboard/project/",
        {"action": "send_test_alert", "_selected_action": [project.pk]},
        follow=True,
    )
    assert f"acme: slack {hook.url}/…: HTTP 404 Not Found." in [
        str(m) for m in again.context["messages"]
    ]


def test_the_delivery_log_masks_routing_keys_and_slack_urls(
    agent: Agent, hook: Hook, staff: Client, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["slack", "pagerduty"])
    exhausted_budget(agent)
    outbox_dispatch()
    page = staff.get("/admin/costboard/alertdelivery/").content.decode()
    assert KEY not in page and "slacksecret" not in page
    assert f"routing key …{KEY[-4:]}" in page


# --- concurrency --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_racing_dispatchers_and_resolvers_make_one_delivery_per_event_and_target(
    hook: Hook,
) -> None:
    agent = make_agent("acme")
    set_up(agent.project, hook, channels=["slack", "pagerduty"])
    made = exhausted_budget(agent)
    # the events ingest announced (the first warn fraction's threshold event is not: its
    # soft_warned is)
    event_ids = [
        pk
        for item in OutboxItem.objects.filter(kind="alerts.dispatch")
        for pk in item.payload["event_ids"]
    ]
    assert BudgetEvent.objects.exclude(pk__in=event_ids).get().kind == "threshold"
    assert run_in_threads(8, lambda _: alerts_dispatch(event_ids)) == []
    assert sorted(AlertDelivery.objects.values_list("channel", "action")) == [
        ("pagerduty", "trigger"),
        ("slack", "trigger"),
        ("slack", "trigger"),
    ]
    outbox_dispatch()
    # the next period: eight sweeps at once resolve the incident once
    later = datetime.now(UTC) + timedelta(days=62)
    assert run_in_threads(8, lambda _: incidents_resolve(now=later)) == []
    assert AlertDelivery.objects.filter(action="resolve").count() == 1
    outbox_dispatch()
    assert [action for action, _ in actions(hook)] == ["trigger", "resolve"]
    assert len(hook.to(SLACK)) == 2
    assert (
        actions(hook)[0][1]
        == actions(hook)[1][1]
        == dedup_of(made).replace(
            "2026-11-01T00:00:00+00:00", PeriodLedger.objects.get().period_start.isoformat()
        )
    )


def test_money_in_the_messages_is_exact(agent: Agent, hook: Hook) -> None:
    """Below a cent, the amount as stored: $0.000003 is not rounded to $0.00."""
    set_up(agent.project, hook, channels=["slack"])
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="0.0001", action="warn")
    spend(agent, "s", 1)  # 1 token at $3/M: $0.000003
    spend(agent, "t", 40)  # $0.000123
    outbox_dispatch()
    spends = [
        f["text"]
        for message in hook.to(SLACK)
        for block in message["blocks"]
        for f in block.get("fields", [])
        if f["text"].startswith("*Spend")
    ]
    assert spends == ["*Spend / limit*\n$0.000123 / $0.0001"] * 2


def test_a_slack_message_escapes_its_text_as_slack_asks(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    """Slack reads `&`, `<` and `>` in a message's `text` as its control characters (its
    "Formatting text" docs: escape them): a budget named `<!channel>` must not notify the
    whole channel, neither in the blocks nor in the notification's `text`."""
    set_up(agent.project, hook, channels=["slack"])
    add_price("test-sonnet")
    made = budget(agent.project, name="<!channel> R&D", cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)  # $3 of $1: soft_warned and exhausted
    outbox_dispatch()
    messages = hook.to(SLACK)
    assert len(messages) == 2
    for message in messages:
        assert "<!channel>" not in json.dumps(message)
        assert message["text"].startswith("acme: budget '&lt;!channel&gt; R&amp;D' (month")
        assert message["text"].endswith(f" https://costboard.example/budgets/{made.pk}/")
        assert message["blocks"][0]["text"]["text"].startswith(
            "*acme: budget '&lt;!channel&gt; R&amp;D' (month"
        )


def test_names_agents_send_show_literally_in_slack(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    """Slack has no escape for `*`, `_`, `~` and backticks: a session id made of them is
    sent as look-alikes that format nothing (∗ ˍ ∼ ˋ), and its `<…|…>` as text, so the
    message shows the id as the agent sent it, not bold, italic, struck, code or a link."""
    set_up(agent.project, hook, channels=["slack"])
    add_price("test-sonnet")
    name = "_deploy_ *prod* ~old~ `rm` <https://evil.example|click me> >quote"
    spend(agent, name, 2_000, token_cap=1_000)  # soft_warned and exhausted
    outbox_dispatch()
    [message] = [m for m in hook.to(SLACK) if "exhausted its" in m["text"]]
    shown = "ˍdeployˍ ∗prod∗ ∼old∼ ˋrmˋ &lt;https://evil.example|click me&gt; &gt;quote"
    assert message["blocks"][0]["text"]["text"] == (
        f"*acme: session {shown} exhausted its token cap*"
    )
    fields = [f["text"] for f in message["blocks"][1]["fields"]]
    assert fields[0] == f"*Session*\n{shown}"
    assert message["text"].startswith(f"acme: session {shown} exhausted its token cap ")
    for text in (message["text"], *fields, message["blocks"][0]["text"]["text"][1:-1]):
        assert not {"_", "~", "`", "<"} & set(text.split(" https://")[0]), text


def test_a_slack_url_that_redirects_fails_at_once_naming_where_it_goes(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    """A redirect will answer the same on every retry (and is never followed: the egress
    rules): the delivery fails at its first attempt, saying where the URL redirects — a
    Slack URL's secret path masked — so the admin sets the final URL."""
    set_up(agent.project, hook, channels=["slack"])
    hook.location = "https://hooks.slack.com/services/T000/B000/newsecret"
    hook.answer_first(SLACK, 301, 301)
    add_price("test-sonnet")
    spend(agent, "s", 2_000, token_cap=1_000)  # soft_warned and exhausted
    outbox_dispatch()
    deliveries = AlertDelivery.objects.order_by("pk")
    assert [(d.status, d.attempts, d.response_code) for d in deliveries] == [("failed", 1, 301)] * 2
    assert {d.error for d in deliveries} == {
        "HTTP 301 Moved Permanently: the URL redirects to https://hooks.slack.com/…; "
        "redirects are not followed: use the final URL"
    }
    assert len(hook.to(SLACK)) == 2
    assert not OutboxItem.objects.exists()
    clock.shift(3600)
    outbox_dispatch()
    assert len(hook.to(SLACK)) == 2  # never retried


def test_an_alert_email_subject_stays_within_the_mail_line_limit(
    agent: Agent, hook: Hook, clock: time_machine.Traveller, mailoutbox: list[mail.EmailMessage]
) -> None:
    """A budget named with 100 invisible tag characters is quoted in the subject as
    `'\\U000e0001…'`: 1,000 characters with no space to fold at, a header line past the 998
    octets mail allows (RFC 5322), which a mail server may refuse on every attempt. The
    subject is cut with "…" to SUBJECT_CHARS; the body keeps the whole name."""
    set_up(agent.project, hook, channels=["email"])
    Project.objects.filter(pk=agent.project.pk).update(alert_emails="ops@example.com")
    add_price("test-sonnet")
    budget(agent.project, name="\U000e0001" * 100, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)  # soft_warned and exhausted
    outbox_dispatch()
    assert len(mailoutbox) == 2
    for message in mailoutbox:
        assert len(message.subject) == 250 and message.subject.endswith("…")
        assert message.subject.startswith("[Costboard] acme: budget '\\U000e0001\\U000e0001")
        raw = message.message().as_bytes()
        assert max(len(line) for line in raw.split(b"\n")) <= 998
        assert "\\U000e0001" * 100 in message.body


def test_an_alert_email_sent_again_carries_the_same_message_id(
    agent: Agent,
    hook: Hook,
    mailoutbox: list[mail.EmailMessage],
    settings: Any,
) -> None:
    """Delivery is at least once: a dispatcher that dies between the mail server's yes and
    recording it sends the mail again at the next claim. Both carry one Message-ID (the
    delivery's), by which mail systems that drop duplicates show it once; each delivery has
    its own, in the sender's domain, and another installation (SECRET_KEY) another."""
    settings.DEFAULT_FROM_EMAIL = "Costboard <alerts@Costs.Example.COM>"
    set_up(agent.project, hook, channels=["email"])
    Project.objects.filter(pk=agent.project.pk).update(alert_emails="ops@example.com")
    add_price("test-sonnet")
    spend(agent, "s", 2_000, token_cap=1_000)  # soft_warned and exhausted
    outbox_dispatch()
    first, second = AlertDelivery.objects.filter(channel="email").order_by("pk")
    email_send(first)  # the attempt a re-claim makes after the dispatcher died
    ids = [message.message()["Message-ID"] for message in mailoutbox]
    assert len(ids) == 3 and ids[0] != ids[1] and ids[2] == ids[0] == message_id("alert", first.pk)
    assert ids[1] == message_id("alert", second.pk)
    assert ids[0].startswith(f"<costboard.alert.{first.pk}.") and ids[0].endswith(
        "@Costs.Example.COM>"
    )
    settings.SECRET_KEY = "another installation's secret key, as long as Django wants it"
    assert message_id("alert", first.pk) != ids[0]
