"""Proposing, deciding and serving memories: duplicates merged, rejected sentences kept out,
every decision in the history, and MEMORY.md at its caps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from costboard.models import Project
from memory_ui import services
from memory_ui.models import Memory, MemoryEvent
from memory_ui.services import (
    MemoryInputError,
    candidate_propose,
    memory_approve,
    memory_edit,
    memory_expire,
    memory_md,
    memory_reject,
)
from tests.conftest import make_agent, run_in_threads

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Acme", slug="acme")


@pytest.fixture
def reviewer(db: None) -> Any:
    return get_user_model().objects.create_user("rita", password="pw-rita-123")


def propose(project: Project, content: str, **fields: Any) -> Memory | None:
    return candidate_propose(
        project=project, type=fields.pop("type", "feedback"), content=content, now=NOW, **fields
    )


def actions(memory: Memory) -> list[str]:
    return list(memory.events.values_list("action", flat=True))


def test_a_candidate_is_pending_with_its_fingerprint_and_history(project: Project) -> None:
    memory = propose(project, "  Always use ruff,   never black. ", importance="0.7")
    assert memory is not None
    assert (memory.status, memory.content, memory.importance) == (
        "pending",
        "Always use ruff, never black.",
        Decimal("0.700"),
    )
    assert memory.fingerprint == services.fingerprint("always use RUFF never black")
    assert actions(memory) == ["proposed"]


def test_the_same_sentence_again_is_merged_and_weighs_more(project: Project) -> None:
    first = propose(project, "Always use ruff, never black.", importance="0.6")
    again = propose(project, "always use ruff — never black", importance="0.5")
    assert again is not None and first is not None and again.pk == first.pk
    assert (again.times_proposed, again.importance) == (2, Decimal("0.650"))
    assert Memory.objects.count() == 1
    assert actions(again) == ["proposed", "reproposed"]


def test_a_near_duplicate_is_merged_too_but_not_across_scopes(project: Project) -> None:
    first = propose(project, "The staging database is on port 5433")
    near = propose(project, "The staging database is on port 5433 now")
    assert near is not None and first is not None and near.pk == first.pk
    other = propose(project, "The staging database is on port 5433", scope="user:u-1")
    assert other is not None and other.pk != first.pk
    different = propose(project, "Deploys happen on Tuesdays after the standup")
    assert different is not None and different.pk != first.pk


def test_a_rejected_sentence_does_not_come_back(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Use tabs for indentation")
    assert memory is not None
    memory_reject(memory, by=reviewer, now=NOW)
    assert propose(project, "use tabs for indentation!") is None
    assert Memory.objects.count() == 1
    memory.refresh_from_db()
    assert actions(memory) == ["proposed", "rejected"]
    event = memory.events.get(action="rejected")
    assert (event.actor, event.actor_name) == (reviewer, "rita")


def test_approval_sets_the_expiry_and_edits_keep_before_and_after(
    project: Project, reviewer: Any
) -> None:
    memory = propose(project, "Release freeze starts March 3", type="project", ttl_days=30)
    assert memory is not None
    memory = memory_approve(memory, by=reviewer, now=NOW)
    assert (memory.status, memory.decided_by, memory.expires_at) == (
        "approved",
        reviewer,
        NOW + timedelta(days=30),
    )
    memory = memory_edit(
        memory, by=reviewer, now=NOW, content="Release freeze starts March 4", importance="0.9"
    )
    edit = memory.events.get(action="edited")
    assert edit.before == {"content": "Release freeze starts March 3", "importance": "0.500"}
    assert edit.after == {"content": "Release freeze starts March 4", "importance": "0.900"}
    assert memory.fingerprint == services.fingerprint("Release freeze starts March 4")
    memory_expire(memory, by=reviewer, now=NOW)
    memory.refresh_from_db()
    assert memory.status == "expired"
    assert actions(memory) == ["proposed", "approved", "edited", "expired"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("content", "x" * 151),
        ("content", "   "),
        ("type", "preference"),
        ("scope", "team:a"),
        ("importance", "1.5"),
        ("importance", True),
        ("tags", "billing"),
        ("ttl_days", 0),
    ],
)
def test_bad_input_names_the_field_and_stores_nothing(
    project: Project, field: str, value: Any
) -> None:
    fields: dict[str, Any] = {"content": "Fine sentence", "type": "user", field: value}
    with pytest.raises(MemoryInputError) as error:
        candidate_propose(project=project, **fields)
    assert error.value.field == field
    assert not Memory.objects.exists() and not MemoryEvent.objects.exists()


def test_only_pending_candidates_are_decided(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Answer in British English")
    assert memory is not None
    memory_approve(memory, by=reviewer)
    with pytest.raises(services.DecisionError):
        memory_reject(memory, by=reviewer)
    with pytest.raises(services.DecisionError):
        memory_approve(memory, by=reviewer)


def approved(project: Project, n: int, content: str, **fields: Any) -> list[Memory]:
    rows = [
        Memory(
            project=project,
            type=fields.get("type", "user"),
            content=content.format(i=i),
            scope=fields.get("scope", "project"),
            status="approved",
            importance=fields.get("importance", Decimal("0.5")),
            decided_at=NOW - timedelta(minutes=i),
            fingerprint=services.fingerprint(content.format(i=i)),
        )
        for i in range(n)
    ]
    return Memory.objects.bulk_create(rows)


def test_memory_md_is_at_most_200_lines(project: Project) -> None:
    approved(project, 200, "fact number {i:03}")
    md = memory_md(project, now=NOW)
    assert (md.lines, md.total, md.cut_count) == (200, 200, 0)
    assert md.text.count("\n") == 200 and md.text.endswith("\n")
    approved(project, 1, "one too many {i}")  # as new as the newest: it goes in
    md = memory_md(project, now=NOW)
    assert (md.lines, md.total, md.cut_count) == (200, 201, 1)
    assert md.text.startswith("[user] one too many 0\n[user] fact number 000\n")
    assert [m.content for m in md.cut] == ["fact number 199"]  # the oldest is cut


def test_memory_md_is_at_most_25000_bytes_cut_at_a_line_boundary(project: Project) -> None:
    # 149 characters, 146 of them 2-byte: "[user] " + 295 bytes + "\n" = 303 bytes a line
    approved(project, 100, "é" * 146 + "{i:03}")
    md = memory_md(project, now=NOW)
    line_bytes = len(("[user] " + "é" * 146 + "000\n").encode())
    assert line_bytes == 303
    assert md.lines == 25_000 // line_bytes == 82
    assert md.bytes == len(md.text.encode()) == 82 * line_bytes <= 25_000
    assert md.text.endswith("\n") and all(
        line.startswith("[user] ") for line in md.text.splitlines()
    )
    assert md.cut_count == 18


def test_memory_md_exactly_at_25000_bytes_keeps_the_last_line(project: Project) -> None:
    # 100 lines of 250 bytes each = 25,000 exactly: "[user] " (7) + 242 + "\n", the 242
    # bytes in 150 characters (92 of them 2-byte)
    approved(project, 100, "é" * 92 + "a" * 55 + "{i:03}")
    md = memory_md(project, now=NOW)
    assert (md.lines, md.bytes, md.cut_count) == (100, 25_000, 0)


def test_memory_md_orders_by_importance_then_newest_and_keeps_only_live_entries(
    project: Project,
) -> None:
    approved(project, 1, "low", importance=Decimal("0.2"))
    approved(project, 1, "high", importance=Decimal("0.9"), type="feedback")
    Memory.objects.create(
        project=project,
        type="user",
        content="newer mid",
        status="approved",
        importance=Decimal("0.5"),
        decided_at=NOW,
    )
    Memory.objects.create(
        project=project,
        type="user",
        content="older mid",
        status="approved",
        importance=Decimal("0.5"),
        decided_at=NOW - timedelta(days=1),
    )
    Memory.objects.create(
        project=project,
        type="user",
        content="expired",
        status="approved",
        expires_at=NOW - timedelta(seconds=1),
        importance=Decimal(1),
    )
    Memory.objects.create(project=project, type="user", content="pending", importance=Decimal(1))
    Memory.objects.create(
        project=project,
        type="user",
        content="other scope",
        status="approved",
        scope="user:u-1",
        importance=Decimal(1),
    )
    md = memory_md(project, now=NOW)
    assert md.text == "[feedback] high\n[user] newer mid\n[user] older mid\n[user] low\n"
    assert memory_md(project, "user:u-1", now=NOW).text == "[user] other scope\n"


@pytest.mark.django_db(transaction=True)
def test_the_same_sentence_proposed_at_once_is_one_memory() -> None:
    agent = make_agent("race")
    assert (
        run_in_threads(
            8,
            lambda i: candidate_propose(
                project=agent.project, type="feedback", content="Never force-push to main"
            ),
        )
        == []
    )
    memory = Memory.objects.get()
    assert memory.times_proposed == 8
    assert memory.events.count() == 8
