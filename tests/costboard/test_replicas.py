"""Read replicas (costboard/replicas.py; docs/operations.md, "Read replicas"): which reads go
where, the lag and the fall-back to the primary.

Most of these run on either database with a second alias over the test database (what a
caught-up replica holds): each connection's queries say which one a page read. The last two
run the pages and bench_ingest's lag sampler against a real streaming replica (tests/pg_pair.py,
tests/costboard/replica_pair_checks.py), on either leg wherever PostgreSQL's server tools are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import OperationalError, connections, router, transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver

from costboard import replicas
from costboard.models import ApiKey, Project
from costboard.replicas import PRIMARY, WROTE_COOKIE, LagGauge, ReadSource, replica_reads
from devtools.replica_lag import LagSampler, NotAReplica, lag_line, replica_connect
from tests.conftest import make_agent
from tests.pg_pair import Pair, pair_started, postgres_bin
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
REPLICA = "replica_1"
REPLICA_NOTE = "Read from a replica, 0.3 s behind the primary."
PRIMARY_NOTE = "Data is current (read from the primary)."


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lags:
    """A gauge's measure: each alias's lag as set (None: it does not answer), and how often it
    was asked."""

    def __init__(self, **lags: Decimal | None) -> None:
        self.lags = lags
        self.asked: list[str] = []

    def __call__(self, alias: str) -> Decimal | None:
        self.asked.append(alias)
        return self.lags[alias]


RETRY_SECONDS = 30.0


def gauge(lags: Lags, clock: Clock | None = None) -> LagGauge:
    return LagGauge(measure=lags, clock=clock or Clock(), retry_seconds=lambda: RETRY_SECONDS)


# --- choosing where to read ---------------------------------------------------------------


def test_replicas_within_the_limit_are_read_in_turn() -> None:
    lags = Lags(replica_1=Decimal("0.4"), replica_2=Decimal("3"), replica_3=Decimal("12"))
    aliases = ["replica_1", "replica_2", "replica_3"]
    chosen = [
        replicas.source_chosen(aliases=aliases, wrote=False, gauge=gauge(lags), max_lag=Decimal(10))
        for _ in range(4)
    ]
    assert sorted({source.alias for source in chosen}) == ["replica_1", "replica_2"]
    assert {source.alias: source.lag for source in chosen} == {
        "replica_1": Decimal("0.4"),
        "replica_2": Decimal("3"),
    }
    strict = replicas.source_chosen(
        aliases=aliases, wrote=False, gauge=gauge(lags), max_lag=Decimal(1)
    )
    assert strict == ReadSource("replica_1", lag=Decimal("0.4"))


@pytest.mark.parametrize(
    ("lags", "why"),
    [
        ({"replica_1": Decimal("10.5"), "replica_2": None}, "lagging"),
        ({"replica_1": None, "replica_2": None}, "unreachable"),
        ({"replica_1": replicas.LAG_UNKNOWN, "replica_2": Decimal("11")}, "lagging"),
    ],
)
def test_past_the_limit_or_down_the_primary_is_read(
    lags: dict[str, Decimal | None], why: str
) -> None:
    source = replicas.source_chosen(
        aliases=list(lags), wrote=False, gauge=gauge(Lags(**lags)), max_lag=Decimal(10)
    )
    assert source == ReadSource(PRIMARY, why=why)
    assert not source.replica


def test_a_browser_that_just_wrote_reads_the_primary_without_asking_a_replica() -> None:
    lags = Lags(replica_1=Decimal(0))
    source = replicas.source_chosen(
        aliases=[REPLICA], wrote=True, gauge=gauge(lags), max_lag=Decimal(10)
    )
    assert source == ReadSource(PRIMARY, why="wrote")
    assert lags.asked == []


def test_the_lag_is_measured_once_per_keep_time_per_replica() -> None:
    lags = Lags(replica_1=Decimal("0.2"), replica_2=None)
    clock = Clock()
    lag_gauge = gauge(lags, clock)
    assert lag_gauge.lag("replica_1") == Decimal("0.2")
    assert lag_gauge.lag("replica_2") is None
    lags.lags["replica_1"] = Decimal(30)
    clock.now += replicas.LAG_CHECK_SECONDS - 0.5
    assert lag_gauge.lag("replica_1") == Decimal("0.2")  # kept
    assert lag_gauge.lag("replica_2") is None  # not asked again either
    assert lags.asked == ["replica_1", "replica_2"]
    clock.now += 0.5
    assert lag_gauge.lag("replica_1") == Decimal(30)
    assert lags.asked == ["replica_1", "replica_2", "replica_1"]
    lag_gauge.unreachable("replica_1")  # failed in a request: down for the retry time
    assert lag_gauge.lag("replica_1") is None
    clock.now += RETRY_SECONDS
    assert lag_gauge.lag("replica_1") == Decimal(30)


def test_a_replica_that_did_not_answer_is_not_asked_again_for_the_retry_time(
    settings: Any,
) -> None:
    """Each try at a replica that does not answer costs a page its timeout: once per
    COSTBOARD_REPLICA_RETRY_S, counted from when the try gave up, not once per lag check."""
    settings.COSTBOARD_REPLICA_RETRY_S = Decimal(30)
    clock = Clock()
    lags = Lags(replica_1=None)

    def timing_out(alias: str) -> Decimal | None:
        clock.now += 3  # the replica's connect_timeout
        return lags(alias)

    lag_gauge = LagGauge(measure=timing_out, clock=clock)
    assert lag_gauge.lag("replica_1") is None
    for _ in range(14):  # two lag checks' time each, 28 s in all
        clock.now += replicas.LAG_CHECK_SECONDS
        assert lag_gauge.lag("replica_1") is None
    assert lags.asked == ["replica_1"]
    clock.now += 2
    lags.lags["replica_1"] = Decimal("0.1")  # back
    assert lag_gauge.lag("replica_1") == Decimal("0.1")
    assert lags.asked == ["replica_1", "replica_1"]
    # failed in a page: as long again, from then
    lag_gauge.unreachable("replica_1")
    clock.now += 29
    assert lag_gauge.lag("replica_1") is None
    assert lags.asked == ["replica_1", "replica_1"]
    clock.now += 1
    assert lag_gauge.lag("replica_1") == Decimal("0.1")
    assert lags.asked == ["replica_1", "replica_1", "replica_1"]


def test_while_one_thread_measures_a_replica_the_others_read_the_primary() -> None:
    """gunicorn's threads share a process's gauge: when a reading expires, one of them
    measures (and pays the connect timeout of a replica that does not answer); the requests
    meanwhile read the primary instead of each trying the replica too."""
    entered, release = threading.Event(), threading.Event()
    lags = Lags(replica_1=Decimal("0.2"))

    def slow(alias: str) -> Decimal | None:
        entered.set()
        release.wait(timeout=60)
        return lags(alias)

    lag_gauge = LagGauge(measure=slow, clock=Clock())
    found: list[Decimal | None] = []
    measuring = threading.Thread(target=lambda: found.append(lag_gauge.lag("replica_1")))
    measuring.start()
    entered.wait(timeout=60)
    try:
        assert lag_gauge.lag("replica_1") is None  # not measured a second time
        assert lags.asked == []
    finally:
        release.set()
        measuring.join(timeout=60)
    assert found == [Decimal("0.2")]
    assert lag_gauge.lag("replica_1") == Decimal("0.2")  # kept
    assert lags.asked == ["replica_1"]


# --- the router ------------------------------------------------------------------------


def test_outside_a_view_that_asks_every_read_goes_to_the_primary() -> None:
    assert router.db_for_read(Project) == PRIMARY
    assert router.db_for_write(Project) == PRIMARY
    assert replicas.read_source() is None
    assert router.allow_migrate(REPLICA, "costboard") is False
    assert router.allow_migrate(PRIMARY, "costboard") is True


@pytest.fixture(scope="class")
def _second_alias(django_db_setup: None) -> Iterator[None]:
    """`replica_1`: the test database under a connection of its own. What it reads is what the
    test committed, as a caught-up replica's would be. Made before the class's tests set up
    their databases, which must name it."""
    connections.settings[REPLICA] = {**connections[PRIMARY].settings_dict}
    yield
    connections[REPLICA].close()
    del connections[REPLICA]
    del connections.settings[REPLICA]


@pytest.fixture
def second_alias(_second_alias: None, monkeypatch: pytest.MonkeyPatch) -> Lags:
    """The second alias, 0.3 s behind by the gauge."""
    lags = Lags(replica_1=Decimal("0.3"))
    monkeypatch.setattr(replicas, "GAUGE", gauge(lags))
    return lags


def _routes(request: HttpRequest) -> HttpResponse:
    """A view that says where its reads go: at first, inside a transaction of its own, and
    after it wrote."""
    seen = [router.db_for_read(Project)]
    with transaction.atomic():
        seen.append(router.db_for_read(Project))
    seen.append(router.db_for_read(Project))
    Project.objects.create(name="Written", slug=f"written-{uuid.uuid4().hex[:8]}")
    seen.append(router.db_for_read(Project))
    source = replicas.read_source()
    said = [source.alias, source.why] if source is not None else ["none"]
    return HttpResponse(" ".join([*seen, *said]))


RATE_TABLES = ("costboard_modelprice", "costboard_priceadjustment", "costboard_rate_version")


def _pages_own(sql: str) -> bool:
    """SQL over Costboard's tables but the prices' and their version: the rate table is the
    process's, always read from the primary (costboard/pricing/rates.py)."""
    return "costboard_" in sql and not any(table in sql for table in RATE_TABLES)


def _page_reads(client: Client, path: str) -> tuple[str, list[str], list[str]]:
    """The page, and the SQL over Costboard's tables each connection ran for it."""
    with (
        CaptureQueriesContext(connections[PRIMARY]) as on_primary,
        CaptureQueriesContext(connections[REPLICA]) as on_replica,
    ):
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        body = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
    ours = [
        [q["sql"] for q in captured.captured_queries if _pages_own(q["sql"])]
        for captured in (on_primary, on_replica)
    ]
    return body.decode(), ours[0], ours[1]


@pytest.fixture
def browser() -> Client:
    user = get_user_model().objects.create_superuser("root", "", "pw-root-123")
    client = Client()
    client.force_login(user)
    return client


PAGES = [
    "/",
    "/sessions/",
    "/steps/",
    "/users/",
    "/budgets/",
    "/flagged/",
    "/reconciliation/",
    "/sessions/export.csv",
    "/users/export.csv",
]


@pytest.mark.django_db(transaction=True, databases=[PRIMARY, REPLICA])
class TestWithASecondAlias:
    def test_a_view_reads_the_replica_until_its_own_transaction_or_write(
        self, second_alias: Lags
    ) -> None:
        view = replica_reads(_routes)
        got = view(RequestFactory().get("/")).content.decode()
        assert got == "replica_1 default replica_1 default default wrote"
        # not GET or HEAD: the view reads the primary throughout, and no replica is asked
        asked = len(second_alias.asked)
        posted = view(RequestFactory().post("/")).content.decode()
        assert posted.split() == ["default"] * 4 + ["none"]
        assert len(second_alias.asked) == asked

    def test_a_replica_failing_in_the_view_sends_it_again_to_the_primary(
        self, second_alias: Lags
    ) -> None:
        calls: list[str] = []

        def fragile(request: HttpRequest) -> HttpResponse:
            source = replicas.read_source()
            assert source is not None
            calls.append(source.alias)
            if source.replica:
                raise OperationalError(
                    "connection to server at 127.0.0.1 failed: Connection refused"
                )
            return HttpResponse(source.why)

        response = replica_reads(fragile)(RequestFactory().get("/"))
        assert (calls, response.content) == (["replica_1", "default"], b"unreachable")
        assert replicas.GAUGE.lag(REPLICA) is None  # not read again until measured again

    def test_the_pages_and_exports_read_the_replica_and_say_so(
        self, second_alias: Lags, browser: Client
    ) -> None:
        agent = make_agent("acme")
        agent.events({"session_id": "s1", "step_type": "response", "model": "m", "input_tokens": 7})
        for path in PAGES:
            body, on_primary, on_replica = _page_reads(browser, path)
            assert on_primary == [], (path, on_primary)
            assert on_replica, path
            if not path.endswith(".csv"):
                assert REPLICA_NOTE in body, path
        body, _, _ = _page_reads(browser, "/sessions/export.csv")
        assert "acme,s1," in body  # the streamed rows came from the replica too
        auth = {"Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='read')[1]}"}
        for path in ["/api/v1/spend", "/api/v1/reconciliation"]:
            with CaptureQueriesContext(connections[REPLICA]) as api_reads:
                assert Client().get(path, headers=auth).status_code == 200
            assert [q for q in api_reads.captured_queries if "costboard_" in q["sql"]], path

    def test_after_a_write_the_browser_reads_the_primary_for_the_lag_limit(
        self, second_alias: Lags, browser: Client, settings: Any
    ) -> None:
        settings.COSTBOARD_REPLICA_MAX_LAG_S = Decimal("4.5")
        response = browser.post("/flagged/999999/acknowledge/")  # a write, refused or not
        cookie = response.cookies[WROTE_COOKIE]
        assert (cookie["max-age"], cookie["httponly"], cookie["samesite"]) == (5, True, "Lax")
        body, on_primary, on_replica = _page_reads(browser, "/")
        assert (PRIMARY_NOTE in body, on_replica) == (True, [])
        assert on_primary
        del browser.cookies[WROTE_COOKIE]  # expired
        body, on_primary, on_replica = _page_reads(browser, "/")
        assert (REPLICA_NOTE in body, on_primary) == (True, [])
        # an API client's write sets no cookie (it sends none back)
        agent = make_agent("acme")
        reply = agent.post({"events": []})
        assert WROTE_COOKIE not in reply.cookies

    def test_a_replica_past_the_limit_leaves_the_page_on_the_primary(
        self, second_alias: Lags, browser: Client
    ) -> None:
        second_alias.lags[REPLICA] = Decimal("10.1")  # over the default 10
        body, on_primary, on_replica = _page_reads(browser, "/")
        assert (PRIMARY_NOTE in body, REPLICA_NOTE in body, on_replica) == (True, False, [])
        assert on_primary


@pytest.mark.django_db
def test_without_replicas_the_pages_say_nothing_of_them(browser: Client) -> None:
    body = browser.get("/").content.decode()
    assert "read-source" not in body
    assert browser.post("/flagged/999999/acknowledge/").cookies.get(WROTE_COOKIE) is None


def _replica_views(patterns: list[URLPattern | URLResolver], prefix: str = "") -> set[str]:
    found = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            found |= _replica_views(pattern.url_patterns, prefix)
        elif getattr(pattern.callback, "reads_replica", False):
            found.add(pattern.name or "")
    return found


def test_exactly_the_pages_reports_and_exports_read_replicas() -> None:
    assert _replica_views(get_resolver().url_patterns) == {
        "overview",
        "sessions",
        "sessions-csv",
        "session",
        "steps",
        "users",
        "users-csv",
        "budgets",
        "budget",
        "reconciliation",
        "reports",
        "reports-csv",
        "flagged",
        "api-spend",
        "api-reconciliation",
    }


# --- a real streaming replica -------------------------------------------------------------

CHECKS = ROOT / "tests" / "costboard" / "replica_pair_checks.py"


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    # The pair is its own two servers, whatever DATABASE_URL the suite runs on: it runs on
    # both legs wherever PostgreSQL's server tools are. Only a machine without them (a
    # newcomer's SQLite `make test`) leaves it out; the PostgreSQL leg requires them.
    tools = postgres_bin()
    if tools is None:
        missing = (
            "no initdb, pg_ctl and pg_basebackup found: install PostgreSQL's server package "
            "or set COSTBOARD_PG_BIN to their directory"
        )
        if os.environ.get("DATABASE_URL", "").startswith("postgres"):
            pytest.fail(missing)
        pytest.skip(missing)
    started = pair_started(tools)
    yield started
    started.stop()


@pytest.mark.slow
def test_pages_read_a_real_streaming_replica_and_fall_back_to_the_primary(pair: Pair) -> None:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "CELERY_BROKER_URL", "COSTBOARD_REPLICA"))
    }
    env.update(
        DATABASE_URL=pair.primary_url,
        # a replica that does not answer is given up on sooner than by default
        DATABASE_REPLICA_URLS=f"{pair.replica_url}?connect_timeout=2",
        COSTBOARD_REPLICA_TIMEOUT_S="2",
        COSTBOARD_TEST_PAIR=pair.to_json(),
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", str(CHECKS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "8 passed" in result.stdout, result.stdout[-2000:]


@pytest.mark.slow
def test_bench_samples_a_real_replicas_lag_and_refuses_what_is_not_one(pair: Pair) -> None:
    """`bench_ingest --replica`'s sampler reads the lag as the pages do, on the real replica,
    while the primary commits; a primary, or a server that does not answer, is refused with
    the URL named."""
    with psycopg.connect(pair.replica_url, autocommit=True) as replica:
        replica.execute("SELECT pg_wal_replay_resume()")  # whatever the checks above left
        with LagSampler(pair.replica_url, every=0.01) as sampler:
            with psycopg.connect(pair.primary_url, autocommit=True) as primary:
                primary.execute("CREATE TABLE lag_probe (n int)")
                for n in range(50):
                    primary.execute("INSERT INTO lag_probe VALUES (%s)", [n])

            def replayed() -> bool:
                found = replica.execute(
                    "SELECT count(*) FROM pg_class WHERE relname = 'lag_probe'"
                ).fetchone()
                if not found or not found[0]:
                    return False
                row = replica.execute("SELECT count(*) FROM lag_probe").fetchone()
                return bool(row and row[0] == 50)

            wait_until(replayed, what="the replica replaying the 50 inserts")
    assert len(sampler.samples) >= 2
    assert all(lag >= 0 for lag in sampler.samples)
    assert sampler.samples[-1] == 0  # taken on leaving, with everything replayed
    assert lag_line(sampler.samples, 0.01).startswith(
        f"replica:    lag over {len(sampler.samples)} samples every 0.01 s: p50 "
    )
    # a replica that stops in the middle ends the sampling, not the run; it is said why
    with LagSampler(pair.replica_url, every=0.01) as cut:
        pair.stop_replica()
        wait_until(lambda: cut.lost, what="the sampler noticing that the replica stopped")
    pair.start_replica()
    assert cut.samples[0] >= 0  # taken on entering, before the stop
    assert "; then it stopped answering: " in lag_line(cut.samples, 0.01, lost=cut.lost)
    with pytest.raises(NotAReplica, match=r"is not a standby \(pg_is_in_recovery\(\) is false\)"):
        replica_connect(pair.primary_url)
    with pytest.raises(NotAReplica, match=r"^--replica postgres://postgres@127\.0\.0\.1:1/x does"):
        replica_connect("postgres://postgres@127.0.0.1:1/x")
