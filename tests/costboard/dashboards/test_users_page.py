"""/users/: spend per end user from the per-user rollups, equal to the sums of their steps;
sortable; each user linked to their sessions; login required; a bounded number of queries."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal
from html import escape, unescape
from typing import Any
from urllib.parse import parse_qs, quote_plus

import pytest
from django.test import Client
from django.utils import timezone

from costboard.models import Step
from costboard.templatetags.costboard_tags import usd
from tests.conftest import Agent, add_price, streamed

pytestmark = pytest.mark.django_db


def traffic(agent: Agent, users: int = 3) -> None:
    events: list[dict[str, Any]] = []
    for u in range(users):
        for s in range(u + 1):
            sid = f"u{u}-s{s}"
            events.append({"type": "session", "session_id": sid, "user_id": f"user-{u}"})
            events += [
                {
                    "session_id": sid,
                    "step_type": "x",
                    "model": "test-sonnet",
                    "input_tokens": 1000 * (u + 1),
                    "output_tokens": 10,
                }
                for _ in range(2)
            ]
    events.append(
        {"session_id": "anon", "step_type": "x", "model": "test-sonnet", "input_tokens": 5}
    )
    agent.events(*events)


def rows(html: str) -> list[str]:
    return re.findall(r'<tr data-user="([^"]*)">', html)


def test_the_page_shows_each_users_spend_equal_to_their_steps(staff: Client, agent: Agent) -> None:
    add_price("test-sonnet")
    traffic(agent)
    html = staff.get("/users/").content.decode()
    assert rows(html) == ["user-2", "user-1", "user-0", ""]  # the costliest first
    for user in ("user-0", "user-1", "user-2"):
        steps = Step.objects.filter(session__user_id=user)
        cost = sum((s.cost_usd for s in steps), Decimal(0))
        row = html[html.index(f'<tr data-user="{user}">') :]
        row = row[: row.index("</tr>")]
        assert f"data-user-cost>{usd(cost)}<" in row
        assert f'<td class="num">{steps.count()}</td>' in row
        # to the user's sessions in the page's period
        today = timezone.now().date()
        since = today - timedelta(days=29)
        assert f'href="/sessions/?user_id={user}&amp;since={since}&amp;until={today}"' in row
        query = f"user_id={user}&since={since}&until={today}"
        listed = staff.get(f"/sessions/?{query}").content.decode()
        sessions = int(user.removeprefix("user-")) + 1
        assert f'data-total="{sessions}"' in listed
    assert "no user_id" in html
    by_user = staff.get("/users/?sort=user").content.decode()
    assert rows(by_user) == ["", "user-0", "user-1", "user-2"]
    by_sessions = staff.get("/users/?sort=-sessions").content.decode()
    assert rows(by_sessions)[0] == "user-2"  # three sessions


def user_link(html: str, user: str) -> str:
    """The href of `user`'s link on /users/, unescaped."""
    row = html[html.index(f'<tr data-user="{escape(user)}">') :]
    found = re.search(r'<a href="([^"]+)">', row[: row.index("</tr>")])
    assert found is not None, row
    return unescape(found[1])


@pytest.mark.parametrize(
    "user", ["bob", "a+b@x.com", "auth0|123", "team/alice", "ann smith", "x&y=z#1", "名前"]
)
def test_a_users_link_lists_that_users_sessions_alone(
    staff: Client, agent: Agent, user: str
) -> None:
    """The link is an exact match on user_id, the id URL-encoded: bob's lists none of bobby's
    (the list's User box is a search by the start of an id; the link is not a search)."""
    add_price("test-sonnet")
    others = [user + "by", user + "2", user[:-1]]  # ids that start alike, or it starts them
    events: list[dict[str, Any]] = []
    for n, owner in enumerate([user, user, *others]):
        events += [
            {"type": "session", "session_id": f"s{n}", "user_id": owner},
            {"session_id": f"s{n}", "step_type": "x", "model": "test-sonnet", "input_tokens": 9},
        ]
    agent.events(*events)
    link = user_link(staff.get("/users/").content.decode(), user)
    listed = staff.get(link)
    assert listed.status_code == 200
    html = listed.content.decode()
    assert sorted(re.findall(r'<tr data-session="([^"]+)"', html)) == ["s0", "s1"]
    assert 'data-total="2"' in html
    path, _, query = link.partition("?")
    assert path == "/sessions/"
    assert parse_qs(query)["user_id"] == [user]  # decoded, it is the id whole
    assert f"user_id={quote_plus(user, safe='')}&" in link  # encoded: + @ | / & = # % …
    assert f"<code>{escape(user)}</code>" in html  # the filter shown, with a way to drop it
    # the search box still finds every id that starts so
    search = staff.get("/sessions/", {"user": user}).content.decode()
    assert 'data-total="4"' in search
    # and the CSV of the linked list has the same two rows
    export = staff.get(link.replace("/sessions/", "/sessions/export.csv", 1))
    assert export.status_code == 200
    exported = csv.DictReader(io.StringIO(streamed(export).decode()))
    assert sorted(row["session_id"] for row in exported) == ["s0", "s1"]


def test_it_needs_a_login_and_keeps_to_the_project(client: Client, agent: Agent) -> None:
    assert client.get("/users/").status_code == 302
    from tests.conftest import make_agent

    add_price("test-sonnet")
    traffic(agent, users=1)
    other = make_agent("other")
    other.events(
        {"type": "session", "session_id": "o", "user_id": "outsider"},
        {"session_id": "o", "step_type": "x", "model": "test-sonnet", "input_tokens": 1},
    )
    from django.contrib.auth import get_user_model

    from costboard.models import Membership

    person = get_user_model().objects.create_user("member", "", "pw")
    Membership.objects.create(user=person, project=agent.project)
    member = Client()
    member.force_login(person)
    html = member.get("/users/").content.decode()
    assert "user-0" in html and "outsider" not in html


def test_its_queries_do_not_grow_with_the_users(
    staff: Client, agent: Agent, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    add_price("test-sonnet")
    traffic(agent, users=2)
    with CaptureQueriesContext(connection) as queries:
        staff.get("/users/")
    count = len(queries)  # (the next requests reset the connection's query log)
    assert count <= 8
    traffic(agent, users=12)
    with django_assert_max_num_queries(count):
        staff.get("/users/")


def test_the_users_csv_is_the_page_in_rows_with_formulas_quoted(
    staff: Client, agent: Agent
) -> None:
    add_price("test-sonnet")
    traffic(agent, users=2)
    agent.events(
        {"type": "session", "session_id": "f", "user_id": "=cmd|' /C calc'!A0"},
        {"session_id": "f", "step_type": "x", "model": "test-sonnet", "input_tokens": 1},
    )
    assert 'href="/users/export.csv?' in staff.get("/users/").content.decode()
    response = staff.get("/users/export.csv?sort=user")
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["user_id", "cost_usd", "input_tokens", "output_tokens", "sessions", "steps"]
    assert [r[0] for r in rows[1:]] == ["", "'=cmd|' /C calc'!A0", "user-0", "user-1"]
    user0 = Step.objects.filter(session__user_id="user-0")
    assert rows[3][1] == usd(sum((s.cost_usd for s in user0), Decimal(0))).lstrip("$")
    assert rows[3][5] == str(user0.count())


def test_the_users_come_fifty_a_page_counted_and_summed_over_all(
    staff: Client, agent: Agent
) -> None:
    add_price("test-sonnet")
    events: list[dict[str, Any]] = []
    for u in range(120):
        sid = f"s-{u}"
        events.append({"type": "session", "session_id": sid, "user_id": f"user-{u:03}"})
        events.append(
            {"session_id": sid, "step_type": "x", "model": "test-sonnet", "input_tokens": 100 + u}
        )
    agent.events(*events)
    total = sum((s.cost_usd for s in Step.objects.all()), Decimal(0))
    first = staff.get("/users/?sort=user").content.decode()
    assert rows(first) == [f"user-{u:03}" for u in range(50)]
    assert "120 users" in first and f"{usd(total)} in all" in first
    assert "page 1 of 3" in first and "?sort=user&amp;page=2" in first
    last = staff.get("/users/?sort=user&page=3").content.decode()
    assert rows(last) == [f"user-{u:03}" for u in range(100, 120)]
    assert "120 users" in last and f"{usd(total)} in all" in last
    # a sort starts again at the first page; a user's link does not carry the page along
    assert "?sort=-tokens&amp;page=" not in last
    assert "page=3" not in re.findall(r'href="/sessions/\?([^"]*)"', last)[0]
    beyond = staff.get("/users/?page=4")
    assert beyond.status_code == 422
    assert "is not a page of this list: it has pages 1–3" in unescape(beyond.content.decode())


def headers(html: str) -> dict[str, tuple[str, str | None, str]]:
    """Each sortable header: its label -> (the sort its link asks for, aria-sort, arrow)."""
    found = {}
    for th in re.findall(r"<th[^>]*>.*?</th>", html[html.index('id="user-table"') :], re.S):
        link = re.search(r'href="([^"]*)"[^>]*>([^<]*?)( [▲▼])?</a>', th)
        if link is None:
            continue
        aria = re.search(r'aria-sort="([a-z]+)"', th)
        sort = parse_qs(unescape(link.group(1)).lstrip("?"))["sort"][0]
        arrow = (link.group(3) or "").strip()
        found[link.group(2)] = (sort, aria.group(1) if aria else None, arrow)
    return found


def test_a_header_clicked_again_reverses_its_order_with_the_arrow_shown(
    staff: Client, agent: Agent
) -> None:
    # Only Cost toggled; Tokens, Sessions and Steps always asked for descending, and no
    # header showed which order the table was in.
    add_price("test-sonnet")
    traffic(agent)
    page = staff.get("/users/").content.decode()  # the costliest first
    assert headers(page) == {
        "User": ("user", None, ""),
        "Cost": ("cost", "descending", "▼"),
        "Tokens": ("-tokens", None, ""),
        "Sessions started": ("-sessions", None, ""),
        "Steps": ("-steps", None, ""),
    }
    fewest = staff.get("/users/?sort=tokens").content.decode()
    assert rows(fewest) == ["", "user-0", "user-1", "user-2"]
    assert headers(fewest)["Tokens"] == ("-tokens", "ascending", "▲")
    assert headers(fewest)["Cost"] == ("-cost", None, "")
    most = staff.get("/users/?sort=-tokens").content.decode()
    assert rows(most) == ["user-2", "user-1", "user-0", ""]
    assert headers(most)["Tokens"] == ("tokens", "descending", "▼")
    by_user = staff.get("/users/?sort=user").content.decode()
    assert headers(by_user)["User"] == ("-user", "ascending", "▲")
    assert rows(staff.get("/users/?sort=-user").content.decode()) == [
        "user-2",
        "user-1",
        "user-0",
        "",
    ]
    # the CSV link carries the order, and the CSV has it
    assert 'href="/users/export.csv?sort=tokens"' in fewest
    exported = list(
        csv.reader(io.StringIO(staff.get("/users/export.csv?sort=tokens").content.decode()))
    )
    assert [r[0] for r in exported[1:]] == ["", "user-0", "user-1", "user-2"]
