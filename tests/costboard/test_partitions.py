"""Steps partitioned by month on PostgreSQL (migration 0022, costboard/partitions.py): ingest
makes a batch's missing month, the sweep makes months ahead, a replay is a duplicate within its
month, and rows without a month of their own wait in the DEFAULT partition until it is made.
SQLite has one plain table: these read PostgreSQL's catalog, and CI runs them there."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Sum
from django.test import Client
from django.test.utils import CaptureQueriesContext
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.trace import Tracer

from costboard import partitions, tasks
from costboard.models import DailyRollup, Session, Step
from costboard.partitions import (
    DEFAULT_PARTITION,
    step_partition_drop,
    step_partitions,
    step_partitions_ahead,
    step_partitions_ensure,
)
from costboard.retention import retention_sweep
from tests.conftest import Agent, make_agent, run_in_threads
from tests.otlp_spans import CHAT, PROTOBUF, span, spans_of

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="partitions are PostgreSQL's; CI runs them there"
)


def step(event_id: str | None, at: datetime, tokens: int = 100, **fields: Any) -> dict[str, Any]:
    event = {
        "session_id": "s",
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": tokens,
        "timestamp": at.isoformat(),
        **fields,
    }
    if event_id is not None:
        event["event_id"] = event_id
    return event


def where_stored() -> list[tuple[str, str | None]]:
    """(partition, event_id) of every step, by id."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text, event_id FROM {Step._meta.db_table} ORDER BY id"  # noqa: S608 — the model's table
        )
        return [(name, event_id) for name, event_id in cursor.fetchall()]


def exists(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
        return bool(cursor.fetchone()[0])


@contextmanager
def reading(table: str) -> Iterator[None]:
    """Another connection in the middle of a long read of `table`."""
    from django.db import connections

    reader = connections.create_connection("default")
    try:
        reader.set_autocommit(False)
        with reader.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
            yield
    finally:
        reader.rollback()
        reader.close()


@pytest.mark.django_db
def test_ingest_makes_the_month_of_a_batch_and_then_does_no_catalog_work(
    agent: Agent, priced: Any
) -> None:
    march = datetime(2026, 3, 14, 9, tzinfo=UTC)
    assert date(2026, 3, 1) not in step_partitions()
    agent.events(step("a", march), step("b", march.replace(day=31, hour=23)))
    assert where_stored() == [("costboard_step_p202603", "a"), ("costboard_step_p202603", "b")]

    with CaptureQueriesContext(connection) as queries:
        agent.events(step("c", march + timedelta(days=1)))
    catalog = [q["sql"] for q in queries if "pg_inherits" in q["sql"] or "ATTACH" in q["sql"]]
    assert catalog == []  # the month is known to this process
    assert where_stored()[-1] == ("costboard_step_p202603", "c")


@pytest.mark.django_db
def test_a_month_boundary_is_midnight_utc(agent: Agent, priced: Any) -> None:
    # 00:30 on 1 May in Paris is 22:30 on 30 April in UTC
    agent.events(
        {
            **step("late-april", datetime(2026, 4, 30, 22, 30, tzinfo=UTC)),
            "timestamp": "2026-05-01T00:30:00+02:00",
        },
        step("may", datetime(2026, 5, 1, 0, 0, tzinfo=UTC)),
    )
    assert where_stored() == [
        ("costboard_step_p202604", "late-april"),
        ("costboard_step_p202605", "may"),
    ]


@pytest.mark.django_db
def test_a_replay_is_a_duplicate_within_its_month(agent: Agent, priced: Any) -> None:
    at = datetime(2026, 6, 10, 12, tzinfo=UTC)
    first = agent.events(step("e1", at, 100), step("e2", at, 200))
    assert (first["accepted"], first["duplicates"]) == (2, 0)
    again = agent.events(step("e1", at, 100), step("e2", at + timedelta(days=5), 200))
    assert (again["accepted"], again["duplicates"]) == (0, 2)  # same month: both replays
    other = make_agent("other")
    assert other.events(step("e1", at))["accepted"] == 1  # event_ids are per project
    session = Session.objects.get(project=agent.project, external_id="s")
    assert (session.step_count, session.input_tokens) == (2, 300)
    assert Step.objects.filter(project=agent.project).count() == 2


@pytest.mark.django_db
def test_a_step_outside_the_ingest_window_waits_in_the_default_partition(
    agent: Agent, priced: Any
) -> None:
    """A typo'd year makes no table of its own; when its month is made, its rows move there
    and its event_id still finds them."""
    long_ago = datetime(2001, 2, 3, tzinfo=UTC)
    agent.events(step("old", long_ago, 70), step("old-2", long_ago, 30))
    assert where_stored() == [(DEFAULT_PARTITION, "old"), (DEFAULT_PARTITION, "old-2")]
    assert date(2001, 2, 1) not in step_partitions()
    assert agent.events(step("old", long_ago))["duplicates"] == 1  # DEFAULT has the index too

    assert step_partitions_ensure(months=[date(2001, 2, 1)]) == ["costboard_step_p200102"]
    assert where_stored() == [
        ("costboard_step_p200102", "old"),
        ("costboard_step_p200102", "old-2"),
    ]
    assert agent.events(step("old", long_ago))["duplicates"] == 1
    assert Session.objects.get(external_id="s").input_tokens == 100
    assert step_partitions_ensure(months=[date(2001, 2, 1)]) == []  # made once


@pytest.mark.django_db
def test_the_sweep_makes_this_month_and_the_next_two(db: None) -> None:
    now = datetime(2031, 11, 30, 23, 59, tzinfo=UTC)
    assert step_partitions_ahead(now=now) == [
        "costboard_step_p203111",
        "costboard_step_p203112",
        "costboard_step_p203201",
    ]
    assert step_partitions_ahead(now=now) == []
    bounds = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_class c "
            "WHERE c.relname = 'costboard_step_p203112'"
        )
        bounds = dict(cursor.fetchall())
    assert bounds == {
        "costboard_step_p203112": "FOR VALUES FROM ('2031-12-01 00:00:00+00') TO "
        "('2032-01-01 00:00:00+00')"
    }


@pytest.mark.django_db
def test_guard_sweep_and_celery_beat_make_the_months_ahead(db: None, settings: Any) -> None:
    import io

    out = io.StringIO()
    call_command("guard_sweep", stdout=out)
    this = partitions.month_of(datetime.now(UTC))
    ahead = [partitions.month_add(this, n) for n in range(3)]
    assert set(ahead) <= set(step_partitions())
    schedule = {
        entry["task"]: entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()
    }
    assert schedule["costboard.tasks.step_partitions_ahead"] == 3600.0
    assert tasks.step_partitions_ahead.delay().get() == []  # already made


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_making_the_same_months_at_once_make_each_once() -> None:
    months = [date(2040, m, 1) for m in (1, 2, 3)]
    made: list[str] = []

    def work(_: int) -> None:
        made.extend(step_partitions_ensure(months=months))

    try:
        assert run_in_threads(6, work) == []
        assert sorted(made) == [
            "costboard_step_p204001",
            "costboard_step_p204002",
            "costboard_step_p204003",
        ]
        assert set(months) <= set(step_partitions())
    finally:
        for month in months:
            step_partition_drop(month, droppable=lambda projects: True)
    assert not set(months) & set(step_partitions())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_busy_default_partition_delays_a_new_month_but_never_a_batch(
    priced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long reader holds the DEFAULT partition: making a month waits LOCK_TIMEOUT, gives
    up, and the batch goes on into the DEFAULT partition; a later ensure moves it."""
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT", "200ms")
    agent = make_agent("busy")
    month = date(2026, 7, 1)
    assert month not in step_partitions()
    with reading(DEFAULT_PARTITION):
        agent.events(step("held", datetime(2026, 7, 4, tzinfo=UTC)))
    assert where_stored() == [(DEFAULT_PARTITION, "held")]
    try:
        assert step_partitions_ensure(months=[month]) == ["costboard_step_p202607"]
        assert where_stored() == [("costboard_step_p202607", "held")]
    finally:
        step_partition_drop(month, droppable=lambda projects: True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_steps_into_month_partitions_and_back() -> None:
    before = ("costboard", "0021_project_in_ingest_keys")
    after = ("costboard", "0022_step_partitions")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    Project = old.get_model("costboard", "Project")
    OldSession = old.get_model("costboard", "Session")
    OldStep = old.get_model("costboard", "Step")
    project = Project.objects.create(name="Old", slug="old")
    session = OldSession.objects.create(project=project, external_id="s")
    times = [
        datetime(2026, 9, 30, 23, 59, 59, tzinfo=UTC),
        datetime(2026, 10, 1, tzinfo=UTC),
        datetime(2026, 10, 31, 12, tzinfo=UTC),
        datetime(1999, 1, 15, tzinfo=UTC),
    ]
    ids = [
        OldStep.objects.create(
            project=project,
            session=session,
            timestamp=at,
            step_type="x",
            model="m",
            event_id=f"e{n}" if n < 3 else None,
            input_tokens=n,
        ).pk
        for n, at in enumerate(times)
    ]
    OldStep.objects.filter(pk=ids[-1]).delete()  # the sequence is past the largest id
    OldStep.objects.create(
        project=project, session=session, timestamp=times[3], step_type="x", model="m"
    )

    MigrationExecutor(connection).migrate([after])
    stored = where_stored()
    assert stored == [
        ("costboard_step_p202609", "e0"),
        ("costboard_step_p202610", "e1"),
        ("costboard_step_p202610", "e2"),
        ("costboard_step_p199901", None),
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {Step._meta.db_table} ORDER BY id")  # noqa: S608 — its table
        assert [row[0] for row in cursor.fetchall()] == [*ids[:3], ids[3] + 1]
        cursor.execute("SELECT nextval(pg_get_serial_sequence('costboard_step', 'id'))")
        assert cursor.fetchone()[0] == ids[3] + 2  # counting on, never reusing an id
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'costboard_step'")
        assert cursor.fetchone()[0] == "p"
        # the same event_id once in a month (kept) and once in another (allowed now)
        cursor.execute(
            'INSERT INTO costboard_step (project_id, session_id, event_id, "timestamp", '
            "step_type, model) VALUES (%s, %s, 'e1', %s, 'x', 'm'), (%s, %s, 'e0', %s, 'x', 'm') "
            "ON CONFLICT DO NOTHING RETURNING event_id",
            [project.pk, session.pk, times[2], project.pk, session.pk, times[2]],
        )
        assert cursor.fetchall() == [("e0",)]
    assert exists("costboard_step_default")

    MigrationExecutor(connection).migrate([before])
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'costboard_step'")
        assert cursor.fetchone()[0] == "r"
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'step_event_id'")
        assert "UNIQUE" in cursor.fetchone()[0]
    assert not exists("costboard_step_p202610") and not exists("costboard_step_default")
    back = sorted(OldStep.objects.values_list("event_id", "input_tokens"), key=str)
    # the October copy of e0 keeps its row, not its event_id; the September one keeps both
    assert back == sorted([("e0", 0), ("e1", 1), ("e2", 2), (None, 0), (None, 0)], key=str)
    MigrationExecutor(connection).migrate(latest)


NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> Any:
    import time_machine

    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def totals() -> tuple[Any, ...]:
    rollups = DailyRollup.objects.aggregate(Sum("calls"), Sum("input_tokens"), Sum("cost_usd"))
    sessions = sorted(
        Session.objects.values_list("external_id", "step_count", "input_tokens", "cost_usd")
    )
    return rollups, sessions


@pytest.mark.django_db
def test_retention_drops_the_months_past_every_cutoff_and_deletes_the_rest(
    priced: Any, clock: Any
) -> None:
    """A keeps 30 days (cutoff 21 October noon), B keeps everything. August is A's alone:
    dropped whole. September holds B's steps too: kept, A's steps in it deleted. October
    ends past A's cutoff: its older steps deleted one by one."""
    a = make_agent("a", retention_days=30)
    b = make_agent("b")
    a.events(
        step("aug-1", datetime(2026, 8, 2, tzinfo=UTC), 10),
        step("aug-2", datetime(2026, 8, 31, 23, tzinfo=UTC), 20),
        step("sep", datetime(2026, 9, 9, tzinfo=UTC), 40),
        step("oct-early", datetime(2026, 10, 5, tzinfo=UTC), 80),
        step("oct-late", datetime(2026, 10, 25, tzinfo=UTC), 160),
        step("nov", datetime(2026, 11, 10, tzinfo=UTC), 320),
    )
    b.events(step("b-sep", datetime(2026, 9, 20, tzinfo=UTC), 640))
    before = totals()
    assert exists("costboard_step_p202608") and exists("costboard_step_p202609")

    result = retention_sweep()
    assert result.steps_deleted == 4  # two dropped with August, two deleted
    assert not exists("costboard_step_p202608")
    assert exists("costboard_step_p202609") and exists("costboard_step_p202610")
    assert sorted(where_stored()) == [
        ("costboard_step_p202609", "b-sep"),
        ("costboard_step_p202610", "oct-late"),
        ("costboard_step_p202611", "nov"),
    ]
    assert totals() == before  # rollups and session totals keep what was dropped
    assert date(2026, 8, 1) not in step_partitions()
    assert retention_sweep().steps_deleted == 0

    # a late step for August: its month is made again (it is within ingest's window)
    b.events(step("b-aug", datetime(2026, 8, 15, tzinfo=UTC), 1))
    assert where_stored()[-1] == ("costboard_step_p202608", "b-aug")
    assert retention_sweep().steps_deleted == 0  # B keeps everything: August stays


@pytest.mark.django_db
def test_a_month_with_a_project_whose_cutoff_is_later_is_not_dropped(
    priced: Any, clock: Any
) -> None:
    short = make_agent("short", retention_days=30)
    long = make_agent("long", retention_days=90)  # cutoff 22 August noon
    short.events(step("s-aug", datetime(2026, 8, 10, tzinfo=UTC)))
    long.events(step("l-aug", datetime(2026, 8, 25, tzinfo=UTC)))
    long.events(step("l-jul", datetime(2026, 7, 25, tzinfo=UTC)))

    result = retention_sweep()
    assert not exists("costboard_step_p202607")  # ends 1 August: past both cutoffs
    assert exists("costboard_step_p202608")  # ends 1 September: after long's cutoff
    assert result.steps_deleted == 2
    assert where_stored() == [("costboard_step_p202608", "l-aug")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_busy_locks_put_off_the_sweep_and_the_drop_but_not_retention(
    priced: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT", "200ms")
    a = make_agent("a", retention_days=30)
    a.events(step("aug", datetime(2026, 8, 2, tzinfo=UTC), 10))
    try:
        with reading(DEFAULT_PARTITION):
            assert step_partitions_ahead(now=datetime(2041, 5, 1, tzinfo=UTC)) == []
        assert not {date(2041, 5, 1), date(2041, 6, 1)} & set(step_partitions())

        with reading("costboard_step_p202608"):
            result = retention_sweep()
        assert result.steps_deleted == 1  # deleted row by row instead
        assert exists("costboard_step_p202608") and where_stored() == []
        assert retention_sweep().steps_deleted == 0
        assert not exists("costboard_step_p202608")  # an hour later: the empty month dropped
    finally:
        step_partition_drop(date(2026, 8, 1), droppable=lambda projects: True)


MAY_2 = datetime(2026, 5, 2, tzinfo=UTC)


def keyed_request(agent: Agent) -> Any:
    """A batch under an Idempotency-Key: one transaction with the key's row."""
    return Client().post(
        "/api/v1/events",
        json.dumps({"events": [step("first", MAY_2)]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}", "Idempotency-Key": "batch-1"},
    )


def otlp_request(agent: Agent) -> Any:
    """An OTLP export of one chat span in session s: the whole request one transaction."""

    def build(tracer: Tracer) -> None:
        start = int(MAY_2.timestamp() * 1e9)
        span(tracer, "chat", {**CHAT, "gen_ai.conversation.id": "s"}, start=start)

    return Client().post(
        "/v1/traces",
        encode_spans(spans_of(build)).SerializeToString(),
        content_type=PROTOBUF,
        headers={"Authorization": f"Bearer {agent.key}"},
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first_request", [keyed_request, otlp_request], ids=["keyed", "otlp"])
def test_a_batch_in_a_transaction_of_its_own_makes_its_month_before_it(
    first_request: Callable[[Agent], Any], priced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Idempotency-Key holds its batch in one transaction with the key's row, an OTLP
    export all its spans in one. Were a new month made inside it, the partition's locks would
    be held to its end: a batch of the same session, its session locked, would wait on them,
    and the first would then wait on that session — a deadlock, one of the two lost. The
    month is made (and committed) before that transaction: both batches are stored."""
    agent = make_agent("first")
    month = date(2026, 5, 1)
    assert month not in step_partitions()
    made = threading.Event()
    other_done = threading.Event()
    ensure = partitions.step_partitions_ensure

    def ensure_then_wait(*, months: Any) -> list[str]:
        names = ensure(months=months)
        made.set()
        other_done.wait(timeout=5)  # the other batch goes on meanwhile (or waits on us)
        return names

    monkeypatch.setattr(partitions, "step_partitions_ensure", ensure_then_wait)
    answers: dict[int, Any] = {}

    def work(index: int) -> None:
        if index == 0:
            answers[0] = first_request(agent)
            return
        made.wait(timeout=5)
        try:
            answers[1] = Client().post(
                "/api/v1/events",
                json.dumps({"events": [step("plain", MAY_2 + timedelta(days=1))]}),
                content_type="application/json",
                headers={"Authorization": f"Bearer {agent.key}"},
            )
        finally:
            other_done.set()

    try:
        assert run_in_threads(2, work) == []
        assert [answers[i].status_code for i in (0, 1)] == [200, 200]
        assert len(where_stored()) == 2
        assert {name for name, _ in where_stored()} == {"costboard_step_p202605"}
        assert Session.objects.get(project=agent.project, external_id="s").step_count == 2
    finally:
        step_partition_drop(month, droppable=lambda projects: True)


def step_table_models() -> str:
    """The most common models of the partitioned step table as a whole, as its statistics
    have them ("" when it has none)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT most_common_vals::text FROM pg_stats"
            " WHERE tablename = %s AND inherited AND attname = 'model'",
            [Step._meta.db_table],
        )
        row = cursor.fetchone()
        return str(row[0]) if row else ""


@pytest.mark.django_db
def test_the_sweep_analyzes_the_partitioned_step_table_once_a_day(
    agent: Agent, priced: Any
) -> None:
    """Autovacuum analyzes each partition but never the partitioned parent: the hourly sweep
    does, when its statistics are a day old or missing."""
    now = datetime.now(UTC)
    agent.events(*(step(f"e{n}", now - timedelta(minutes=n), model="probe") for n in range(20)))
    assert "probe" not in step_table_models()
    with connection.cursor() as cursor:  # inside the test's transaction, as a caller's
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        assert partitions.step_statistics_refresh(every=timedelta(0)) is True
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone() == ("7s",)  # the caller's own, put back
    assert step_table_models() == "{probe}"
    assert partitions.step_statistics_refresh() is False  # analyzed less than a day ago
    tasks.step_partitions_ahead.delay()  # the sweep's task: this month's made, no ANALYZE
    assert partitions.step_statistics_refresh(every=timedelta(0)) is True


@pytest.mark.django_db
def test_a_worker_warm_up_rolled_back_leaves_its_month_for_ingest_to_make(
    agent: Agent, priced: Any
) -> None:
    """A gunicorn worker's warm-up (costboard/warmup.py) ingests in a transaction it rolls
    back: the month partition it made goes with it. The worker must not take that month as
    made: its batches of the month would all go to the DEFAULT partition, until the sweep made
    the month under them (and a batch inserting into DEFAULT meanwhile failed, a 500)."""
    import time_machine

    from costboard.warmup import worker_warm

    now = datetime(2033, 8, 20, 12, tzinfo=UTC)
    with time_machine.travel(now, tick=False):
        worker_warm()
        assert date(2033, 8, 1) not in step_partitions()  # rolled back with the warm-up
        agent.events(step("a", now))
    assert where_stored() == [("costboard_step_p203308", "a")]


def lock_waiters() -> int:
    """How many backends of this database wait for a lock (another connection's view)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(cursor.fetchone()[0])


def until_a_lock_waits() -> None:
    """Return once another backend waits for a lock (5 s at most: the test then fails)."""
    for _ in range(500):
        if lock_waiters():
            return
        threading.Event().wait(0.01)
    raise AssertionError("no backend waited for a lock")


def post_while_the_month_is_made(
    agent: Agent, at: datetime, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """Make the month of `at` (as the sweep, or ingest in another process, would) while a
    batch of one step at `at` is posted: the batch goes in once the month's making holds the
    DEFAULT partition and waits behind it. The batch's answer."""
    making = threading.Event()
    make = partitions._partition_make

    def make_once_a_batch_waits(cursor: Any, month: date) -> str:
        making.set()  # the DEFAULT partition is locked: a batch now waits behind us
        until_a_lock_waits()
        return make(cursor, month)

    monkeypatch.setattr(partitions, "_partition_make", make_once_a_batch_waits)
    answers: dict[int, Any] = {}

    def work(index: int) -> None:
        if index == 0:
            step_partitions_ensure(months=[partitions.month_of(at)])
            return
        assert making.wait(timeout=5)
        answers[1] = agent.post({"events": [step("late", at, 20)]})

    assert run_in_threads(2, work) == []
    return answers[1]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_month_made_while_a_batch_of_it_waits_for_the_default_partition(
    priced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step outside the ingest window goes to the DEFAULT partition; the sweep (another
    process) makes its month meanwhile. The batch that waited for the DEFAULT partition
    behind it was routed there before the month existed, and PostgreSQL refused the row
    (the DEFAULT partition's constraint had changed under it): a 500. It is stored in its
    new month instead."""
    agent = make_agent("far")
    try:
        # far past the window: ingest never makes this month itself
        answer = post_while_the_month_is_made(agent, datetime(2091, 3, 15, tzinfo=UTC), monkeypatch)
        assert answer.status_code == 200, answer.content
        assert answer.json()["accepted"] == 1
        assert where_stored() == [("costboard_step_p209103", "late")]
    finally:
        step_partition_drop(date(2091, 3, 1), droppable=lambda projects: True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_month_dropped_elsewhere_and_made_again_while_a_batch_of_it_waits(
    priced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention in another process (a Celery worker) dropped August, which this process
    still takes as made: its late August step goes to the DEFAULT partition, while ingest in
    a third process makes August again. That was the same 500."""
    agent = make_agent("late")
    agent.events(step("aug-1", datetime(2026, 8, 2, tzinfo=UTC), 10))  # August made, known
    with connection.cursor() as cursor:  # dropped elsewhere: this process is not told
        cursor.execute("ALTER TABLE costboard_step DETACH PARTITION costboard_step_p202608")
        cursor.execute("DROP TABLE costboard_step_p202608")
    try:
        answer = post_while_the_month_is_made(agent, datetime(2026, 8, 3, tzinfo=UTC), monkeypatch)
        assert answer.status_code == 200, answer.content
        assert where_stored() == [("costboard_step_p202608", "late")]
        session = Session.objects.get(project=agent.project, external_id="s")
        assert (session.step_count, session.input_tokens) == (2, 30)
    finally:
        step_partition_drop(date(2026, 8, 1), droppable=lambda projects: True)


def holds_new_steps_off(month: str) -> bool:
    """Whether this connection holds the lock that keeps new steps out of the month while it
    is dropped (the step table's, or the month's own)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND granted"
            " AND mode IN ('ShareLock', 'AccessExclusiveLock')"
            " AND relation IN ('costboard_step'::regclass, %s::regclass)",
            [f"costboard_step_p{month}"],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_retention_dropping_a_month_while_a_batch_writes_to_it(
    priced: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention drops August (past A's 30 days) while a late batch of August steps goes in.
    The drop held August's partition and waited for the step table, the batch held the step
    table and waited for August: a deadlock, the batch a 500 (or the retention sweep lost).
    Now the drop takes the step table first: the batch waits for it, then goes on into the
    DEFAULT partition (August is gone), and the drop counts what it held."""
    a = make_agent("a", retention_days=30)
    a.events(step("aug-1", datetime(2026, 8, 2, tzinfo=UTC), 10))
    answers: dict[int, Any] = {}
    dropped: dict[int, int] = {}
    batch_sent = threading.Event()
    projects_of = partitions.step_partition_projects

    def projects_once_a_batch_waits(month: date) -> list[int]:
        if holds_new_steps_off(f"{month:%Y%m}"):
            batch_sent.set()
            until_a_lock_waits()
        return projects_of(month)

    monkeypatch.setattr(partitions, "step_partition_projects", projects_once_a_batch_waits)

    def work(index: int) -> None:
        if index == 0:
            dropped[0] = step_partition_drop(
                date(2026, 8, 1), droppable=lambda projects: projects == [a.project.pk]
            )
            return
        assert batch_sent.wait(timeout=5)
        answers[1] = a.post({"events": [step("aug-2", datetime(2026, 8, 3, tzinfo=UTC), 20)]})

    try:
        assert run_in_threads(2, work) == []
        assert answers[1].status_code == 200, answers[1].content
        assert dropped == {0: 1}
        assert not exists("costboard_step_p202608")
        assert where_stored() == [(DEFAULT_PARTITION, "aug-2")]
        session = Session.objects.get(project=a.project, external_id="s")
        assert (session.step_count, session.input_tokens) == (2, 30)
    finally:
        step_partition_drop(date(2026, 8, 1), droppable=lambda projects: True)
