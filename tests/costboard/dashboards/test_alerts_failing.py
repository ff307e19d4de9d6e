"""Alerts that do not arrive are shown where teams look (docs/budgets.md, "Delivery"): the
overview and /budgets/ say which channel has been failing since when and its last error, to
the project's members only, until an alert to it is delivered.

The receiver is a real local HTTP server (test_alert_channels.Hook), answering 404 like a
deleted Slack webhook, or stopped and started again; the outbox is dispatched in-process
under an injected clock."""

from __future__ import annotations

import re

import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from costboard.budgets.alerts import alert_deliveries_retry
from costboard.dashboards.selectors.budgets import alert_channels_failing
from costboard.models import AlertDelivery, WebhookEndpoint
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent
from tests.costboard.budgets import test_alert_channels as channels
from tests.costboard.budgets.test_alert_channels import SLACK, Hook, budget, set_up, spend
from tests.costboard.dashboards.test_dashboards import member_of

hook = channels.hook  # its fixtures: the local receiver, the clock turned by hand
clock = channels.clock
PAGES = ["/", "/budgets/"]


def notices(client: Client, page: str) -> list[str]:
    """The page's failing-alerts notices, as text without tags."""
    response = client.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    found = re.findall(r'<p data-alert-failing="[a-z]+">(.*?)</p>', html, re.S)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).strip() for text in found]


def test_a_dead_slack_webhook_is_shown_until_an_alert_to_it_is_delivered(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["slack"])
    hook.answer_first(SLACK, 404, 404)  # the Slack app was removed: every message refused
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)  # $3 of $1: soft_warned and exhausted
    outbox_dispatch()
    assert [(d.status, d.response_code) for d in AlertDelivery.objects.order_by("pk")] == [
        ("failed", 404)
    ] * 2
    members = member_of(agent)
    shown = (
        f"Alerts to slack {hook.url}/… (Acme) have been failing since Nov 10, 12:00 UTC: "
        "HTTP 404 Not Found (given up)."
    )
    for page in PAGES:
        assert notices(members, page) == [shown]
        assert "slacksecret" not in members.get(page).content.decode()  # the URL's secret
    outsider = member_of(make_agent("other"))
    assert [notices(outsider, page) for page in PAGES] == [[], []]

    # fixed (the receiver answers 200 again): the admin's retry delivers, and it is gone
    clock.shift(600)
    failed = list(AlertDelivery.objects.values_list("pk", flat=True))
    assert alert_deliveries_retry(delivery_ids=failed) == 2
    outbox_dispatch()
    assert set(AlertDelivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert len(hook.to(SLACK)) == 4
    assert [notices(members, page) for page in PAGES] == [[], []]


def test_a_receiver_down_is_shown_while_retried_and_gone_once_it_is_back(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["slack", "webhook"])
    WebhookEndpoint.objects.create(
        project=agent.project, url=f"{hook.url}/hooks/token-in-path", secret="whsec-down"
    )
    hook.stop()
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)
    outbox_dispatch()
    members = member_of(agent)
    texts = notices(members, "/")
    assert len(texts) == 2, texts
    for text, channel in zip(texts, ["slack", "webhook"], strict=True):
        assert text.startswith(
            f"Alerts to {channel} {hook.url}/… (Acme) have been failing since Nov 10, 12:00 UTC: "
            "cannot connect:"
        ), text
        assert text.endswith("(being retried).")
    assert "token-in-path" not in members.get("/").content.decode()

    clock.shift(30)  # the first retry, with the receiver still down: still failing since 12:00
    outbox_dispatch()
    assert [t.split(" UTC: ")[0] for t in notices(members, "/budgets/")] == [
        f"Alerts to slack {hook.url}/… (Acme) have been failing since Nov 10, 12:00",
        f"Alerts to webhook {hook.url}/… (Acme) have been failing since Nov 10, 12:00",
    ]
    hook.start()
    clock.shift(60)
    outbox_dispatch()
    assert set(AlertDelivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert [notices(members, page) for page in PAGES] == [[], []]


def test_a_target_changed_since_is_not_shown_and_the_read_is_five_queries(
    agent: Agent, hook: Hook, clock: time_machine.Traveller
) -> None:
    set_up(agent.project, hook, channels=["slack"])
    hook.answer_first(SLACK, 410, 410)
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)
    outbox_dispatch()
    with CaptureQueriesContext(connection) as queries:
        [failing] = alert_channels_failing(project_ids=[agent.project.pk], now=timezone.now())
    assert len(queries) == 5
    assert (failing.channel, failing.error, failing.retrying) == ("slack", "HTTP 410 Gone", False)
    assert failing.since == timezone.now()

    agent.project.slack_webhook_url = f"{hook.url}/services/T000/B000/new-one"
    agent.project.save()
    assert alert_channels_failing(project_ids=[agent.project.pk], now=timezone.now()) == []


def test_a_webhook_that_redirects_is_shown_given_up_without_the_path_it_names(
    agent: Agent, hook: Hook, clock: time_machine.Traveller, staff: Client
) -> None:
    """A redirect fails at once, naming where the URL redirects: in full (scheme, host and
    path) in the admin's delivery log, and to the project's members without the path, which
    may hold a token, as their notice shows a webhook's own URL."""
    set_up(agent.project, hook, channels=["webhook"])
    WebhookEndpoint.objects.create(
        project=agent.project, url=f"{hook.url}/hooks/old-token", secret="whsec-moved"
    )
    hook.location = f"{hook.url}/hooks/new-token-in-path"
    hook.answer_first("/hooks/old-token", 308, 308)
    add_price("test-sonnet")
    budget(agent.project, cost_limit_usd="1.00")
    spend(agent, "s", 1_000_000)  # soft_warned and exhausted
    outbox_dispatch()
    deliveries = list(AlertDelivery.objects.order_by("pk"))
    assert [(d.status, d.attempts) for d in deliveries] == [("failed", 1)] * 2
    fix = "redirects are not followed: use the final URL"
    logged = f"HTTP 308 Permanent Redirect: the URL redirects to {hook.location}; {fix}"
    assert {d.error for d in deliveries} == {logged}
    page = staff.get(f"/admin/costboard/alertdelivery/{deliveries[0].pk}/change/")
    assert logged.encode() in page.content
    members = member_of(agent)
    for page_path in PAGES:
        assert notices(members, page_path) == [
            f"Alerts to webhook {hook.url}/… (Acme) have been failing since Nov 10, 12:00 UTC: "
            f"HTTP 308 Permanent Redirect: the URL redirects to {hook.url}/…; {fix} (given up)."
        ]
        assert "-token" not in members.get(page_path).content.decode()
