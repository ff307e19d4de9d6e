"""The sessions list shows the last 30 days unless asked otherwise, as the overview, /steps/
and /users/ do: its count, sorts, id search and last page read a month of sessions however
long the history. `since=` given empty (the date cleared, the "All time" link) is all of it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.conftest import Agent

pytestmark = pytest.mark.django_db


def traffic(agent: Agent) -> None:
    now = timezone.now()
    for sid, days_ago in (("recent", 1), ("month-edge", 29), ("old", 40), ("older", 200)):
        at = (now - timedelta(days=days_ago)).isoformat()
        agent.events(
            {"session_id": sid, "step_type": "x", "model": "m", "input_tokens": 5, "timestamp": at}
        )


def listed(html: str) -> list[str]:
    return sorted(re.findall(r'href="/sessions/\d+/[^"]*"[^>]*>(?:<code>)?([\w-]+)', html))


def test_the_list_shows_the_last_30_days_by_default(staff: Client, agent: Agent) -> None:
    traffic(agent)
    html = staff.get("/sessions/").content.decode()
    assert 'data-total="2"' in html
    assert listed(html) == ["month-edge", "recent"]
    first_day = timezone.now().date() - timedelta(days=29)
    assert f'name="since" value="{first_day:%Y-%m-%d}"' in html  # the window, in the form
    assert 'href="?since=" data-all-time' in html


def test_since_given_empty_is_all_time(staff: Client, agent: Agent) -> None:
    traffic(agent)
    html = staff.get("/sessions/?since=").content.decode()
    assert 'data-total="4"' in html
    assert listed(html) == ["month-edge", "old", "older", "recent"]
    assert "data-all-time" not in html
    # a search or a sort keeps the period it is given
    assert 'data-total="1"' in staff.get("/sessions/?since=&q=olde").content.decode()
    assert 'data-total="0"' in staff.get("/sessions/?q=olde").content.decode()
    assert 'data-total="2"' in staff.get("/sessions/?sort=-cost").content.decode()


def test_a_date_given_is_the_window(staff: Client, agent: Agent) -> None:
    traffic(agent)
    since = (timezone.now() - timedelta(days=45)).date()
    html = staff.get(f"/sessions/?since={since}").content.decode()
    assert listed(html) == ["month-edge", "old", "recent"]
    until = (timezone.now() - timedelta(days=35)).date()
    only_old = staff.get(f"/sessions/?until={until}").content.decode()  # 30 days to `until`
    assert listed(only_old) == ["old"]


def test_the_overview_links_every_flagged_session_of_all_time(staff: Client, agent: Agent) -> None:
    now = timezone.now()
    for n in range(14):  # more than the overview lists, so it links to them all
        at = (now - timedelta(days=40 if n == 0 else 1)).isoformat()
        agent.events(
            {"type": "session", "session_id": f"capped-{n}", "token_cap": 1, "timestamp": at},
            {
                "session_id": f"capped-{n}",
                "step_type": "x",
                "model": "m",
                "input_tokens": 5,
                "timestamp": at,
            },
        )
    html = staff.get("/").content.decode()
    # to /flagged/, whose list the overview's is the start of: every open flag, of any age
    link = re.search(r'<a href="(/flagged/)" data-flagged-all>All 14 flagged sessions', html)
    assert link is not None, html
    assert 'data-count="all">14<' in staff.get(link.group(1)).content.decode()
    assert 'data-total="14"' in staff.get("/sessions/?state=flagged&since=").content.decode()
    assert 'data-total="13"' in staff.get("/sessions/?state=flagged").content.decode()
