"""A bad page parameter in a real browser: the 422 page draws with the error in its form, and
choosing a good value in the form swaps the results in (htmx) without it, the charts of the
chosen steps drawn."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from costboard.models import Step
from tests.conftest import add_price, make_agent
from tests.costboard.dashboards.test_dashboards import traffic
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def turn_counts(page: Any) -> int:
    figures = json.loads(page.text_content("#figures"))
    return sum(figures["turn_costs"]["data"][0]["x"])


def test_a_bad_step_type_is_named_and_a_good_one_filters_table_and_charts(
    live_server: Any, page: Any
) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet")
    add_price("test-haiku", input_mtok=Decimal(1), output_mtok=Decimal(5))
    agent = make_agent("acme")
    traffic(agent, sessions=3, turns=2)  # six turns, each an intent and a response step
    agent.events(
        *(
            {"session_id": "searcher", "turn": t, "step_type": "search", "model": "test-haiku"}
            for t in (1, 2, 3)
        )
    )
    base = live_server.url
    log_in(page, base)
    # the 422 answer is the page itself (Chromium reports the status as a failed load)
    response = page.goto(f"{base}/steps/?step_type=zzz")
    assert response.status == 422
    error = page.text_content('[data-error="step_type"]')
    assert "“zzz” is not a step type" in error and "intent, response, search" in error
    page.wait_for_selector('[data-chart="turn_costs"] svg.main-svg', state="attached")
    assert turn_counts(page) == 9  # left out: every turn

    page.select_option("select[name=step_type]", "search")
    page.wait_for_function("!document.querySelector('[data-error]')")
    assert "step_type=search" in page.url
    assert page.locator("#step-table tbody tr").count() == 1
    page.wait_for_selector('[data-chart="turn_costs"] svg.main-svg', state="attached")
    searched = Step.objects.filter(step_type="search").values("turn_id").distinct().count()
    assert turn_counts(page) == searched == 3

    # no script error: the one console line is Chromium's note of the page's own 422
    assert page.errors == [
        "Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"
    ]
