"""/reports/: the showback report of any past week or month, the same figures as the email and
GET /api/v1/spend, names escaped, bad parameters named (422), only the projects the user may
see (404 for another's), a bounded number of queries, and its CSV."""

from __future__ import annotations

import csv
import io
import re
from typing import Any
from urllib.parse import parse_qsl

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.test import Client

from costboard.models import Membership, usd
from costboard.reports.messages import report_csv, report_url
from costboard.reports.periods import period_of
from costboard.reports.selectors import spend_report
from tests.conftest import make_agent
from tests.costboard.reports.showback import NOW, SCRIPT, W46, W47, Showback, showback_made, step
from tests.costboard.reports.test_report import api_spend

pytestmark = pytest.mark.django_db


@pytest.fixture
def showback(db: None) -> Showback:
    return showback_made()


def get(client: Client, path: str = "/reports/", **params: str) -> Any:
    with time_machine.travel(NOW, tick=False):
        return client.get(path, params)


def test_the_last_complete_week_by_default_with_the_apis_figures(
    showback: Showback, staff: Client
) -> None:
    response = get(staff, project="acme")
    assert response.status_code == 200
    report = response.context["report"]
    assert (report.period.label, report.tag_key) == ("2026-W47", "customer")
    html = response.content.decode()
    assert "<span data-report-total>$6.45</span>" in html
    assert "<span data-report-change-pct>+43.3 %</span>" in html
    assert api_spend(showback.read_key, "user", *W47)["total"]["cost_usd"] == "6.45"
    # the tag's values are user data: escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and SCRIPT not in html
    assert 'href="/reports/?project=acme" aria-current="page"' in html  # in the navigation
    assert (
        'href="/reports/export.csv?project=acme&amp;period=week&amp;at=2026-W47&amp;tag=customer"'
        in html
    )


def test_any_past_week_or_month(showback: Showback, staff: Client) -> None:
    response = get(staff, project="acme", period="week", at="2026-W46", tag="customer")
    report = response.context["report"]
    assert (report.period.first, report.period.last) == W46
    assert (
        usd(report.total["cost_usd"])
        == api_spend(showback.read_key, "user", *W46)["total"]["cost_usd"]
    )
    month = get(staff, project="acme", period="month", at="2026-10").context["report"]
    assert month.period.label == "2026-10" and month.total["steps"] == 0
    offered = [p.label for p in get(staff, project="acme", period="month").context["asked"].periods]
    assert offered[:2] == ["2026-10", "2026-09"] and len(offered) == 24


def form_fields(html: str) -> dict[str, str]:
    """What the page's filter form submits as it stands: each field's selected value."""
    start = html.index('<form class="filters')
    form = html[start : html.index("</form>", start)]
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form))
    for name, options in re.findall(r'<select name="(\w+)"[^>]*>(.*?)</select>', form, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected', options) or re.search(
            r'<option value="([^"]*)"', options
        )
        fields[name] = chosen[1] if chosen else ""
    return fields


def test_the_other_period_kind_is_one_click_away_keeping_the_project_and_tag(
    showback: Showback, staff: Client
) -> None:
    """On a week's report, asking for the month used to send the week still picked with it
    (`?period=month&at=2026-W47`): a 422. The period kinds are links that keep the project
    and the tag key and leave the period to pick to the new kind's default."""
    week = get(staff, project="acme", period="week", at="2026-W46", tag="customer")
    html = week.content.decode()
    # the form submitted as it stands answers the same report
    again = get(staff, **form_fields(html))
    assert again.status_code == 200 and again.context["report"].period.label == "2026-W46"
    links = dict(re.findall(r'<a href="\?([^"]*)" data-period-kind="(\w+)"', html))
    month_query = {v: k for k, v in links.items()}["month"]
    params = dict(parse_qsl(month_query.replace("&amp;", "&")))
    assert params == {"project": "acme", "period": "month", "tag": "customer"}
    month = get(staff, **params)
    assert month.status_code == 200
    report = month.context["report"]
    assert (report.period.label, report.project.slug, report.tag_key) == (
        "2026-10",
        "acme",
        "customer",
    )
    # and back: the week's link from the month's page
    back = dict(re.findall(r'<a href="\?([^"]*)" data-period-kind="(\w+)"', month.content.decode()))
    week_params = dict(parse_qsl({v: k for k, v in back.items()}["week"].replace("&amp;", "&")))
    assert get(staff, **week_params).context["report"].period.label == "2026-W47"


def test_the_link_in_a_report_by_a_tag_no_step_carries_opens_that_report(
    showback: Showback, staff: Client
) -> None:
    """`spend_report --tag team` sends a report whose link asks the page for `tag=team`; no
    step of the two weeks carries `team`, and the page answered its link with a 422. It shows
    the report sent: every dollar untagged, the same total."""
    acme = showback.agent.project
    sent = spend_report(project=acme, period=period_of("week", W47[0]), tag_key="team")
    query = dict(parse_qsl(report_url(sent).split("?", 1)[1]))
    assert query["tag"] == "team"
    response = get(staff, **query)
    assert response.status_code == 200
    report = response.context["report"]
    assert report.tag_key == "team" and report.total == sent.total
    by_tag = report.tables[0]
    assert by_tag.grouping == "tag:team"
    assert [line.name for line in by_tag.lines] == [None]  # all of it untagged
    assert usd(by_tag.lines[0].cost_usd) == usd(report.total["cost_usd"]) == "6.45"
    assert 'value="team" selected' in response.content.decode()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"period": "year"}, "period"),
        ({"at": "2026-47"}, "at"),
        ({"at": "2026-W48"}, "at"),  # not over yet
        # the ends of the calendar: a week or month past them went out of range (a 500)
        ({"at": "0001-W01"}, "at"),
        ({"at": "9999-W52"}, "at"),
        ({"period": "month", "at": "0001-01"}, "at"),
        ({"period": "month", "at": "9999-12"}, "at"),
        ({"at": "١٩٧٠-W01"}, "at"),  # digits, but not ASCII ones
        ({"tag": "Customer!"}, "tag"),  # no tag key events can carry
    ],
)
def test_a_bad_parameter_is_named(
    showback: Showback, staff: Client, params: dict[str, str], field: str
) -> None:
    response = get(staff, project="acme", **params)
    assert response.status_code == 422
    assert list(response.context["filter_errors"]) == [field]
    as_without = "2026-10" if params.get("period") == "month" else "2026-W47"
    assert response.context["report"].period.label == as_without  # the page as without it
    csv_response = get(staff, "/reports/export.csv", project="acme", **params)
    assert csv_response.status_code == 422


def test_a_member_sees_their_project_and_not_anothers(showback: Showback) -> None:
    other = make_agent("other")
    user = get_user_model().objects.create_user("member", "", "pw-member-123")
    Membership.objects.create(user=user, project=other.project)
    client = Client()
    client.force_login(user)
    assert get(client, project="acme").status_code == 404
    assert get(client, "/reports/export.csv", project="acme").status_code == 404
    mine = get(client)
    assert mine.status_code == 200 and mine.context["asked"].project == other.project
    nobody = get_user_model().objects.create_user("nobody", "", "pw-nobody-123")
    client.force_login(nobody)
    assert "You see no project yet" in get(client).content.decode()


def test_the_csv_is_the_emails_attachment(showback: Showback, staff: Client) -> None:
    response = get(staff, "/reports/export.csv", project="acme")
    assert response["Content-Disposition"] == 'attachment; filename="spend-acme-2026-W47.csv"'
    report = spend_report(
        project=showback.agent.project, period=period_of("week", W47[0]), tag_key="customer"
    )
    assert response.content.decode() == report_csv(report)
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {r["grouping"] for r in rows} == {"tag:customer", "user", "model"}


def test_the_page_reads_a_bounded_number_of_queries(
    showback: Showback, staff: Client, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        get(staff, project="acme")
    count = len(queries)
    assert count <= 16
    showback.agent.events(
        *(
            step(
                f"more-{n}",
                f"2026-11-{10 + n % 12:02d}T09:00:00Z",
                "test-sonnet",
                input_tokens=1000,
                tags={"customer": f"c{n}", "team": f"t{n}"},
            )
            for n in range(30)
        ),
        *({"type": "session", "session_id": f"more-{n}", "user_id": f"u{n}"} for n in range(30)),
    )
    with django_assert_max_num_queries(count):
        get(staff, project="acme")
