"""The Budgets pages in a real browser: /budgets/ from the navigation, a budget's own page with
the sessions it stops, and a session page's "stopped by" link back to its budget; every asset
from our own static files, and no JavaScript error on the way."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from costboard.models import PeriodBudget, Session
from tests.conftest import add_price, make_agent
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_budgets_and_a_stopped_session_in_chromium(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet", input_mtok=Decimal(3000))  # 100 tokens: $0.30
    agent = make_agent("acme")
    budget = PeriodBudget.objects.create(
        project=agent.project,
        name="ann monthly",
        scope="user",
        scope_value="ann",
        cost_limit_usd=Decimal("0.50"),
        action="stop",
    )
    step = {"session_id": "ann-1", "step_type": "x", "model": "test-sonnet", "input_tokens": 100}
    agent.events({"type": "session", "session_id": "ann-1", "user_id": "ann"}, step, step)
    base = live_server.url
    assets: list[str] = []
    page.on("request", lambda r: assets.append(r.url))

    log_in(page, base)
    page.click("nav >> text=Budgets")
    page.wait_for_url(f"{base}/budgets/")
    row = page.locator(f"tr[data-budget='{budget.pk}']")
    assert row.locator("[data-budget-state]").text_content() == "exhausted"
    assert row.locator("[data-budget-spent]").text_content() == "$0.60"

    row.locator("a", has_text="ann monthly").click()
    page.wait_for_url(f"{base}/budgets/{budget.pk}/")
    assert page.text_content("[data-stopped-total]") == (
        "1 session active this period is told to stop."
    )
    page.locator("#stopped a", has_text="ann-1").click()
    session = Session.objects.get(external_id="ann-1")
    page.wait_for_url(f"{base}/sessions/{session.pk}/")
    assert page.text_content("[data-state]") == "exhausted"

    # the session page's "stopped by" link leads back to the budget
    page.locator("h1 [data-stopped-by] a").click()
    page.wait_for_url(f"{base}/budgets/{budget.pk}/")
    assert page.text_content("h1").startswith("ann monthly")
    assert page.errors == []
    assert {urlsplit(url).netloc for url in assets} == {urlsplit(base).netloc}
