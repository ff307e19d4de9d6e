"""The dashboards in a real browser: log in, charts drawn, htmx filtering, a session's totals,
and no JavaScript error anywhere on the way."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from costboard.models import Session
from costboard.templatetags.costboard_tags import usd
from tests.conftest import add_price, make_agent
from tests.costboard.dashboards.test_dashboards import traffic

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", "viewer")
    page.fill("input[name=password]", "pw-viewer-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def test_overview_sessions_and_a_session_in_chromium(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet")
    add_price("test-haiku", input_mtok=Decimal(1), output_mtok=Decimal(5))
    agent = make_agent("acme")
    traffic(agent, sessions=4, turns=3)
    agent.events(
        {"type": "session", "session_id": "over", "token_cap": 1000},
        {
            "session_id": "over",
            "turn": 1,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 1200,
            "output_tokens": 34,
        },
    )
    base = live_server.url

    log_in(page, base)
    for name in ("daily", "step_types", "kinds"):
        page.wait_for_selector(f'[data-chart="{name}"] svg.main-svg', state="attached")
    assert page.locator('[data-chart="daily"] .bars path').count() > 0

    page.click("nav >> text=Sessions")
    page.wait_for_url(f"{base}/sessions/")
    assert page.locator("tr[data-session]").count() == 5
    page.evaluate("window.__kept = 'same page'")  # gone if the page reloads
    page.select_option("select[name=state]", "exhausted")
    page.wait_for_function("document.querySelectorAll('tr[data-session]').length === 1")
    assert page.locator("tr[data-session]").get_attribute("data-session") == "over"
    assert "state=exhausted" in page.url
    assert page.evaluate("window.__kept") == "same page"

    page.click("tr[data-session=over] a")
    page.wait_for_url("**/sessions/*/")
    session = Session.objects.get(external_id="over")
    assert page.text_content("[data-total=tokens]") == f"{session.tokens_used:,}" == "1,234"
    assert page.text_content("[data-total=cost]") == usd(session.cost_usd)
    assert page.text_content("[data-state]") == "exhausted"
    for name in ("tokens_gauge", "cost_gauge", "cumulative", "per_turn"):
        page.wait_for_selector(f'[data-chart="{name}"] svg.main-svg', state="attached")

    assert page.errors == []


def test_one_model_under_three_names_is_one_row_with_its_names_a_click_away(
    live_server: Any, page: Any
) -> None:
    from costboard.pricing.sync import prices_sync

    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    prices_sync()
    agent = make_agent("acme")
    agent.events(
        *[
            {
                "session_id": "chat",
                "turn": 1,
                "step_type": "response",
                "model": model,
                "input_tokens": 1000,
                "output_tokens": 100,
            }
            for model in ("gpt-4o-2024-08-06", "openai/gpt-4o", "gpt-4o")
        ],
        {"session_id": "chat", "turn": 1, "step_type": "tool", "model": "none", "duration_ms": 9},
    )
    base = live_server.url

    log_in(page, base)
    page.wait_for_selector('[data-chart="daily"] svg.main-svg', state="attached")
    legend = page.locator('[data-chart="daily"] .legendtext').all_text_contents()
    assert legend == [] or legend == ["gpt-4o"]  # one series (a lone one has no legend)
    row = page.locator('#models tr[data-family="gpt-4o"]')
    assert row.count() == 1
    assert page.locator('#models tr[data-family="none"]').text_content().count("$0 (tool)") == 1
    assert not row.locator("[data-exact]").first.is_visible()  # folded until asked
    row.locator("summary").click()
    names = row.locator("[data-exact]")
    assert sorted(names.all_text_contents()) == ["gpt-4o", "gpt-4o-2024-08-06", "openai/gpt-4o"]

    row.locator('[data-exact="openai/gpt-4o"]').click()
    page.wait_for_url("**/steps/?*exact=openai*")
    assert page.locator("[data-exact-filter]").is_visible()
    assert page.locator('#step-table tr[data-family="gpt-4o"] td.num').first.text_content() == "1"

    page.goto(f"{base}/steps/")
    assert page.locator('#step-table tr[data-family="gpt-4o"]').count() == 1
    options = page.locator("select[name=model] option").all_text_contents()
    assert options == ["any", "gpt-4o", "— (tool)"]
    page.select_option("select[name=model]", "none")  # htmx swaps the results in place
    page.wait_for_function(
        "document.querySelectorAll('#step-table tr[data-family]').length === 1"
        " && document.querySelector('#step-table tr[data-family=none]') !== null"
    )
    assert "$0 (tool)" in page.text_content('#step-table tr[data-family="none"]')
    assert page.errors == []


def test_a_one_step_session_draws_its_point_and_a_tool_only_one_says_it_has_no_tokens(
    live_server: Any, page: Any
) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet")
    agent = make_agent("acme")
    agent.events(
        {
            "session_id": "one-step",
            "turn": 1,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 800,
            "output_tokens": 40,
        },
        *[
            {"session_id": "tools", "turn": 1, "step_type": "tool", "model": "none"}
            for _ in range(2)
        ],
    )
    base = live_server.url
    log_in(page, base)

    one = Session.objects.get(external_id="one-step")
    page.goto(f"{base}/sessions/{one.pk}/")
    point = page.locator('[data-chart="cumulative"] .scatterlayer .points path.point')
    point.first.wait_for(state="attached")
    assert point.count() == 1
    box = point.first.bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0  # a visible marker
    ticks = page.locator('[data-chart="cumulative"] .xtick text').all_text_contents()
    assert ticks and not any(".0001" in tick or "ms" in tick for tick in ticks)

    tools = Session.objects.get(external_id="tools")
    page.goto(f"{base}/sessions/{tools.pk}/")
    for name, words in (("cumulative", "No token data"), ("per_turn", "No cost data")):
        note = page.locator(f'[data-chart="{name}"] .annotation-text')
        note.first.wait_for(state="attached")
        assert words in note.first.text_content()
        assert page.locator(f'[data-chart="{name}"] .scatterlayer .trace').count() == 0
    assert page.errors == []


def test_another_filter_keeps_the_exact_model_name(live_server: Any, page: Any) -> None:
    """/steps/ and /sessions/ filtered to one exact name (its chip shown) keep it when another
    filter changes: the form sends it, so the figures, the URL and the CSV link stay of that
    name, as the chip says, not of its whole family."""
    from costboard.pricing.sync import prices_sync

    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    prices_sync()
    make_agent("acme").events(
        *[
            {
                "session_id": session,
                "turn": 1,
                "step_type": step_type,
                "model": model,
                "input_tokens": 1000,
                "output_tokens": 100,
            }
            for session, step_type, model in (
                ("dated", "response", "gpt-4o-2024-08-06"),
                ("routed", "response", "openai/gpt-4o"),
                ("routed-search", "search", "openai/gpt-4o"),
            )
        ]
    )
    base = live_server.url
    log_in(page, base)

    page.goto(f"{base}/steps/?model=gpt-4o&exact=openai%2Fgpt-4o")
    calls = '#step-table tr[data-family="gpt-4o"] td.num'
    assert page.locator("[data-exact-filter]").is_visible()
    assert page.locator(calls).all_text_contents()[0::8] == ["1", "1"]  # response, search
    page.select_option("select[name=step_type]", "response")
    page.wait_for_url("**/steps/?*step_type=response*")
    assert "exact=openai%2Fgpt-4o" in page.url
    assert page.locator(calls).first.text_content() == "1"  # not the family's 2

    page.goto(f"{base}/sessions/?model=gpt-4o&exact=openai%2Fgpt-4o")
    listed = "document.querySelectorAll('tr[data-session]')"
    assert page.locator("tr[data-session]").count() == 2
    page.select_option("select[name=state]", "ok")
    page.wait_for_url("**/sessions/?*state=ok*")
    assert "exact=openai%2Fgpt-4o" in page.url
    page.wait_for_function(f"{listed}.length === 2")
    rows = page.locator("tr[data-session]")
    assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.session)")) == [
        "routed",
        "routed-search",
    ]
    assert "exact=openai%2Fgpt-4o" in page.get_attribute("text=Export CSV", "href")
    assert page.errors == []
