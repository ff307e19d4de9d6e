"""What a page keeps as you use it, in a real Chromium: the filters when the project changes
(after htmx swapped the table and pushed its URL too), a header clicked twice, and the way back
through the history."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tests.conftest import add_price, make_agent
from tests.costboard.dashboards.test_dashboards import traffic
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def query(url: str) -> dict[str, list[str]]:
    """The URL's parameters with a value (the filter form sends its empty boxes too)."""
    return parse_qs(urlsplit(url).query)


@pytest.fixture
def two_projects() -> None:
    get_user_model().objects.create_superuser("viewer", "", "pw-viewer-123")
    add_price("test-sonnet")
    add_price("test-haiku", input_mtok=Decimal(1), output_mtok=Decimal(5))
    traffic(make_agent("acme"), sessions=3, turns=1, prefix="a")
    other = make_agent("other")
    traffic(other, sessions=2, turns=1, prefix="o")
    other.events(
        {"type": "session", "session_id": "o-over", "token_cap": 1000},
        {"session_id": "o-over", "turn": 1, "step_type": "response", "model": "test-sonnet"}
        | {"input_tokens": 1200, "output_tokens": 34},
    )


def test_the_switcher_keeps_the_filters_chosen_since_the_page_loaded(
    live_server: Any, two_projects: None, page: Any
) -> None:
    # The switcher sent only `project`: on /sessions/?state=exhausted&… another project landed
    # on its whole unfiltered list. It must keep what the URL says now (htmx changed it after
    # the page loaded), and drop the page number, which is of the other project's list.
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/sessions/?project=acme&since=2020-01-01&model=test-sonnet&page=1")
    page.select_option("select[name=state]", "exhausted")  # an htmx swap, not a page load
    page.wait_for_url("**/sessions/?*state=exhausted*")
    page.click("th >> text=Cost / cap")
    page.wait_for_url("**/sessions/?*sort=-cost*")

    page.select_option("#project-switcher", "other")
    page.wait_for_url("**/sessions/?*project=other*")
    assert query(page.url) == {
        "project": ["other"],
        "since": ["2020-01-01"],
        "model": ["test-sonnet"],
        "state": ["exhausted"],
        "sort": ["-cost"],
    }
    assert [r.get_attribute("data-session") for r in page.locator("tr[data-session]").all()] == [
        "o-over"
    ]
    assert page.input_value("select[name=state]") == "exhausted"

    # "All projects" keeps them too
    page.select_option("#project-switcher", "")
    page.wait_for_url(lambda url: "project=" not in url)
    assert query(page.url) == {
        "since": ["2020-01-01"],
        "model": ["test-sonnet"],
        "state": ["exhausted"],
        "sort": ["-cost"],
    }
    assert page.errors == []


def test_without_javascript_the_switcher_sends_the_pages_filters(
    live_server: Any, two_projects: None, browser: Any
) -> None:
    from tests.e2e.conftest import Page

    context = browser.new_context(java_script_enabled=False)
    page = Page(context.new_page())
    base = live_server.url
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", "viewer")
    page.fill("input[name=password]", "pw-viewer-123")
    page.click("button[type=submit]")
    page.goto(f"{base}/sessions/?project=acme&state=exhausted&sort=-cost&page=1")
    page.select_option("#project-switcher", "other")
    page.click("form.switcher button[type=submit]")  # Go, shown without JavaScript
    page.wait_for_url("**project=other*")
    assert query(page.url) == {"project": ["other"], "state": ["exhausted"], "sort": ["-cost"]}
    assert [r.get_attribute("data-session") for r in page.locator("tr[data-session]").all()] == [
        "o-over"
    ]
    context.close()


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("/steps/?step_type=response&by_tier=1", {"step_type": ["response"], "by_tier": ["1"]}),
        ("/users/?since=2020-01-01&sort=user&page=2", {"since": ["2020-01-01"], "sort": ["user"]}),
        ("/?tag_key=team", {"tag_key": ["team"]}),
        ("/flagged/?acknowledged=1", {"acknowledged": ["1"]}),
        ("/reconciliation/?since=2020-01-01", {"since": ["2020-01-01"]}),
        ("/memory/?q=cache&page=3", {"q": ["cache"]}),
    ],
)
def test_every_page_with_the_switcher_keeps_its_filters(
    live_server: Any, two_projects: None, page: Any, path: str, kept: dict[str, list[str]]
) -> None:
    base = live_server.url
    log_in(page, base)
    page.goto(base + path)
    page.select_option("#project-switcher", "other")
    page.wait_for_url("**project=other*")
    got = query(page.url)
    assert got.pop("project") == ["other"]
    assert got == kept
    assert urlsplit(page.url).path == urlsplit(path).path


def test_a_users_header_clicked_twice_reverses_the_table_and_the_csv(
    live_server: Any, two_projects: None, page: Any
) -> None:
    # traffic(): in acme, user u0 has sessions a0 and a2, the more tokens; u1 has a1
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/users/?project=acme")

    def listed() -> list[str]:
        return [r.get_attribute("data-user") for r in page.locator("tr[data-user]").all()]

    page.click("th >> text=Tokens")
    page.wait_for_url("**/users/?*sort=-tokens*")
    assert listed() == ["u0", "u1"]
    assert page.inner_text("th[aria-sort=descending]") == "Tokens ▼"
    page.click("th >> text=Tokens")
    page.wait_for_url("**/users/?*sort=tokens*")
    assert query(page.url)["sort"] == ["tokens"]
    assert listed() == ["u1", "u0"]
    assert page.inner_text("th[aria-sort=ascending]") == "Tokens ▲"
    with page.expect_download() as download:
        page.click("[data-csv]")
    text = Path(download.value.path()).read_text(encoding="utf-8")
    assert [line.split(",")[0] for line in text.splitlines()[1:]] == ["u1", "u0"]
    page.go_back()
    page.wait_for_url("**/users/?*sort=-tokens*")
    assert listed() == ["u0", "u1"]
    assert page.errors == []


# every card whose content is wider than it (scrolled sideways), and the table cells that end
# past the window's right edge (out of view)
WIDE_CARDS = """() => [
  Array.from(document.querySelectorAll('.card'))
    .filter(c => c.scrollWidth > c.clientWidth + 1)
    .map(c => (c.querySelector('h2, .table-head') || c).textContent.trim().slice(0, 30)),
  Array.from(document.querySelectorAll('td'))
    .filter(td => td.getBoundingClientRect().right > window.innerWidth).length,
]"""


def test_long_names_and_ids_do_not_widen_the_page_at_1024_px(
    live_server: Any, two_projects: None, browser: Any
) -> None:
    # The switcher's select was as wide as its longest option: a project named at length
    # pushed every page 300 px past a 1024 px window. A 128-character session id and a long
    # user id (no space to break at) widened the sessions table to 2,700 px, the project
    # column beside them a sliver 550 px tall, the user and last active out of view.
    from costboard.models import Project
    from tests.e2e.conftest import Page

    long_name = "Zürich 日本語プロジェクト " + "a project named at some length " * 4
    Project.objects.filter(slug="other").update(name=long_name)
    agent = make_agent("long")
    agent.events(
        {"type": "session", "session_id": "L" * 128, "user_id": "u" * 100},
        {"session_id": "L" * 128, "turn": 1, "step_type": "response", "model": "test-sonnet"}
        | {"input_tokens": 99_000, "output_tokens": 10},
    )
    Project.objects.filter(slug="long").update(name=long_name + "too")
    context = browser.new_context(viewport={"width": 1024, "height": 800})
    page = Page(context.new_page())
    base = live_server.url
    log_in(page, base)
    for path in ("/", "/sessions/", "/users/", "/flagged/", "/reports/?project=long"):
        page.goto(base + path)
        assert page.evaluate("document.documentElement.scrollWidth") == 1024, path
        assert page.locator("#project-switcher").bounding_box()["width"] <= 1024 / 2
        assert page.evaluate(WIDE_CARDS) == [[], 0], path
    assert long_name.strip() in page.inner_text("#project-switcher")
    assert page.errors == []
    context.close()


def test_back_after_htmx_swaps_shows_the_filters_the_url_has(
    live_server: Any, two_projects: None, page: Any
) -> None:
    # Back restored htmx's snapshot of the page: the table of that URL, but every select as
    # first rendered ("any"), so the next filter changed dropped the state the URL and the
    # table had; the sort field sent the sort chosen later.
    base = live_server.url
    log_in(page, base)

    page.goto(f"{base}/sessions/?project=other")
    expect(page.locator("tr[data-session]")).to_have_count(3)
    page.select_option("select[name=state]", "ok")
    page.wait_for_url("**/sessions/?*state=ok*")
    page.wait_for_function("document.querySelectorAll('tr[data-session]').length === 2")
    page.click("th >> text=Cost / cap")
    page.wait_for_url("**/sessions/?*sort=-cost*")
    page.select_option("select[name=state]", "exhausted")
    page.wait_for_url("**/sessions/?*state=exhausted*")
    page.wait_for_function("document.querySelectorAll('tr[data-session]').length === 1")

    # (expect: waits through a reload, if the way back is one)
    page.go_back()
    page.wait_for_url("**/sessions/?*state=ok*")
    expect(page.locator("tr[data-session]")).to_have_count(2)
    expect(page.locator("select[name=state]")).to_have_value("ok")
    expect(page.locator("#sort-field")).to_have_value("-cost")
    page.go_back()
    page.wait_for_url(lambda url: "state=ok" in url and "sort=-cost" not in url)
    expect(page.locator("select[name=state]")).to_have_value("ok")
    expect(page.locator("#sort-field")).to_have_value("-last_active")
    page.go_forward()
    page.wait_for_url("**/sessions/?*sort=-cost*")
    expect(page.locator("#sort-field")).to_have_value("-cost")
    expect(page.locator("tr[data-session]").first).to_have_attribute("data-session", "o1")
    page.go_back()
    page.wait_for_url(lambda url: "state=ok" in url and "sort=-cost" not in url)
    expect(page.locator("select[name=state]")).to_have_value("ok")
    page.fill("input[name=q]", "o")  # another filter keeps the state the page shows
    page.wait_for_url("**/sessions/?*q=o*")
    assert query(page.url)["state"] == ["ok"]
    expect(page.locator("tr[data-session]")).to_have_count(2)
    assert page.errors == []
