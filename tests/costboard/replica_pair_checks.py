"""Pages against a real streaming replica: run only by tests/costboard/test_replicas.py, in a
pytest of its own whose DATABASE_URL and DATABASE_REPLICA_URLS name the pair it started
(tests/pg_pair.py; COSTBOARD_TEST_PAIR says where it is). The file name keeps it out of the
suite's own collection.

Which server a request read is seen in its statistics: pg_stat_statements on each counts the
statements over Costboard's tables that it ran.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test import Client

from costboard import replicas
from costboard.models import ApiKey, Project, Session
from tests.conftest import Agent, make_agent, streamed
from tests.pg_pair import Pair
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica_1"])

PAIR = Pair.from_json(os.environ["COSTBOARD_TEST_PAIR"])
REPLICA_NOTE = re.compile(r"Read from a replica, (\d+\.\d) s behind the primary\.")
PRIMARY_NOTE = "Data is current (read from the primary)."

# the statements over Costboard's tables one server ran in this database, and how often
_COUNTED = """
SELECT s.query, s.calls FROM pg_stat_statements s
JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database()
  AND s.query LIKE '%costboard\\_%' AND s.query NOT LIKE '%pg_stat_statements%'
"""
# Read from the primary whatever the page: the prices and their version (the rate table is
# the process's: costboard/pricing/rates.py) and, for the API, the key that says who asks.
_ALWAYS_PRIMARY = (
    "costboard_modelprice",
    "costboard_priceadjustment",
    "costboard_rate_version",
    "costboard_apikey",
)


class Server:
    """A connection of the test's own to one server of the pair, in autocommit."""

    def __init__(self, port: int) -> None:
        name = connections["default"].settings_dict["NAME"]
        self.port = port
        self.connection = psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname=name, autocommit=True
        )

    def one(self, sql: str) -> Any:
        row = self.connection.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def reads(self) -> Counter[str]:
        """How often each statement over the pages' own tables has run here."""
        rows = self.connection.execute(_COUNTED).fetchall()
        return Counter(
            {
                query: int(calls)
                for query, calls in rows
                if not any(table in query for table in _ALWAYS_PRIMARY)
            }
        )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        """Past the gauge's keep time, and past the wait after a replica did not answer: the
        next page measures the lag again."""
        self.now += max(replicas.LAG_CHECK_SECONDS, float(settings.COSTBOARD_REPLICA_RETRY_S)) + 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(replicas, "GAUGE", replicas.LagGauge(clock=clock))
    return clock


@pytest.fixture
def primary() -> Iterator[Server]:
    server = Server(PAIR.primary_port)
    yield server
    server.connection.close()


@pytest.fixture
def replica() -> Iterator[Server]:
    server = Server(PAIR.replica_port)
    yield server
    if server.one("SELECT pg_is_wal_replay_paused()"):
        server.one("SELECT pg_wal_replay_resume()")
    server.connection.close()


def caught_up(replica: Server, primary: Server) -> None:
    """Wait until the replica has replayed everything the primary has written."""
    target = primary.one("SELECT pg_current_wal_lsn()::text")
    wait_until(
        lambda: replica.one(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"),
        what=f"the replica replaying up to {target}",
    )


@pytest.fixture
def world(primary: Server, replica: Server) -> tuple[Agent, Client, Session]:
    """A project with a session of one step, a staff browser; on the replica too."""
    agent = make_agent("acme")
    agent.events({"session_id": "s1", "step_type": "response", "model": "m", "input_tokens": 1234})
    user = get_user_model().objects.create_superuser("root", "", "pw-root-123")
    browser = Client()
    browser.force_login(user)
    caught_up(replica, primary)
    return agent, browser, Session.objects.get(external_id="s1")


def read_by(
    primary: Server, replica: Server, browser: Client, path: str, **extra: Any
) -> tuple[Any, str]:
    """The page at `path`, and which server read Costboard's tables for it."""
    before = primary.reads(), replica.reads()
    response = browser.get(path, **extra)
    assert response.status_code == 200, (path, response.status_code)
    body = streamed(response) if response.streaming else response.content
    on_primary = primary.reads() - before[0]
    on_replica = replica.reads() - before[1]
    assert bool(on_primary) != bool(on_replica), (path, on_primary, on_replica)
    return body.decode(), "replica" if on_replica else "primary"


def test_the_pages_exports_and_reports_read_the_replica(
    world: tuple[Agent, Client, Session], primary: Server, replica: Server, clock: Clock
) -> None:
    agent, browser, session = world
    pages = [
        "/",
        "/sessions/",
        f"/sessions/{session.pk}/",
        "/steps/",
        "/users/",
        "/budgets/",
        "/flagged/",
        "/reconciliation/",
        "/reports/",
    ]
    for path in pages:
        body, server = read_by(primary, replica, browser, path)
        assert server == "replica", path
        note = REPLICA_NOTE.search(body)
        assert note is not None, path
        assert Decimal(note.group(1)) == Decimal("0.0")  # caught up
        assert PRIMARY_NOTE not in body
    for path in ["/sessions/export.csv", "/users/export.csv", "/reports/export.csv"]:
        body, server = read_by(primary, replica, browser, path)
        assert server == "replica", path
    assert "s1" in read_by(primary, replica, browser, "/sessions/export.csv")[0]
    api = Client()
    auth = {
        "headers": {
            "Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='read')[1]}"
        }
    }
    for path in ["/api/v1/spend", "/api/v1/reconciliation"]:
        _, server = read_by(primary, replica, api, path, **auth)
        assert server == "replica", path
    spend = api.get("/api/v1/spend", **auth).json()  # type: ignore[arg-type]
    assert spend["total"]["input_tokens"] == 1234


def test_the_events_reply_and_the_admin_read_the_primary(
    world: tuple[Agent, Client, Session], primary: Server, replica: Server, clock: Clock
) -> None:
    agent, browser, session = world
    before = replica.reads()
    reply = agent.events(
        {"session_id": "s1", "step_type": "response", "model": "m", "input_tokens": 10}
    )
    assert reply["sessions"]["s1"]["tokens_used"] == 1244
    admin = browser.get(f"/admin/costboard/session/{session.pk}/change/")
    assert admin.status_code == 200
    assert replica.reads() == before


def test_a_page_right_after_an_action_reads_the_primary(
    world: tuple[Agent, Client, Session], primary: Server, replica: Server, clock: Clock
) -> None:
    _, browser, session = world
    replica.one("SELECT pg_wal_replay_pause()")  # the replica will not see the action
    done = browser.post(
        f"/flagged/{session.pk}/raise-cap/", {"token_cap": "345678", "render": "banner"}
    )
    assert done.status_code == 303
    assert replica.one("SELECT pg_is_wal_replay_paused()")
    body, server = read_by(primary, replica, browser, done["Location"])
    assert server == "primary"
    assert PRIMARY_NOTE in body
    assert "345,678" in body
    # another browser, which did not act, reads the replica: a second old, within the limit
    other = Client()
    other.force_login(get_user_model().objects.get(username="root"))
    body, server = read_by(primary, replica, other, done["Location"])
    assert server == "replica"
    assert "345,678" not in body


def test_a_replica_past_the_lag_limit_is_not_read(
    world: tuple[Agent, Client, Session],
    primary: Server,
    replica: Server,
    clock: Clock,
    settings: Any,
) -> None:
    _, browser, _ = world
    settings.COSTBOARD_REPLICA_MAX_LAG_S = Decimal("0.5")
    assert read_by(primary, replica, browser, "/")[1] == "replica"
    replica.one("SELECT pg_wal_replay_pause()")
    Project.objects.create(name="Written while paused", slug="paused")
    wait_until(
        lambda: replica.one("SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()"),
        what="the replica receiving WAL it does not replay",
    )
    # the lag read a moment ago is kept: still the replica, without the new project
    body, server = read_by(primary, replica, browser, "/")
    assert (server, "Written while paused" in body) == ("replica", False)

    def lagging() -> bool:
        clock.tick()
        lag = replicas.GAUGE.lag("replica_1")
        return lag is not None and lag > settings.COSTBOARD_REPLICA_MAX_LAG_S

    wait_until(lagging, what="the paused replica's lag passing the limit")
    body, server = read_by(primary, replica, browser, "/")
    assert server == "primary"
    assert PRIMARY_NOTE in body
    assert "Written while paused" in body
    assert REPLICA_NOTE.search(body) is None

    replica.one("SELECT pg_wal_replay_resume()")
    caught_up(replica, primary)
    clock.tick()
    body, server = read_by(primary, replica, browser, "/")
    assert server == "replica"
    assert "Written while paused" in body


def test_a_replica_that_is_down_does_not_break_the_pages(
    world: tuple[Agent, Client, Session], primary: Server, replica: Server, clock: Clock
) -> None:
    _, browser, _ = world
    assert read_by(primary, replica, browser, "/")[1] == "replica"
    replica.connection.close()
    PAIR.stop_replica()
    try:
        # measured a moment ago, so chosen: the page fails over to the primary mid-request
        response = browser.get("/")
        assert response.status_code == 200
        assert PRIMARY_NOTE in response.content.decode()
        # measured again: it does not answer, and the primary is read from the start
        clock.tick()
        response = browser.get("/sessions/")
        assert response.status_code == 200
        assert PRIMARY_NOTE in response.content.decode()
        assert replicas.GAUGE.lag("replica_1") is None
    finally:
        PAIR.start_replica()
    replica.connection = Server(PAIR.replica_port).connection
    caught_up(replica, primary)
    clock.tick()
    assert read_by(primary, replica, browser, "/")[1] == "replica"


def test_the_pair_is_the_one_started() -> None:
    assert Path(PAIR.root).exists()
    assert connections["replica_1"].settings_dict["PORT"] == PAIR.replica_port


def _children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (a postmaster's backends, walreceiver, …)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            # after the command's closing parenthesis: state, then the parent's pid
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
    return found


def test_a_replica_that_stops_answering_on_an_open_connection_does_not_hang_the_pages(
    world: tuple[Agent, Client, Session], primary: Server, replica: Server, clock: Clock
) -> None:
    """A replica whose machine stops answering (frozen, or cut off) leaves this process's
    connection to it open: the next lag check must not wait on that connection for ever, but
    find the replica unreachable within its connect timeout and send the page to the primary.
    (Should it wait, the replica is thawed after a minute and the page reads it.)"""
    _, browser, _ = world
    assert read_by(primary, replica, browser, "/")[1] == "replica"  # its connection is open
    with frozen_replica(thaw_after=60):
        clock.tick()  # the lag is measured again
        response = browser.get("/sessions/")
    assert response.status_code == 200
    assert PRIMARY_NOTE in response.content.decode()
    clock.tick()
    assert read_by(primary, replica, browser, "/")[1] == "replica"


class Attempts:
    """Connections this process tried to open to the replica: the lag checks' and the pages'."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        connect = DatabaseWrapper.get_new_connection

        def counted(wrapper: DatabaseWrapper, params: dict[str, Any]) -> Any:
            if wrapper.alias == "replica_1":
                self.count += 1
            return connect(wrapper, params)

        monkeypatch.setattr(DatabaseWrapper, "get_new_connection", counted)


@contextlib.contextmanager
def frozen_replica(thaw_after: float = 20) -> Iterator[None]:
    """The replica's server stopped (SIGSTOP) as a frozen machine is: its connections stay
    open and its kernel still accepts bytes, but nothing answers. Thawed on leaving, or after
    `thaw_after` seconds whatever happens: a page that waits on it for ever then reads it (and
    fails the test)."""
    postmaster = int((PAIR.root / "replica" / "postmaster.pid").read_text().split()[0])
    frozen = [postmaster, *_children(postmaster)]

    def send(sent: signal.Signals) -> None:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):  # a backend that was ending
                os.kill(pid, sent)

    def thaw() -> None:
        send(signal.SIGCONT)

    send(signal.SIGSTOP)
    thaw_later = threading.Timer(thaw_after, thaw)
    thaw_later.start()
    try:
        yield
    finally:
        thaw_later.cancel()
        thaw()


def test_a_replica_that_freezes_in_the_middle_of_a_page_costs_that_page_its_timeout_once(
    world: tuple[Agent, Client, Session],
    primary: Server,
    replica: Server,
    clock: Clock,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lag was measured a moment ago, so the page reads the replica on its open
    connection: the replica's answer is waited for COSTBOARD_REPLICA_TIMEOUT_S (and a second),
    then the page is read again from the primary; later pages read the primary without
    trying the replica for COSTBOARD_REPLICA_RETRY_S."""
    _, browser, _ = world
    settings.COSTBOARD_REPLICA_TIMEOUT_S = Decimal("0.5")
    settings.COSTBOARD_REPLICA_RETRY_S = Decimal(30)
    assert read_by(primary, replica, browser, "/")[1] == "replica"  # its connection is open
    attempts = Attempts(monkeypatch)
    with frozen_replica():
        response = browser.get("/sessions/")
        assert response.status_code == 200
        assert PRIMARY_NOTE in response.content.decode()
        assert "s1" in response.content.decode()
        tried = attempts.count  # Django's reconnect after its health check timed out
        assert tried <= 1
        # within the wait: the primary, without a try at the replica
        clock.now += 29
        for path in ["/", "/users/", "/sessions/export.csv"]:
            response = browser.get(path)
            assert response.status_code == 200, path
            body = streamed(response) if response.streaming else response.content
            if not response.streaming:
                assert PRIMARY_NOTE in body.decode(), path
        assert attempts.count == tried
        assert replicas.GAUGE.lag("replica_1") is None
        # past it, one try, which the frozen replica does not answer: the primary again
        clock.now += 2
        response = browser.get("/")
        assert response.status_code == 200
        assert PRIMARY_NOTE in response.content.decode()
        assert attempts.count == tried + 1
        response = browser.get("/")
        assert attempts.count == tried + 1
    clock.tick()
    assert read_by(primary, replica, browser, "/")[1] == "replica"
    assert attempts.count == tried + 3  # the lag check's connection and the page's own
    # set when the connection opened again, from the environment the test's pytest was given
    with connections["replica_1"].cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone() == ("2s",)
