"""One model, one name on every page: `gpt-4o-2024-08-06`, `openai/gpt-4o` and `gpt-4o` are one
`gpt-4o` in every breakdown, filter and chart, with the exact names a click away; steps
without a model are tool steps, $0, never unpriced. Real prices (genai-prices' rows), real
PostgreSQL, through the API."""

from __future__ import annotations

import html as html_lib
import re
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db.models import Sum
from django.test import Client

from costboard.models import DailyRollup, Session, SessionModelUsage, Step
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent
from tests.costboard.dashboards.test_dashboards import figures

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SPELLINGS = ("gpt-4o-2024-08-06", "openai/gpt-4o", "gpt-4o")


@pytest.fixture
def four_o(agent: Agent) -> Agent:
    """A session calling gpt-4o under three names, gpt-4o-mini once, and a tool."""
    prices_sync()
    events: list[dict[str, Any]] = [
        {
            "session_id": "chat",
            "turn": 1,
            "step_type": "response",
            "model": model,
            "input_tokens": 1000 * (i + 1),
            "output_tokens": 100,
        }
        for i, model in enumerate(SPELLINGS)
    ]
    events += [
        {
            "session_id": "chat",
            "turn": 1,
            "step_type": "intent",
            "model": "gpt-4o-mini",
            "input_tokens": 500,
            "output_tokens": 5,
        },
        {"session_id": "chat", "turn": 1, "step_type": "tool", "model": "none", "duration_ms": 80},
    ]
    agent.events(*events)
    return agent


def rows(page: str, family: str) -> list[str]:
    """The table rows of one family on a page."""
    return re.findall(rf'<tr data-family="{re.escape(family)}">.*?</tr>', page, re.S)


def exact_links(row: str) -> dict[str, str]:
    """Exact name → the link it offers, from a family row's expanded names."""
    return {
        html_lib.unescape(name): html_lib.unescape(href)
        for href, name in re.findall(r'<a href="([^"]*)" data-exact="([^"]*)"', row)
    }


def test_the_family_rollups_equal_the_sums_of_their_steps(four_o: Agent) -> None:
    steps = Step.objects.filter(model__in=SPELLINGS)
    assert {s.family for s in steps} == {"gpt-4o"}
    assert all(s.price_id is not None for s in steps)
    rollups = DailyRollup.objects.filter(family="gpt-4o")
    assert sorted(rollups.values_list("model", flat=True)) == sorted(SPELLINGS)
    totals = rollups.aggregate(calls=Sum("calls"), cost=Sum("cost_usd"), tokens=Sum("input_tokens"))
    assert totals == {
        "calls": 3,
        "cost": sum((s.cost_usd for s in steps), Decimal(0)),
        "tokens": 6000,
    }
    mix = SessionModelUsage.objects.filter(session__external_id="chat")
    assert sorted(mix.values_list("family", flat=True).distinct()) == [
        "gpt-4o",
        "gpt-4o-mini",
        "none",
    ]


def test_the_overview_shows_one_gpt_4o_with_its_exact_names(staff: Client, four_o: Agent) -> None:
    response = staff.get("/")
    page = response.content.decode()
    [row] = rows(page, "gpt-4o")
    cost = DailyRollup.objects.filter(family="gpt-4o").aggregate(c=Sum("cost_usd"))["c"]
    assert f"${cost.quantize(Decimal('0.01'))}" in row
    links = exact_links(row)
    assert set(links) == set(SPELLINGS)
    for name, link in links.items():
        assert urlsplit(link).path == "/steps/"
        assert parse_qs(urlsplit(link).query) == {"model": ["gpt-4o"], "exact": [name]}
    assert len(rows(page, "gpt-4o-mini")) == 1
    daily = [trace["name"] for trace in figures(response)["daily"]["data"]]
    assert sorted(daily) == ["gpt-4o", "gpt-4o-mini"]  # no dated name, no tool series
    [tool] = rows(page, "none")
    assert "— (tool)" in tool and "$0 (tool)" in tool
    assert 'id="unpriced"' not in page  # the tool step is not an unpriced model


def test_the_steps_page_and_its_filter_name_gpt_4o_once(staff: Client, four_o: Agent) -> None:
    page = staff.get("/steps/").content.decode()
    [row] = rows(page, "gpt-4o")
    assert re.search(r'<td class="num">3</td>', row)  # three calls, one row
    model_select = page.split('<select name="model">')[1].split("</select>")[0]
    assert re.findall(r'<option value="([^"]*)"', model_select) == [
        "",
        "gpt-4o",
        "gpt-4o-mini",
        "none",
    ]
    assert ">— (tool)</option>" in page
    [tool] = rows(page, "none")
    assert "$0 (tool)" in tool and "unpriced" not in tool

    # one click: the row's names, each a filtered view of that exact name
    link = exact_links(row)["gpt-4o-2024-08-06"]
    exact = staff.get(link).content.decode()
    [only] = rows(exact, "gpt-4o")
    assert re.search(r'<td class="num">1</td>', only)
    assert "data-exact-filter" in exact and "gpt-4o-2024-08-06" in exact
    fragment = staff.get("/steps/?model=gpt-4o", headers={"HX-Request": "true"}).content.decode()
    assert len(rows(fragment, "gpt-4o")) == 1 and not rows(fragment, "gpt-4o-mini")

    # a link from before families, to an exact name, still finds its calls
    old_link = staff.get("/steps/?model=openai/gpt-4o").content.decode()
    [row] = rows(old_link, "gpt-4o")
    assert re.search(r'<td class="num">1</td>', row)
    assert '<option value="openai/gpt-4o" selected>' in old_link


def test_the_sessions_list_filters_by_family_and_by_exact_name(
    staff: Client, four_o: Agent
) -> None:
    def listed(query: str) -> list[str]:
        page = staff.get(f"/sessions/{query}").content.decode()
        return re.findall(r'<tr data-session="([^"]+)"', page)

    assert listed("?model=gpt-4o") == ["chat"]
    assert listed("?model=gpt-4o-2024-08-06") == ["chat"]  # an exact name, as links had it
    assert listed("?model=gpt-4o&exact=openai/gpt-4o") == ["chat"]
    assert listed("?exact=gpt-4o-2024-08-06") == ["chat"]
    assert listed("?model=gpt-4o-mini&exact=gpt-4o") == []

    page = staff.get("/sessions/").content.decode()
    chips = re.findall(r'<span class="chip" data-family="([^"]+)" title="([^"]*)"', page)
    assert [family for family, _ in chips].count("gpt-4o") == 1
    title = html_lib.unescape(dict(chips)["gpt-4o"])
    assert all(name in title for name in SPELLINGS)
    model_select = page.split('<select name="model">')[1].split("</select>")[0]
    options = re.findall(r'<option value="([^"]*)"', model_select)
    assert options == ["", "gpt-4o", "gpt-4o-mini", "none"]


def test_the_session_page_shows_tool_steps_as_tool_not_unpriced(
    staff: Client, four_o: Agent
) -> None:
    session = Session.objects.get(external_id="chat")
    page = staff.get(f"/sessions/{session.pk}/").content.decode()
    assert "$0 (tool)" in page
    assert "unpriced" not in page
    assert "gpt-4o-2024-08-06" in page  # the exact name as sent, its family beside it


def test_tool_steps_cost_nothing_and_are_not_unpriced(four_o: Agent) -> None:
    tool = Step.objects.get(model="none")
    assert (tool.price_id, tool.cost_usd, tool.family, tool.is_tool) == (
        None,
        Decimal(0),
        "none",
        True,
    )
    rollup = DailyRollup.objects.get(family="none")
    assert (rollup.calls, rollup.unpriced_calls, rollup.cost_usd) == (1, 0, Decimal(0))
