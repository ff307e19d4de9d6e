"""bench_pages on a small data set: a line per page with its times, queries and size."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from devtools.page_bench import page_cases
from memory_ui.cleaners import MemoryFields
from memory_ui.writes import decisions, proposals
from tests.conftest import Agent
from tests.costboard.dashboards.test_dashboards import priced, traffic  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

ROW = re.compile(
    r"^(?P<name>.+?)\s+(?P<p50>\d+\.\d)\s+(?P<p95>\d+\.\d)\s+(?P<max>\d+\.\d)\s+"
    r"(?P<queries>\d+)\s+(?P<kb>\d+\.\d)\s+(?P<path>/\S*)(?P<flag>.*)$"
)


@pytest.mark.slow
def test_bench_pages_times_every_page_and_fragment(agent: Agent, priced: None) -> None:  # noqa: F811
    traffic(agent, sessions=4, turns=3)
    kept = proposals.candidate_propose(
        project=agent.project, fields=MemoryFields.of(type="user", content="Likes tea")
    )
    assert kept is not None
    decisions.memory_approve(kept, by=None)
    proposals.candidate_propose(
        project=agent.project, fields=MemoryFields.of(type="project", content="Deploy on Fridays")
    )
    out = StringIO()
    # a target no machine misses: this test reads the report, it does not time the pages
    call_command("bench_pages", runs=3, warmup=0, target_ms=600_000, stdout=out, stderr=StringIO())
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("data: 24 steps, 4 sessions, 12 turns in 1 projects")
    rows = [m for line in lines if (m := ROW.match(line))]
    cases = page_cases()
    assert [m["path"] for m in rows] == [c.path for c in cases]
    assert {m["name"] for m in rows} >= {
        "overview, all projects",
        "overview, one project",
        "sessions",
        "sessions, state=exhausted",
        "sessions, by model",
        "sessions, sorted by cost",
        "sessions, page 100",
        "sessions, last page",
        "sessions table (htmx)",
        "sessions CSV, warning",
        "session, most steps",
        "session, typical",
        "flagged",
        "flagged, one project",
        "flagged list, exhausted (htmx)",
        "steps",
        "steps, one type",
        "steps results (htmx)",
        "memory review",
        "memory review list, one type (htmx)",
        "memory browser",
        "memory browser, search",
        "memory metrics",
    }
    assert "/memory/review/" in [m["path"] for m in rows]
    assert "/sessions/?model=test-" in "".join(m["path"] for m in rows)
    for m in rows:
        assert 0 < float(m["p50"]) <= float(m["p95"]) <= float(m["max"])
        assert 1 <= int(m["queries"]) <= 16, m.group(0)  # the overview: 16 (anomalies, alerts)
        assert float(m["kb"]) > 0
        assert "HTTP" not in m["flag"]
    assert lines[-1].startswith(f"{len(cases)} of {len(cases)} pages under 600000 ms p95")


@pytest.mark.slow
def test_bench_pages_flags_a_page_over_the_target(agent: Agent, priced: None) -> None:  # noqa: F811
    traffic(agent, sessions=1, turns=1)
    out = StringIO()
    with pytest.raises(CommandError, match="pages missed the target"):
        call_command(
            "bench_pages",
            runs=1,
            warmup=0,
            target_ms=0.001,
            strict=True,
            stdout=out,
            stderr=StringIO(),
        )
    assert out.getvalue().count("OVER 0 ms") == len(page_cases())


def test_bench_pages_asks_for_data_on_an_empty_database() -> None:
    with pytest.raises(CommandError, match="seed_demo --steps 1000000"):
        call_command("bench_pages", stdout=StringIO())


@pytest.mark.slow
def test_bench_pages_needs_no_collectstatic(
    agent: Agent,
    priced: None,  # noqa: F811
    settings: Any,
    tmp_path: Path,
) -> None:
    """With the production storage (hashed names from a manifest) and nothing collected, as
    on a checkout where `make run` never ran, every page is still timed, each a 200."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    settings.STATIC_ROOT = tmp_path  # no manifest in it
    settings.DEBUG = False
    traffic(agent, sessions=2, turns=2)
    out = StringIO()
    call_command("bench_pages", runs=1, warmup=0, target_ms=600_000, stdout=out, stderr=StringIO())
    rows = [m for line in out.getvalue().splitlines() if (m := ROW.match(line))]
    assert len(rows) == len(page_cases())
    assert not [m["name"] for m in rows if "FAIL" in m["flag"] or "HTTP" in m["flag"]]


on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="its worker processes connect to the database"
)

COMPARED = re.compile(
    r"^(?P<name>.+?)\s+(?P<h50>\d+\.\d)\s+(?P<h95>\d+\.\d)\s+(?P<t50>\d+\.\d)\s+(?P<t95>\d+\.\d)"
    r"\s+(?P<r50>\d+\.\d\d)\s+(?P<r95>\d+\.\d\d)\s+(?P<hq>\d+)\s+(?P<tq>\d+)(?P<flag>.*)$"
)


@pytest.mark.slow
@on_postgres
@pytest.mark.django_db(transaction=True)  # committed: the two worker processes read it
def test_against_times_every_page_on_both_databases_in_turn(
    agent: Agent,
    priced: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    traffic(agent, sessions=4, turns=3)
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    monkeypatch.setenv("DATABASE_URL", url)
    out = StringIO()
    call_command(
        "bench_pages", runs=4, warmup=0, rounds=2, against=url, stdout=out, stderr=StringIO()
    )
    lines = out.getvalue().splitlines()
    rows = [m for line in lines if (m := COMPARED.match(line))]
    assert [m["name"] for m in rows] == [case.name for case in page_cases()]
    assert all(m["flag"] == "" for m in rows)  # every page 200 on both sides
    assert all(m["hq"] == m["tq"] for m in rows)  # one database: the same queries
    assert re.match(rf"\d+ of {len(rows)} pages within 1\.20× at p95", lines[-1])


def test_against_needs_the_first_database_in_database_url(
    agent: Agent,
    priced: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    traffic(agent, sessions=1, turns=1)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(CommandError, match="set DATABASE_URL"):
        call_command("bench_pages", against="postgres://x/y", stdout=StringIO())
