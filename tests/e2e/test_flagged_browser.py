"""The flagged sessions page in a real browser: raise a cap and acknowledge with htmx, each
swapping its row in place (no reload), errors shown inline, every asset from our own static
files, and no JavaScript error on the way."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from costboard.models import BudgetEvent, Session
from tests.conftest import make_agent
from tests.costboard.dashboards.test_dashboards import capped
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

REFUSED = "the server responded with a status of 422"  # Chromium's note on a 422, expected


def test_raise_a_cap_and_acknowledge_in_chromium(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    agent = make_agent("acme")
    capped(agent, "over", "exhausted")
    capped(agent, "near", "warning")
    base = live_server.url
    assets: list[tuple[str, str]] = []
    page.on("request", lambda r: assets.append((r.resource_type, r.url)))

    log_in(page, base)
    page.click("nav >> text=Flagged")
    page.wait_for_url(f"{base}/flagged/")
    assert page.locator("tr[data-session]").count() == 2
    assert page.get_attribute("tr[data-session=over]", "data-state") == "exhausted"
    page.evaluate("window.__kept = 'same page'")  # gone if the page reloads

    over = page.locator("tr[data-session=over]")
    over.locator("summary", has_text="Raise cap").click()
    assert over.locator("input[name=token_cap]").input_value() == "2000"  # prefilled

    # a lower cap is refused in place, naming the field
    over.locator("input[name=token_cap]").fill("5")
    over.locator("button", has_text="Raise").click()
    page.wait_for_selector("tr[data-session=over] [data-error=token_cap]")
    assert "Token cap: must be higher than the current cap of 1,000" in page.text_content(
        "tr[data-session=over] [data-error=token_cap]"
    )

    # the form stays open with what was typed; a real raise swaps the row
    over = page.locator("tr[data-session=over]")
    over.locator("input[name=token_cap]").fill("1100")
    over.locator("button", has_text="Raise").click()
    page.wait_for_selector("tr[data-session=over][data-state=warning]")
    assert "tokens 1,000 of 1,100 (90%)" in page.text_content("tr[data-session=over]")
    assert page.evaluate("window.__kept") == "same page"
    session = Session.objects.get(external_id="over")
    assert (session.token_cap, session.state) == (1100, "warning")
    assert BudgetEvent.objects.filter(session=session, kind="cap_changed").count() == 1

    # raise it past the warning level: resolved
    over = page.locator("tr[data-session=over]")
    over.locator("summary", has_text="Raise cap").click()
    over.locator("input[name=token_cap]").fill("10,000")
    over.locator("button", has_text="Raise").click()
    page.wait_for_selector("tr[data-session=over][data-state=resolved]")

    page.locator("tr[data-session=near] button", has_text="Acknowledge").click()
    page.wait_for_selector("tr[data-session=near] .badge.acknowledged")
    assert page.evaluate("window.__kept") == "same page"
    assert Session.objects.get(external_id="near").acknowledged_by == "viewer"

    page.goto(f"{base}/flagged/")
    assert page.locator("tr[data-session]").count() == 0
    page.click("[data-toggle=acknowledged]")
    page.wait_for_selector("tr[data-session=near]")
    assert "acknowledged=1" in page.url

    # the one refused raise, and nothing else
    assert [e for e in page.errors if REFUSED in e] == [page.errors[0]]
    assert [e for e in page.errors if REFUSED not in e] == []
    # every request to this server; every asset (htmx, CSS, icon) from our static files
    origin = urlsplit(base).netloc
    assert {urlsplit(url).netloc for _, url in assets} == {origin}
    fetched = [(kind, url) for kind, url in assets if kind not in {"document", "xhr", "fetch"}]
    assert {kind for kind, _ in fetched} >= {"script", "stylesheet"}
    for kind, url in fetched:
        assert urlsplit(url).path.startswith("/static/"), (kind, url)


def _drawn(page: Any, chart: str) -> dict[str, Any]:
    """What Plotly drew in a chart: its gauge's cap (the threshold) and its end tick."""
    return page.evaluate(
        """(chart) => {
            const g = document.querySelector(`[data-chart=${chart}]`).data[0].gauge;
            return {cap: g.threshold.value, ticks: g.axis.ticktext, colour: g.bar.color};
        }""",
        chart,
    )


def test_a_cap_raised_on_the_session_page_redraws_its_dials(live_server: Any, page: Any) -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    agent = make_agent("acme")
    capped(agent, "over", "exhausted")  # 1,000 tokens of a 1,000 cap
    session = Session.objects.get(external_id="over")
    base = live_server.url

    log_in(page, base)
    page.goto(f"{base}/sessions/{session.pk}/")
    page.wait_for_function("document.querySelector('[data-chart=tokens_gauge] .main-svg')")
    assert _drawn(page, "tokens_gauge")["cap"] == 1000
    page.evaluate("window.__kept = 'same page'")  # gone if the page reloads

    banner = page.locator("#flag-banner")
    banner.locator("summary", has_text="Raise cap").click()
    banner.locator("input[name=token_cap]").fill("4000")
    banner.locator("button", has_text="Raise").click()
    page.wait_for_selector("#budget-tiles >> text=of 4,000")
    assert page.evaluate("window.__kept") == "same page"
    # the dial says what the tile says: 1,000 of a 4,000 cap, not still at its old cap
    page.wait_for_function(
        "document.querySelector('[data-chart=tokens_gauge]').data[0].gauge.threshold.value === 4000"
    )
    drawn = _drawn(page, "tokens_gauge")
    assert drawn["ticks"] == ["0", "3.2k", "4k"]
    assert drawn["colour"] == _drawn(page, "cost_gauge")["colour"]  # below warning: both green
    assert Session.objects.get(pk=session.pk).token_cap == 4000
    assert page.errors == []
