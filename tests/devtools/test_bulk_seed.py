"""seed_bulk: the same events stored by the real ingest and by the seeder's COPY and set-based
rebuild leave every total and rollup equal, row for row; a second run adds; bad input is
refused by name."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Model, Sum

from costboard.ingest.schemas import Event, validate_event
from costboard.ingest.service import events_ingest
from costboard.models import (
    BudgetEvent,
    DailyRollup,
    EventReceipt,
    IngestTally,
    LatencyRollup,
    PeriodLedger,
    Project,
    Session,
    SessionModelUsage,
    Step,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from devtools.bulk_seed import Workload, seed_bulk, workload_events
from tests.conftest import add_price

on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="seed_bulk writes with PostgreSQL's COPY"
)

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def _prices() -> None:
    """The seeder's models, at rates with many decimals, one with a context window, the
    other priced only from 20 October (earlier steps unpriced) and dearer from the 28th (each
    step priced at its own time)."""
    add_price(
        "claude-sonnet-4-5",
        provider="anthropic",
        input_mtok=Decimal("3.000001"),
        output_mtok=Decimal("15.3333337"),
        context_window=200_000,
    )
    for since, rate in ((20, "0.15"), (28, "0.1777777")):
        add_price(
            "gpt-4o-mini",
            provider="openai",
            input_mtok=Decimal(rate),
            effective_from=datetime(2026, 10, since, tzinfo=UTC),
        )


def _valid(raw: dict[str, Any]) -> Event:
    event, errors = validate_event(0, raw)
    assert event is not None, errors
    return event


def _rows(model: type[Model], project: Project, **keys: str) -> list[tuple[Any, ...]]:
    """The project's rows of this table, without ids or project, the foreign keys named in
    `keys` replaced by what identifies them across projects, sorted."""
    skip = {"id", "project", *keys}
    names = [
        f.attname
        for f in model._meta.concrete_fields
        if f.name not in skip and f.attname != "project_id"
    ]
    values = model._default_manager.filter(project=project).values_list(*names, *keys.values())
    return sorted(values, key=repr)


COMPARED: list[tuple[type[Model], dict[str, str]]] = [
    (Session, {"parent": "parent__external_id"}),
    (Turn, {"session": "session__external_id"}),
    (Step, {"session": "session__external_id", "turn": "turn__number"}),
    (SessionModelUsage, {"session": "session__external_id"}),
    (DailyRollup, {}),
    (UserDailyRollup, {}),
    (TagDailyRollup, {}),
    (LatencyRollup, {}),
    (IngestTally, {}),
]


@pytest.mark.slow
@on_postgres
@pytest.mark.django_db
def test_the_seeder_stores_what_ingest_stores_for_the_same_events() -> None:
    _prices()
    workload = Workload(run="same", steps=2_950, days=30, now=NOW)  # the last session: 50
    ingested = Project.objects.create(name="Ingested", slug="ingested")
    for events in workload_events(workload):
        for start in range(0, len(events), 40):  # batches that split sessions and turns
            events_ingest(
                project=ingested, events=[_valid(e) for e in events[start : start + 40]], now=NOW
            )

    result = seed_bulk(steps=2_950, slug="seeded", days=30, run="same", now=NOW)
    seeded = result.project
    assert (result.steps, result.sessions, result.turns) == (2_950, 30, 590)
    assert result.over_caps == 0

    months = {
        d.month for d in DailyRollup.objects.filter(project=seeded).values_list("day", flat=True)
    }
    assert months == {10, 11}
    for model, keys in COMPARED:
        assert _rows(model, seeded, **keys) == _rows(model, ingested, **keys), model.__name__
    # what the seeder does not write, ingest did not write either for these events
    for model in (EventReceipt, BudgetEvent, PeriodLedger):
        assert not model._default_manager.filter(project=ingested).exists(), model.__name__
    # not vacuous: the tables compared hold what the workload made
    assert Turn.objects.filter(project=seeded, context_window=200_000).exists()
    assert Turn.objects.filter(project=seeded, repeat_peak__gt=1).exists()
    assert TagDailyRollup.objects.filter(project=seeded, key="team").count() > 4
    mini = Step.objects.filter(project=seeded, model="gpt-4o-mini")
    assert mini.values("price").distinct().count() == 3  # none, then each row in turn
    assert _sums(DailyRollup, seeded, "unpriced_calls")["unpriced_calls"] > 0


def _sums(model: type[Model], project: Project, *names: str) -> dict[str, Any]:
    return model._default_manager.filter(project=project).aggregate(
        **{name: Sum(name) for name in names}
    )


USAGE = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cost_usd")


@on_postgres
@pytest.mark.django_db
def test_a_second_run_adds_and_every_rollup_stays_the_sum_of_its_steps() -> None:
    _prices()
    first = seed_bulk(steps=1_000, days=40, run="one", now=NOW)
    assert first.api_key is not None  # made, with a key
    again = seed_bulk(steps=1_000, days=40, run="two", now=NOW)
    assert again.api_key is None and again.project == first.project
    project = first.project
    assert Step.objects.filter(project=project).count() == 2_000
    assert Session.objects.filter(project=project).count() == 20
    steps = _sums(Step, project, *USAGE)
    for model in (Session, Turn, DailyRollup, UserDailyRollup):
        assert _sums(model, project, *USAGE) == steps, model.__name__
    assert _sums(Session, project, "step_count", "turn_count") == {
        "step_count": 2_000,
        "turn_count": 400,
    }
    assert _sums(DailyRollup, project, "calls")["calls"] == 2_000
    assert _sums(LatencyRollup, project, "calls")["calls"] == 2_000
    assert _sums(SessionModelUsage, project, "calls", "cost_usd") == {
        "calls": 2_000,
        "cost_usd": steps["cost_usd"],
    }
    # every step carries two tags (team and env): each tag's rollups hold every step
    assert _sums(TagDailyRollup, project, "calls")["calls"] == 4_000
    tally = IngestTally.objects.get(project=project)
    assert (tally.day, tally.accepted) == (NOW.date(), 2_020)  # steps and session events


@on_postgres
@pytest.mark.django_db
def test_days_ago_puts_a_run_behind_the_last_one() -> None:
    """The growth benchmark's history: a month, then nine months before it."""
    _prices()
    seed_bulk(steps=500, days=30, run="recent", now=NOW)
    seed_bulk(steps=2_000, days=270, days_ago=30, run="history", now=NOW)
    month_start = NOW - timedelta(days=30)
    recent = Step.objects.filter(session__external_id__startswith="recent-")
    history = Step.objects.filter(session__external_id__startswith="history-")
    assert recent.count() == 500 and history.count() == 2_000
    assert recent.filter(timestamp__lt=month_start).count() == 0
    assert history.filter(timestamp__gte=month_start).count() == 0
    assert history.filter(timestamp__lt=NOW - timedelta(days=300)).count() == 0
    # it reaches back most of the nine months, so their month partitions are made and used
    assert history.filter(timestamp__lt=NOW - timedelta(days=240)).exists()
    project = Project.objects.get(slug="bulk")
    assert _sums(DailyRollup, project, "calls")["calls"] == 2_500
    with pytest.raises(ValueError, match="--days-ago must be 0"):
        seed_bulk(steps=10, days_ago=-1, run="bad", now=NOW)


@on_postgres
@pytest.mark.django_db
def test_a_run_already_seeded_is_refused() -> None:
    _prices()
    seed_bulk(steps=10, run="once", now=NOW)
    with pytest.raises(ValueError, match="run once was already seeded"):
        seed_bulk(steps=10, run="once", now=NOW)


@pytest.mark.django_db
@pytest.mark.parametrize("steps", ["0", "-5"])
def test_steps_must_be_positive(steps: str) -> None:
    with pytest.raises(CommandError, match="--steps must be at least 1"):
        call_command("seed_bulk", "--steps", steps, stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_sqlite_is_refused_naming_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(CommandError, match="DATABASE_URL=postgres://"):
        call_command("seed_bulk", "--steps", "10", stdout=StringIO(), stderr=StringIO())


@on_postgres
@pytest.mark.django_db
def test_days_must_be_positive() -> None:
    with pytest.raises(CommandError, match="--days must be at least 1"):
        call_command(
            "seed_bulk", "--steps", "10", "--days", "0", stdout=StringIO(), stderr=StringIO()
        )


@on_postgres
@pytest.mark.django_db
def test_the_command_makes_the_project_and_reports_each_phase() -> None:
    _prices()
    out = StringIO()
    call_command(
        "seed_bulk",
        "--steps",
        "250",
        "--project",
        "cmd",
        "--no-progress",
        stdout=out,
        stderr=StringIO(),
    )
    report = out.getvalue()
    assert "made project cmd; its API key: cb_" in report
    assert re.search(
        r"seeded 250 steps, 3 sessions, 50 turns into cmd in [\d.]+ s: "
        r"copy [\d.]+ s \([\d,]+ rows/s\), rollups [\d.]+ s \([\d,]+ steps/s\), "
        r"analyze [\d.]+ s \([\d,]+ steps/s\)",
        report,
    ), report
