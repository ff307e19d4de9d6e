"""The pages' Content-Security-Policy (costboard/csp.py): the header on every page, its
directives, none on the API's data; templates that need nothing inline; and the static plotly
styles that stand in for the <style> plotly.js would write, matching the installed bundle.
tests/e2e/test_csp_browser.py loads the pages in Chromium under it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from costboard.budgets.period_services import BudgetFields
from costboard.models import ApiKey, PeriodBudget, Session
from devtools import plotly_css
from memory_ui.models import Memory
from tests.conftest import Agent
from tests.costboard.dashboards.test_dashboards import traffic

ROOT = Path(__file__).resolve().parents[2]
HEADER = "Content-Security-Policy"

# every page a person opens, logged in as staff; {session}, {memory}, {budget}, {project} are
# filled from the data `pages` makes
PAGES = [
    "/",
    "/sessions/",
    "/sessions/{session}/",
    "/sessions/?state=bogus",
    "/steps/",
    "/steps/?since=2026-12-01&until=2026-11-01",
    "/users/",
    "/budgets/",
    "/budgets/{budget}/",
    "/flagged/",
    "/memory/",
    "/memory/review/",
    "/memory/metrics/",
    "/memory/{memory}/",
    "/memory/{memory}/edit/",
    "/admin/",
    "/admin/costboard/modelprice/",
    "/admin/costboard/project/{project}/change/",
    "/api/v1/docs",
    "/no-such-page/",
]


def directives(header: str) -> dict[str, list[str]]:
    parsed = {}
    for part in header.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


@pytest.fixture
def pages(staff: Client, agent: Agent, priced: None) -> dict[str, Any]:
    traffic(agent)
    admin_key = ApiKey.issue(project=agent.project, role="admin")[1]
    auth = {"Authorization": f"Bearer {admin_key}"}
    budget = Client().post(
        "/api/v1/budgets", BudgetFields.example(), "application/json", headers=auth
    )
    assert budget.status_code == 201, budget.content
    memory = Client().post(
        "/api/v1/memory/candidates",
        json.dumps({"content": "Always use ruff", "type": "feedback"}),
        "application/json",
        headers=auth,
    )
    assert memory.status_code == 201, memory.content
    return {
        "session": Session.objects.filter(project=agent.project).latest("pk").pk,
        "budget": PeriodBudget.objects.get().pk,
        "memory": Memory.objects.get().pk,
        "project": agent.project.pk,
    }


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_every_page_has_the_policy(staff: Client, pages: dict[str, Any], path: str) -> None:
    response = staff.get(path.format(**pages))
    assert response.status_code in (200, 404, 422), response.status_code
    assert response["Content-Type"].startswith("text/html")
    policy = directives(response[HEADER])
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval'
    assert policy["style-src"] == ["'self'"]  # nor for styles: no style attribute either
    assert "style-src-attr" not in policy
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"]
    assert policy["form-action"] == ["'self'"]
    html = response.content.decode()
    assert not INLINE_SCRIPT.search(html), INLINE_SCRIPT.search(html)
    assert not INLINE_STYLE.search(html), INLINE_STYLE.search(html)


@pytest.mark.django_db
def test_the_login_page_has_the_policy(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert directives(response[HEADER])["form-action"] == ["'self'"]


@pytest.mark.django_db
def test_only_the_api_docs_allow_data_images_for_swagger_uis_icons(staff: Client) -> None:
    assert directives(staff.get("/api/v1/docs")[HEADER])["img-src"] == ["'self'", "data:"]
    assert directives(staff.get("/")[HEADER])["img-src"] == ["'self'"]


@pytest.mark.django_db
def test_the_apis_data_carries_no_policy(agent: Agent) -> None:
    auth = {"Authorization": f"Bearer {agent.key}"}
    answers = [
        Client().get("/api/v1/openapi.json"),
        Client().get("/api/v1/sessions/nope/budget", headers=auth),  # a JSON 404
        Client().post("/api/v1/events", "{}", "application/json", headers=auth),
        Client().get("/metrics"),
    ]
    for answer in answers:
        assert HEADER not in answer, answer["Content-Type"]


# a <script> with inline code (one with src, or a JSON data block, runs nothing inline), a
# <style> element, a style attribute, an on*= handler attribute
INLINE_SCRIPT = re.compile(
    r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>|\son[a-z]+\s*=", re.I
)
INLINE_STYLE = re.compile(r"<style[\s>]|\sstyle\s*=", re.I)


COMMENTS = re.compile(r"\{#.*?#\}|\{% comment %\}.*?\{% endcomment %\}", re.S)


@pytest.mark.parametrize(
    "template", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "templates").rglob("*.html"))
)
def test_no_template_has_inline_script_or_style(template: str) -> None:
    text = COMMENTS.sub("", (ROOT / template).read_text())
    assert not INLINE_SCRIPT.search(text), INLINE_SCRIPT.search(text)
    assert not INLINE_STYLE.search(text), INLINE_STYLE.search(text)


def test_htmx_is_told_to_inject_no_styles_and_evaluate_nothing() -> None:
    base = (ROOT / "templates" / "base.html").read_text()
    found = re.search(r"name=\"htmx-config\" content='([^']+)'", base)
    assert found is not None
    config = json.loads(found[1])
    assert config["includeIndicatorStyles"] is False
    assert config["allowEval"] is False
    assert ".htmx-request .htmx-indicator" in (ROOT / "static/costboard/app.css").read_text()


def test_the_plotly_styles_match_the_installed_plotly_js() -> None:
    """Run `python -m devtools.plotly_css` after upgrading plotly if this fails."""
    bundle = plotly_css.BUNDLE.read_text(encoding="utf-8")
    assert plotly_css.OUTPUT.read_text() == plotly_css.plotly_css(
        bundle, plotly_css.bundle_version(bundle)
    )
    assert plotly_css.PARTIAL.read_text() == plotly_css.plotly_partial(bundle)
    rules = plotly_css.plotly_rules(bundle)
    assert len(rules) > 50
    assert (".js-plotly-plot .plotly .modebar", "position:absolute;top:2px;right:2px;") in rules
    # every <style> the bundle can make is either addStyleRule's (skipped for a
    # no-inline-styles element) or one guarded by an element id the partial stands in for
    assert bundle.count('createElement("style")') == 1 + len(plotly_css.guarded_style_ids(bundle))
    assert 'n.matches(".no-inline-styles")' in bundle
