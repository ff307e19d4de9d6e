"""/reports/ in a real browser: reached from the navigation, the last complete week's figures
against the week before, a tag value that is markup shown as text, another week picked from
the selector, and the CSV link answering the same report; no JavaScript error on the way."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.conftest import add_price, make_agent
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SCRIPT = "<img src=x onerror=alert(1)>"


def test_the_report_page_shows_the_figures_in_chromium(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet")  # $3 per million input tokens
    agent = make_agent("acme", report_tag_key="customer")
    today = timezone.now().date()
    last_monday = today - timedelta(days=today.weekday() + 7)  # the last complete week's
    before = last_monday - timedelta(days=7)

    def at(day: Any) -> str:
        return datetime.combine(day, time(9), tzinfo=UTC).isoformat()

    agent.events(
        {"type": "session", "session_id": "s1", "user_id": "ann"},
        *(
            {
                "session_id": "s1",
                "step_type": "llm",
                "model": "test-sonnet",
                "input_tokens": tokens,
                "timestamp": at(day),
                "tags": {"customer": customer},
            }
            for day, tokens, customer in [
                (before + timedelta(days=2), 1_000_000, "globex"),
                (last_monday + timedelta(days=1), 2_000_000, "globex"),
                (last_monday + timedelta(days=6), 500_000, SCRIPT),
            ]
        ),
    )
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:  # an alert() a tag value managed to run
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    base = live_server.url
    log_in(page, base)
    page.click("nav >> text=Reports")
    page.wait_for_url(f"{base}/reports/")
    assert page.text_content("[data-report-total]") == "$7.50"
    assert page.text_content("[data-report-previous]") == "$3.00"
    assert page.text_content("[data-report-change]") == "+$4.50"
    assert page.text_content("[data-report-change-pct]") == "+150.0 %"
    tag = page.locator('[data-grouping="tag:customer"]')
    assert tag.locator("tbody tr").count() == 2
    markup = tag.locator("tbody tr").nth(1)
    assert markup.locator("td").first.text_content() == SCRIPT  # shown as text, never run
    assert markup.locator("[data-change-pct]").text_content() == "new"
    assert tag.locator("tbody tr").first.locator("[data-change]").text_content() == "+$3.00"
    assert page.locator('[data-grouping="user"] [data-mover="ann"]').count() == 1

    # the week before, from the selector
    label = page.locator("select[name=at] option").nth(1).get_attribute("value")
    page.select_option("select[name=at]", label)
    page.click("form.filters button[type=submit]")
    page.wait_for_url(lambda url: f"at={label}" in url)
    assert page.text_content("[data-report-total]") == "$3.00"

    href = page.get_attribute("[data-csv]", "href")
    request = urllib.request.Request(f"{base}{href}")
    cookies = page.context.cookies()
    request.add_header("Cookie", "; ".join(f"{c['name']}={c['value']}" for c in cookies))
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    assert text.splitlines()[0].startswith("grouping,name,cost_usd")
    assert "tag:customer,globex,3.00" in text
    assert Decimal("3.00") == Decimal(text.splitlines()[1].split(",")[2])
    assert dialogs == [] and page.errors == []
