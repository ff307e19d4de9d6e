"""bench_otlp end to end, small: exports posted to a real gunicorn on the test database, the
stored steps and cost checked against what was sent."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from costboard.models import Project, Step
from tests.conftest import add_price

on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="bench_otlp is defined on PostgreSQL (CI)"
)


@pytest.mark.slow
@on_postgres
@pytest.mark.django_db(transaction=True)
def test_bench_otlp_posts_both_shapes_and_verifies() -> None:
    add_price("claude-sonnet-4-5", provider="anthropic")
    out, err = StringIO(), StringIO()
    call_command("bench_otlp", spans=30, runs=2, sessions=4, stdout=out, stderr=err)
    report = out.getvalue()
    assert "verified:   every export 200, none rejected" in report, report + err.getvalue()
    assert "2 exports of 30 spans per shape" in report
    for shape in ("trace", "traces"):
        line = re.search(
            rf"^{shape}:\s+median ([\d.]+) s, runs ([\d.]+) / ([\d.]+) s", report, re.M
        )
        assert line is not None, report
    assert "4 sessions" in report
    # the bench project is deleted afterwards, its steps with it
    assert not Project.objects.filter(slug__startswith="otlp-").exists()
    assert not Step.objects.exists()


@pytest.mark.django_db
def test_bench_otlp_refuses_bad_options() -> None:
    if connection.vendor != "postgresql":
        with pytest.raises(CommandError, match="bench_otlp is defined on PostgreSQL"):
            call_command("bench_otlp")
        return
    with pytest.raises(CommandError, match="--spans must be 1 to 10000"):
        call_command("bench_otlp", spans=10_001)
    with pytest.raises(CommandError, match="--runs must be at least 1"):
        call_command("bench_otlp", runs=0)
