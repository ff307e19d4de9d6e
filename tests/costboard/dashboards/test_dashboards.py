from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import plotly.graph_objects as go
import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from costboard.budgets.engine import Flag
from costboard.budgets.services import session_flag_runaway
from costboard.models import DailyRollup, Membership, Session, Step
from tests.conftest import Agent, add_price, make_agent, streamed

pytestmark = pytest.mark.django_db


def member_of(*agents: Agent) -> Client:
    user = get_user_model().objects.create_user(f"user{Membership.objects.count()}", "", "pw")
    for agent in agents:
        Membership.objects.create(user=user, project=agent.project)
    client = Client()
    client.force_login(user)
    return client


def ago(**delta: float) -> str:
    return (timezone.now() - timedelta(**delta)).isoformat()


def traffic(agent: Agent, sessions: int = 3, turns: int = 2, prefix: str = "s") -> None:
    """`sessions` sessions of `turns` turns, each turn an intent and a response step."""
    events: list[dict[str, Any]] = []
    for s in range(sessions):
        sid = f"{prefix}{s}"
        at = ago(minutes=10 * (s + 1))
        events.append(
            {"type": "session", "session_id": sid, "user_id": f"u{s % 2}", "timestamp": at}
        )
        for t in range(1, turns + 1):
            events.append(
                {
                    "type": "turn",
                    "session_id": sid,
                    "turn": t,
                    "timestamp": at,
                    "user_message": f"question {t}",
                    "context": {"focus": f"f{t}"},
                }
            )
            events.append(
                {
                    "session_id": sid,
                    "turn": t,
                    "step_type": "intent",
                    "model": "test-haiku",
                    "input_tokens": 100 * (s + 1),
                    "output_tokens": 10,
                    "duration_ms": 200 + s,
                    "timestamp": at,
                }
            )
            events.append(
                {
                    "session_id": sid,
                    "turn": t,
                    "step_type": "response",
                    "model": "test-sonnet",
                    "input_tokens": 1000 * (s + 1),
                    "output_tokens": 300,
                    "cache_read_input_tokens": 5000,
                    "duration_ms": 3000 + 100 * s,
                    "success": s != 1,
                    "timestamp": at,
                }
            )
    agent.events(*events)


@pytest.fixture
def priced(db: None) -> None:
    add_price("test-sonnet")
    add_price(
        "test-haiku",
        input_mtok=Decimal(1),
        output_mtok=Decimal(5),
        cache_read_mtok=Decimal("0.1"),
        cache_write_mtok=Decimal("1.25"),
    )


def figures(response: Any) -> dict[str, Any]:
    """The page's figures: `#figures`, and a session page's drawn against its caps
    (`#budget-figures`)."""
    found = re.search(
        r'<script id="figures" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    assert found is not None
    budget = re.search(
        r'<script id="budget-figures" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    return {**json.loads(found.group(1)), **(json.loads(budget.group(1)) if budget else {})}


def assert_valid_figures(response: Any, names: set[str]) -> None:
    figs = figures(response)
    assert set(figs) == names
    for fig in figs.values():
        go.Figure(fig)  # raises on anything Plotly would not draw


@pytest.mark.parametrize("path", ["/", "/sessions/", "/steps/", "/sessions/export.csv"])
def test_pages_need_a_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.fixture
def midday() -> Iterator[None]:
    """Noon today (UTC): traffic from "10 to 30 minutes ago" falls on today whatever the hour
    the suite runs at. Run just after midnight, it fell on yesterday and "Today" read $0.00."""
    noon = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    with time_machine.travel(noon, tick=True):
        yield


def test_overview_numbers_equal_the_sums_of_steps(
    staff: Client, agent: Agent, priced: None, midday: None
) -> None:
    traffic(agent)
    response = staff.get("/")
    assert response.status_code == 200
    steps = list(Step.objects.all())
    total = sum((s.cost_usd for s in steps), Decimal(0))
    html = response.content.decode()
    today = re.search(r'data-spend="Today">([^<]+)<', html)
    assert today is not None
    assert today.group(1) == f"${total.quantize(Decimal('0.01'))}"
    figs = figures(response)
    drawn = sum(sum(trace["y"]) for trace in figs["daily"]["data"])
    assert round(drawn, 9) == round(float(total), 9)
    kinds = dict(zip(figs["kinds"]["data"][0]["x"], figs["kinds"]["data"][0]["y"], strict=True))
    assert kinds == {
        "input": sum(s.input_tokens for s in steps),
        "output": sum(s.output_tokens for s in steps),
        "cache read": sum(s.cache_read_input_tokens for s in steps),
        "cache write": sum(s.cache_creation_input_tokens for s in steps),
    }
    # cache reads at $0.30/M instead of $3/M: 6 response steps × 5000 tokens saved $2.70/M
    savings = re.search(r"data-savings>([^<]+)<", html)
    assert savings is not None
    assert savings.group(1) == "$0.08"
    assert_valid_figures(response, {"daily", "step_types", "kinds"})


def test_overview_flags_sessions_and_links_to_them(
    staff: Client, agent: Agent, priced: None
) -> None:
    agent.events(
        {"type": "session", "session_id": "near", "token_cap": 1000},
        {"session_id": "near", "step_type": "x", "model": "test-haiku", "input_tokens": 850},
        {"type": "session", "session_id": "over", "token_cap": 1000},
        {"session_id": "over", "step_type": "x", "model": "test-haiku", "input_tokens": 1000},
        {"session_id": "calm", "step_type": "x", "model": "test-haiku", "input_tokens": 10},
        {"session_id": "loop", "step_type": "x", "model": "test-haiku", "input_tokens": 10},
    )
    loop = Session.objects.get(external_id="loop")
    session_flag_runaway(
        session_id=loop.pk, flag=Flag(at=timezone.now(), rule="retry_loop", reason="retry_loop")
    )
    html = staff.get("/").content.decode()
    panel = html[html.index('id="flagged"') : html.index("Daily cost by model")]
    for name in ("near", "over", "loop"):
        pk = Session.objects.get(external_id=name).pk
        assert f'href="/sessions/{pk}/"' in panel
    assert "calm" not in panel
    assert panel.index("loop") < panel.index("over") < panel.index("near")


def test_sessions_list_filters_sorts_and_pages(staff: Client, agent: Agent, priced: None) -> None:
    traffic(agent, sessions=3)
    page = staff.get("/sessions/").content.decode()
    assert [m for m in re.findall(r'data-session="([^"]+)"', page)] == ["s0", "s1", "s2"]
    by_cost = staff.get("/sessions/?sort=-cost").content.decode()
    assert re.findall(r'data-session="(s\d)"', by_cost) == ["s2", "s1", "s0"]
    ascending = staff.get("/sessions/?sort=cost").content.decode()
    assert re.findall(r'data-session="(s\d)"', ascending) == ["s0", "s1", "s2"]
    by_user = staff.get("/sessions/?user=u1").content.decode()
    assert re.findall(r'data-session="(s\d)"', by_user) == ["s1"]
    by_id = staff.get("/sessions/?q=2").content.decode()
    assert re.findall(r'data-session="(s\d)"', by_id) == ["s2"]
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()
    none = staff.get(f"/sessions/?since={tomorrow}").content.decode()
    assert re.findall(r'data-session="(s\d)"', none) == []
    assert "No session matches" in none


def test_sessions_list_filters_by_state(staff: Client, agent: Agent, priced: None) -> None:
    agent.events(
        {"type": "session", "session_id": "over", "token_cap": 100},
        {"session_id": "over", "step_type": "x", "model": "test-haiku", "input_tokens": 150},
        {"session_id": "fine", "step_type": "x", "model": "test-haiku", "input_tokens": 1},
    )
    exhausted = staff.get("/sessions/?state=exhausted").content.decode()
    assert re.findall(r'data-session="([^"]+)"', exhausted) == ["over"]
    ok = staff.get("/sessions/?state=ok").content.decode()
    assert re.findall(r'data-session="([^"]+)"', ok) == ["fine"]


def test_sessions_list_pages_by_fifty(staff: Client, agent: Agent) -> None:
    agent.events(
        *[
            {"session_id": f"p{i:03d}", "step_type": "x", "model": "m", "timestamp": ago(minutes=i)}
            for i in range(120)
        ]
    )
    first = staff.get("/sessions/").content.decode()
    third = staff.get("/sessions/?page=3").content.decode()
    assert len(re.findall(r'data-session="p', first)) == 50
    assert re.findall(r'data-session="(p\d+)"', third) == [f"p{i:03d}" for i in range(100, 120)]
    assert "page 3 of 3" in third


def test_the_htmx_fragment_is_only_the_table(staff: Client, agent: Agent, priced: None) -> None:
    traffic(agent)
    response = staff.get("/sessions/?user=u0&sort=-cost", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="table"')
    assert "<html" not in body and "<form" not in body
    assert re.findall(r'data-session="(s\d)"', body) == ["s2", "s0"]
    # sort and page links keep the filters
    assert "user=u0" in body


def test_live_refresh_polls_the_table(staff: Client, agent: Agent) -> None:
    body = staff.get("/sessions/?live=1", headers={"HX-Request": "true"}).content.decode()
    assert 'hx-trigger="every 10s"' in body


def test_csv_export_of_the_filtered_list(staff: Client, agent: Agent, priced: None) -> None:
    traffic(agent)
    response = staff.get("/sessions/export.csv?user=u0")
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(streamed(response).decode())))
    assert [r["session_id"] for r in rows] == ["s0", "s2"]
    s2 = Session.objects.get(external_id="s2")
    row = rows[1]
    assert Decimal(row["cost_usd"]) == s2.cost_usd
    assert int(row["tokens_used"]) == s2.tokens_used
    assert (row["turns"], row["steps"], row["project"]) == ("2", "4", "acme")


def test_a_member_sees_only_their_projects(agent: Agent, priced: None) -> None:
    other = make_agent("other")
    traffic(agent, prefix="mine")
    traffic(other, prefix="theirs")
    client = member_of(agent)
    listing = client.get("/sessions/").content.decode()
    assert "mine0" in listing and "theirs0" not in listing
    theirs = Session.objects.get(project=other.project, external_id="theirs0")
    assert client.get(f"/sessions/{theirs.pk}/").status_code == 404
    assert client.get("/sessions/?project=other").status_code == 404
    assert client.get("/?project=other").status_code == 404
    exported = streamed(client.get("/sessions/export.csv")).decode()
    assert "theirs" not in exported
    overview = client.get("/").content.decode()
    assert "theirs0" not in overview
    assert '<option value="other"' not in overview


def test_the_project_switcher_scopes_pages_and_links(
    staff: Client, agent: Agent, priced: None
) -> None:
    other = make_agent("other")
    traffic(agent, prefix="mine")
    traffic(other, prefix="theirs")
    page = staff.get("/sessions/?project=other").content.decode()
    assert "theirs0" in page and "mine0" not in page
    assert 'href="/steps/?project=other"' in page
    assert 'href="/?project=other"' in page
    assert '<option value="other" selected>' in page
    session = Session.objects.get(external_id="theirs0")
    assert f'href="/sessions/{session.pk}/?project=other"' in page


def test_the_switcher_sends_the_pages_filters_without_javascript(
    staff: Client, agent: Agent, priced: None
) -> None:
    # it sent only `project`: another project opened on its whole unfiltered list
    make_agent("other")
    page = staff.get(
        "/sessions/?project=acme&state=exhausted&since=&tag=team%3D%22a%22&page=1"
    ).content.decode()
    switcher = page[page.index('<form class="switcher"') :]
    switcher = switcher[: switcher.index("</form>")]
    assert re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', switcher) == [
        ("state", "exhausted"),
        ("since", ""),  # all time, kept
        ("tag", "team=&quot;a&quot;"),
    ]
    assert 'action="/sessions/" data-keeps-filters' in switcher
    # a session's own page switches to the other project's list, with none of its filters
    session = Session.objects.create(project=agent.project, external_id="x")
    page = staff.get(f"/sessions/{session.pk}/?project=acme").content.decode()
    switcher = page[page.index('<form class="switcher"') :]
    switcher = switcher[: switcher.index("</form>")]
    assert '<input type="hidden"' not in switcher and "data-keeps-filters" not in switcher


def test_session_page_shows_totals_turns_steps_and_events(
    staff: Client, agent: Agent, priced: None
) -> None:
    traffic(agent, sessions=2)
    agent.events({"type": "session", "session_id": "s0-fork", "parent_session_id": "s0"})
    session = Session.objects.get(external_id="s0")
    response = staff.get(f"/sessions/{session.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-total="tokens">{session.tokens_used:,}<' in html
    assert "question 1" in html and "question 2" in html
    assert "s0-fork" in html
    assert html.count('<article class="card turn"') == 2
    assert_valid_figures(response, {"tokens_gauge", "cost_gauge", "cumulative", "per_turn"})
    figs = figures(response)
    assert figs["cumulative"]["data"][0]["y"][-1] == session.tokens_used
    per_turn = {t["name"]: t["y"] for t in figs["per_turn"]["data"]}
    steps = Step.objects.filter(session=session)
    assert sum(per_turn["response"]) == pytest.approx(
        float(sum(s.cost_usd for s in steps if s.step_type == "response"))
    )


def test_a_session_without_steps_says_so(staff: Client, agent: Agent, priced: None) -> None:
    """A session event alone (no step yet) has no steps outside a turn to point at, and a
    turn of one step says "1 step"."""
    agent.events(
        {"type": "session", "session_id": "empty", "user_id": "u"},
        {"session_id": "one", "turn": 1, "step_type": "x", "model": "test-haiku"},
    )
    empty = staff.get(f"/sessions/{Session.objects.get(external_id='empty').pk}/")
    html = re.sub(r"<script .*?</script>", "", empty.content.decode(), flags=re.S)  # shown
    assert '<p class="muted" data-no-steps>No steps yet.</p>' in html
    assert "outside any turn" not in html and "listed below" not in html
    assert 'data-total="cost">$0.00<' in html
    one = staff.get(f"/sessions/{Session.objects.get(external_id='one').pk}/").content.decode()
    assert "· 1 step ·" in one


def test_a_cheap_sessions_cost_axis_reads_its_ticks_as_the_tables_do(
    staff: Client, agent: Agent, priced: None
) -> None:
    """A session of $0.000021 (2 input and 1 output tokens at $3 and $15 per million): its
    cost-per-turn axis is ticked every $0.000005, written so, not in binary floating point's
    22 decimals ("$0.0000050000000000000004")."""
    agent.events(
        {"session_id": "cheap", "turn": 1, "step_type": "intent", "model": "test-sonnet"}
        | {"input_tokens": 2, "output_tokens": 1}
    )
    session = Session.objects.get(external_id="cheap")
    assert session.cost_usd == Decimal("0.000021")
    response = staff.get(f"/sessions/{session.pk}/")
    assert 'data-total="cost">$0.000021<' in response.content.decode()
    assert figures(response)["per_turn"]["layout"]["yaxis"]["ticktext"] == [
        "$0",
        "$0.000005",
        "$0.00001",
        "$0.000015",
        "$0.00002",
        "$0.000025",
    ]


def test_steps_page_table_equals_the_steps(staff: Client, agent: Agent, priced: None) -> None:
    traffic(agent)
    response = staff.get("/steps/")
    assert response.status_code == 200
    html = response.content.decode()
    steps = list(Step.objects.all())
    response_cost = sum((s.cost_usd for s in steps if s.step_type == "response"), Decimal(0))
    assert f"${response_cost.quantize(Decimal('0.01'))}" in html
    assert_valid_figures(response, {"latency", "turn_costs"})
    turn_counts = figures(response)["turn_costs"]["data"][0]["x"]  # horizontal bars
    assert sum(turn_counts) == 6
    fragment = staff.get("/steps/?model=test-haiku", headers={"HX-Request": "true"})
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="results"')
    assert "test-sonnet" not in body.split("Latency by step type")[0]


@pytest.mark.slow
def test_query_counts_do_not_grow_with_the_data(
    staff: Client, agent: Agent, priced: None, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    traffic(agent, sessions=2, turns=1, prefix="a")
    session = Session.objects.get(external_id="a0")
    htmx = {"HX-Request": "true"}
    pages: list[tuple[str, dict[str, str]]] = [
        ("/", {}),
        (f"/?project={agent.project.slug}", {}),
        ("/sessions/", {}),
        ("/sessions/?sort=-cost&state=ok", {}),
        ("/sessions/?model=test-haiku&page=1", {}),
        ("/sessions/?model=test-haiku&exact=test-haiku", {}),
        ("/sessions/?state=ok&sort=-tokens", htmx),
        ("/sessions/export.csv?state=ok", {}),
        (f"/sessions/{session.pk}/", {}),
        ("/steps/", {}),
        ("/steps/?model=test-haiku", htmx),
        ("/steps/?model=test-haiku&exact=test-haiku", {}),
    ]

    def get(path: str, headers: dict[str, str]) -> None:
        response = staff.get(path, headers=headers)
        assert response.status_code == 200, path
        if response.streaming:
            streamed(response)  # the CSV's queries run as it streams

    counts = {}
    for path, headers in pages:
        with CaptureQueriesContext(connection) as queries:
            get(path, headers)
        counts[path] = len(queries)
    traffic(agent, sessions=30, turns=4, prefix="b")
    traffic(agent, sessions=1, turns=20, prefix="a")  # a0 gets 20 turns
    for path, headers in pages:
        with django_assert_max_num_queries(counts[path]):
            get(path, headers)
    # the overview: 14, its spend anomalies (issue 34) and its alert channels failing
    assert max(counts.values()) <= 16
    assert DailyRollup.objects.count() >= 2


def test_a_huge_session_page_shows_its_latest_steps_and_bucketed_tokens(
    staff: Client, agent: Agent, priced: None, monkeypatch: Any
) -> None:
    from costboard.dashboards.selectors import session as selectors

    monkeypatch.setattr(selectors, "MAX_LOOSE_STEPS_SHOWN", 3)
    monkeypatch.setattr(selectors, "MAX_POINTS", 5)
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=5)
    steps: list[dict[str, Any]] = [
        {
            "event_id": f"loose-{i}",
            "session_id": "busy",
            "step_type": "filter",
            "model": "test-haiku",
            "input_tokens": 10 * (i + 1),
            "output_tokens": 1,
            "timestamp": (start + timedelta(minutes=50 * i)).isoformat(),
        }
        for i in range(6)
    ]
    agent.events(*steps)
    session = Session.objects.get(external_id="busy")
    page = staff.get(f"/sessions/{session.pk}/")
    body = page.content.decode()
    assert page.status_code == 200 and "the latest 3" in body
    detail = selectors.session_detail(session=session)
    assert [s.event_id for s in detail.loose_steps] == ["loose-3", "loose-4", "loose-5"]
    assert detail.loose_more
    # 6 steps over 250 minutes, more than MAX_POINTS: summed per hour, in SQL.
    hourly: dict[Any, int] = {}
    for i, step in enumerate(steps):
        at = start + timedelta(minutes=50 * i)
        hour = at.replace(minute=0)
        hourly[hour] = hourly.get(hour, 0) + step["input_tokens"] + step["output_tokens"]
    running, expected = 0, []
    for hour in sorted(hourly):
        running += hourly[hour]
        expected.append((hour, running))
    assert detail.cumulative == expected
    assert detail.cumulative[-1][1] == session.tokens_used


def system_steps(agent: Agent, count: int, prefix: str) -> None:
    """`count` steps without a session: they gather in the project's `system` session, outside
    any turn (the session page's loose steps)."""
    agent.events(
        *[
            {
                "event_id": f"{prefix}-{i}",
                "step_type": "embed",
                "model": "test-haiku",
                "input_tokens": 50,
                "timestamp": ago(minutes=7 * i),
            }
            for i in range(count)
        ]
    )


def capped(agent: Agent, session_id: str, state: str) -> None:
    """A session past 80 % of its token cap (`warning`) or at it (`exhausted`)."""
    tokens = 850 if state == "warning" else 1000
    answer = agent.events(
        {"type": "session", "session_id": session_id, "token_cap": 1000},
        {"session_id": session_id, "step_type": "x", "model": "test-haiku", "input_tokens": tokens},
    )
    assert answer["sessions"][session_id]["state"] == state


@pytest.mark.slow
def test_every_benchmarked_page_runs_a_bounded_number_of_queries(
    staff: Client,
    agent: Agent,
    priced: None,
    monkeypatch: Any,
    django_assert_max_num_queries: Any,
) -> None:
    """The pages bench_pages times, as it picks them (the biggest session, a typical one, the
    most used model, the last page…), run no more queries on ten times the data."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from costboard.dashboards.selectors import session as selectors
    from devtools.page_bench import page_cases

    monkeypatch.setattr(selectors, "MAX_POINTS", 5)  # the system session's chart: per hour
    traffic(agent, sessions=3, turns=1, prefix="a")
    system_steps(agent, 4, "sys")
    capped(agent, "w0", "warning")
    capped(agent, "x0", "exhausted")
    cases = page_cases()
    assert "/sessions/export.csv?state=warning" in [c.path for c in cases]

    def get(path: str, htmx: bool) -> None:
        response = staff.get(path, headers={"HX-Request": "true"} if htmx else {})
        assert response.status_code == 200, path
        if response.streaming:
            streamed(response)  # the CSV's queries run as it streams

    counts = {}
    for case in cases:
        with CaptureQueriesContext(connection) as queries:
            get(case.path, case.htmx)
        counts[case.path] = len(queries)
    traffic(agent, sessions=40, turns=3, prefix="b")
    traffic(agent, sessions=3, turns=12, prefix="a")  # the first sessions get 12 turns
    system_steps(agent, 40, "sys-more")
    for i in range(1, 4):
        capped(agent, f"w{i}", "warning")
        capped(agent, f"x{i}", "exhausted")
    assert Session.objects.count() == 52 and Step.objects.filter(turn=None).count() >= 44
    for case in cases:
        with django_assert_max_num_queries(counts[case.path], info=case.path):
            get(case.path, case.htmx)
    # the overview: 14, its spend anomalies (issue 34) and its alert channels failing
    assert max(counts.values()) <= 16


def test_the_costliest_sessions_are_of_the_same_30_utc_days_as_the_tiles(
    staff: Client, agent: Agent, priced: object
) -> None:
    def sent(session: str, at: str, tokens: int) -> None:
        agent.events({"step_type": "response", "model": "test-sonnet", "session_id": session,
                      "input_tokens": tokens, "timestamp": at})  # fmt: skip

    with time_machine.travel("2026-03-20T12:00:00Z", tick=False):
        # within 30 × 24 hours of now, but the day before the 30 UTC days (02-19 … 03-20)
        sent("before-the-days", "2026-02-18T18:00:00Z", 9_000)
        sent("first-day", "2026-02-19T00:30:00Z", 10)
        shown = [s.external_id for s, _stop in staff.get("/").context["costliest"]]
        listed = staff.get("/sessions/").content.decode()
    assert shown == ["first-day"]
    assert "first-day" in listed and "before-the-days" not in listed


def test_the_cumulative_chart_ends_at_the_sessions_tokens_after_retention(
    staff: Client, agent: Agent, priced: None
) -> None:
    """Retention deletes a session's old steps and keeps its totals (docs/operations.md,
    "Retention"): the chart of tokens against the cap still ends at the gauge's figure, the
    deleted steps' tokens carried under the kept ones."""
    from costboard.retention import retention_sweep

    agent.project.retention_days = 30
    agent.project.save()
    agent.events(
        *[
            {
                "event_id": f"long-{i}",
                "session_id": "long",
                "step_type": "search",
                "model": "test-haiku",
                "input_tokens": 100 * (i + 1),
                "output_tokens": 7,
                "timestamp": ago(days=days),
            }
            for i, days in enumerate([45, 40, 2, 1])
        ]
    )
    assert retention_sweep().steps_deleted == 2
    session = Session.objects.get(external_id="long")
    assert session.tokens_used == 1000 + 4 * 7
    figs = figures(staff.get(f"/sessions/{session.pk}/"))
    # the two kept steps, after the 314 tokens of the two deleted
    assert figs["cumulative"]["data"][0]["y"] == [314 + 307, 314 + 307 + 407]
