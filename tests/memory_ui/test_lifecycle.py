"""The lifecycle: TTL expiry, and eviction, merge and compression proposals that a person
approves (which applies them); run twice, nothing is proposed twice."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth import get_user_model

from costboard.celery import app as celery_app
from costboard.models import Project
from memory_ui import lifecycle, memory_file
from memory_ui.cleaners import MemoryFields
from memory_ui.lifecycle import lifecycle_run, scope_proposals
from memory_ui.memory_file import memory_md
from memory_ui.models import Memory, MemoryEvent
from memory_ui.text import fingerprint, similarity
from memory_ui.writes.decisions import memories_expire_due, memory_approve, memory_reject
from memory_ui.writes.proposals import candidate_propose

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
# no two of these are similar (trigram similarity below 0.3)
DISTINCT = [
    "Deploys happen on Tuesdays",
    "Invoices go out monthly",
    "Keep pull requests small",
    "Logs are kept in UTC",
    "Prefers metric units",
    "Release notes need a changelog entry",
    "Ask before running migrations",
    "Billing questions go to finance",
]


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Acme", slug="acme")


@pytest.fixture
def reviewer(db: None) -> Any:
    return get_user_model().objects.create_user("rita", password="pw-rita-123")


def remember(project: Project, content: str, **fields: Any) -> Memory:
    return Memory.objects.create(
        project=project,
        type=fields.pop("type", "user"),
        content=content,
        status="approved",
        decided_at=fields.pop("decided_at", NOW - timedelta(days=1)),
        fingerprint=fingerprint(content),
        **fields,
    )


def pending_proposals(project: Project, kind: str | None = None) -> list[Memory]:
    proposals = Memory.objects.filter(project=project, status="pending").exclude(proposal="new")
    if kind:
        proposals = proposals.filter(proposal=kind)
    return list(proposals.order_by("pk"))


def target_ids(memory: Memory) -> set[int]:
    return set(memory.targets.values_list("pk", flat=True))


# --- TTL ------------------------------------------------------------------------------------------


def test_ttl_expiry_expires_what_is_due_once(project: Project, reviewer: Any) -> None:
    week = candidate_propose(
        project=project, fields=MemoryFields.of(type="project", content="Freeze now", ttl_days=7)
    )
    month = candidate_propose(
        project=project, fields=MemoryFields.of(type="project", content="Q4 goal", ttl_days=30)
    )
    forever = candidate_propose(
        project=project, fields=MemoryFields.of(type="project", content="Use ruff")
    )
    assert week is not None and month is not None and forever is not None
    for memory in (week, month, forever):
        memory_approve(memory, by=reviewer, now=NOW)
    with time_machine.travel(NOW + timedelta(days=6), tick=False):
        assert memories_expire_due() == 0
    with time_machine.travel(NOW + timedelta(days=8), tick=False):
        assert memories_expire_due() == 1
        assert memories_expire_due() == 0  # run twice: nothing more
        assert memory_md(project).text == "[project] Use ruff\n[project] Q4 goal\n"
    week.refresh_from_db()
    assert week.status == "expired"
    event = week.events.get(action="expired")
    assert (event.actor, event.actor_name, event.note) == (None, "ttl", "TTL of 7 days ran out")
    assert event.at == NOW + timedelta(days=8)
    with time_machine.travel(NOW + timedelta(days=31), tick=False):
        assert lifecycle.memory_ttl_sweep.delay().get() == 1
    assert set(Memory.objects.values_list("content", "status")) == {
        ("Freeze now", "expired"),
        ("Q4 goal", "expired"),
        ("Use ruff", "approved"),
    }


# --- eviction -------------------------------------------------------------------------------------


def test_over_the_cap_the_cut_entries_are_proposed_for_eviction(
    project: Project, reviewer: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(memory_file, "MEMORY_MD_LINES", 3)
    kept = [remember(project, text, importance=Decimal("0.9")) for text in DISTINCT[:3]]
    low = [
        remember(project, "Rarely useful", importance=Decimal("0.2"), type="reference"),
        remember(project, "Never useful", importance=Decimal("0.1"), type="reference"),
    ]
    result = scope_proposals(project, "project", now=NOW)
    assert (result.evictions, result.merges, result.compressions) == (1, 0, 0)
    (proposal,) = pending_proposals(project)
    assert proposal.proposal == "evict" and proposal.status == "pending"
    assert target_ids(proposal) == {m.pk for m in low}
    assert proposal.content == "Evict 2 low-value entries: Rarely useful; Never useful"
    assert len(proposal.content) <= 150
    assert (proposal.type, proposal.scope, proposal.proposed_by) == (
        "reference",
        "project",
        "lifecycle",
    )
    assert proposal.events.get().action == "proposed"
    # run again: nothing new
    assert scope_proposals(project, "project", now=NOW).proposals == []
    assert pending_proposals(project) == [proposal]
    # approving applies it: the targets are expired, MEMORY.md is within its cap
    memory_approve(proposal, by=reviewer, now=NOW)
    assert set(
        Memory.objects.filter(pk__in=target_ids(proposal)).values_list("status", flat=True)
    ) == {"expired"}
    assert Memory.objects.get(pk=low[0].pk).events.get().action == "evicted"
    md = memory_md(project, now=NOW)
    assert (md.lines, md.cut_count) == (3, 0)
    assert all(m.content in md.text for m in kept)
    assert "Evict" not in md.text
    assert scope_proposals(project, "project", now=NOW).proposals == []


def test_a_waiting_eviction_is_brought_up_to_date_not_repeated(
    project: Project, monkeypatch: Any
) -> None:
    monkeypatch.setattr(memory_file, "MEMORY_MD_LINES", 2)
    first = [remember(project, DISTINCT[n], importance=Decimal(n + 1) / 10) for n in range(3)]
    scope_proposals(project, "project", now=NOW)
    (proposal,) = pending_proposals(project)
    assert target_ids(proposal) == {first[0].pk}
    newer = remember(project, DISTINCT[3], importance=Decimal("0.95"))
    result = scope_proposals(project, "project", now=NOW)
    assert result.proposals == [proposal.pk]
    (same,) = pending_proposals(project)
    assert same.pk == proposal.pk and same.times_proposed == 2
    assert target_ids(same) == {first[0].pk, first[1].pk}
    assert same.content.startswith("Evict 2 low-value entries: ")
    assert list(same.events.values_list("action", flat=True)) == ["proposed", "reproposed"]
    assert newer.pk not in target_ids(same)


def test_a_long_eviction_is_described_in_at_most_150_characters(
    project: Project, monkeypatch: Any
) -> None:
    monkeypatch.setattr(memory_file, "MEMORY_MD_LINES", 1)
    for n in range(30):
        remember(project, f"a rather long entry about topic number {n} that nobody reads")
    scope_proposals(project, "project", now=NOW)
    (proposal,) = pending_proposals(project, "evict")
    assert proposal.content.startswith("Evict 29 low-value entries: ")
    assert len(proposal.content) <= 150 and proposal.content.endswith("…")
    assert proposal.targets.count() == 29


# --- merge and compress ---------------------------------------------------------------------------


def test_duplicates_are_proposed_for_a_merge_and_approving_merges_them(
    project: Project, reviewer: Any
) -> None:
    weaker = remember(project, "The staging database is on port 5433 now", type="project")
    better = remember(
        project,
        "The staging database is on port 5433",
        type="reference",
        importance=Decimal("0.8"),
        tags=["db"],
    )
    other = remember(project, "Deploys happen on Tuesdays after the standup", type="project")
    result = scope_proposals(project, "project", now=NOW)
    assert (result.merges, result.compressions, result.evictions) == (1, 0, 0)
    (proposal,) = pending_proposals(project)
    assert proposal.proposal == "merge"
    assert target_ids(proposal) == {weaker.pk, better.pk}
    assert (proposal.content, proposal.type, proposal.importance, proposal.tags) == (
        "The staging database is on port 5433",
        "reference",
        Decimal("0.800"),
        ["db"],
    )
    assert "similarity 0.90" in proposal.events.get().note
    assert scope_proposals(project, "project", now=NOW).proposals == []  # run twice
    approved = memory_approve(proposal, by=reviewer, now=NOW)
    assert (approved.status, approved.proposal) == ("approved", "new")
    for target in (weaker, better):
        target.refresh_from_db()
        assert (target.status, target.merged_into) == ("merged", approved)
    md = memory_md(project, now=NOW)
    assert md.text.count("port 5433") == 1 and other.content in md.text
    assert scope_proposals(project, "project", now=NOW).proposals == []


COMPRESSIBLE = [
    "User prefers short answers with bullet points",
    "User prefers short answers without any preamble",
    "User prefers concise short answers",
]


def test_many_similar_entries_are_proposed_for_compression(project: Project, reviewer: Any) -> None:
    group = [remember(project, text, type="user") for text in COMPRESSIBLE]
    another_type = remember(project, "User prefers short answers in code review", type="feedback")
    result = scope_proposals(project, "project", now=NOW)
    assert (result.compressions, result.merges) == (1, 0)
    (proposal,) = pending_proposals(project)
    assert proposal.proposal == "compress"
    assert target_ids(proposal) == {m.pk for m in group}
    assert (proposal.content, proposal.type) == ("User prefers concise short answers", "user")
    assert scope_proposals(project, "project", now=NOW).proposals == []  # run twice
    memory_approve(proposal, by=reviewer, now=NOW)
    assert set(
        Memory.objects.filter(pk__in=[m.pk for m in group]).values_list("status", flat=True)
    ) == {"merged"}
    md = memory_md(project, now=NOW)
    assert md.text.count("User prefers") == 2 and another_type.content in md.text


def test_two_similar_entries_are_not_compressed(project: Project) -> None:
    for text in COMPRESSIBLE[:2]:
        remember(project, text)
    assert scope_proposals(project, "project", now=NOW).proposals == []
    remember(project, COMPRESSIBLE[2])  # positive control: the third makes a group
    assert len(scope_proposals(project, "project", now=NOW).proposals) == 1


def test_scopes_are_kept_apart(project: Project) -> None:
    remember(project, "The staging database is on port 5433")
    remember(project, "The staging database is on port 5433 now", scope="user:u-1")
    assert lifecycle_run(now=NOW).proposals == []
    # positive control: the same two sentences in one scope are proposed for merging
    remember(project, "The staging database is on port 5433 now")
    assert len(lifecycle_run(now=NOW).proposals) == 1


def test_the_whole_run_twice_proposes_once(project: Project, monkeypatch: Any) -> None:
    monkeypatch.setattr(memory_file, "MEMORY_MD_LINES", 5)
    for text in COMPRESSIBLE:
        remember(project, text)
    remember(project, "The staging database is on port 5433")
    remember(project, "The staging database is on port 5433 now")
    for text in DISTINCT[:3]:
        remember(project, text, importance=Decimal("0.1"))
    first = lifecycle_run(now=NOW)
    assert (first.compressions, first.merges, first.evictions) == (1, 1, 1)
    second = lifecycle_run(now=NOW)
    assert second.proposals == [] and len(pending_proposals(project)) == 3
    assert MemoryEvent.objects.filter(action="reproposed").count() == 0


def test_the_beat_tasks_are_registered_and_run(project: Project) -> None:
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {
        "memory_ui.lifecycle.memory_ttl_sweep",
        "memory_ui.lifecycle.memory_proposals_sweep",
    } <= names
    assert names <= set(celery_app.tasks)
    remember(project, "The staging database is on port 5433")
    remember(project, "The staging database is on port 5433 now")
    assert lifecycle.memory_proposals_sweep.delay().get() == 1
    assert len(pending_proposals(project, "merge")) == 1
    assert lifecycle.memory_proposals.delay(10**9).get() == {}  # a project gone: quietly


def test_a_rejected_merge_does_not_reject_its_sentence(project: Project, reviewer: Any) -> None:
    first = remember(project, "The staging database is on port 5433", importance=Decimal("0.9"))
    second = remember(project, "The staging database is on port 5433 now")
    scope_proposals(project, "project", now=NOW)
    (proposal,) = pending_proposals(project)
    memory_reject(proposal, by=reviewer, now=NOW)
    Memory.objects.filter(pk__in=[first.pk, second.pk]).update(status="expired")
    again = candidate_propose(
        project=project,
        fields=MemoryFields.of(type="project", content="The staging database is on port 5433"),
    )
    assert again is not None and again.status == "pending" and again.proposal == "new"


def test_at_most_max_pending_merges_wait_the_rest_come_after_decisions(
    project: Project, reviewer: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(lifecycle, "MAX_PENDING", 1)
    remember(project, "The staging database is on port 5433")
    remember(project, "The staging database is on port 5433 now")
    remember(project, "Invoices go out on the first Monday of the month")
    remember(project, "Invoices go out on the first Monday of each month")
    assert scope_proposals(project, "project", now=NOW).merges == 1
    assert scope_proposals(project, "project", now=NOW).merges == 0  # the queue is full
    (waiting,) = pending_proposals(project, "merge")
    memory_approve(waiting, by=reviewer, now=NOW)
    assert scope_proposals(project, "project", now=NOW).merges == 1
    (second,) = pending_proposals(project, "merge")
    assert not target_ids(second) & target_ids(waiting)


def test_similar_pairs_finds_exactly_the_pairs_every_comparison_would(monkeypatch: Any) -> None:
    rng = random.Random(5)
    words = ["deploy", "staging", "port", "database", "invoice", "monday", "ruff", "lint"]
    words += ["answer", "short", "user"]
    entries = {
        pk: lifecycle.Entry(
            pk=pk,
            type="user",
            content=" ".join(rng.choices(words, k=rng.randint(2, 6))),
            importance=Decimal("0.5"),
            source="agent_inferred",
            times_proposed=1,
            tags=[],
            ttl_days=None,
            at=NOW,
        )
        for pk in range(1, 150)
    }
    expected = {
        (a.pk, b.pk): similarity(a.content, b.content)
        for a, b in itertools.combinations(entries.values(), 2)
        if similarity(a.content, b.content) >= 0.3
    }
    monkeypatch.setattr(lifecycle, "MAX_NEIGHBOURS", 10_000)
    pairs = lifecycle.similar_pairs(entries, threshold=0.3)
    assert {(a, b): score for a, b, score in pairs} == expected
    assert [p[2] for p in pairs] == sorted((p[2] for p in pairs), reverse=True)
    # however alike the entries, each keeps its most similar few
    monkeypatch.setattr(lifecycle, "MAX_NEIGHBOURS", 3)
    capped = lifecycle.similar_pairs(entries, threshold=0.3)
    assert len(capped) <= 3 * len(entries) < len(expected)
    assert {(a, b) for a, b, _ in capped} <= set(expected)
