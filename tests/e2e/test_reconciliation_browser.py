"""/reconciliation/ in a real browser: reached from the navigation, its chart drawn from our
own static files, the largest gap first, and the drill-down to a day and then to a model
narrowing the rows; a proposed adjustment applied with its button; no JavaScript error on
the way."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from costboard.billing.services import billing_rows_replace
from costboard.billing.uploads import rows_from_json
from costboard.models import PriceAdjustment
from costboard.outbox import outbox_dispatch
from tests.conftest import add_price, make_agent
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_reconciliation_renders_and_drills_down_in_chromium(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("mistral-large", provider="mistral", input_mtok=Decimal(2), output_mtok=Decimal(6))
    agent = make_agent("acme")
    today = timezone.now().date()
    d1, d2 = today - timedelta(days=3), today - timedelta(days=2)
    agent.events(
        *(
            {
                "session_id": "s",
                "step_type": "chat",
                "model": "mistral-large",
                "input_tokens": 1_000_000,
                "output_tokens": 0,
                "timestamp": f"{day}T09:00:00Z",
            }
            for day in (d1, d2)
        )
    )  # $2.00 a day
    rows = [
        {"date": str(d1), "provider": "mistral", "model": "mistral-large", "cost_usd": "2.50"},
        {"date": str(d2), "provider": "mistral", "model": "mistral-large", "cost_usd": "2.05"},
        {"date": str(d2), "provider": "mistral", "model": "codestral-latest", "cost_usd": "0.75"},
    ]
    billing_rows_replace(
        rows_from_json({"rows": rows}, default_project=agent.project), source="api"
    )
    base = live_server.url
    assets: list[str] = []
    page.on("request", lambda r: assets.append(r.url))

    log_in(page, base)
    page.click("nav >> text=Reconciliation")
    page.wait_for_url(f"{base}/reconciliation/")
    page.wait_for_selector('[data-chart="daily"] svg.main-svg', state="attached")
    assert page.locator('[data-chart="daily"] .bars path').count() == 4  # 2 days × 2 series
    gaps = page.locator("#gaps tbody tr")
    assert gaps.count() == 3
    # the largest first: d2's codestral, billed $0.75 with no step
    assert gaps.nth(0).get_attribute("data-gap") == f"{d2} mistral codestral-latest"
    assert "uninstrumented" in (gaps.nth(0).text_content() or "")
    assert gaps.nth(1).locator("[data-drift]").text_content() == "$0.50"
    assert page.locator("#uninstrumented tbody tr").count() == 1
    assert page.text_content("[data-total-billed]") == "$5.30"

    # drill down: d2, then its mistral-large line's model
    page.locator(f"#days tr[data-day='{d2}'] a").click()
    page.wait_for_url(lambda url: "day=" in url)
    assert parse_qs(urlsplit(page.url).query)["day"] == [str(d2)]
    assert page.locator("#gaps tbody tr").count() == 2
    page.locator(f"#gaps tr[data-gap='{d2} mistral mistral-large'] [data-drill-model]").click()
    page.wait_for_url(lambda url: "model=" in url)
    query = parse_qs(urlsplit(page.url).query)
    assert (query["model"], query["provider"], query["day"]) == (
        ["mistral-large"],
        ["mistral"],
        [str(d2)],
    )
    [line] = page.locator("#gaps tbody tr").all()
    assert line.locator("[data-drift]").text_content() == "$0.05"
    assert line.locator("[data-drift-pct]").text_content() == "2.44%"
    assert page.locator("#uninstrumented").count() == 0
    # clearing the drill-down shows the whole period again
    page.click("[data-clear]")
    page.wait_for_url(lambda url: "day=" not in url)
    assert page.locator("#gaps tbody tr").count() == 3

    hosts = {urlsplit(url).netloc for url in assets if url.startswith("http")}
    assert hosts == {urlsplit(base).netloc}  # nothing from a CDN
    assert page.errors == []


def test_a_proposal_is_applied_with_one_click_in_chromium(live_server: Any, page: Any) -> None:
    """Eight days billed 12 % under list: the page proposes −12 % from the first day; the
    button records it; once the outbox has repriced, the drift reads $0.00 and the proposal
    is gone."""
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price(
        "claude-sonnet-4-5", provider="anthropic", input_mtok=Decimal(3), output_mtok=Decimal(15)
    )
    agent = make_agent("acme")
    today = timezone.now().date()
    days = [today - timedelta(days=10 - i) for i in range(8)]
    agent.events(
        *(
            {
                "session_id": "s",
                "step_type": "chat",
                "model": "claude-sonnet-4-5",
                "input_tokens": 1_000_000,
                "output_tokens": 100_000,
                "timestamp": f"{day}T09:00:00Z",
            }
            for day in days
        )
    )  # $4.50 a day at list
    rows = [
        {
            "date": str(day),
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "cost_usd": "3.96",
        }
        for day in days
    ]
    billing_rows_replace(
        rows_from_json({"rows": rows}, default_project=agent.project), source="api"
    )
    base = live_server.url
    log_in(page, base)
    url = f"{base}/reconciliation/?project=acme&since={days[0]}"
    page.goto(url)
    proposal = page.locator("#proposals [data-proposal]")
    assert proposal.count() == 1
    assert (
        f"billed 12.0 % under list for claude-sonnet-4-5 since {days[0]}: add −12 % from that date"
        in (proposal.text_content() or "")
    )
    assert page.text_content("[data-total-drift]") == "-$4.32"  # 8 × ($3.96 − $4.50)

    page.click("#proposals [data-apply]")
    page.wait_for_selector("[data-repricing]")
    assert page.url == url  # back on the same page, filters kept
    adjustment = PriceAdjustment.objects.get()
    assert (adjustment.percent, adjustment.effective_from) == (Decimal(-12), days[0])

    outbox_dispatch()  # the worker's part: reprice the steps the adjustment covers
    page.reload()
    page.wait_for_selector('[data-chart="daily"] svg.main-svg', state="attached")
    page.wait_for_load_state("networkidle")  # no request of the page's left in the server
    assert page.locator("#proposals").count() == 0
    assert page.text_content("[data-total-estimated]") == "$31.68"
    assert page.text_content("[data-total-drift]") == "$0.00"
    assert {cell.text_content() for cell in page.locator("#gaps [data-drift]").all()} == {"$0.00"}
    assert page.errors == []
