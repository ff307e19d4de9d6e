"""The flagged sessions page (/flagged/): what it lists and why, its htmx actions (raise a
cap, acknowledge), who may act, and the session page's budget events, banner and context
pressure."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from costboard.budgets.engine import Flag
from costboard.budgets.period_services import period_budget_create
from costboard.budgets.services import session_flag_runaway
from costboard.dashboards.selectors import flagged as selectors
from costboard.models import BudgetEvent, Membership, Session, Turn
from tests.conftest import Agent, make_agent
from tests.costboard.dashboards import test_dashboards as dashboards
from tests.costboard.dashboards.test_dashboards import capped, traffic

pytestmark = pytest.mark.django_db

priced = dashboards.priced  # prices for test-sonnet and test-haiku; `staff` (root) is shared

HTMX = {"HX-Request": "true"}


def listed(html: str) -> list[str]:
    """The sessions the page lists, in order."""
    return re.findall(r'<tr id="flagged-\d+" data-session="([^"]+)"', html)


def row_of(html: str, session_id: str) -> str:
    found = re.search(rf'<tr id="flagged-\d+" data-session="{session_id}".*?</tr>', html, re.S)
    assert found is not None, f"no row for {session_id}"
    return found.group(0)


def person(*agents: Agent, perms: bool = False, staff_user: bool = False) -> Client:
    user = get_user_model().objects.create_user(
        f"person{get_user_model().objects.count()}", "", "pw", is_staff=staff_user
    )
    for agent in agents:
        Membership.objects.create(user=user, project=agent.project)
    if perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="costboard", codename="change_session")
        )
    client = Client()
    client.force_login(user)
    return client


def session(external_id: str, agent: Agent | None = None) -> Session:
    sessions = Session.objects.filter(external_id=external_id)
    if agent is not None:
        sessions = sessions.filter(project=agent.project)
    return sessions.get()


def runaway(agent: Agent, session_id: str, **evidence: Any) -> Session:
    agent.events(
        {"session_id": session_id, "step_type": "x", "model": "test-haiku", "input_tokens": 10}
    )
    flagged = session(session_id, agent)
    session_flag_runaway(
        session_id=flagged.pk,
        flag=Flag(
            at=timezone.now(),
            rule="retry_loop",
            reason="retry loop: 5 failed steps in a row in turn 1",
            evidence=evidence or {"failed_steps": 5, "turn": 1},
        ),
    )
    return session(session_id, agent)


def raise_cap(client: Client, pk: int, query: str = "", **fields: str) -> Any:
    return client.post(f"/flagged/{pk}/raise-cap/{query}", fields, headers=HTMX)


def acknowledge(client: Client, pk: int, **fields: str) -> Any:
    return client.post(f"/flagged/{pk}/acknowledge/", fields, headers=HTMX)


def cap_events(pk: int) -> list[BudgetEvent]:
    return list(BudgetEvent.objects.filter(session_id=pk, kind="cap_changed").order_by("id"))


# --- the list -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/flagged/", "/flagged/1/raise-cap/", "/flagged/1/acknowledge/"])
def test_the_page_and_its_actions_need_a_login(client: Client, path: str) -> None:
    response = client.post(path) if "flagged/1/" in path else client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_it_lists_exactly_the_open_flagged_sessions_most_urgent_first(
    staff: Client, agent: Agent, priced: None
) -> None:
    traffic(agent, sessions=2, prefix="calm")  # ok: not listed
    capped(agent, "near", "warning")
    capped(agent, "over", "exhausted")
    agent.events(
        {"type": "session", "session_id": "pricey", "cost_cap_usd": "0.01"},
        {"session_id": "pricey", "step_type": "x", "model": "test-sonnet", "output_tokens": 700},
    )
    capped(agent, "done", "exhausted")
    agent.events({"type": "session", "session_id": "done", "ended": True})  # ended: not listed
    loop = runaway(agent, "loop")

    html = staff.get("/flagged/").content.decode()
    assert listed(html) == ["loop", "pricey", "over", "near"]
    assert "calm0" not in html and "done" not in listed(html)

    near = row_of(html, "near")
    assert "near cap: tokens 850 of 1,000 (85%)" in near
    assert '<span class="badge warning">near cap</span>' in near
    assert "cap reached: tokens 1,000 of 1,000 (100%)" in row_of(html, "over")
    # 700 output tokens at $15/M = $0.0105 of a $0.01 cap: the USD cap is the one reached,
    # with the decimals it takes to tell them apart
    pricey = row_of(html, "pricey")
    assert "cap reached: $0.011 of $0.010 (105%)" in pricey
    assert "tokens" not in pricey.split("data-why")[1].split("</td>")[0]
    assert "runaway:</strong> retry loop: 5 failed steps in a row in turn 1" in row_of(html, "loop")
    assert '<span class="badge runaway">runaway</span>' in row_of(html, "loop")
    # each row links to its session's page, and says when it was flagged
    assert f'href="/sessions/{loop.pk}/"' in row_of(html, "loop")
    assert loop.latest_flag_at is not None
    assert f'<time datetime="{loop.latest_flag_at.isoformat()}">' in row_of(html, "loop")
    assert re.search(r'data-count="all">4<', html)
    assert re.search(r'data-count="runaway">1<', html)
    assert re.search(r'data-count="exhausted">2<', html)
    assert re.search(r'data-count="warning">1<', html)


def test_within_a_kind_the_newest_flag_comes_first(staff: Client, agent: Agent) -> None:
    for name in ("w-old", "w-new", "w-mid"):
        capped(agent, name, "warning")
    now = timezone.now()
    for name, minutes in (("w-old", 30), ("w-new", 1), ("w-mid", 10)):
        Session.objects.filter(external_id=name).update(warned_at=now - timedelta(minutes=minutes))
    capped(agent, "x-old", "exhausted")
    Session.objects.filter(external_id="x-old").update(
        warned_at=now - timedelta(hours=5), exhausted_at=now - timedelta(hours=4)
    )
    html = staff.get("/flagged/").content.decode()
    assert listed(html) == ["x-old", "w-new", "w-mid", "w-old"]
    kind = staff.get("/flagged/?kind=warning").content.decode()
    assert listed(kind) == ["w-new", "w-mid", "w-old"]


def test_a_member_sees_only_their_projects_and_links_keep_the_project(agent: Agent) -> None:
    other = make_agent("other")
    capped(agent, "mine", "exhausted")
    capped(other, "theirs", "exhausted")
    client = person(agent)
    html = client.get("/flagged/").content.decode()
    assert listed(html) == ["mine"]
    assert client.get("/flagged/?project=other").status_code == 404
    one = client.get("/flagged/?project=acme").content.decode()
    assert listed(one) == ["mine"]
    pk = session("mine").pk
    assert f'href="/sessions/{pk}/?project=acme"' in one
    assert 'href="/flagged/?project=acme" aria-current="page"' in one
    assert 'href="/?project=acme"' in one


def test_staff_switch_between_projects(staff: Client, agent: Agent) -> None:
    other = make_agent("other")
    capped(agent, "mine", "exhausted")
    capped(other, "theirs", "warning")
    assert sorted(listed(staff.get("/flagged/").content.decode())) == ["mine", "theirs"]
    page = staff.get("/flagged/?project=other").content.decode()
    assert listed(page) == ["theirs"]
    assert '<option value="other" selected>' in page


def test_overview_and_nav_link_to_the_page(staff: Client, agent: Agent) -> None:
    capped(agent, "over", "exhausted")
    html = staff.get("/?project=acme").content.decode()
    panel = html[html.index('id="flagged"') : html.index("Daily cost by model")]
    assert 'href="/flagged/?project=acme" data-flagged-page' in panel
    assert '<a href="/flagged/?project=acme" >Flagged</a>' in html


def overview_flagged(html: str) -> tuple[list[str], str]:
    """The overview's flagged short list (session ids, in order) and its count."""
    panel = html[html.index('id="flagged"') : html.index("Daily cost by model")]
    count = re.search(r'<span class="count">(\d+)</span>', panel)
    assert count is not None
    return re.findall(r"<code>([^<]+)</code></a></td>", panel), count.group(1)


def test_the_overview_lists_what_flagged_lists_in_its_order(staff: Client, agent: Agent) -> None:
    """The overview's short list is the start of /flagged/'s, its count /flagged/'s "All":
    an acknowledged session is on neither, and the most urgent (an exhausted session, however
    long ago it was last active) comes before fresher near-cap ones."""
    capped(agent, "x-old", "exhausted")
    capped(agent, "acked", "warning")
    for n in range(14):
        capped(agent, f"w-{n:02d}", "warning")
    now = timezone.now()
    Session.objects.filter(external_id="x-old").update(
        last_active_at=now - timedelta(days=3),
        warned_at=now - timedelta(days=3),
        exhausted_at=now - timedelta(days=3),
    )
    Session.objects.filter(external_id="acked").update(
        acknowledged_at=now + timedelta(minutes=1), acknowledged_by="root"
    )

    page = staff.get("/flagged/?project=acme").content.decode()
    assert re.search(r'data-count="all">15<', page)
    assert "acked" not in listed(page) and listed(page)[0] == "x-old"
    rows, total = overview_flagged(staff.get("/?project=acme").content.decode())
    assert total == "15"
    assert rows == listed(page)[: len(rows)] and len(rows) == 12
    assert "acked" not in rows


def test_the_list_pages_by_fifty(staff: Client, agent: Agent) -> None:
    events: list[dict[str, Any]] = []
    for i in range(55):
        events.append({"type": "session", "session_id": f"x{i:02d}", "token_cap": 10})
        events.append(
            {"session_id": f"x{i:02d}", "step_type": "x", "model": "m", "input_tokens": 20}
        )
    agent.events(*events)
    first = staff.get("/flagged/").content.decode()
    second = staff.get("/flagged/?page=2").content.decode()
    assert len(listed(first)) == 50 and len(listed(second)) == 5
    assert not set(listed(first)) & set(listed(second))
    assert "page 2 of 2" in second


def test_the_htmx_list_fragment_is_only_the_list(staff: Client, agent: Agent) -> None:
    capped(agent, "near", "warning")
    capped(agent, "over", "exhausted")
    body = staff.get("/flagged/?kind=exhausted", headers=HTMX).content.decode()
    assert body.lstrip().startswith('<div id="flagged-list"')
    assert "<html" not in body
    assert listed(body) == ["over"]


# --- raise a cap ----------------------------------------------------------------------------


def test_raising_a_cap_recomputes_the_state_and_records_the_change(
    staff: Client, agent: Agent
) -> None:
    capped(agent, "over", "exhausted")
    capped(agent, "over2", "exhausted")
    over, over2 = session("over"), session("over2")

    response = raise_cap(staff, over.pk, token_cap="1,200")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.startswith(f'<tr id="flagged-{over.pk}" data-session="over" data-state="warning"')
    _row, counts = body.split("</tr>")
    assert "<html" not in body
    # the list's counts come along, out of band (htmx swaps them into #flag-counts)
    assert counts.strip().startswith('<nav class="flag-counts card" id="flag-counts"')
    assert 'hx-swap-oob="true"' in counts
    assert "near cap: tokens 1,000 of 1,200 (83%)" in body
    over.refresh_from_db()
    assert (over.token_cap, over.state, over.exhausted_at) == (1200, "warning", None)
    [event] = cap_events(over.pk)
    assert event.detail["token_cap"] == [1000, 1200]
    assert event.detail["cost_cap_usd"] == ["5.00", "5.00"]
    assert event.detail["state"] == ["exhausted", "warning"]

    resolved = raise_cap(staff, over2.pk, token_cap="5000", cost_cap_usd="$20").content.decode()
    over2.refresh_from_db()
    assert (over2.token_cap, over2.cost_cap_usd, over2.state) == (5000, Decimal(20), "ok")
    assert 'data-state="resolved"' in resolved
    assert '<span class="badge ok">resolved</span>' in resolved
    assert "now tokens 1,000 of 5,000 (20%)" in resolved
    assert "Raise cap" not in resolved  # nothing left to do
    [event] = cap_events(over2.pk)
    assert event.detail["cost_cap_usd"] == ["5.00", "20.0000"]
    assert event.detail["state"] == ["exhausted", "ok"]
    # resolved sessions leave the list
    assert listed(staff.get("/flagged/").content.decode()) == ["over"]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"token_cap": "lots"}, "token_cap", "Token cap: enter a whole number of tokens"),
        ({"token_cap": "0"}, "token_cap", "Token cap: must be a positive whole number"),
        ({"token_cap": "-5"}, "token_cap", "Token cap: must be a positive whole number"),
        ({"token_cap": "500"}, "token_cap", "Token cap: must be higher than the current cap"),
        ({"token_cap": "1000"}, "token_cap", "Token cap: must be higher than the current cap"),
        ({"cost_cap_usd": "ten"}, "cost_cap_usd", "USD cap: enter an amount in dollars"),
        ({"cost_cap_usd": "0"}, "cost_cap_usd", "USD cap: must be more than $0."),
        ({"cost_cap_usd": "-1"}, "cost_cap_usd", "USD cap: must be more than $0."),
        ({"cost_cap_usd": "5.00"}, "cost_cap_usd", "USD cap: must be higher than the current"),
        ({"cost_cap_usd": "9.123456"}, "cost_cap_usd", "USD cap: at most 4 decimal places."),
        # Decimal() reads fullwidth and Arabic-Indic digits as 12: refused, as typed
        ({"cost_cap_usd": "１２"}, "cost_cap_usd", "USD cap: has a digit that is not 0-9"),
        ({"cost_cap_usd": "$١٢.٥٠"}, "cost_cap_usd", "USD cap: has a digit that is not 0-9"),
        # int() too: "２０００" would be 2000 tokens (the page takes "2,000" and "2_000")
        ({"token_cap": "２０００"}, "token_cap", "Token cap: has a digit that is not 0-9"),
        ({"token_cap": "", "cost_cap_usd": ""}, "__all__", "Give a new token cap, a new USD"),
        ({"token_cap": "5000", "cost_cap_usd": "1"}, "cost_cap_usd", "USD cap: must be higher"),
    ],
)
def test_a_refused_raise_names_the_field_and_saves_nothing(
    staff: Client, agent: Agent, fields: dict[str, str], field: str, message: str
) -> None:
    capped(agent, "over", "exhausted")
    over = session("over")
    response = raise_cap(staff, over.pk, **fields)
    assert response.status_code == 422
    body = response.content.decode()
    assert body.startswith(f'<tr id="flagged-{over.pk}"')
    found = re.search(rf'data-error="{field}">([^<]+)<', body)
    assert found is not None, body
    assert found.group(1).startswith(message), found.group(1)
    assert '<details class="raise-cap" open>' in body  # the form stays open, as typed
    over.refresh_from_db()
    assert (over.token_cap, over.cost_cap_usd, over.state) == (1000, None, "exhausted")
    assert cap_events(over.pk) == []


def test_the_raise_form_is_prefilled_with_double_the_cap_behind_the_flag(
    staff: Client, agent: Agent
) -> None:
    capped(agent, "over", "exhausted")
    agent.events(
        {"type": "session", "session_id": "way-over", "token_cap": 1000},
        {"session_id": "way-over", "step_type": "x", "model": "m", "input_tokens": 3100},
    )
    html = staff.get("/flagged/").content.decode()
    over = row_of(html, "over")
    assert re.search(r'name="token_cap" id="[^"]+"\s+value="2000"', over)
    assert re.search(r'name="cost_cap_usd" id="[^"]+"\s+value=""', over)  # not behind it
    assert 'placeholder="keep $5.00"' in over
    # double the use when that is more than double the cap, rounded up: 6,200 → 6,200
    assert re.search(r'name="token_cap" id="[^"]+"\s+value="6200"', row_of(html, "way-over"))
    # the prefilled form raises as it is
    assert raise_cap(staff, session("over").pk, token_cap="2000").status_code == 200
    assert session("over").state == "ok"


def test_a_plain_form_post_redirects_back_keeping_the_query(staff: Client, agent: Agent) -> None:
    capped(agent, "over", "exhausted")
    over = session("over")
    refused = staff.post(f"/flagged/{over.pk}/raise-cap/?project=acme", {"token_cap": "1"})
    assert refused.status_code == 422
    page = refused.content.decode()
    assert "<html" in page  # the whole page, the row with its errors
    assert 'data-error="token_cap">Token cap: must be higher' in row_of(page, "over")
    response = staff.post(f"/flagged/{over.pk}/raise-cap/?project=acme", {"token_cap": "3000"})
    assert response.status_code == 303
    assert response["Location"] == "/flagged/?project=acme"
    assert session("over").token_cap == 3000


# --- acknowledge ----------------------------------------------------------------------------


def test_acknowledging_hides_a_session_until_it_is_flagged_again(
    staff: Client, agent: Agent
) -> None:
    capped(agent, "near", "warning")
    capped(agent, "over", "exhausted")
    near = session("near")

    response = acknowledge(staff, near.pk)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.startswith(f'<tr id="flagged-{near.pk}" data-session="near"')
    assert '<span class="badge acknowledged"' in body
    assert "acknowledged by root" in body
    assert "Acknowledge</button>" not in body
    near.refresh_from_db()
    assert near.acknowledged and near.acknowledged_by == "root"

    default = staff.get("/flagged/").content.decode()
    assert listed(default) == ["over"]
    assert re.search(r'data-count="acknowledged">1<', default)
    shown = staff.get("/flagged/?acknowledged=1").content.decode()
    assert listed(shown) == ["over", "near"]
    assert "Hide acknowledged" in shown

    # exhausting it later is a new flag: back on the list
    agent.events({"session_id": "near", "step_type": "x", "model": "m", "input_tokens": 200})
    near.refresh_from_db()
    assert near.state == "exhausted" and not near.acknowledged
    assert listed(staff.get("/flagged/").content.decode()) == ["near", "over"]


def test_the_unacknowledged_filter_agrees_with_the_model(agent: Agent) -> None:
    now = timezone.now()
    for i, (ack, warned, exhausted) in enumerate(
        [
            (None, 5, None),
            (3, 5, None),
            (6, 5, None),
            (6, 5, 4),
            (6, 5, 7),
            (5, 5, None),
        ]
    ):
        capped(agent, f"s{i}", "warning")
        Session.objects.filter(external_id=f"s{i}").update(
            acknowledged_at=now + timedelta(minutes=ack) if ack is not None else None,
            warned_at=now + timedelta(minutes=warned),
            exhausted_at=now + timedelta(minutes=exhausted) if exhausted is not None else None,
        )
    hidden = {s.external_id for s in Session.objects.all() if s.acknowledged}
    assert hidden == {"s2", "s3", "s5"}
    ids = [agent.project.pk]
    shown = selectors.sessions_flagged_list(project_ids=ids)
    assert {s.external_id for s in shown} == {"s0", "s1", "s4"}
    assert selectors.sessions_flagged_counts(project_ids=ids).acknowledged == 3


def test_acknowledging_a_runaway_lets_a_held_session_go_on(staff: Client, agent: Agent) -> None:
    loop = runaway(agent, "loop")
    html = staff.get("/flagged/").content.decode()
    assert listed(html) == ["loop"]
    row = acknowledge(staff, loop.pk).content.decode()
    loop.refresh_from_db()
    assert loop.acknowledged
    # a runaway that stops its project's agents is held at exhausted until now
    assert loop.state == "ok"
    assert '<span class="badge runaway">runaway</span>' in row
    assert listed(staff.get("/flagged/").content.decode()) == []


# --- who may act ----------------------------------------------------------------------------


def test_only_staff_or_the_change_permission_may_act(agent: Agent) -> None:
    capped(agent, "over", "exhausted")
    over = session("over")
    viewer = person(agent)
    page = viewer.get("/flagged/").content.decode()
    assert listed(page) == ["over"]
    assert "Raise cap" not in page and "Acknowledge</button>" not in page
    assert raise_cap(viewer, over.pk, token_cap="5000").status_code == 403
    assert acknowledge(viewer, over.pk).status_code == 403
    over.refresh_from_db()
    assert (over.token_cap, over.acknowledged_at) == (1000, None)

    allowed = person(agent, perms=True)
    assert "Raise cap" in allowed.get("/flagged/").content.decode()
    assert raise_cap(allowed, over.pk, token_cap="1100").status_code == 200
    staff_member = person(agent, staff_user=True)
    assert acknowledge(staff_member, over.pk).status_code == 200
    over.refresh_from_db()
    assert over.token_cap == 1100 and over.acknowledged


def test_actions_reach_only_sessions_in_scope(agent: Agent) -> None:
    other = make_agent("other")
    capped(other, "theirs", "exhausted")
    theirs = session("theirs")
    allowed = person(agent, perms=True)
    assert raise_cap(allowed, theirs.pk, token_cap="5000").status_code == 404
    assert acknowledge(allowed, theirs.pk).status_code == 404
    assert allowed.get(f"/flagged/{theirs.pk}/acknowledge/").status_code == 405
    theirs.refresh_from_db()
    assert (theirs.token_cap, theirs.acknowledged_at) == (1000, None)


# --- bounded --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_page_runs_a_bounded_number_of_queries(
    staff: Client, agent: Agent, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def flag_some(prefix: str, n: int) -> None:
        for i in range(n):
            capped(agent, f"{prefix}w{i}", "warning")
            capped(agent, f"{prefix}x{i}", "exhausted")
            runaway(agent, f"{prefix}r{i}")

    flag_some("a", 1)
    other = make_agent("other")
    capped(other, "theirs", "exhausted")
    viewer = person(agent, other, perms=True)
    acknowledge(staff, session("aw0").pk)
    pages = [
        (staff, "/flagged/", {}),
        (staff, "/flagged/?acknowledged=1", {}),
        (staff, "/flagged/?project=acme&kind=exhausted", HTMX),
        (viewer, "/flagged/", {}),
        (viewer, "/flagged/?page=1", {}),
    ]
    counts = {}
    for client, path, headers in pages:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path, headers=headers).status_code == 200
        counts[(id(client), path)] = len(queries)
    flag_some("b", 10)
    for i in range(5):
        acknowledge(staff, session(f"bw{i}").pk)
    assert Session.objects.count() >= 33
    for client, path, headers in pages:
        with django_assert_max_num_queries(counts[(id(client), path)], info=path):
            assert client.get(path, headers=headers).status_code == 200
    assert max(counts.values()) <= 10


# --- the session page -----------------------------------------------------------------------


def test_the_session_page_lists_budget_events_in_words(staff: Client, agent: Agent) -> None:
    capped(agent, "over", "exhausted")
    over = session("over")
    raise_cap(staff, over.pk, token_cap="2000")
    session_flag_runaway(
        session_id=over.pk,
        flag=Flag(
            at=timezone.now(),
            rule="retry_loop",
            reason="retry loop: 5 failed steps in a row in turn 1",
            evidence={"failed_steps": 5, "turn": 1, "step_type": "search"},
        ),
    )
    html = staff.get(f"/sessions/{over.pk}/").content.decode()
    events = html[html.index('id="budget-events"') :]
    events = events[: events.index("</section>")]
    kinds = re.findall(r'<tr data-event="([a-z_]+)"', events)
    assert kinds[:3] == ["soft_warned", "exhausted", "cap_changed"] and "runaway" in kinds
    assert "token cap:</span> 1,000" in events  # the crossings' caps
    assert "warn at:</span> 80%" in events
    assert "token cap:</span> 1,000 → 2,000" in events
    assert "state:</span> exhausted → ok" in events
    assert "USD cap:</span> $5.00 (unchanged)" in events
    assert "rule:</span> retry_loop" in events
    assert "failed steps:</span> 5" in events and "step type:</span> search" in events
    assert "{&#x27;" not in events  # no raw dicts


def test_the_session_page_banner_says_why_and_acts_in_place(staff: Client, agent: Agent) -> None:
    capped(agent, "over", "exhausted")
    over = session("over")
    html = staff.get(f"/sessions/{over.pk}/").content.decode()
    banner = html[html.index('<div id="flag-banner">') : html.index('id="budget-tiles"')]
    assert "<strong>Exhausted</strong>" in banner
    assert "tokens 1,000 of 1,000 (100%)" in banner
    assert "Raise cap" in banner and "Acknowledge</button>" in banner
    assert 'name="render" value="banner"' in banner

    response = raise_cap(staff, over.pk, token_cap="1100", render="banner")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="flag-banner">')
    assert "<strong>Near its cap</strong>" in body and "tokens 1,000 of 1,100 (90%)" in body
    assert '<span id="session-badges" hx-swap-oob="true">' in body
    assert 'id="budget-tiles" hx-swap-oob="true"' in body
    assert 'id="budget-events" hx-swap-oob="true"' in body and "1,000 → 1,100" in body

    refused = raise_cap(staff, over.pk, token_cap="5", render="banner")
    assert refused.status_code == 422
    assert 'data-error="token_cap">Token cap: must be higher' in refused.content.decode()

    done = staff.post(f"/flagged/{over.pk}/acknowledge/")
    assert done.status_code == 303 and done["Location"] == "/flagged/"
    plain = staff.post(f"/flagged/{over.pk}/raise-cap/", {"token_cap": "9000", "render": "banner"})
    assert plain.status_code == 303 and plain["Location"] == f"/sessions/{over.pk}/"
    page = staff.get(f"/sessions/{over.pk}/").content.decode()
    assert "data-banner" not in page  # ok now, nothing to say


def test_a_runaway_session_page_says_so(staff: Client, agent: Agent) -> None:
    loop = runaway(agent, "loop")
    html = staff.get(f"/sessions/{loop.pk}/").content.decode()
    banner = html[html.index('<div id="flag-banner">') : html.index('id="budget-tiles"')]
    assert "<strong>Runaway</strong>" in banner
    assert "retry loop: 5 failed steps in a row in turn 1" in banner


def test_the_session_page_shows_context_pressure(staff: Client, agent: Agent, priced: None) -> None:
    traffic(agent, sessions=1, turns=3)
    s0 = session("s0")
    Turn.objects.filter(session=s0, number=1).update(context_tokens=50_000, context_window=200_000)
    Turn.objects.filter(session=s0, number=3).update(context_tokens=168_000, context_window=200_000)
    html = staff.get(f"/sessions/{s0.pk}/").content.decode()
    assert re.search(r'data-context="1"[^>]*>context 50,000 of 200,000 \(25%\)<', html)
    assert re.search(r'data-context="3"[^>]*>context 168,000 of 200,000 \(84%\)<', html)
    assert 'data-summarize-turn="3">should summarize<' in html
    assert 'data-summarize-turn="1"' not in html
    assert (
        "The last turn used 84% of <code>test-sonnet</code>’s context window "
        "(168,000 of 200,000 tokens): summarize before continuing."
    ) in html

    # only the latest turn's pressure raises the banner
    Turn.objects.filter(session=s0, number=3).update(context_tokens=1_000)
    Turn.objects.filter(session=s0, number=2).update(context_tokens=190_000, context_window=200_000)
    html = staff.get(f"/sessions/{s0.pk}/").content.decode()
    assert 'data-summarize-turn="2"' in html
    assert "data-summarize>" not in html


def test_a_stop_budget_holding_an_acknowledged_session_flags_it_again(
    staff: Client, agent: Agent
) -> None:
    agent.events({"type": "session", "session_id": "near", "user_id": "u-a"})
    capped(agent, "near", "warning")
    near = session("near")
    acknowledge(staff, near.pk)
    assert listed(staff.get("/flagged/").content.decode()) == []
    # then u-a's budget is exhausted by another of its sessions: "near" is held, a new flag
    period_budget_create(
        project=agent.project,
        fields={"name": "u-a", "scope": "user", "scope_value": "u-a", "token_limit": 500,
                "action": "stop"},
    )  # fmt: skip
    agent.events(
        {"type": "session", "session_id": "other", "user_id": "u-a"},
        {"session_id": "other", "step_type": "x", "model": "test-haiku", "input_tokens": 600},
    )
    held = staff.get("/flagged/").content.decode()
    assert sorted(listed(held)) == ["near", "other"]
    assert re.search(r'data-count="acknowledged">0<', held)
    # acknowledged again, after the hold began: hidden, and counted so
    acknowledge(staff, near.pk)
    again = staff.get("/flagged/").content.decode()
    assert listed(again) == ["other"]
    assert re.search(r'data-count="acknowledged">1<', again)
