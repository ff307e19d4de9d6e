"""Every migration runs backward and forward again (on PostgreSQL in CI), and the models match
the migrations (make lint also runs `makemigrations --check`)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.conftest import add_price, make_agent

pytestmark = pytest.mark.slow


def tables() -> set[str]:
    return set(connection.introspection.table_names())


def indexes(table: str) -> set[str]:
    """The table's indexes and constraints by name, as the database has them."""
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))


def leaf(app: str) -> tuple[str, str]:
    executor = MigrationExecutor(connection)
    [node] = [n for n in executor.loader.graph.leaf_nodes() if n[0] == app]
    return node


@pytest.mark.django_db(transaction=True)
def test_every_migration_goes_back_to_zero_and_forward_again() -> None:
    latest = [leaf("costboard"), leaf("memory_ui")]
    before = tables()
    assert {"costboard_session", "costboard_step", "memory_ui_memory"} <= before

    executor = MigrationExecutor(connection)
    executor.migrate([("costboard", None)])  # memory_ui depends on it: unapplied first
    gone = tables()
    assert not any(name.startswith(("costboard_", "memory_ui_")) for name in gone)

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    assert tables() == before

    # the schema works end to end after the round trip
    add_price("test-sonnet")
    agent = make_agent("round-trip")
    answer = agent.events(
        {"session_id": "s", "step_type": "x", "model": "test-sonnet", "input_tokens": 1000}
    )
    assert answer["sessions"]["s"]["cost_usd"] == "0.003"  # 1000 × $3 per million


@pytest.mark.django_db
def test_the_models_need_no_new_migration() -> None:
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_model_families_are_filled_for_what_was_stored_and_merged_back() -> None:
    """0013 gives stored steps, daily rollups and model-mix rows their family; a rollup whose
    steps were priced by two rows of different models is split, the larger family keeping
    what retention deleted; tool steps stop counting as unpriced. Backward, merged again."""
    from datetime import UTC, date, datetime
    from decimal import Decimal

    before_families = ("costboard", "0012_modelprice_daily_window")
    executor = MigrationExecutor(connection)
    latest = [leaf("costboard"), leaf("memory_ui")]
    executor.migrate([before_families])
    old = executor.loader.project_state([before_families]).apps
    Project = old.get_model("costboard", "Project")
    Session = old.get_model("costboard", "Session")
    Step = old.get_model("costboard", "Step")
    ModelPrice = old.get_model("costboard", "ModelPrice")
    DailyRollup = old.get_model("costboard", "DailyRollup")
    SessionModelUsage = old.get_model("costboard", "SessionModelUsage")

    project = Project.objects.create(name="Old", slug="old")
    session = Session.objects.create(project=project, external_id="s")
    openai = ModelPrice.objects.create(provider="openai", model="gpt-4o")
    azure = ModelPrice.objects.create(provider="azure", model="azure-4o-deploy")
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    dated = "gpt-4o-2024-08-06"
    for price, cost in [(openai, "0.01"), (openai, "0.02"), (azure, "0.04")]:
        Step.objects.create(
            project=project,
            session=session,
            timestamp=at,
            step_type="response",
            model=dated,
            price=price,
            input_tokens=10,
            cost_usd=Decimal(cost),
        )
    Step.objects.create(
        project=project, session=session, timestamp=at, step_type="tool", model="none"
    )
    day = date(2026, 3, 1)
    # one more gpt-4o-2024-08-06 call whose step retention deleted: 4 calls, $0.08
    DailyRollup.objects.create(
        project=project,
        day=day,
        model=dated,
        step_type="response",
        calls=4,
        input_tokens=40,
        cost_usd=Decimal("0.08"),
    )
    DailyRollup.objects.create(
        project=project, day=day, model="none", step_type="tool", calls=1, unpriced_calls=1
    )
    DailyRollup.objects.create(  # every step of it deleted
        project=project, day=day, model="claude-3-5-sonnet-20241022", step_type="x", calls=2
    )
    SessionModelUsage.objects.create(
        session=session, model=dated, calls=4, tokens_used=40, cost_usd=Decimal("0.08")
    )

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    new = executor.loader.project_state([leaf("costboard")]).apps
    NewStep = new.get_model("costboard", "Step")
    NewRollup = new.get_model("costboard", "DailyRollup")
    NewUsage = new.get_model("costboard", "SessionModelUsage")
    assert sorted(NewStep.objects.values_list("model", "family")) == [
        (dated, "azure-4o-deploy"),
        (dated, "gpt-4o"),
        (dated, "gpt-4o"),
        ("none", "none"),
    ]
    rollups = {
        (r.family, r.model): (r.calls, r.input_tokens, r.cost_usd, r.unpriced_calls)
        for r in NewRollup.objects.all()
    }
    assert rollups == {
        ("gpt-4o", dated): (3, 30, Decimal("0.04"), 0),  # its 2 steps and the deleted one
        ("azure-4o-deploy", dated): (1, 10, Decimal("0.04"), 0),
        ("none", "none"): (1, 0, Decimal(0), 0),  # a tool step: not unpriced
        ("claude-3-5-sonnet", "claude-3-5-sonnet-20241022"): (2, 0, Decimal(0), 0),
    }
    usage = {(u.family, u.model): (u.calls, u.cost_usd) for u in NewUsage.objects.all()}
    assert usage == {
        ("gpt-4o", dated): (3, Decimal("0.04")),
        ("azure-4o-deploy", dated): (1, Decimal("0.04")),
    }

    executor = MigrationExecutor(connection)
    executor.migrate([before_families])
    assert sorted(
        DailyRollup.objects.values_list("model", "calls", "cost_usd", "unpriced_calls")
    ) == [
        ("claude-3-5-sonnet-20241022", 2, Decimal(0), 0),
        (dated, 4, Decimal("0.08"), 0),
        ("none", 1, Decimal(0), 1),
    ]
    assert list(SessionModelUsage.objects.values_list("calls", "cost_usd")) == [
        (4, Decimal("0.08"))
    ]
    MigrationExecutor(connection).migrate(latest)


@pytest.mark.django_db(transaction=True)
def test_stored_memories_get_their_frame_key() -> None:
    """memory_ui 0004 fills frame_key for the memories already stored, as services would (empty
    for a sentence with no frame); the GiST index is made and dropped with it."""
    from memory_ui.conflicts import frame_key

    before = ("memory_ui", "0003_search_indexes_reviewers")
    executor = MigrationExecutor(connection)
    latest = [leaf("costboard"), leaf("memory_ui")]
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    project = old.get_model("costboard", "Project").objects.create(name="Old", slug="old")
    Memory = old.get_model("memory_ui", "Memory")
    texts = ["the staging database runs on port 5432", "Port 5433 for the staging database", "42"]
    for text in texts:
        Memory.objects.create(project=project, type="project", content=text)

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    new = executor.loader.project_state(latest).apps
    keys = dict(new.get_model("memory_ui", "Memory").objects.values_list("content", "frame_key"))
    assert keys == {text: frame_key(text) for text in texts}
    assert keys[texts[0]] and keys[texts[2]] == ""
    # a trigram index: PostgreSQL's alone (SQLite has no pg_trgm)
    made = "memory_content_trgm_gist" in indexes("memory_ui_memory")
    assert made == (connection.vendor == "postgresql")
    MigrationExecutor(connection).migrate([before])
    assert "memory_content_trgm_gist" not in indexes("memory_ui_memory")
    MigrationExecutor(connection).migrate(latest)


@pytest.mark.django_db(transaction=True)
def test_stored_memories_get_keys_that_keep_marks_and_symbols() -> None:
    """memory_ui 0006 reads the keys again: "दिन" and "दान" (vowel signs, combining marks) and
    "🚀" and "!!!" (no letter) had one fingerprint each pair; an eviction keeps its empty keys."""
    import hashlib

    from memory_ui.conflicts import frame_key
    from memory_ui.text import fingerprint

    before = ("memory_ui", "0005_session_turn_without_constraints")
    executor = MigrationExecutor(connection)
    latest = [leaf("costboard"), leaf("memory_ui")]
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    from costboard.models import Project  # costboard's tables stay at their latest

    project = Project.objects.create(name="Old", slug="old")
    Memory = old.get_model("memory_ui", "Memory")
    old_keys = {  # as the rule before stored them
        "दिन": hashlib.sha256("द न".encode()).hexdigest(),
        "दान": hashlib.sha256("द न".encode()).hexdigest(),
        "🚀": hashlib.sha256(b"").hexdigest(),
        "!!!": hashlib.sha256(b"").hexdigest(),
        "Deploys happen on Tuesdays": fingerprint("Deploys happen on Tuesdays"),
    }
    for text, key in old_keys.items():
        Memory.objects.create(project_id=project.pk, type="project", content=text, fingerprint=key)
    Memory.objects.create(project_id=project.pk, type="project", content="दिन", proposal="evict")

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    new = executor.loader.project_state(latest).apps
    rows = new.get_model("memory_ui", "Memory").objects
    keys = dict(rows.filter(proposal="new").values_list("content", "fingerprint"))
    assert keys == {text: fingerprint(text) for text in old_keys}
    assert len(set(keys.values())) == len(old_keys)
    frames = dict(rows.filter(proposal="new").values_list("content", "frame_key"))
    assert frames == {text: frame_key(text) for text in old_keys}
    assert frames["दिन"] != frames["दान"]
    assert rows.filter(proposal="evict").values_list("fingerprint", "frame_key").get() == ("", "")


@pytest.mark.django_db(transaction=True)
def test_sessions_get_the_families_of_their_model_mix() -> None:
    """0024 gives each stored session the families of its model-mix rows; a session without
    any keeps an empty object."""
    before = ("costboard", "0023_partial_parent_index_model_mix_fillfactor")
    latest = [leaf("costboard"), leaf("memory_ui")]
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    project = old.get_model("costboard", "Project").objects.create(name="Old", slug="old")
    Session = old.get_model("costboard", "Session")
    Usage = old.get_model("costboard", "SessionModelUsage")
    mixed = Session.objects.create(project=project, external_id="mixed")
    Session.objects.create(project=project, external_id="empty")
    for family, model in [
        ("gpt-4o", "gpt-4o-2024-08-06"),
        ("gpt-4o", "openai/gpt-4o"),
        ("claude-3-5-sonnet", "claude-3-5-sonnet-20241022"),
    ]:
        Usage.objects.create(project=project, session=mixed, family=family, model=model, calls=1)

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    new = executor.loader.project_state(latest).apps
    families = dict(
        new.get_model("costboard", "Session").objects.values_list("external_id", "families")
    )
    assert families == {"mixed": {"claude-3-5-sonnet": True, "gpt-4o": True}, "empty": {}}


@pytest.mark.django_db(transaction=True)
def test_sessions_stored_are_counted_in_their_projects_tallies() -> None:
    """0026 counts each project's stored sessions into its tally (on the day each started),
    beside the events already counted there."""
    from costboard.dashboards.selectors.sessions import sessions_total

    before = ("costboard", "0025_session_cost_index")
    latest = [leaf("costboard"), leaf("memory_ui")]
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    Project = old.get_model("costboard", "Project")
    Session = old.get_model("costboard", "Session")
    Tally = old.get_model("costboard", "IngestTally")
    one = Project.objects.create(name="One", slug="one")
    two = Project.objects.create(name="Two", slug="two")
    started = datetime(2026, 11, 20, 23, 30, tzinfo=UTC)
    for n in range(5):
        Session.objects.create(
            project=one, external_id=f"a{n}", started_at=started + timedelta(hours=n)
        )
    Session.objects.create(project=two, external_id="b", started_at=started)
    Tally.objects.create(project=one, day=started.date(), accepted=7)

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    new = executor.loader.project_state(latest).apps
    rows = new.get_model("costboard", "IngestTally").objects.filter(project_id=one.pk)
    assert sorted(rows.values_list("day", "accepted", "sessions_made")) == [
        (started.date(), 7, 1),
        (started.date() + timedelta(days=1), 0, 4),
    ]
    assert sessions_total(project_ids=[one.pk]) == 5
    assert sessions_total(project_ids=[one.pk, two.pk]) == 6


@pytest.mark.django_db(transaction=True)
def test_execute_tool_steps_and_their_rollups_become_tool_steps() -> None:
    """0030 stores OTLP's `execute_tool` steps as `tool`, the name as sent kept in their
    metadata; a daily or latency rollup row is added into its `tool` twin, or renamed."""
    from datetime import date
    from decimal import Decimal

    before = ("costboard", "0027_session_recent_covers_user_and_id")
    latest = [leaf("costboard"), leaf("memory_ui")]
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    project = old.get_model("costboard", "Project").objects.create(name="Old", slug="old")
    session = old.get_model("costboard", "Session").objects.create(project=project, external_id="s")
    Step = old.get_model("costboard", "Step")
    Daily = old.get_model("costboard", "DailyRollup")
    Latency = old.get_model("costboard", "LatencyRollup")
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    otlp = {"otlp": {"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "execute_tool search"}}
    for event_id, step_type, metadata in [
        ("otlp", "execute_tool", otlp),
        ("sent-with-metadata", "execute_tool", {"tool": "search"}),
        ("sent-bare", "execute_tool", None),
        ("tool", "tool", {"tool": "fetch"}),
        ("chat", "chat", None),
    ]:
        Step.objects.create(
            project=project,
            session=session,
            event_id=event_id,
            timestamp=at,
            step_type=step_type,
            model="none",
            metadata=metadata,
        )
    day, other_day = date(2026, 3, 1), date(2026, 3, 2)
    for when, step_type, calls, duration in [
        (day, "execute_tool", 3, 750),
        (day, "tool", 1, 100),
        (other_day, "execute_tool", 2, 40),
    ]:
        Daily.objects.create(
            project=project,
            day=when,
            family="none",
            model="none",
            step_type=step_type,
            calls=calls,
            errors=1,
            duration_ms=duration,
            cost_usd=Decimal("0.000001"),
        )
        Latency.objects.create(
            project=project, day=when, step_type=step_type, bucket=48, calls=calls
        )

    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    new = executor.loader.project_state(latest).apps
    steps = {
        s.event_id: (s.step_type, s.metadata)
        for s in new.get_model("costboard", "Step").objects.all()
    }
    assert steps == {
        "otlp": ("tool", {"otlp": {**otlp["otlp"], "operation": "execute_tool"}}),
        "sent-with-metadata": ("tool", {"tool": "search", "step_type_sent": "execute_tool"}),
        "sent-bare": ("tool", {"step_type_sent": "execute_tool"}),
        "tool": ("tool", {"tool": "fetch"}),
        "chat": ("chat", None),
    }
    daily = new.get_model("costboard", "DailyRollup").objects.order_by("day")
    assert list(daily.values_list("day", "step_type", "calls", "errors", "duration_ms")) == [
        (day, "tool", 4, 2, 850),
        (other_day, "tool", 2, 1, 40),
    ]
    assert [row.cost_usd for row in daily] == [Decimal("0.000002"), Decimal("0.000001")]
    latency = new.get_model("costboard", "LatencyRollup").objects.order_by("day")
    assert list(latency.values_list("day", "step_type", "bucket", "calls")) == [
        (day, "tool", 48, 4),
        (other_day, "tool", 48, 2),
    ]
