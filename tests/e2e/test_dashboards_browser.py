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


def test_a_sort_chosen_on_the_list_survives_a_filter_and_the_all_time_link(
    live_server: Any, page: Any
) -> None:
    # The column headers and the filters both swap only the table: a filter changed after a
    # header was clicked sent the sort of the page as first loaded, and "All time" led to
    # the filters of that first page.
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet")
    add_price("test-haiku", input_mtok=Decimal(1), output_mtok=Decimal(5))
    agent = make_agent("acme")
    traffic(agent, sessions=4, turns=1)  # s0 the latest and cheapest, s3 the oldest, costliest
    agent.events(
        {"type": "session", "session_id": "over", "token_cap": 1000},
        {"session_id": "over", "step_type": "response", "model": "test-sonnet", "turn": 1}
        | {"input_tokens": 1200, "output_tokens": 34},
    )
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/sessions/")

    def listed() -> list[str]:
        return [r.get_attribute("data-session") for r in page.locator("tr[data-session]").all()]

    assert [s for s in listed() if s != "over"] == ["s0", "s1", "s2", "s3"]
    page.click("th >> text=Cost / cap")
    page.wait_for_url("**/sessions/?sort=-cost")
    assert [s for s in listed() if s != "over"] == ["s3", "s2", "s1", "s0"]

    page.select_option("select[name=state]", "ok")
    page.wait_for_function("document.querySelectorAll('tr[data-session]').length === 4")
    assert "sort=-cost" in page.url
    assert listed() == ["s3", "s2", "s1", "s0"]

    page.click("[data-all-time]")
    page.wait_for_url("**/sessions/?*since=*")
    assert "state=ok" in page.url and "sort=-cost" in page.url
    assert listed() == ["s3", "s2", "s1", "s0"]
    assert page.errors == []


def test_an_exact_model_filter_stays_while_other_filters_change(
    live_server: Any, page: Any
) -> None:
    # The exact-name chip (a click on one of a family's names) sat outside the part htmx
    # swaps and sent nothing: the next filter changed dropped it while the chip still said
    # it applied, and its × went back to the filters of the page as first loaded.
    from costboard.pricing.sync import prices_sync

    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    prices_sync()
    agent = make_agent("acme")
    dated = "gpt-4o-2024-08-06"
    agent.events(
        {"type": "session", "session_id": "dated-over", "token_cap": 1000},
        {"session_id": "dated-over", "turn": 1, "step_type": "response", "model": dated}
        | {"input_tokens": 1200, "output_tokens": 10},
        {"session_id": "dated-ok", "turn": 1, "step_type": "intent", "model": dated}
        | {"input_tokens": 100, "output_tokens": 10},
        {"session_id": "plain-ok", "turn": 1, "step_type": "response", "model": "gpt-4o"}
        | {"input_tokens": 100, "output_tokens": 10},
    )
    base = live_server.url
    log_in(page, base)

    def listed() -> list[str]:
        return sorted(
            r.get_attribute("data-session") for r in page.locator("tr[data-session]").all()
        )

    page.goto(f"{base}/sessions/?exact={dated}")
    assert listed() == ["dated-ok", "dated-over"]
    page.select_option("select[name=state]", "ok")
    page.wait_for_url("**/sessions/?*state=ok*")
    assert f"exact={dated}" in page.url
    assert listed() == ["dated-ok"]
    assert f"exact={dated}" in page.get_attribute("text=Export CSV", "href")
    assert page.locator("[data-exact-filter]").count() == 1
    page.click("[data-exact-filter] a")  # × drops the exact name, keeps the state chosen
    page.wait_for_url("**/sessions/?*")
    assert "exact=" not in page.url and "state=ok" in page.url
    assert listed() == ["dated-ok", "plain-ok"]

    def calls() -> list[str]:  # of the gpt-4o rows, one per step type
        rows = page.locator('#step-table tr[data-family="gpt-4o"]').all()
        return [r.locator("td.num").first.inner_text() for r in rows]

    page.goto(f"{base}/steps/?exact={dated}")
    assert calls() == ["1", "1"]  # an intent and a response
    page.select_option("select[name=step_type]", "response")
    page.wait_for_url("**/steps/?*step_type=response*")
    assert f"exact={dated}" in page.url
    assert calls() == ["1"]  # dated-over's response; plain-ok's is another name
    page.click("[data-exact-filter] a")
    page.wait_for_url("**/steps/?*")
    assert "exact=" not in page.url and "step_type=response" in page.url
    assert calls() == ["2"]
    assert page.errors == []
