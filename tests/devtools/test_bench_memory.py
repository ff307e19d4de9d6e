"""bench_memory on tiny sizes: every figure printed (search only on PostgreSQL), its own
project deleted afterwards."""

from __future__ import annotations

import random
import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from costboard.models import Project
from devtools import memory_bench as bench
from memory_ui.models import Memory

pytestmark = pytest.mark.django_db

TINY = {"memories": 200, "runs": 3, "messages": 300, "queries": 20}


def run(**options: Any) -> str:
    out, err = StringIO(), StringIO()
    call_command("bench_memory", stdout=out, stderr=err, **{**TINY, **options})
    return out.getvalue()


@pytest.mark.slow
def test_bench_memory_prints_each_figure_and_cleans_up() -> None:
    report = run()
    assert "data:       200 approved memories in one scope" in report
    rate = re.search(r"detection:  ([\d,]+) messages/s on one core \(300 turns", report)
    assert rate is not None and int(rate.group(1).replace(",", "")) > 0, report
    md = re.search(
        r"MEMORY\.md:  p50 [\d.]+ ms, p95 ([\d.]+) ms, max [\d.]+ ms over 3 runs", report
    )
    assert md is not None, report
    assert "(200 lines, " in report and "0 entries cut" in report
    if connection.vendor == "postgresql":
        assert re.search(r"search:     p50 [\d.]+ ms, p95 [\d.]+ ms, .* over 20 varied", report)
    else:
        assert "search:     not measured on sqlite" in report and "DATABASE_URL=postgres" in report
    lookup = re.search(
        r"lookup:     p50 [\d.]+ ms, p95 [\d.]+ ms, .* over 20 proposals' "
        r".*\((\d+) found a contradiction\)",
        report,
    )
    assert lookup is not None and int(lookup.group(1)) > 0, report
    review = re.search(
        r"review:     p50 [\d.]+ ms, .* over 3 renderings of /memory/review/ "
        r"with 50 candidates \((\d+) contradicting",
        report,
    )
    assert review is not None and int(review.group(1)) > 0, report
    assert re.search(r"aside:      p50 [\d.]+ ms, p95 [\d.]+ ms, .* over 50 candidates'", report)
    assert not Project.objects.filter(slug__startswith="bench-memory-").exists()
    assert not Memory.objects.exists()


def test_lookup_sentences_contradict_repeat_and_miss_what_is_stored() -> None:
    from memory_ui.conflicts import conflict, same_meaning

    stored = ["The staging billing database is on port 5124 (#17)"]
    made = bench.lookup_sentences(stored, 4, random.Random(1))
    assert conflict(made[0], stored[0]) == "differs in a number, date or version"
    assert same_meaning(made[1], stored[0])  # a filler word added
    assert conflict(made[2], stored[0]) is None and not same_meaning(made[2], stored[0])


@pytest.mark.slow
def test_keep_leaves_the_project_and_strict_fails_a_missed_target(monkeypatch: Any) -> None:
    run(keep=True, memories=20)
    kept = Project.objects.get(slug__startswith="bench-memory-")
    assert Memory.objects.filter(project=kept, status="approved").count() == 20
    # only MEMORY.md's target can be missed: the others out of reach of a busy machine
    monkeypatch.setattr(bench, "DETECT_TARGET_PER_S", 0.0)
    monkeypatch.setattr(bench, "SEARCH_TARGET_MS", float("inf"))
    monkeypatch.setattr(bench, "LOOKUP_TARGET_MS", float("inf"))
    monkeypatch.setattr(bench, "REVIEW_TARGET_MS", float("inf"))
    monkeypatch.setattr(bench, "MEMORY_MD_TARGET_MS", 0.0)
    with pytest.raises(CommandError, match=r"missed the target: MEMORY\.md$"):
        run(strict=True)


@pytest.mark.slow
def test_detection_not_importable_is_said_not_fatal(monkeypatch: Any) -> None:
    def missing(options: Any, rng: Any) -> Any:
        raise ImportError("No module named 'memory_ui.detect'")

    monkeypatch.setattr(bench, "detect_bench", missing)
    assert "detection:  not measured: memory_ui.detect is not importable" in run()


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(CommandError, match="--memories must be at least 1"):
        call_command("bench_memory", memories=0)


def test_the_generated_search_queries_are_varied() -> None:
    rng = random.Random(1)
    contents = [row.fields.content for row in bench.memory_rows(Project(pk=1), 50, rng)]
    queries = bench.search_queries(contents, 40, rng)
    assert len(set(queries)) > 20
    assert any(q.startswith('"') for q in queries)
    assert len({len(q.split()) for q in queries}) >= 2
