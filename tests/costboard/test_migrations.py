"""Every migration runs backward and forward again (on PostgreSQL in CI), and the models match
the migrations (make lint also runs `makemigrations --check`)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.conftest import add_price, make_agent


def tables() -> set[str]:
    return set(connection.introspection.table_names())


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
