"""A step's event_id is a duplicate in its project in any month, as long as its step is kept
(costboard/models.py StepReceipt; docs/api.md, "Idempotency").

On PostgreSQL the steps are partitioned by month and each partition's unique index only sees
its own month: a client without `timestamp` retrying across midnight on the 1st sent the same
event_id into two partitions, and it was billed twice. These run on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Sum

from costboard.models import DailyRollup, Session, Step, StepReceipt
from costboard.partitions import partitioned, step_partition_drop, step_partitions_ensure
from costboard.retention import retention_sweep
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd

JAN_31 = datetime(2026, 1, 31, 23, 59, 30, tzinfo=UTC)
JAN_2042 = datetime(2042, 1, 31, 23, 59, 30, tzinfo=UTC)
MONTHS_2042 = [date(2042, 1, 1), date(2042, 2, 1)]


def step(event_id: str, at: datetime, tokens: int = 1000, session: str = "s") -> dict[str, Any]:
    return {
        "session_id": session,
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": tokens,
        "output_tokens": 10,
        "event_id": event_id,
        "timestamp": at.isoformat(),
    }


def cost(tokens: int = 1000) -> Decimal:
    return usd(tokens, Decimal(3)) + usd(10, Decimal(15))


@pytest.mark.django_db
def test_a_replay_in_the_next_months_is_a_duplicate(agent: Agent, priced: Any) -> None:
    first = agent.events(step("e1", JAN_31))
    assert (first["accepted"], first["duplicates"]) == (1, 0)
    # the client retries after midnight on the 1st, then again a month later
    for at in (JAN_31 + timedelta(minutes=1), JAN_31 + timedelta(days=29)):
        again = agent.events(step("e1", at))
        assert (again["accepted"], again["duplicates"]) == (0, 1)

    session = Session.objects.get(project=agent.project, external_id="s")
    assert (session.step_count, session.input_tokens, session.cost_usd) == (1, 1000, cost())
    assert list(Step.objects.values_list("event_id", "timestamp")) == [("e1", JAN_31)]
    rollups = DailyRollup.objects.filter(project=agent.project)
    assert list(rollups.values_list("day", "calls", "cost_usd")) == [(JAN_31.date(), 1, cost())]
    assert agent.events(step("e1", JAN_31))["duplicates"] == 1  # and in its own month


@pytest.mark.django_db
def test_a_batch_with_replays_from_other_months_stores_only_the_new(
    agent: Agent, priced: Any
) -> None:
    agent.events(step("a", JAN_31), step("b", JAN_31 - timedelta(days=40)))
    body = agent.events(
        step("a", JAN_31 + timedelta(days=3)),  # February: a replay
        step("c", JAN_31 + timedelta(days=3), tokens=500),  # new
        step("b", JAN_31 + timedelta(days=70)),  # April: a replay of December's
    )
    assert (body["accepted"], body["duplicates"]) == (1, 2)
    stored = sorted(Step.objects.values_list("event_id", "input_tokens"))
    assert stored == [("a", 1000), ("b", 1000), ("c", 500)]
    total = DailyRollup.objects.aggregate(total=Sum("cost_usd"))["total"]
    assert total == cost() * 2 + cost(500)
    assert total == Step.objects.aggregate(total=Sum("cost_usd"))["total"]


@pytest.mark.django_db
def test_event_ids_are_per_project(agent: Agent, priced: Any) -> None:
    agent.events(step("e1", JAN_31))
    other = make_agent("other")
    assert other.events(step("e1", JAN_31 + timedelta(days=2)))["accepted"] == 1
    assert sorted(StepReceipt.objects.values_list("project__slug", "event_id")) == [
        ("acme", "e1"),
        ("other", "e1"),
    ]


@pytest.mark.django_db
def test_retention_deletes_a_receipt_with_its_step(priced: Any) -> None:
    agent = make_agent("short", retention_days=30)
    now = datetime(2026, 6, 15, 12, tzinfo=UTC)
    old, recent = now - timedelta(days=45), now - timedelta(days=5)
    agent.events(step("old", old), step("recent", recent))

    retention_sweep(now)

    assert list(Step.objects.values_list("event_id", flat=True)) == ["recent"]
    assert list(StepReceipt.objects.values_list("event_id", "timestamp")) == [("recent", recent)]
    # the kept step's event_id is still a duplicate, in any month
    assert agent.events(step("recent", now))["duplicates"] == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_replays_racing_across_months_are_stored_once() -> None:
    """Eight clients send the same ten event_ids at once, each with timestamps in its own
    month: the receipts' key makes the later ones wait and find them. (On PostgreSQL the
    months are partitions of their own, made here and dropped after: committed, they would
    outlive the test.)"""
    agent = make_agent("race")
    add_price("test-sonnet")
    months = [date(2041, 1 + thread, 1) for thread in range(8)]
    if partitioned():
        step_partitions_ensure(months=months)
    bodies: list[dict[str, Any]] = []

    def work(thread: int) -> None:
        at = datetime.combine(months[thread], time(12), tzinfo=UTC)
        client = Agent(agent.project, agent.key, agent.client.__class__())
        bodies.append(client.events(*[step(f"e{i}", at, session=f"s{i % 3}") for i in range(10)]))

    try:
        assert run_in_threads(8, work) == []

        assert sorted(b["accepted"] for b in bodies) == [0] * 7 + [10]
        assert sum(b["duplicates"] for b in bodies) == 70
        assert Step.objects.count() == 10 == StepReceipt.objects.count()
        sessions = Session.objects.filter(project=agent.project)
        assert sum(s.step_count for s in sessions) == 10
        assert sum(s.cost_usd for s in sessions) == cost() * 10
    finally:
        if partitioned():
            for month in months:
                step_partition_drop(month, droppable=lambda projects: True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_every_kept_step_its_receipt() -> None:
    """Steps stored before receipts get one each; an event_id stored in two months before
    (possible then on PostgreSQL) gets one receipt, its first step's."""
    before = ("costboard", "0027_session_recent_covers_user_and_id")
    after = ("costboard", "0028_step_receipts")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate([before])
    try:
        old = executor.loader.project_state([before]).apps
        project = old.get_model("costboard", "Project").objects.create(name="Old", slug="old")
        session = old.get_model("costboard", "Session").objects.create(
            project=project, external_id="s"
        )
        stored = [("e1", JAN_2042), ("e2", JAN_2042), (None, JAN_2042)]
        if partitioned():  # one index per month then: the same id in February was stored
            step_partitions_ensure(months=MONTHS_2042)
            stored.append(("e1", JAN_2042 + timedelta(days=1)))
        OldStep = old.get_model("costboard", "Step")
        for event_id, at in stored:
            OldStep.objects.create(
                project=project, session=session, event_id=event_id, timestamp=at, step_type="x"
            )

        MigrationExecutor(connection).migrate([after])

        receipts = StepReceipt.objects.filter(project_id=project.pk)
        assert sorted(receipts.values_list("event_id", "timestamp")) == [
            ("e1", JAN_2042),
            ("e2", JAN_2042),
        ]
    finally:
        MigrationExecutor(connection).migrate(latest)
        if partitioned():  # committed: they would outlive the test
            for month in MONTHS_2042:
                step_partition_drop(month, droppable=lambda projects: True)


@pytest.mark.django_db
def test_a_deleted_project_takes_its_receipts(agent: Agent, priced: Any) -> None:
    other = make_agent("other")
    agent.events(step("e1", JAN_31), step("e2", JAN_31))
    other.events(step("e1", JAN_31))
    agent.project.delete()
    assert list(StepReceipt.objects.values_list("project_id", "event_id")) == [
        (other.project.pk, "e1")
    ]


@pytest.mark.django_db
def test_a_replay_without_timestamps_leaves_its_session_and_turn_as_they_were(
    agent: Agent, priced: Any
) -> None:
    """A client retrying a batch days later (its events without `timestamp`, so timed when
    they arrive) changes nothing: its session and turn do not look active again."""
    import time_machine

    sent = JAN_31 - timedelta(days=3)
    batch: list[dict[str, Any]] = [
        {"type": "session", "session_id": "s", "user_id": "u1", "event_id": "open"},
        {"type": "turn", "session_id": "s", "turn": 1, "user_message": "hi", "event_id": "t1"},
        {**step("e1", JAN_31), "turn": 1},
    ]
    del batch[2]["timestamp"]
    with time_machine.travel(sent, tick=False):
        assert agent.events(*batch)["accepted"] == 3
    with time_machine.travel(JAN_31, tick=False):
        again = agent.events(*batch)
        assert (again["accepted"], again["duplicates"]) == (0, 3)
        # a fresh step, timed by the client an hour after the first batch, beside a replay
        later = step("e2", sent + timedelta(hours=1))
        assert agent.events(batch[2], later)["accepted"] == 1

    session = Session.objects.get(project=agent.project, external_id="s")
    assert (session.started_at, session.last_active_at) == (sent, sent + timedelta(hours=1))
    turn = session.turns.get()
    assert (turn.started_at, turn.last_active_at) == (sent, sent)
