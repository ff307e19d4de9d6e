"""The finish a user sees, in a real Chromium over seeded demo data: every page fits a 390 px
phone (no horizontal scrolling of the document), charts read right, the project switcher keeps
you on the equivalent page, and counts change with the action that changes them."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from costboard.models import SYSTEM_SESSION_ID, Project, Session
from memory_ui.models import Memory
from tests.conftest import make_agent
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def demo() -> None:
    call_command("seed_demo", sessions=30, stdout=StringIO())
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")


@pytest.fixture
def phone(browser: Any) -> Iterator[Any]:
    from tests.e2e.conftest import Page

    context = browser.new_context(viewport=PHONE)
    page = Page(context.new_page())
    page.set_default_timeout(15_000)
    yield page
    context.close()


def every_page() -> list[str]:
    costliest = Session.objects.exclude(external_id=SYSTEM_SESSION_ID).order_by("-cost_usd")[0]
    system = Session.objects.filter(external_id=SYSTEM_SESSION_ID).order_by("pk")[0]
    memory = Memory.objects.order_by("pk")[0]
    return [
        "/",
        "/sessions/",
        f"/sessions/{costliest.pk}/",
        f"/sessions/{system.pk}/",
        "/flagged/",
        "/steps/",
        "/steps/?since=2026-12-01&until=2026-11-01",
        "/users/",
        "/memory/review/",
        "/memory/",
        "/memory/metrics/",
        f"/memory/{memory.pk}/",
        "/admin/",
        "/admin/costboard/modelprice/",
        "/api/v1/docs",
        "/no-such-page/",
    ]


# Elements past the viewport's right edge that no scrolling box of theirs clips: what makes the
# document itself scroll sideways.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth, out = [];
  for (const el of document.querySelectorAll("body *")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= width + 1) continue;
    let up = el.parentElement, clipped = false;
    for (; up; up = up.parentElement) {
      const scrolls = ["auto", "hidden", "scroll"].includes(getComputedStyle(up).overflowX);
      if (scrolls) { clipped = true; break; }
    }
    const name = `${el.tagName.toLowerCase()}.${el.className}`;
    if (!clipped) out.push(`${name} right=${Math.round(box.right)}`);
  }
  return out.slice(0, 5);
}"""


def test_no_page_scrolls_sideways_at_390_px(live_server: Any, demo: None, phone: Any) -> None:
    base = live_server.url
    log_in(phone, base)
    for path in every_page():
        phone.goto(base + path)
        phone.wait_for_load_state("networkidle")
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert (path, width, phone.evaluate(OVERFLOWING)) == (path, 390, [])
        if not path.startswith(("/admin/", "/api/")):
            # the header's every control is on screen: switcher and Log out included
            for control in ("nav", "button:has-text('Log out')"):
                box = phone.locator(f"header.topbar {control}").first.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (
                    path,
                    control,
                    box,
                )


def test_a_session_id_of_128_characters_fits_a_phone(
    live_server: Any, demo: None, phone: Any
) -> None:
    """The longest session id the API takes, with no space to break at, and markup in it: its
    page's heading wraps within 390 px (and shows the id as text, nothing run)."""
    long_id = ("<b>x</b>" + "y" * 128)[:128]
    agent = make_agent("longids")
    agent.events(
        {"type": "session", "session_id": long_id, "user_id": "z" * 120},
        {"session_id": long_id, "step_type": "x", "model": "m", "input_tokens": 5},
    )
    pk = Session.objects.get(external_id=long_id).pk
    base = live_server.url
    log_in(phone, base)
    for path in ("/sessions/?q=yyyy", f"/sessions/{pk}/"):
        phone.goto(base + path)
        phone.wait_for_load_state("networkidle")
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert (path, width, phone.evaluate(OVERFLOWING)) == (path, 390, [])
    assert phone.locator("h1 code").inner_text() == long_id  # the session's page


@pytest.mark.parametrize("width", [1400, 1024])
def test_a_long_user_id_fits_its_tile_on_a_desktop_too(
    live_server: Any, page: Any, width: int
) -> None:
    """The phone's rule, wide: a user id with no space to break at wraps within its tile
    instead of widening the row of tiles past the screen."""
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    user_id = "customer-success+enterprise-trial@globex-corporation.example.com"
    agent = make_agent("longids")
    agent.events(
        {"type": "session", "session_id": "long-user", "user_id": user_id},
        {"session_id": "long-user", "step_type": "x", "model": "m", "input_tokens": 5},
    )
    pk = Session.objects.get(external_id="long-user").pk
    base = live_server.url
    log_in(page, base)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{base}/sessions/{pk}/")
    page.wait_for_load_state("networkidle")
    width_now = page.evaluate("document.documentElement.scrollWidth")
    assert (width_now, page.evaluate(OVERFLOWING)) == (width, [])
    user = page.locator("#budget-tiles .tile .big.small")
    assert user.inner_text() == user_id
    assert user.evaluate("e => e.scrollWidth - e.clientWidth") == 0  # none of it past the tile


def test_the_switcher_on_a_session_page_lands_on_that_projects_sessions(
    live_server: Any, demo: None, page: Any
) -> None:
    session = Session.objects.exclude(external_id=SYSTEM_SESSION_ID).order_by("-cost_usd")[0]
    other = next(p for p in Project.objects.order_by("slug") if p.pk != session.project_id)
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/sessions/{session.pk}/")
    page.select_option("#project-switcher", other.slug)
    page.wait_for_url(f"{base}/sessions/?project={other.slug}")
    assert page.locator("header.topbar nav").is_visible()
    assert page.locator("#project-switcher").input_value() == other.slug
    rows = page.locator("tr[data-session]")
    assert rows.count() > 0
    assert Session.objects.filter(
        project=other, external_id=rows.first.get_attribute("data-session")
    ).exists()

    # a page that is not there: the site's own page, header and all, with a way back
    page.goto(f"{base}/sessions/999999/?project={other.slug}")
    assert page.locator("[data-not-found]").is_visible()
    assert page.locator("header.topbar nav").is_visible()
    page.click("text=Go to the overview")
    page.wait_for_url(f"{base}/?project={other.slug}")
    assert page.errors == [
        "Failed to load resource: the server responded with a status of 404 (Not Found)"
    ]


# every drawn axis's tick labels, per chart: Plotly writes each as an svg text
TICKS = """() => Array.from(document.querySelectorAll("[data-chart]")).map(chart => ({
  name: chart.dataset.chart,
  axes: Array.from(chart.querySelectorAll(".xaxislayer-above, .yaxislayer-above, .angularaxis"))
    .map(axis => Array.from(axis.querySelectorAll("text")).map(t => t.textContent)),
}))"""


def test_no_chart_repeats_a_tick_label(live_server: Any, demo: None, page: Any) -> None:
    cheapest = (
        Session.objects.exclude(external_id=SYSTEM_SESSION_ID)
        .filter(turn_count__gte=3)
        .order_by("cost_usd")[0]
    )
    system = Session.objects.filter(external_id=SYSTEM_SESSION_ID).order_by("pk")[0]
    base = live_server.url
    log_in(page, base)
    seen = 0
    for path in ("/", f"/sessions/{cheapest.pk}/", f"/sessions/{system.pk}/", "/steps/"):
        page.goto(base + path)
        page.wait_for_load_state("networkidle")
        page.wait_for_selector("[data-chart] svg.main-svg", state="attached")
        for chart in page.evaluate(TICKS):
            for labels in chart["axes"]:
                assert len(labels) == len(set(labels)), (path, chart["name"], labels)
                seen += 1
        # the money axes start at $0 and say so once; no "< $0" buckets
        assert "< $0<" not in page.content()
    assert seen >= 10
    page.goto(f"{base}/steps/")
    page.wait_for_selector('[data-chart="turn_costs"] svg.main-svg', state="attached")
    buckets = page.locator('[data-chart="turn_costs"] .yaxislayer-above text').all_text_contents()
    assert buckets and all("$0." in b or "$1" in b or "$3" in b for b in buckets), buckets
    assert page.errors == []


def test_header_counts_change_with_the_action_that_changes_them(
    live_server: Any, demo: None, page: Any
) -> None:
    pending = Memory.objects.filter(status="pending").count()
    assert pending >= 4
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/memory/review/")
    header, queue = page.locator("#nav-pending"), page.locator("[data-count=all]")
    assert header.text_content() == queue.text_content() == str(pending)
    page.evaluate("window.__kept = 'same page'")  # gone if the page reloads

    for box in page.locator("input[data-select]").all()[:3]:
        box.check()
    page.locator("button", has_text="Approve selected").click()
    page.wait_for_selector("[data-note]")
    assert "Approved 3 candidates." in page.text_content("[data-note]")
    assert queue.text_content() == str(pending - 3)
    assert header.text_content() == str(pending - 3)
    assert page.locator("#tab-pending").text_content() == str(pending - 3)

    # one at a time too: the header follows each decision
    page.locator("article.candidate [data-action=approve]").first.click()
    page.wait_for_function(
        f"document.querySelector('#nav-pending').textContent === '{pending - 4}'"
    )
    assert queue.text_content() == str(pending - 4)
    assert page.evaluate("window.__kept") == "same page"

    # /flagged/: an acknowledged session leaves "All" as the row changes
    page.goto(f"{base}/flagged/")
    everything = page.locator("[data-count=all]")
    before = int(everything.text_content() or "0")
    assert before >= 1
    page.locator("tr.flag-row button.acknowledge").first.click()
    page.wait_for_function(
        f"document.querySelector('[data-count=all]').textContent === '{before - 1}'"
    )
    assert page.locator("[data-count=acknowledged]").text_content() == "1"
    assert page.errors == []
