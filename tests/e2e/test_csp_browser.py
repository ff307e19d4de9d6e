"""Every page under its Content-Security-Policy (costboard/csp.py) in a real Chromium: each main
page loads with the header and draws what it draws (charts, tables, Swagger UI, the admin),
htmx swaps and the project switcher work, and the browser reports no CSP violation and no
console error anywhere on the way."""

from __future__ import annotations

from typing import Any

import pytest

from costboard.models import PeriodBudget, Project
from tests.e2e.test_dashboards_browser import log_in
from tests.e2e.test_finish_browser import demo, every_page

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

__all__ = ["demo"]  # the fixture, seeded demo data and the viewer who logs in

# Run before any page script (Playwright's init scripts are not subject to the page's CSP):
# every violation the browser reports, kept in the tab's sessionStorage across navigations.
LISTEN = """
document.addEventListener("securitypolicyviolation", (e) => {
  const seen = JSON.parse(sessionStorage.getItem("violations") || "[]");
  seen.push(`${location.pathname}: ${e.effectiveDirective} blocked ` +
            `${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
  sessionStorage.setItem("violations", JSON.stringify(seen));
});
"""


def violations(page: Any) -> list[str]:
    return list(page.evaluate("JSON.parse(sessionStorage.getItem('violations') || '[]')"))


def settled(page: Any) -> None:
    """Wait until the page's own requests (plotly.js, the OpenAPI document) are done and the
    charts it embeds are drawn."""
    page.wait_for_load_state("networkidle")
    for chart in page.locator("[data-chart]").all():
        if chart.is_visible():
            chart.locator("svg.main-svg").first.wait_for(state="attached")


def test_every_page_loads_under_its_policy_without_a_violation(
    live_server: Any, demo: None, page: Any
) -> None:
    page.add_init_script(LISTEN)
    base = live_server.url
    login = page.goto(f"{base}/accounts/login/")
    assert login is not None and "form-action 'self'" in login.headers["content-security-policy"]
    log_in(page, base)
    paths = [path for path in every_page() if path != "/no-such-page/"]
    project = Project.objects.order_by("pk")[0]
    budget = PeriodBudget.objects.order_by("pk")[0]  # the demo's
    paths += [
        "/budgets/",
        f"/budgets/{budget.pk}/",
        "/reconciliation/",
        f"/admin/costboard/project/{project.pk}/change/",
    ]
    seen: dict[str, list[str]] = {}
    for path in paths:
        response = page.goto(base + path)
        assert response is not None, path
        assert response.status == (422 if "since=" in path else 200), path
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"], path
        settled(page)
        # the 422 of a page whose filter is wrong is the one failed load expected
        errors = [
            e
            for e in page.errors
            if not e.startswith(
                "Failed to load resource: the server responded with a status of 422"
            )
        ]
        if errors:
            seen[path] = errors
        page.errors.clear()
    assert violations(page) == []
    assert seen == {}, "\n".join(f"{p}: {e[:160]}" for p, found in seen.items() for e in found)


def test_the_pages_still_work_under_their_policy(live_server: Any, demo: None, page: Any) -> None:
    page.add_init_script(LISTEN)
    base = live_server.url
    log_in(page, base)  # a form posted to our own origin (form-action 'self')
    page.locator('[data-chart="daily"] svg.main-svg').first.wait_for(state="attached")
    # plotly.js drew with its styles from plotly.css, not from a <style> of its own
    assert page.evaluate("document.querySelectorAll('style').length") == 0
    modebar = page.locator('[data-chart="daily"] .modebar').first
    assert modebar.evaluate("el => getComputedStyle(el).position") == "absolute"

    # an htmx filter: the table swapped in place, the same page
    page.goto(f"{base}/sessions/")
    page.evaluate("window.__kept = 'same page'")
    page.select_option("select[name=state]", "ok")
    page.wait_for_url("**/sessions/?*state=ok*")
    page.wait_for_function(
        "[...document.querySelectorAll('tr[data-session] .badge')].every(b => "
        "b.textContent.trim() === 'ok' || b.classList.contains('runaway'))"
    )
    assert page.evaluate("window.__kept") == "same page"
    # a meter's fill comes from its fill-N class, not a style attribute
    meter = page.locator("tr[data-session] .meter").first
    assert "fill-" in (meter.get_attribute("class") or "")
    assert meter.evaluate("el => getComputedStyle(el).getPropertyValue('--fill')").endswith("%")

    # the project switcher submits from app.js (no onchange attribute), keeping the filters
    other = Project.objects.order_by("slug")[0]
    page.select_option("#project-switcher", other.slug)
    page.wait_for_url(f"**/sessions/?*state=ok*&project={other.slug}")

    # the steps page's charts are drawn again after its htmx swap
    page.goto(f"{base}/steps/")
    page.locator("[data-chart] svg.main-svg").first.wait_for(state="attached")
    page.select_option("select[name=step_type]", "response")  # a known type: a select
    page.wait_for_url("**/steps/?*step_type=response*")
    page.locator("[data-chart] svg.main-svg").first.wait_for(state="attached")

    # the admin's decimal inputs keep their width from admin.css
    page.goto(f"{base}/admin/costboard/modelprice/")
    width = page.locator("input.decimal-input").first.evaluate(
        "el => parseFloat(getComputedStyle(el).width) / parseFloat(getComputedStyle(el).fontSize)"
    )
    assert 5.4 < width < 5.6

    # Swagger UI drew the document
    page.goto(f"{base}/api/v1/docs")
    page.locator(".opblock").first.wait_for()

    assert violations(page) == []
    assert page.errors == []
