"""Ingest's plans on PostgreSQL: every session and turn a batch touches is found by its key,
whatever the planner believes of the tables' sizes. A hash or merge join (or a sequential
scan) reads every row of the table once per batch, and a table only grows: at 11k turns that
was 13 ms of a 500-session batch. The statements' plans are read with auto_explain."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from costboard.ingest.schemas import parse_events
from costboard.ingest.service import events_ingest
from costboard.partitions import step_partitions_cover
from tests.conftest import Agent

on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="reads PostgreSQL's plans (auto_explain)"
)

SESSIONS = 300  # a wide batch: one step from each


def wide_batch(prefix: str, turn: int) -> bytes:
    events = [
        {
            "event_id": f"{prefix}-{turn}-{i}",
            "session_id": f"{prefix}-s{i}",
            "turn": turn,
            "step_type": "response",
            "model": "gpt-4o-mini",
            "input_tokens": 100 + i,
            "output_tokens": 10,
        }
        for i in range(SESSIONS)
    ]
    return json.dumps({"events": events}).encode()


@pytest.fixture
def plans() -> Iterator[list[str]]:
    """The plan of every statement run on this connection meanwhile."""
    found: list[str] = []
    connection.ensure_connection()
    raw: Any = connection.connection

    def on_notice(diagnostic: Any) -> None:
        found.append(diagnostic.message_primary or "")

    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        cursor.execute("SET auto_explain.log_min_duration = 0")
        cursor.execute("SET auto_explain.log_level = notice")
        cursor.execute("SET client_min_messages = notice")
    raw.add_notice_handler(on_notice)
    try:
        yield found
    finally:
        raw.remove_notice_handler(on_notice)
        with connection.cursor() as cursor:
            cursor.execute("RESET auto_explain.log_min_duration")
            cursor.execute("RESET client_min_messages")


def stale_statistics() -> None:
    """The tables as the planner sees them on a fresh deployment: analyzed when nearly empty
    (autovacuum lags a growing table), so it takes a project's sessions and turns for a few
    and a batch's hundreds of keys for more than the table holds."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE costboard_session")
        cursor.execute("ANALYZE costboard_turn")


@on_postgres
@pytest.mark.django_db
def test_a_wide_batch_finds_its_sessions_and_turns_by_key(agent: Agent, plans: list[str]) -> None:
    stale_statistics()  # next to empty
    for turn in (1, 2):
        events_ingest(project=agent.project, events=parse_events(wide_batch("old", turn)))
    plans.clear()

    result = events_ingest(project=agent.project, events=parse_events(wide_batch("old", 3)))

    assert result.accepted == SESSIONS
    # the session and turn tables themselves (not the model mix, whose name starts alike)
    touching = [plan for plan in plans if re.search(r"\bcostboard_(session|turn)\b", plan)]
    assert len(touching) >= 4, plans  # the lock, the turns' read and insert, both updates
    for plan in touching:
        for wrong in (
            "Hash Join",
            "Merge Join",
            "Seq Scan on costboard_session",
            "Seq Scan on costboard_turn",
        ):
            assert wrong not in plan, plan
        assert "Materialize" not in plan, plan  # every session of the project, per key


def updates_of(table: str) -> tuple[int, int]:
    """This transaction's updates of `table` so far: all, and those PostgreSQL made HOT."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
            [table],
        )
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, 0)


@on_postgres
@pytest.mark.django_db
def test_a_wide_batch_rewrites_its_model_mix_in_place(agent: Agent) -> None:
    """Each touched session's model-mix row is rewritten once a batch, none of its indexed
    columns changed: with room kept on its page (migration 0023) every rewrite is a HOT update,
    with no new entry in the table's indexes. Packed full, as before, most were not."""
    events_ingest(project=agent.project, events=parse_events(wide_batch("mix", 1)))
    before, before_hot = updates_of("costboard_sessionmodelusage")

    result = events_ingest(project=agent.project, events=parse_events(wide_batch("mix", 2)))

    assert result.accepted == SESSIONS
    updates, hot = updates_of("costboard_sessionmodelusage")
    assert updates - before == SESSIONS  # one row per session: same family and model
    assert hot - before_hot == SESSIONS


@on_postgres
@pytest.mark.django_db
def test_a_batch_writes_its_new_turns_once(agent: Agent) -> None:
    """New turns are inserted after the steps with their final values (ids reserved first):
    no empty row made and then rewritten. The turns a batch goes on with are updated once."""
    before, _ = updates_of("costboard_turn")
    result = events_ingest(project=agent.project, events=parse_events(wide_batch("once", 1)))
    assert result.accepted == SESSIONS
    assert updates_of("costboard_turn")[0] == before  # 300 turns made, none rewritten

    more = json.loads(wide_batch("once", 1))
    for event in more["events"]:
        event["event_id"] += "-more"  # the same turns go on
    result = events_ingest(project=agent.project, events=parse_events(json.dumps(more).encode()))
    assert result.accepted == SESSIONS
    assert updates_of("costboard_turn")[0] - before == SESSIONS


@on_postgres
@pytest.mark.django_db
def test_ingest_s_statements_are_prepared_on_a_direct_connection(agent: Agent) -> None:
    """Connected directly, psycopg prepares a statement once it has run five times on the
    connection with the same parameter types (settings.py): from then on a batch's
    statements are neither parsed nor, mostly, planned again. Ingest's text is the same
    every batch, its values bound server-side, so its statements qualify. (A session's
    first batch sends some columns with other types; DDL, such as a month's partition,
    makes psycopg forget what it counted.)"""
    step_partitions_cover(days={timezone.now().date()}, now=timezone.now())
    for turn in range(1, 8):
        result = events_ingest(project=agent.project, events=parse_events(wide_batch("prep", turn)))
        assert result.accepted == SESSIONS

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%UPDATE costboard_session SET%'"
        )
        runs = [row[0] for row in cursor.fetchall()]
    assert len(runs) == 1 and runs[0] >= 1, runs  # prepared, and run as such
    # the prepared statement's answer: the same sums as before it was prepared
    assert result.sessions["prep-s7"]["tokens_used"] == 7 * (100 + 7 + 10)
