"""The sessions list's pages are read by key and from their nearer end (KeyedPaginator):
every page must hold exactly the rows, in exactly the order, that Django's OFFSET pages do,
whatever the sort, with ties in the sorted column, a filter and the last, short page."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.paginator import Paginator
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from costboard.dashboards.pagination import KeyedPaginator
from costboard.dashboards.selectors.sessions import SESSION_SORTS, SessionFilters, sessions_filtered
from costboard.models import Session
from tests.conftest import Agent

pytestmark = pytest.mark.django_db

SESSIONS = 23  # pages of 5: four full, one of three


@pytest.fixture
def sessions(agent: Agent) -> Agent:
    now = timezone.now()
    # costs and token counts repeat (every third session the same): ties the order breaks by id
    agent.events(
        *[
            {
                "session_id": f"s{i:02d}",
                "step_type": "x",
                "model": "m",
                "input_tokens": 100 * (i % 3),
                "timestamp": (
                    now - timedelta(minutes=i % 7)
                ).isoformat(),  # ties in last_active_at too
            }
            for i in range(SESSIONS)
        ]
    )
    for i in range(SESSIONS):
        user = "even" if i % 2 == 0 else "odd"
        agent.events({"type": "session", "session_id": f"s{i:02d}", "user_id": user})
    Session.objects.filter(project=agent.project).update(cost_usd=Decimal("0.5"))
    return agent


def _pages(paginator: Paginator) -> list[list[str]]:
    return [[s.external_id for s in paginator.page(n)] for n in paginator.page_range]


@pytest.mark.slow
@pytest.mark.parametrize("sort", [*SESSION_SORTS, *[f"-{key}" for key in SESSION_SORTS]])
def test_every_page_is_the_offset_page(sessions: Agent, sort: str) -> None:
    rows = sessions_filtered(project_ids=[sessions.project.pk], filters=SessionFilters(sort=sort))
    keyed, offset = KeyedPaginator(rows, 5), Paginator(rows, 5)
    assert keyed.count == offset.count == SESSIONS
    pages = _pages(keyed)
    assert pages == _pages(offset)
    assert [len(page) for page in pages] == [5, 5, 5, 5, 3]
    assert sorted(name for page in pages for name in page) == [
        f"s{i:02d}" for i in range(SESSIONS)
    ]  # each once


def test_a_filtered_list_and_orphans(sessions: Agent) -> None:
    rows = sessions_filtered(
        project_ids=[sessions.project.pk], filters=SessionFilters(user="odd", sort="-tokens")
    )
    for orphans in (0, 2):
        keyed, offset = KeyedPaginator(rows, 4, orphans=orphans), Paginator(rows, 4, orphans)
        assert _pages(keyed) == _pages(offset)
    assert KeyedPaginator(rows, 4).count == 11


def test_the_pages_carry_the_project_without_a_query_each(sessions: Agent) -> None:
    rows = sessions_filtered(project_ids=[sessions.project.pk], filters=SessionFilters())
    paginator = KeyedPaginator(rows, 5)
    paginator.count  # noqa: B018  (counted first, as the view's template does)
    with CaptureQueriesContext(connection) as queries:
        page = list(paginator.page(5))
        assert [s.project.slug for s in page] == [sessions.project.slug] * 3
    assert len(queries) == 2  # the page's keys, then its rows with their project
