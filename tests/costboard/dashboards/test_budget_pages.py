"""Stopped means stopped, everywhere (issue 30): a session an exhausted stop-budget holds shows
as stopped, naming and linking the budget, on its page, in the sessions list (and its state
filter), in the CSV and on /flagged/, as the API says; the Budgets pages (/budgets/,
/budgets/<id>/) with their numbers equal to the steps counted, scoped to the user's projects;
the admin's budgets list in dollars."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from costboard.budgets.periods import period_bounds
from costboard.models import ApiKey, PeriodBudget, PeriodLedger, Session, Step
from costboard.numbers import usd_text
from tests.conftest import Agent, add_price, make_agent, streamed, usd
from tests.costboard.dashboards.test_dashboards import member_of

pytestmark = pytest.mark.django_db

# a dear model: 100 tokens cost $0.30, far from the sessions' own caps
RATE = Decimal(3000)
STEP_TOKENS = 100
STEP_COST = usd(STEP_TOKENS, RATE)
NOW = datetime.now(UTC)


def steps(session_id: str, n: int, *, at: datetime | None = None) -> list[dict[str, Any]]:
    when = (at or NOW).isoformat()
    return [
        {
            "session_id": session_id,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": STEP_TOKENS,
            "timestamp": when,
        }
        for _ in range(n)
    ]


@pytest.fixture(autouse=True)
def _priced(db: None) -> None:
    add_price("test-sonnet", input_mtok=RATE)


def ann_over_bob_under(agent: Agent, *, name: str, user: str) -> tuple[PeriodBudget, Any]:
    """A monthly $1.00 user stop-budget (`user`: one user, or "*" for each); ann's session
    ann-1 spends $1.20 and bob's bob-1 $0.30. Returns the budget and the spending reply."""
    budget = PeriodBudget.objects.create(
        project=agent.project,
        name=name,
        scope="user",
        scope_value=user,
        period="month",
        cost_limit_usd=Decimal("1.00"),
        action="stop",
    )
    agent.events(
        {"type": "session", "session_id": "ann-1", "user_id": "ann"},
        {"type": "session", "session_id": "bob-1", "user_id": "bob"},
    )
    return budget, agent.events(*steps("ann-1", 4), *steps("bob-1", 1))


@pytest.fixture
def held(agent: Agent) -> PeriodBudget:
    """Ann's monthly $1.00 stop-budget, exhausted by her session ann-1 ($1.20); bob-1 ($0.30)
    is not hers."""
    budget, answer = ann_over_bob_under(agent, name="ann monthly", user="ann")
    assert answer["budgets"][str(budget.pk)]["state"] == "exhausted"
    return budget


def session(external_id: str) -> Session:
    return Session.objects.get(external_id=external_id)


def list_row(html: str, session_id: str) -> str:
    found = re.search(rf'<tr data-session="{session_id}">.*?</tr>', html, re.S)
    assert found is not None, f"no row for {session_id}"
    return found.group(0)


def listed(html: str) -> list[str]:
    return re.findall(r'<tr data-session="([^"]+)">', html)


def stopped_link(budget: PeriodBudget) -> str:
    return (
        f'<span class="stopped-by" data-stopped-by="{budget.pk}">stopped by budget '
        f'<a href="/budgets/{budget.pk}/">{budget.name}</a></span>'
    )


def test_the_session_page_says_stopped_by_the_budget_as_the_api_does(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    assert agent.budget("ann-1").json()["stopped_by"] == f"budget:{held.pk}"
    assert session("ann-1").state == "ok"  # its own caps are far: the budget stops it

    html = staff.get(f"/sessions/{session('ann-1').pk}/").content.decode()
    assert '<span class="badge exhausted" data-state>exhausted</span>' in html
    assert stopped_link(held) in html
    assert "data-stopped-banner" in html
    assert f'Stopped by budget <a href="/budgets/{held.pk}/">ann monthly</a>' in html
    # its own caps are not what stops it: the cap form says so, and where to go instead
    note = re.search(r"<p class=\"muted\" data-cap-not-the-stop>(.*?)</p>", html, re.S)
    assert note is not None
    assert f'budget <a href="/budgets/{held.pk}/">ann monthly</a> is exhausted' in note.group(1)

    bob = staff.get(f"/sessions/{session('bob-1').pk}/").content.decode()
    assert agent.budget("bob-1").json()["stopped_by"] is None
    assert '<span class="badge ok" data-state>ok</span>' in bob
    assert "data-stopped-by" not in bob


def test_the_sessions_list_shows_and_filters_the_stopped(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    html = staff.get("/sessions/").content.decode()
    ann = list_row(html, "ann-1")
    assert '<td data-state="exhausted"><span class="badge exhausted">exhausted</span>' in ann
    assert stopped_link(held) in ann
    bob = list_row(html, "bob-1")
    assert '<td data-state="ok">' in bob and "data-stopped-by" not in bob
    assert '<option value="stopped" >stopped by a budget</option>' in html

    def states(state: str) -> list[str]:
        return sorted(listed(staff.get(f"/sessions/?state={state}").content.decode()))

    assert states("stopped") == ["ann-1"]
    assert states("exhausted") == ["ann-1"]  # the state its agent is told
    assert states("flagged") == ["ann-1"]
    assert states("ok") == ["bob-1"]
    assert states("warning") == []


def test_the_csv_has_the_state_and_what_stopped_it(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    response = staff.get("/sessions/export.csv")
    rows = list(csv.DictReader(io.StringIO(streamed(response).decode())))
    by_id = {r["session_id"]: r for r in rows}
    assert list(rows[0])[-2:] == ["stopped_by", "stopped_by_budget"]
    ann = by_id["ann-1"]
    assert (ann["state"], ann["stopped_by"], ann["stopped_by_budget"]) == (
        "exhausted",
        f"budget:{held.pk}",
        "ann monthly",
    )
    assert Decimal(ann["cost_usd"]) == 4 * STEP_COST
    bob = by_id["bob-1"]
    assert (bob["state"], bob["stopped_by"], bob["stopped_by_budget"]) == ("ok", "", "")
    # the filter applies to the export too
    stopped = staff.get("/sessions/export.csv?state=stopped")
    text = streamed(stopped).decode()
    assert [r["session_id"] for r in csv.DictReader(io.StringIO(text))] == ["ann-1"]


def test_a_session_exhausted_by_its_own_caps_says_session(staff: Client, agent: Agent) -> None:
    budget = PeriodBudget.objects.create(
        project=agent.project, name="all", cost_limit_usd=Decimal("0.30"), action="stop"
    )
    agent.events({"type": "session", "session_id": "own", "cost_cap_usd": "0.30"})
    agent.events(*steps("own", 1))
    assert agent.budget("own").json()["stopped_by"] == "session"
    text = streamed(staff.get("/sessions/export.csv")).decode()
    own = next(csv.DictReader(io.StringIO(text)))
    assert (own["state"], own["stopped_by"], own["stopped_by_budget"]) == (
        "exhausted",
        "session",
        "",
    )
    html = staff.get(f"/sessions/{session('own').pk}/").content.decode()
    assert "data-stopped-by" not in html  # its caps stop it first, as the API says
    assert PeriodLedger.objects.get(budget=budget).state == "exhausted"
    assert listed(staff.get("/sessions/?state=stopped").content.decode()) == []


def test_flagged_lists_the_stopped_with_the_budget(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    html = staff.get("/flagged/").content.decode()
    rows = re.findall(r'<tr id="flagged-\d+" data-session="([^"]+)" data-state="([^"]+)"', html)
    assert rows == [("ann-1", "exhausted")]
    assert stopped_link(held) in html
    assert '<span class="count" data-count="exhausted">1</span>' in html
    assert '<span class="count" data-count="warning">0</span>' in html
    only = staff.get("/flagged/?kind=exhausted").content.decode()
    assert 'data-session="ann-1"' in only
    assert 'data-session="ann-1"' not in staff.get("/flagged/?kind=warning").content.decode()


def test_the_next_period_releases_the_sessions(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    _, end = period_bounds("month", "UTC", NOW)
    assert end is not None
    with time_machine.travel(end + timedelta(hours=1), tick=False):
        assert agent.budget("ann-1").json()["stopped_by"] is None
        page = staff.get(f"/sessions/{session('ann-1').pk}/").content.decode()
        assert '<span class="badge ok" data-state>ok</span>' in page
        assert "data-stopped-by" not in page
        assert listed(staff.get("/sessions/?state=stopped&since=").content.decode()) == []
        assert 'data-session="ann-1"' not in staff.get("/flagged/").content.decode()


def test_a_tag_budget_holds_the_sessions_with_that_tag(staff: Client, agent: Agent) -> None:
    budget = PeriodBudget.objects.create(
        project=agent.project,
        name="search",
        scope="tag",
        scope_value="feature=search",
        token_limit=STEP_TOKENS,
        action="stop",
    )
    agent.events(
        {"type": "session", "session_id": "s", "tags": {"feature": "search"}},
        {"type": "session", "session_id": "c", "tags": {"feature": "chat"}},
        *steps("s", 1),
        *steps("c", 1),
    )
    assert agent.budget("s").json()["stopped_by"] == f"budget:{budget.pk}"
    assert agent.budget("c").json()["stopped_by"] is None
    assert listed(staff.get("/sessions/?state=stopped").content.decode()) == ["s"]


def test_the_budgets_page_lists_each_budget_with_numbers_equal_to_its_steps(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    whole = PeriodBudget.objects.create(
        project=agent.project, name="project", cost_limit_usd=Decimal("100"), token_limit=10**6
    )
    counted_from = Step.objects.order_by("-pk").values_list("pk", flat=True)[0]
    agent.events(*steps("bob-1", 2), *steps("cy-1", 1))  # the project's, not ann's
    html = staff.get("/budgets/").content.decode()
    assert '<a href="/budgets/" aria-current="page">Budgets</a>' in html

    def row(budget: PeriodBudget) -> str:
        found = re.search(rf'<tr data-budget="{budget.pk}">.*?</tr>', html, re.S)
        assert found is not None
        return found.group(0)

    ann_steps = Step.objects.filter(session__user_id="ann")
    ann_cost = sum((s.cost_usd for s in ann_steps), Decimal(0))
    assert ann_cost == 4 * STEP_COST == Decimal("1.2")
    ann = row(held)
    assert f'<a href="/budgets/{held.pk}/">ann monthly</a>' in ann
    assert f'<td class="num" data-budget-spent>{usd_text(ann_cost)}</td>' in ann
    assert 'data-budget-state="exhausted"' in ann
    assert f'<a href="/budgets/{held.pk}/#stopped">1</a>' in ann  # ann-1

    # a budget counts the steps stored after it was made
    counted = Step.objects.filter(pk__gt=counted_from)
    project_cost = sum((s.cost_usd for s in counted), Decimal(0))
    assert project_cost == 3 * STEP_COST and usd_text(project_cost) == "$0.90"
    project = row(whole)
    assert f"data-budget-spent>{usd_text(project_cost)}<div" in project
    assert '<div class="muted" data-budget-tokens>300 tokens</div>' in project
    assert 'data-budget-state="ok"' in project
    assert '<td class="num" data-budget-stopped><span class="muted">—</span></td>' in project


def test_a_budget_page_shows_its_periods_sessions_and_crossings(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    start, _ = period_bounds("month", "UTC", NOW)
    last_month = start - timedelta(days=3)
    agent.events(
        {"type": "session", "session_id": "ann-old", "user_id": "ann"},
        *steps("ann-old", 2, at=last_month),  # $0.60 in last month's period
    )
    html = staff.get(f"/budgets/{held.pk}/").content.decode()
    assert "<h1>ann monthly" in html

    periods = re.findall(
        r'<tr data-period="([\d-]+)"( data-current)?>.*?data-period-spent>([^<]+)<', html, re.S
    )
    this_month = Step.objects.filter(session__user_id="ann", timestamp__gte=start)
    before = Step.objects.filter(session__user_id="ann", timestamp__lt=start)
    assert periods == [
        (start.date().isoformat(), " data-current", usd_text(sum(s.cost_usd for s in this_month))),
        (
            period_bounds("month", "UTC", last_month)[0].date().isoformat(),
            "",
            usd_text(sum(s.cost_usd for s in before)),
        ),
    ]
    assert periods[0][2] == "$1.20" and periods[1][2] == "$0.60"
    assert '<div class="big" data-budget-spent>$1.20</div>' in html
    assert '<div class="big" data-budget-tokens>400</div>' in html

    stopped = re.search(r'<section class="card" id="stopped">.*?</section>', html, re.S)
    assert stopped is not None
    # sessions it holds that were active this period: ann-1 and ann-old (its session event
    # was sent now, its last activity), not bob's
    assert re.findall(r'<tr data-session="([^"]+)">', stopped.group(0)) == ["ann-old", "ann-1"]
    assert "2 sessions active this period are told to stop" in stopped.group(0)
    assert re.findall(r'<tr data-event="([^"]+)">', html) == [
        "exhausted",
        "threshold",
        "soft_warned",
    ]


def test_budget_pages_are_scoped_to_the_users_projects(agent: Agent, held: PeriodBudget) -> None:
    other = make_agent("globex")
    theirs = PeriodBudget.objects.create(
        project=other.project, name="globex monthly", cost_limit_usd=Decimal(5)
    )
    member = member_of(agent)
    assert member.get(f"/budgets/{held.pk}/").status_code == 200
    assert member.get(f"/budgets/{theirs.pk}/").status_code == 404
    listing = member.get("/budgets/").content.decode()
    assert "ann monthly" in listing and "globex monthly" not in listing
    chosen = member.get(f"/budgets/?project={agent.project.slug}").content.decode()
    assert f'href="/budgets/{held.pk}/?project={agent.project.slug}"' in chosen
    assert member.get(f"/budgets/?project={other.project.slug}").status_code == 404
    assert Client().get("/budgets/").status_code == 302  # login required
    assert Client().get(f"/budgets/{held.pk}/").status_code == 302


def test_an_api_key_budget_names_the_key_it_stops(staff: Client, agent: Agent) -> None:
    budget = PeriodBudget.objects.create(
        project=agent.project,
        name="integration",
        scope="api_key",
        scope_value=agent.key[:10],
        token_limit=STEP_TOKENS,
        action="stop",
    )
    answer = agent.events(*steps("k", 1))
    assert answer["sessions"]["k"]["stopped_by"] == f"budget:{budget.pk}"
    html = staff.get(f"/budgets/{budget.pk}/").content.decode()
    assert f"Every call made with the key <code>{agent.key[:10]}</code> is told to stop" in html


def test_budget_pages_run_a_bounded_number_of_queries(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    def queries(path: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(path).status_code == 200
        return len(captured)

    before = {p: queries(p) for p in ("/budgets/", f"/budgets/{held.pk}/")}
    for n in range(5):
        PeriodBudget.objects.create(
            project=agent.project, name=f"b{n}", cost_limit_usd=Decimal("0.10"), action="stop"
        )
    agent.events(*steps("ann-1", 3), *steps("bob-2", 3))
    after = {p: queries(p) for p in before}
    assert after == before and max(after.values()) <= 14


def test_the_admin_shows_budget_money_in_dollars(staff: Client, agent: Agent) -> None:
    PeriodBudget.objects.create(project=agent.project, name="round", cost_limit_usd=Decimal(1))
    PeriodBudget.objects.create(
        project=agent.project, name="tiny", cost_limit_usd=Decimal("0.0050"), token_limit=250000
    )
    html = staff.get("/admin/costboard/periodbudget/").content.decode()
    assert '<td class="field-cost_limit">$1.00</td>' in html
    assert '<td class="field-cost_limit">$0.005</td>' in html
    assert '<td class="field-tokens">250,000</td>' in html
    assert "1.0000" not in html and "0.0050" not in html


def test_a_per_member_budget_holds_only_its_exhausted_members(staff: Client, agent: Agent) -> None:
    """Every user, $1.00 a month: ann ($1.20) is held, bob ($0.30) is not; the budget's page
    lists its members nearest their limit and its period's spend is all of theirs."""
    budget, _ = ann_over_bob_under(agent, name="each user", user="*")

    page = staff.get(f"/sessions/{session('ann-1').pk}/").content.decode()
    assert f'href="/budgets/{budget.pk}/' in page
    assert (
        f'href="/budgets/{budget.pk}/'
        not in staff.get(f"/sessions/{session('bob-1').pk}/").content.decode()
    )
    assert listed(staff.get("/sessions/?state=stopped").content.decode()) == ["ann-1"]

    html = staff.get(f"/budgets/{budget.pk}/").content.decode()
    members = re.findall(
        r'<tr data-member="([^"]+)">.*?badge (\w+)".*?<td class="num">([^<]+)</td>', html, re.S
    )
    assert members == [("ann", "exhausted", "$1.20"), ("bob", "ok", "$0.30")]
    spent = re.findall(
        r'<tr data-period="[\d-]+" data-current>.*?data-period-spent>([^<]+)<', html, re.S
    )
    assert spent == [usd_text(sum(s.cost_usd for s in Step.objects.all()))] == ["$1.50"]
    stopped = re.search(r'<section class="card" id="stopped">.*?</section>', html, re.S)
    assert stopped is not None
    assert re.findall(r'<tr data-session="([^"]+)">', stopped.group(0)) == ["ann-1"]


def budget_row(html: str, budget: PeriodBudget) -> str:
    found = re.search(rf'<tr data-budget="{budget.pk}">.*?</tr>', html, re.S)
    assert found is not None, f"no row for {budget.name}"
    return found.group(0)


def test_a_period_ends_at_midnight_in_the_budget_s_timezone(staff: Client, agent: Agent) -> None:
    """At 12:00 UTC on Nov 28 it is 02:00 on Nov 29 on Kiritimati (UTC+14): that day budget's
    period ends at midnight starting Nov 30 there (10:00 UTC on Nov 29), and /budgets/ and the
    overview say "ends Nov 30", as its page says its day is Nov 29 — not the UTC date of
    that instant, which a UTC day budget's end (Nov 29) shares."""
    east = PeriodBudget.objects.create(
        project=agent.project,
        name="kiritimati",
        period="day",
        timezone="Pacific/Kiritimati",
        cost_limit_usd=Decimal(1),
    )
    utc = PeriodBudget.objects.create(
        project=agent.project, name="utc", period="day", cost_limit_usd=Decimal(1)
    )
    tokyo = PeriodBudget.objects.create(
        project=agent.project,
        name="tokyo month",
        period="month",
        timezone="Asia/Tokyo",
        cost_limit_usd=Decimal(1),
    )
    with time_machine.travel(datetime(2026, 11, 28, 12, 0, tzinfo=UTC), tick=False):
        assert period_bounds("day", east.timezone, datetime.now(UTC))[1] == datetime(
            2026, 11, 29, 10, 0, tzinfo=UTC
        )
        listing = staff.get("/budgets/").content.decode()
        overview = staff.get("/").content.decode()
        page = staff.get(f"/budgets/{east.pk}/").content.decode()
    for html in (listing, overview):
        assert 'day<span class="muted"> · ends Nov 30</span>' in budget_row(html, east)
        assert 'day<span class="muted"> · ends Nov 29</span>' in budget_row(html, utc)
        # Tokyo's November ends at midnight starting Dec 1 there (Nov 30, 15:00 UTC)
        assert 'month<span class="muted"> · ends Dec 1</span>' in budget_row(html, tokyo)
    assert "ends Nov 30, 2026" in page  # nothing counted yet: the period's end, as there


def test_a_share_of_a_limit_is_rounded_down_as_every_percentage(
    staff: Client, agent: Agent
) -> None:
    """999 of 1,000 tokens is near the limit, not at it: "99%" used (as the session pages'
    cap use, rounded down), never "100%" beside a "near limit" state."""
    budget = PeriodBudget.objects.create(
        project=agent.project, name="tokens", token_limit=1000, action="stop"
    )
    agent.events({"session_id": "a", "step_type": "x", "model": "test-sonnet", "input_tokens": 999})
    for html in (staff.get("/budgets/").content.decode(), staff.get("/").content.decode()):
        row = budget_row(html, budget)
        assert '<span class="badge warning" data-budget-state' in row
        assert '<td class="num">99%</td>' in row
    page = staff.get(f"/budgets/{budget.pk}/").content.decode()
    assert "· 99% used" in page and "100%" not in page


def test_the_overview_marks_a_per_member_budget_s_limit_each(staff: Client, agent: Agent) -> None:
    """Its spend is all its members', its limit each one's: "$1.20 + $0.30" spent is not
    over a "$1.00" limit, and the overview says "each member" as /budgets/ does."""
    budget, _ = ann_over_bob_under(agent, name="each user", user="*")
    for html in (staff.get("/").content.decode(), staff.get("/budgets/").content.decode()):
        row = budget_row(html, budget)
        assert "$1.50" in row and "$1.00" in row
        assert '<div class="muted" data-per-member>each member</div>' in row


def test_the_overview_never_says_ok_of_a_session_a_budget_stops(
    staff: Client, agent: Agent, held: PeriodBudget
) -> None:
    """ann-1 is within its own caps (stored "ok") but her budget stops it: the overview's
    costliest sessions and its flagged short list say exhausted, stopped by that budget, as
    the API, /sessions/ and /flagged/ do; bob-1 goes on."""
    assert session("ann-1").state == "ok"
    assert agent.budget("ann-1").json()["state"] == "exhausted"
    html = staff.get("/").content.decode()

    def overview_row(heading: str, session_id: str) -> str:
        card = html[html.index(heading) :]
        card = card[: card.index("</section>")]
        row = re.search(
            rf'<tr[^>]*>\s*<td><a href="/sessions/\d+/"><code>{session_id}</code>.*?</tr>',
            card,
            re.S,
        )
        assert row is not None, f"{session_id} not under {heading}"
        return row.group(0)

    ann = overview_row("Ten costliest sessions", "ann-1")
    assert '<span class="badge exhausted">exhausted</span>' in ann and "badge ok" not in ann
    assert stopped_link(held) in ann
    assert '<span class="badge ok">ok</span>' in overview_row("Ten costliest sessions", "bob-1")
    flagged = overview_row("Flagged sessions <span", "ann-1")
    assert "badge exhausted" in flagged and stopped_link(held) in flagged


def test_a_limit_crossed_earlier_in_the_period_says_the_day_it_was_crossed(
    staff: Client, agent: Agent
) -> None:
    """A Berlin month budget exhausted late on Nov 2 UTC (early Nov 3 in Berlin), read on
    Nov 28: the API's `crossing_date` and its page's "crossed" are Nov 3, the day its
    exhaustion was in its timezone, not the day it is read."""
    key = ApiKey.issue(project=agent.project, role="admin")[1]
    with time_machine.travel(datetime(2026, 10, 30, tzinfo=UTC), tick=False):
        budget = PeriodBudget.objects.create(
            project=agent.project,
            name="berlin month",
            period="month",
            timezone="Europe/Berlin",
            cost_limit_usd=Decimal("1.00"),
        )
    crossed = datetime(2026, 11, 2, 23, 30, tzinfo=UTC)  # 00:30 on Nov 3 in Berlin
    with time_machine.travel(crossed, tick=False):
        agent.events(*steps("s1", 4, at=crossed))  # $1.20
    with time_machine.travel(datetime(2026, 11, 28, 12, 0, tzinfo=UTC), tick=False):
        read = agent.client.get(
            f"/api/v1/budgets/{budget.pk}", headers={"Authorization": f"Bearer {key}"}
        ).json()
        page = staff.get(f"/budgets/{budget.pk}/").content.decode()
    assert (read["state"], read["exhausted_at"]) == ("exhausted", crossed.isoformat())
    assert read["crossing_date"] == "2026-11-03"
    assert "<span data-budget-crossing>crossed Nov 3</span>" in page
