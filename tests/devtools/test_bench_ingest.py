"""bench_ingest end to end, small: a real gunicorn on the test database, totals verified."""

from __future__ import annotations

import re
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from costboard.models import Project, Step
from costboard.replicas import LAG_UNKNOWN
from devtools.replica_lag import lag_line
from tests.conftest import add_price

on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="bench_ingest is defined on PostgreSQL (CI)"
)


@pytest.mark.slow
@on_postgres
@pytest.mark.django_db(transaction=True)
def test_bench_ingest_posts_verifies_and_compares_with_copy() -> None:
    add_price("claude-sonnet-4-5", provider="anthropic")
    add_price("gpt-4o-mini", provider="openai")
    out, err = StringIO(), StringIO()
    call_command(
        "bench_ingest",
        events=3000,
        batch=500,
        clients=2,
        workers=1,
        warmup=1,
        spread=100,
        single=20,
        minimal=True,
        stdout=out,
        stderr=err,
    )
    report = out.getvalue()
    assert "verified:   every request 200" in report, report + err.getvalue()
    rate = re.search(r"ingest:\s+([\d,]+) events/s", report)
    assert rate is not None and int(rate.group(1).replace(",", "")) > 0
    copy = re.search(r"raw COPY:\s+([\d,]+) rows/s, the same 3,000 rows", report)
    assert copy is not None, report
    assert re.search(r"ratio:\s+0\.\d{3} of raw COPY", report)
    assert "in 6 requests of 500 from 100 sessions each" in report, report
    assert "; Prefer: return=minimal" in report
    # The one-step posts (first, on the cold server) are in the verified totals.
    assert re.search(
        r"one step:\s+20 one-step posts in a row on the server just started, p50 [\d.]+ ms, p95 ",
        report,
    )
    assert re.search(r"budget:\s+20 budget reads in a row, p50 [\d.]+ ms, .*, max ", report)
    # The bench project is deleted afterwards, its steps with it.
    assert not Project.objects.filter(slug__startswith="bench-").exists()
    assert not Step.objects.exists()


@pytest.mark.django_db
def test_bench_ingest_refuses_another_database_with_the_fix(monkeypatch: Any) -> None:
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(CommandError, match="DATABASE_URL=postgres://"):
        call_command("bench_ingest", events=10)


def test_the_replica_line_gives_the_lag_percentiles_and_counts_the_unknown_apart() -> None:
    samples = [Decimal(0), Decimal("0.250"), Decimal("1.5"), LAG_UNKNOWN, Decimal(0)]
    assert lag_line(samples, 0.1) == (
        "replica:    lag over 5 samples every 0.1 s: p50 0.250 s, p95 1.500 s, max 1.500 s;"
        " 1 with nothing replayed yet"
    )
    assert lag_line([LAG_UNKNOWN, LAG_UNKNOWN], 0.1) == (
        "replica:    2 samples, none with a transaction replayed yet"
    )
    assert lag_line([Decimal(0)], 0.1, lost="server closed the connection") == (
        "replica:    lag over 1 samples every 0.1 s: p50 0.000 s, p95 0.000 s, max 0.000 s;"
        " then it stopped answering: server closed the connection"
    )


@on_postgres
def test_bench_ingest_refuses_a_replica_url_that_is_not_a_standby() -> None:
    """Before anything is built or started: the test database's own server is a primary."""
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    with pytest.raises(CommandError, match=r"is not a standby .* pg_basebackup -R"):
        call_command("bench_ingest", events=10, replica=url)
