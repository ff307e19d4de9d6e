"""Spend anomalies (docs/budgets.md, "Spend anomalies"): a day's spend, the project's or one
tag value's, far above its trailing 14 days raises one `anomaly` alert, explained in words.
Spend is ingested through the API (so the daily rollups are ingest's), at a price of one
cent a token; the sweep is given its `now`."""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.test import Client

from costboard.budgets.alert_messages import verify_signature
from costboard.budgets.anomalies import anomaly_sweep, series_judged
from costboard.models import AlertDelivery, OutboxItem, SpendAnomaly, WebhookEndpoint
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent, run_in_threads
from tests.servers import free_port, serve

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
TODAY = NOW.date()
SECRET = "whsec-anomaly-0123456789"
# 13 days chosen by hand, the 14th makes the total $85.40: mean $6.10, sample sd $2.3025…
HISTORY = [
    Decimal(x)
    for x in (
        *("4.00", "8.50", "6.00", "9.20", "3.10", "7.40", "5.00"),
        *("8.80", "3.90", "6.30", "9.90", "3.20", "5.10", "5.00"),
    )
]


@pytest.fixture
def spender(db: None) -> Agent:
    add_price("cent-model", input_mtok=Decimal(10_000))  # $0.01 a token
    # caps far away: the sessions' budgets play no part here
    return make_agent("shop", token_cap=10**12, cost_cap_usd=Decimal(10**6))


def spend(agent: Agent, day_offset: int, amounts: dict[str, Decimal], *, hour: int = 9) -> None:
    """One step per customer on the day `day_offset` days before today, tagged
    `customer=<name>` and `env=prod`, costing exactly `amounts[name]`."""
    at = datetime.combine(TODAY - timedelta(days=day_offset), datetime.min.time(), UTC)
    agent.events(
        *[
            {
                "session_id": f"day-{day_offset}",
                "step_type": "response",
                "model": "cent-model",
                "input_tokens": int(amount * 100),
                "timestamp": (at + timedelta(hours=hour, minutes=n)).isoformat(),
                "event_id": f"d{day_offset}-{customer}-{hour}",
                "tags": {"customer": customer, "env": "prod"},
            }
            for n, (customer, amount) in enumerate(amounts.items())
        ]
    )


def steady_history(agent: Agent, days: list[Decimal] = HISTORY) -> None:
    """The 14 days before today: acme $0.10 a day, beta the rest of HISTORY's amount."""
    for offset, total in zip(range(len(days), 0, -1), days, strict=True):
        spend(agent, offset, {"acme": Decimal("0.10"), "beta": total - Decimal("0.10")})


@dataclass
class Hooks:
    """A local webhook receiver: every POST's headers and body."""

    url: str = ""
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def hooks(settings: Any) -> Iterator[Hooks]:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    state = Hooks()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state.lock:
                state.received.append((dict(self.headers.items()), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    base, stop = serve(Handler)
    state.url = f"{base}/anomalies"
    try:
        yield state
    finally:
        stop()


def test_a_spike_on_one_customer_raises_one_alert_naming_it(
    spender: Agent, hooks: Hooks, mailoutbox: list[mail.EmailMessage], staff: Client
) -> None:
    WebhookEndpoint.objects.create(
        project=spender.project, url=hooks.url, secret=SECRET, kinds=["anomaly"]
    )
    spender.project.alert_emails = "ops@example.com"
    spender.project.save()
    steady_history(spender)
    spend(spender, 0, {"acme": Decimal("32.14"), "beta": Decimal("9.06")})  # $41.20 today

    assert anomaly_sweep(now=NOW) == 1
    [anomaly] = SpendAnomaly.objects.all()
    text = "$41.20 today against $6.10 ± $2.30 over 14 days; 78 % from customer=acme"
    assert anomaly.explanation == text
    assert (anomaly.tag_key, anomaly.tag_value, anomaly.day) == ("", "", TODAY)
    # the figures, checked against the standard library's statistics over the same days
    assert anomaly.spend_usd == Decimal("41.20")
    assert anomaly.mean_usd == statistics.mean(HISTORY) == Decimal("6.10")
    assert anomaly.stddev_usd == statistics.stdev(HISTORY).quantize(Decimal("1e-12"))
    assert (anomaly.history_days, anomaly.k, anomaly.floor_usd) == (14, 3, 5)
    # env=prod carries every step, so its share did not rise: the customer is named
    assert (anomaly.top_tag, anomaly.top_share) == ("customer=acme", Decimal("0.7801"))

    # the second sweep, later the same day and with more spend, raises nothing more
    spend(spender, 0, {"acme": Decimal("5.00")}, hour=11)
    assert anomaly_sweep(now=NOW + timedelta(minutes=30)) == 0
    assert SpendAnomaly.objects.count() == 1

    outbox_dispatch()
    [(headers, body)] = hooks.received
    payload = json.loads(body)
    assert headers["X-Costboard-Event"] == "anomaly"
    assert verify_signature(
        SECRET,
        headers["X-Costboard-Timestamp"],
        body,
        headers["X-Costboard-Signature"],
        tolerance_seconds=None,
    )
    delivery = AlertDelivery.objects.get(channel="webhook")
    assert delivery.spend_anomaly_id == anomaly.pk and delivery.kind == "anomaly"
    assert payload == {
        "delivery_id": delivery.pk,
        "event_id": anomaly.pk,
        "kind": "anomaly",
        "at": NOW.isoformat(),
        "project": "shop",
        "day": "2026-11-20",
        "tag": None,
        "spend_usd": "41.20",
        "mean_usd": "6.10",
        "stddev_usd": str(anomaly.stddev_usd.normalize()),
        "history_days": 14,
        "k": "3.00",
        "floor_usd": "5.00",
        "top_tag": "customer=acme",
        "top_share": "0.7801",
        "explanation": text,
        "overview_url": "/?project=shop",
    }
    [email] = mailoutbox
    assert email.to == ["ops@example.com"]
    assert email.subject == "[Costboard] shop: spend on 2026-11-20 far above its usual ($41.20)"
    assert f"Project shop, 2026-11-20 (UTC): {text}." in email.body
    # dispatched again: nothing sent twice
    outbox_dispatch()
    assert len(hooks.received) == 1 and len(mailoutbox) == 1
    # the admin's delivery log and list of anomalies
    log = staff.get("/admin/costboard/alertdelivery/").content.decode()
    assert log.count("the project 2026-11-20") == 2  # the webhook's and the email's
    assert text in staff.get("/admin/costboard/spendanomaly/").content.decode()


def test_a_small_customer_spiking_in_a_big_project_is_alerted_on_its_own(
    spender: Agent,
) -> None:
    for offset in range(14, 0, -1):
        acme = Decimal("1.00") + Decimal("0.10") * (offset % 3)  # $1.00, $1.10, $1.20
        spend(spender, offset, {"acme": acme, "beta": Decimal(100) + offset % 5})
    spend(spender, 0, {"acme": Decimal("8.00"), "beta": Decimal(98)})  # $106: usual for the project

    assert anomaly_sweep(now=NOW) == 1
    [anomaly] = SpendAnomaly.objects.all()
    assert (anomaly.tag_key, anomaly.tag_value) == ("customer", "acme")
    acme_days = [Decimal("1.00") + Decimal("0.10") * (o % 3) for o in range(14, 0, -1)]
    assert anomaly.explanation == (
        "customer=acme: $8.00 today against $1.11 ± $0.08 over 14 days; 8 % of the "
        "project's $106.00"
    )
    assert anomaly.mean_usd == statistics.mean(acme_days).quantize(Decimal("1e-12"))
    assert anomaly.stddev_usd == statistics.stdev(acme_days).quantize(Decimal("1e-12"))
    assert (anomaly.top_tag, anomaly.top_share) == ("customer=acme", Decimal("0.0755"))
    assert anomaly_sweep(now=NOW + timedelta(hours=1)) == 0


def test_a_spike_below_the_floor_raises_nothing(spender: Agent) -> None:
    steady_history(spender, [d / 10 for d in HISTORY])  # $0.61 a day
    spend(spender, 0, {"acme": Decimal("4.00"), "beta": Decimal("0.50")})  # $4.50 < $5
    assert anomaly_sweep(now=NOW) == 0
    # positive control: the same day with the floor at $4
    spender.project.anomaly_floor_usd = Decimal(4)
    spender.project.save()
    assert anomaly_sweep(now=NOW) == 1


def test_without_seven_days_of_history_nothing_is_judged(spender: Agent) -> None:
    steady_history(spender, HISTORY[-6:])  # six days with spend
    spend(spender, 0, {"acme": Decimal("40.00")})
    assert anomaly_sweep(now=NOW) == 0
    # positive control: a seventh day (eight days back) and the same spike is judged
    spend(spender, 7, {"beta": Decimal("6.00")})
    assert anomaly_sweep(now=NOW) == 1
    [anomaly] = SpendAnomaly.objects.all()
    assert anomaly.history_days == 7  # from its first day with spend, not 14


def test_days_of_only_unpriced_steps_are_no_history(spender: Agent) -> None:
    """Days whose steps all cost $0 (tool steps, a model no price covers) have rollup rows but
    no spend: they are not the 7 days with spend a judgement needs, nor where a series
    starts. A project that only ran tools until today is not "$50.00 against $0.00 ± $0.00"."""
    for offset in range(13, 0, -1):
        at = datetime.combine(TODAY - timedelta(days=offset), datetime.min.time(), UTC)
        spender.events(
            {
                "session_id": f"tools-{offset}",
                "step_type": "tool",
                "model": "none",
                "timestamp": (at + timedelta(hours=9)).isoformat(),
                "event_id": f"tool-{offset}",
                "tags": {"customer": "acme"},
            }
        )
    spend(spender, 0, {"acme": Decimal("50.00")})
    assert anomaly_sweep(now=NOW) == 0
    assert not SpendAnomaly.objects.exists()
    # positive control: seven days with spend among them, and the same day is judged against
    # those seven (from the first with spend), the days of $0 rows after it counted as $0
    for offset in (11, 9, 8, 6, 4, 2, 1):
        spend(spender, offset, {"acme": Decimal("2.00")})
    assert anomaly_sweep(now=NOW) == 1
    [anomaly] = SpendAnomaly.objects.all()
    assert (anomaly.tag_key, anomaly.history_days) == ("", 11)
    assert anomaly.mean_usd == (Decimal(14) / 11).quantize(Decimal("1e-12"))


def test_steady_spend_raises_nothing(spender: Agent) -> None:
    steady_history(spender, [Decimal("20.00")] * 14)
    spend(spender, 0, {"acme": Decimal("0.10"), "beta": Decimal("19.90")})
    assert anomaly_sweep(now=NOW) == 0
    # a cent more than every day before: above the mean by more than 3 × 0, and the floor
    spend(spender, 0, {"beta": Decimal("0.01")}, hour=10)
    assert anomaly_sweep(now=NOW) == 1


def test_a_project_without_k_is_not_checked(spender: Agent) -> None:
    spender.project.anomaly_k = None
    spender.project.save()
    steady_history(spender)
    spend(spender, 0, {"acme": Decimal("40.00")})
    assert anomaly_sweep(now=NOW) == 0
    spender.project.anomaly_k = Decimal(3)  # positive control
    spender.project.save()
    assert anomaly_sweep(now=NOW) == 1


def test_the_mean_and_deviation_are_exact_decimals() -> None:
    days = {
        TODAY - timedelta(days=n): Decimal(v)
        for n, v in zip(range(14, 0, -1), HISTORY, strict=True)
    }
    judged = series_judged(TODAY, Decimal("41.20"), days)
    assert judged is not None
    assert judged.mean == Decimal("6.1") and judged.days == 14
    assert judged.stddev == statistics.stdev(HISTORY)  # Decimal.sqrt at 28 digits
    assert judged.above(Decimal(3), Decimal(5))
    assert not judged.above(Decimal(16), Decimal(5))  # 35.10 < 16 × 2.3025…


def test_the_overview_shows_recent_anomalies(spender: Agent, staff: Client) -> None:
    steady_history(spender)
    spend(spender, 0, {"acme": Decimal("32.14"), "beta": Decimal("9.06")})
    with time_machine.travel(NOW + timedelta(hours=1), tick=False):
        assert 'id="anomalies"' not in staff.get("/").content.decode()
        anomaly_sweep(now=NOW)
        page = staff.get("/").content.decode()
    assert 'id="anomalies"' in page and page.count("data-anomaly-explanation") == 1
    assert (
        "<td data-anomaly-explanation>$41.20 today against $6.10 ± $2.30 over 14 days; "
        "78 % from customer=acme</td>"
    ) in page
    with time_machine.travel(NOW + timedelta(days=8), tick=False):  # a week on: gone
        assert 'id="anomalies"' not in staff.get("/").content.decode()


def test_the_overview_says_when_it_shows_fewer_anomalies_than_were_alerted(
    spender: Agent, staff: Client
) -> None:
    """Twelve customers spike on their own in a big project: twelve alerts go out, and the
    overview, which lists the latest ten, says there were twelve."""
    names = [f"c{n:02d}" for n in range(12)]
    for offset in range(14, 0, -1):
        usual = Decimal("1.00") + Decimal("0.10") * (offset % 3)
        spend(spender, offset, {**dict.fromkeys(names, usual), "big": Decimal(1000) + offset % 5})
    spend(spender, 0, {**dict.fromkeys(names, Decimal("9.00")), "big": Decimal(900)})
    assert anomaly_sweep(now=NOW) == 12
    assert OutboxItem.objects.filter(kind="alerts.anomaly").count() == 12
    with time_machine.travel(NOW + timedelta(hours=1), tick=False):
        page = staff.get("/", {"project": "shop"}).content.decode()
    assert page.count("data-anomaly-explanation") == 10
    assert '<p class="muted" data-anomalies-more>The latest 10 of 12' in page
    # positive control: with ten, no such line
    SpendAnomaly.objects.filter(tag_value__in=["c00", "c01"]).delete()
    with time_machine.travel(NOW + timedelta(hours=1), tick=False):
        page = staff.get("/", {"project": "shop"}).content.decode()
    assert page.count("data-anomaly-explanation") == 10 and "data-anomalies-more" not in page


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_raise_one_anomaly() -> None:
    add_price("cent-model", input_mtok=Decimal(10_000))
    agent = make_agent("race", token_cap=10**12, cost_cap_usd=Decimal(10**6))
    steady_history(agent)
    spend(agent, 0, {"acme": Decimal("32.14"), "beta": Decimal("9.06")})
    made: list[int] = []
    assert run_in_threads(2, lambda _: made.append(anomaly_sweep(now=NOW))) == []
    assert sorted(made) == [0, 1]
    assert SpendAnomaly.objects.count() == 1
    assert OutboxItem.objects.filter(kind="alerts.anomaly").count() == 1


def test_an_anomaly_for_a_receiver_that_is_down_is_retried(spender: Agent, settings: Any) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    nobody = f"http://127.0.0.1:{free_port()}/anomalies"  # nothing listens there
    WebhookEndpoint.objects.create(
        project=spender.project, url=nobody, secret=SECRET, kinds=["anomaly"]
    )
    steady_history(spender)
    spend(spender, 0, {"acme": Decimal("32.14"), "beta": Decimal("9.06")})
    assert anomaly_sweep(now=NOW) == 1
    outbox_dispatch()
    [delivery] = AlertDelivery.objects.all()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.error.startswith("cannot connect")
    assert OutboxItem.objects.filter(kind="alert.deliver", attempts=1).count() == 1  # retried


def test_an_anomaly_reaches_slack_through_the_projects_channels(
    spender: Agent, hooks: Hooks
) -> None:
    """An anomaly has no budget: it goes through the project's default channels, Slack among
    them, and its message carries the explanation and the overview's link; it never pages."""
    project = spender.project
    project.slack_webhook_url = hooks.url
    project.pagerduty_routing_key = "0123456789abcdef0123456789abcdef"
    project.alert_channels = ["slack", "pagerduty"]
    project.save()
    steady_history(spender)
    spend(spender, 0, {"acme": Decimal("32.14"), "beta": Decimal("9.06")})
    assert anomaly_sweep(now=NOW) == 1
    outbox_dispatch()
    [delivery] = AlertDelivery.objects.all()
    assert (delivery.channel, delivery.status) == ("slack", "delivered")
    [(_, body)] = hooks.received
    message = json.loads(body)
    text = "$41.20 today against $6.10 ± $2.30 over 14 days; 78 % from customer=acme"
    assert message["text"] == (
        "shop: spend on 2026-11-20 far above its usual ($41.20) /?project=shop"
    )
    fields = {
        f["text"].split("\n", 1)[0]: f["text"].split("\n", 1)[1]
        for f in message["blocks"][1]["fields"]
    }
    assert fields["*Spend*"] == text
    assert fields["*Day*"] == "2026-11-20 (UTC)"
    assert fields["*Project*"] == "shop"
