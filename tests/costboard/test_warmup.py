"""A gunicorn worker's warm-up: the real ingest and budget read once, rolled back."""

from __future__ import annotations

import logging

import pytest
from django.apps import apps
from django.db import OperationalError, connection

from costboard import warmup
from costboard.warmup import worker_warm
from tests.conftest import add_price

pytestmark = pytest.mark.slow


def row_counts() -> dict[str, int]:
    return {
        model._meta.label: model._default_manager.count()
        for app in ("costboard", "memory_ui")
        for model in apps.get_app_config(app).get_models()
    }


@pytest.mark.django_db(transaction=True)
def test_the_warm_up_runs_ingest_and_stores_nothing(caplog: pytest.LogCaptureFixture) -> None:
    add_price("gpt-4o-mini", provider="openai")  # so the warm-up's step is priced, as in use
    before = row_counts()
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with caplog.at_level(logging.WARNING), connection.execute_wrapper(record):
        seconds = worker_warm()

    assert seconds > 0
    assert caplog.records == []  # it ran through, it did not fail quietly
    # the step insert and the session lock ran: the statements a real batch plans
    assert any("INSERT INTO costboard_step" in s for s in statements)
    assert any("FOR UPDATE" in s for s in statements) or connection.vendor == "sqlite"
    assert row_counts() == before  # every table as it was: the project, outbox, memory queue


@pytest.mark.django_db(transaction=True)
def test_a_warm_up_that_fails_is_logged_and_the_worker_serves(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(**_: object) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(warmup, "events_ingest", down)
    before = row_counts()
    with caplog.at_level(logging.WARNING):
        worker_warm()
    assert [r.getMessage() for r in caplog.records] == ["worker warm-up failed; serving cold"]
    assert row_counts() == before
