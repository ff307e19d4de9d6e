"""The all-time sessions list counts its sessions from the projects' tallies (sessions ingest
made, less those the admin deleted), not row by row: the count and every page, the last
read from the far end by that count, stay those of the sessions themselves. Whatever else
makes or deletes a session is put right by the hourly check."""

from __future__ import annotations

import re
import threading

import pytest
from django.db import connection, connections, transaction
from django.db.models import Sum
from django.test import Client
from django.test.utils import CaptureQueriesContext

from costboard.models import IngestTally, Session
from costboard.projects import sessions_tally_check
from costboard.retention import retention_sweep
from tests.conftest import Agent, make_agent
from tests.waiting import blocked_on_a_lock, wait_until

pytestmark = pytest.mark.django_db

SESSION_TABLE = Session._meta.db_table


def total(html: str) -> int:
    found = re.search(r'data-total="(\d+)"', html)
    assert found is not None
    return int(found.group(1))


def listed(html: str) -> list[str]:
    return re.findall(r'<tr data-session="([^"]+)"', html)


def pages(staff: Client, query: str) -> list[str]:
    """Every session the list shows, page after page."""
    first = staff.get(query).content.decode()
    paged = re.search(r"page 1 of (\d+)", first)
    assert paged or "page 1 of" not in first
    last = int(paged.group(1)) if paged else 1
    shown = listed(first)
    for number in range(2, last + 1):
        shown += listed(staff.get(f"{query}&page={number}").content.decode())
    return shown


@pytest.fixture
def sessions(agent: Agent) -> list[str]:
    """120 sessions of two projects' traffic over three batches (some named twice)."""
    keys = [f"s{n:03d}" for n in range(120)]
    for start in (0, 40, 80):
        batch = keys[start : start + 50]  # ten of each batch's sessions again in the next
        agent.events(
            *[
                {"session_id": key, "step_type": "x", "model": "m", "input_tokens": 1}
                for key in batch
            ]
        )
    make_agent("other").events({"session_id": "elsewhere", "step_type": "x", "model": "m"})
    return keys


def test_the_all_time_count_is_the_tallys_and_every_page_is_right(
    staff: Client, sessions: list[str]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        html = staff.get("/sessions/?since=").content.decode()
    assert total(html) == 121  # both projects
    assert not [q for q in queries if f'COUNT(*) AS "__count" FROM "{SESSION_TABLE}"' in q["sql"]]
    assert sorted(pages(staff, "/sessions/?since=&sort=session")) == sorted(
        [*sessions, "elsewhere"]
    )
    # a filter counts its rows, as before
    assert total(staff.get("/sessions/?since=&q=s00").content.decode()) == 10


def test_sessions_deleted_in_the_admin_leave_the_count(staff: Client, sessions: list[str]) -> None:
    gone = list(
        Session.objects.filter(external_id__in=["s000", "s119"]).values_list("pk", flat=True)
    )
    response = staff.post(
        "/admin/costboard/session/",
        {"action": "delete_selected", "_selected_action": gone, "post": "yes"},
    )
    assert response.status_code == 302
    one = Session.objects.get(external_id="s050")
    assert (
        staff.post(f"/admin/costboard/session/{one.pk}/delete/", {"post": "yes"}).status_code == 302
    )

    html = staff.get("/sessions/?since=&sort=session").content.decode()
    assert total(html) == 118 == Session.objects.count()
    kept = sorted({*sessions, "elsewhere"} - {"s000", "s119", "s050"})
    assert sorted(pages(staff, "/sessions/?since=&sort=session")) == kept
    assert sessions_tally_check() == {}


def test_the_hourly_check_counts_a_session_made_some_other_way(
    staff: Client, agent: Agent, sessions: list[str]
) -> None:
    Session.objects.create(project=agent.project, external_id="by-hand")
    Session.objects.filter(external_id="s010").delete()  # not through the admin
    Session.objects.filter(external_id="s011").delete()
    assert total(staff.get("/sessions/?since=").content.decode()) == 121  # not yet
    retention_sweep()  # the hourly sweep checks every project's tally
    assert total(staff.get("/sessions/?since=").content.decode()) == 120 == Session.objects.count()
    assert sessions_tally_check() == {}  # once only
    assert "by-hand" in pages(staff, "/sessions/?since=&sort=session")


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the row lock that holds a check")
def test_two_checks_at_once_put_a_difference_right_once(agent: Agent) -> None:
    """Two beats (or beat and guard_sweep) run the hourly check at the same moment: each read
    the same difference, and each added it (the tally off the other way, until the next hour,
    when two at once did it again). Checks take turns: the second reads what the first put
    right."""
    agent.events(
        *[
            {"session_id": f"t{n}", "step_type": "x", "model": "m", "input_tokens": 1}
            for n in (1, 2)
        ]
    )
    for n in (3, 4, 5):  # made some other way: the tally says 2
        Session.objects.create(project=agent.project, external_id=f"by-hand-{n}")
    results: list[dict[int, int]] = []

    def check() -> None:
        try:
            results.append(sessions_tally_check())
        finally:
            connections.close_all()

    with transaction.atomic():  # the tally's row held, as an ingest batch holds it to its commit
        list(IngestTally.objects.select_for_update().filter(project=agent.project))
        threads = [threading.Thread(target=check) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: blocked_on_a_lock("%") == 2, what="both checks waiting")
    for thread in threads:
        thread.join(timeout=30)

    tally = IngestTally.objects.filter(project=agent.project).aggregate(
        made=Sum("sessions_made"), deleted=Sum("sessions_deleted")
    )
    assert tally["made"] - tally["deleted"] == 5 == Session.objects.count()
    assert sorted(results, key=len) == [{}, {agent.project.pk: 3}]
    assert sessions_tally_check() == {}
