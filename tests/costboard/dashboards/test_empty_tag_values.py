"""A tag sent with an empty value (`team: ""`) is a value, not the absence of the tag: every
tag breakdown (the overview, /steps/, the showback report) and every CSV (the spend API's,
the report's) tells it apart from the untagged spend, and from a value that reads like the
untagged label."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from costboard.models import ApiKey
from costboard.reports.messages import report_csv
from costboard.reports.periods import period_of
from costboard.reports.selectors import spend_report
from costboard.templatetags.costboard_tags import usd
from tests.conftest import Agent, add_price, streamed

pytestmark = pytest.mark.django_db

# value sent -> input tokens of its one step (test-sonnet: $3 a million input tokens)
SENT: dict[str | None, int] = {
    "": 1000,
    "(untagged)": 2000,
    "'(untagged)": 3000,
    "(empty)": 4000,
    "=1+1": 5000,
}
UNTAGGED_TOKENS = 6000


@pytest.fixture
def teams(agent: Agent) -> Agent:
    add_price("test-sonnet")
    events: list[dict[str, object]] = []
    for n, (value, tokens) in enumerate(SENT.items()):
        events.append({"type": "session", "session_id": f"s{n}", "tags": {"team": value}})
        events.append(
            {"session_id": f"s{n}", "step_type": "x", "model": "test-sonnet"}
            | {"input_tokens": tokens}
        )
    events.append(
        {"session_id": "bare", "step_type": "x", "model": "test-sonnet"}
        | {"input_tokens": UNTAGGED_TOKENS}
    )
    agent.events(*events)
    return agent


def cost(tokens: int) -> str:
    return usd(Decimal(tokens) * 3 / 1_000_000)


def breakdown(html: str) -> list[tuple[str, str, str]]:
    """The tag table's rows: (data-tag-* attribute, the first cell's text, the cost)."""
    table = html[html.index('id="tags"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(
        r"<tr (data-tag-untagged|data-tag-value=\"[^\"]*\")><td[^>]*>(.*?)</td>.*?"
        r"data-tag-cost>([^<]+)<",
        table,
    )
    return [(attr, re.sub(r"<[^>]+>", "", text), price) for attr, text, price in rows]


EXPECTED_ROWS = [
    ("data-tag-untagged", "(untagged)", cost(UNTAGGED_TOKENS)),
    ('data-tag-value="=1+1"', "=1+1", cost(5000)),
    ('data-tag-value="(empty)"', "(empty)", cost(4000)),
    ('data-tag-value="&#x27;(untagged)"', "&#x27;(untagged)", cost(3000)),
    ('data-tag-value="(untagged)"', "(untagged)", cost(2000)),
    ('data-tag-value=""', "(empty)", cost(1000)),
]
# the labels, set apart from the values a user sent (which a cell shows as they are)
UNTAGGED_CELL = '<td class="muted"><em>(untagged)</em></td>'
EMPTY_LABEL = '<em class="muted" title="the tag sent with an empty value">(empty)</em>'


@pytest.mark.parametrize("path", ["/steps/?tag_key=team", "/steps/?tag_key=team&step_type=x"])
def test_steps_names_the_empty_value_apart_from_the_untagged_row(
    staff: Client, teams: Agent, path: str
) -> None:
    # the empty value was a row with an empty cell (its link had no text) beside the
    # "untagged" row: a reader saw two blank-looking rows and could not tell which was which
    html = staff.get(path).content.decode()
    assert breakdown(html) == EXPECTED_ROWS
    assert html.count(UNTAGGED_CELL) == 1
    assert f'<a href="/sessions/?tag=team%3D">{EMPTY_LABEL}</a>' in html  # team="" sessions
    assert html.count(EMPTY_LABEL) == 1


def test_the_overview_names_them_as_steps_does(staff: Client, teams: Agent) -> None:
    html = staff.get("/?tag_key=team").content.decode()
    assert breakdown(html) == EXPECTED_ROWS
    assert html.count(UNTAGGED_CELL) == 1 and html.count(EMPTY_LABEL) == 1


# a CSV's tag cells: the value as sent (empty for ""), an apostrophe before one that could be
# read as a formula or as the label; the untagged row's label, which no value is written as
CSV_CELLS = [
    ("(untagged)", UNTAGGED_TOKENS),
    ("'=1+1", 5000),
    ("(empty)", 4000),
    ("''(untagged)", 3000),
    ("'(untagged)", 2000),
    ("", 1000),
]


def test_the_spend_csv_writes_untagged_as_no_value_is_written(teams: Agent) -> None:
    # untagged and "" were both an empty cell
    key = ApiKey.issue(project=teams.project, role="read")[1]
    response = Client().get(
        "/api/v1/spend?group_by=tag:team",
        headers={"Authorization": f"Bearer {key}", "Accept": "text/csv"},
    )
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][0] == "tag:team"
    assert sorted((r[0], int(r[2])) for r in rows[1:]) == sorted(CSV_CELLS)
    # the JSON is as it was: the untagged row's tag is null, the empty value ""
    answer = (
        Client()
        .get("/api/v1/spend?group_by=tag:team", headers={"Authorization": f"Bearer {key}"})
        .json()
    )
    expected = {None: UNTAGGED_TOKENS, **SENT}
    assert {r["tag:team"]: r["input_tokens"] for r in answer["rows"]} == expected


def test_the_report_names_the_empty_value_on_its_page_and_in_its_csv(
    staff: Client, teams: Agent
) -> None:
    today = timezone.now().date()
    period = period_of("week", today)
    report = spend_report(project=teams.project, period=period, tag_key="team")
    by_tag = report.tables[0]
    assert {(line.label, line.current["input_tokens"]) for line in by_tag.lines} == {
        ("(untagged)", UNTAGGED_TOKENS),
        ("(empty)", 1000),  # the label
        ("(empty)", 4000),  # the value sent: the page sets the label apart
        ("(untagged)", 2000),
        ("'(untagged)", 3000),
        ("=1+1", 5000),
    }
    rows = list(csv.reader(io.StringIO(report_csv(report))))
    tag_rows = [r for r in rows[1:] if r[0] == "tag:team"]
    assert sorted((r[1], int(r[3])) for r in tag_rows) == sorted(CSV_CELLS)
    with time_machine.travel(timezone.now() + timedelta(days=8), tick=False):  # a past week
        html = staff.get(
            "/reports/",
            {"project": teams.project.slug, "period": "week", "at": period.label} | {"tag": "team"},
        ).content.decode()
    section = html[html.index('data-grouping="tag:team"') :]
    section = section[: section.index("</section>")]
    assert section.count('<td><em class="muted">(untagged)</em></td>') == 1
    assert section.count('<td><em class="muted">(empty)</em></td>') == 1
    assert section.count("<td>(untagged)</td>") == 1 and section.count("<td>(empty)</td>") == 1


def test_the_empty_values_link_lists_the_sessions_tagged_with_it(
    staff: Client, teams: Agent
) -> None:
    # ?tag=team= (the link from the (empty) row) was refused as "not a tag", a 422 listing
    # every session
    response = staff.get("/sessions/?tag=team%3D&since=")
    assert response.status_code == 200
    assert re.findall(r'<tr data-session="([^"]+)">', response.content.decode()) == ["s0"]
    exported = list(
        csv.reader(
            io.StringIO(streamed(staff.get("/sessions/export.csv?tag=team%3D&since=")).decode())
        )
    )
    assert [r[1] for r in exported[1:]] == ["s0"]
