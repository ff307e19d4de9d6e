"""Memories that don't contradict: a sentence near-identical to a live memory but for a number,
a date, a version, a negation or an opposite is a new pending candidate that lists what it
contradicts; approving it supersedes them (kept in history, out of MEMORY.md and search), or
keeps both; re-proposals merge only when they mean the same."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from memory_ui import lifecycle
from memory_ui.cleaners import MemoryFields, Search
from memory_ui.conflicts import conflict, read, same_meaning
from memory_ui.memory_file import memory_md
from memory_ui.models import Memory
from memory_ui.ranking import memories_search
from memory_ui.writes import decisions, proposals
from tests.conftest import Agent

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}

CONTRADICTING = [
    # the pairs
    ("the staging database runs on port 5432", "the staging database runs on port 5433"),
    ("never deploy on Fridays", "always deploy on Fridays"),
    ("only keep results published after 2023", "only keep results published after 2024"),
    # a version, a date, an amount, a negation, opposites
    ("The API targets Python 3.11", "The API targets Python 3.12"),
    ("Release freeze starts 2026-12-01", "Release freeze starts 2026-12-15"),
    ("The monthly budget is 1,000 USD", "The monthly budget is 2,000 USD"),
    ("The user prefers dark mode", "The user doesn't prefer dark mode"),
    ("The user prefers dark mode", "The user prefers light mode"),
    ("deploy on Fridays", "never deploy on Fridays"),
    ("Feature flag checkout_v2 is enabled", "Feature flag checkout_v2 is disabled"),
    ("Run the migrations before the deploy", "Run the migrations after the deploy"),
    ("turn the query cache off", "turn the query cache on"),
]

SAME = [
    ("The staging database is on port 5433", "The staging database is on port 5433 now"),
    ("Always use ruff, never black.", "always use ruff — never black"),
    ("User prefers concise answers", "The user prefers concise answers"),
    ("The API targets Python 3.11", "The API targets Python 3.11.0"),
    ("The monthly budget is 1,000 USD", "The monthly budget is 1000 USD"),
    ("deploy on Fridays", "always deploy on Fridays"),  # emphasis, not a new claim
]

NEITHER = [
    ("use tabs for indentation", "use spaces for indentation"),
    ("The user prefers dark mode", "The user prefers dark mode in the editor"),
    ("Call Bob at 5", "Meet Alice at 3"),
    ("deploy on Fridays", "deploy on Mondays"),
]


@pytest.mark.parametrize(("old", "new"), CONTRADICTING)
def test_contradicting_pairs_conflict_both_ways(old: str, new: str) -> None:
    assert conflict(new, old) is not None
    assert conflict(old, new) is not None
    assert not same_meaning(new, old)


@pytest.mark.parametrize(("old", "new"), SAME)
def test_the_same_meaning_in_other_words_is_no_conflict(old: str, new: str) -> None:
    assert conflict(new, old) is None
    assert same_meaning(new, old)


@pytest.mark.parametrize(("old", "new"), NEITHER)
def test_different_sentences_are_neither(old: str, new: str) -> None:
    assert conflict(new, old) is None
    assert not same_meaning(new, old)


def test_the_reason_names_what_differs() -> None:
    assert conflict("port 5433 for staging", "port 5432 for staging") == (
        "differs in a number, date or version"
    )
    assert conflict("never deploy on Fridays", "always deploy on Fridays") == (
        "differs in always/never and a negation"
    )
    assert conflict("the cache is enabled", "the cache is disabled") == "differs in disable/enable"
    # numbers are read whole: a version keeps its dots, a thousands separator is dropped
    assert read("Python 3.11 with 1,000 workers at 10:30").claims.numbers == (
        "1000",
        "10:30",
        "3.11",
    )


# --- proposing ------------------------------------------------------------------------------


def post_candidate(agent: Agent, content: str, **fields: Any) -> Any:
    return agent.client.post(
        "/api/v1/memory/candidates",
        {"content": content, "type": fields.pop("type", "project"), **fields},
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )


def approved(agent: Agent, content: str) -> Memory:
    memory = proposals.candidate_propose(
        project=agent.project, fields=MemoryFields.of(type="project", content=content)
    )
    assert memory is not None and memory.times_proposed == 1
    return decisions.memory_approve(memory, by=None)


@pytest.mark.parametrize(("old", "new"), CONTRADICTING[:3])
def test_a_contradiction_is_a_new_candidate_that_lists_what_it_contradicts(
    agent: Agent, old: str, new: str
) -> None:
    first = approved(agent, old)
    response = post_candidate(agent, new)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["merged"]) == ("pending", False)
    assert body["conflicts_with"] == [first.pk]
    assert body["content"] == new
    first.refresh_from_db()
    assert (first.status, first.times_proposed, first.content) == ("approved", 1, old)
    proposed = Memory.objects.get(pk=body["id"]).events.get(action="proposed")
    assert f"contradicts #{first.pk} (differs in" in proposed.note
    # the same contradiction again is the same candidate proposed once more
    again = post_candidate(agent, new)
    assert again.status_code == 200
    assert (again.json()["id"], again.json()["merged"]) == (body["id"], True)
    assert again.json()["conflicts_with"] == [first.pk]
    assert Memory.objects.count() == 2


def test_a_pending_contradiction_is_listed_too(agent: Agent) -> None:
    first = post_candidate(agent, "the staging database runs on port 5432").json()
    second = post_candidate(agent, "the staging database runs on port 5433").json()
    assert second["conflicts_with"] == [first["id"]]
    assert first["conflicts_with"] == []


def test_a_near_duplicate_that_means_the_same_still_merges(agent: Agent) -> None:
    first = approved(agent, "The staging database is on port 5433")
    response = post_candidate(agent, "The staging database is on port 5433 now")
    assert response.status_code == 200
    assert (response.json()["id"], response.json()["conflicts_with"]) == (first.pk, [])
    # and a near sentence with other words is new, without a conflict
    other = post_candidate(agent, "The staging database is on port 5433 behind the VPN")
    assert other.status_code == 201 and other.json()["conflicts_with"] == []


def test_approving_supersedes_the_old_memory(agent: Agent) -> None:
    old = approved(agent, "the staging database runs on port 5432")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="the staging database runs on port 5433"),
    )
    assert new is not None
    new = decisions.memory_approve(new, by=None, actor_name="rita")
    old.refresh_from_db()
    assert (old.status, old.superseded_by_id) == ("superseded", new.pk)
    assert list(old.events.values_list("action", "actor_name")) == [
        ("proposed", ""),
        ("approved", ""),
        ("superseded", "rita"),
    ]
    assert new.events.get(action="approved").note == f"supersedes #{old.pk}"
    md = memory_md(agent.project, "project").text
    assert "port 5433" in md and "port 5432" not in md
    found = memories_search(project=agent.project, search=Search.of(query="staging database port"))
    assert [r.memory_id for r in found] == [new.pk]
    # the superseded sentence proposed again is a new candidate against the current fact
    back = post_candidate(agent, "the staging database runs on port 5432")
    assert back.status_code == 201
    assert back.json()["conflicts_with"] == [new.pk]


def test_keeping_both_leaves_the_old_memory_approved(agent: Agent) -> None:
    old = approved(agent, "never deploy on Fridays")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="always deploy on Fridays"),
    )
    assert new is not None
    decisions.memory_approve(new, by=None, keep_both=True)
    old.refresh_from_db()
    assert (old.status, old.superseded_by_id) == ("approved", None)
    assert new.events.get(action="approved").note == (
        f"kept beside #{old.pk}, which it contradicts"
    )
    md = memory_md(agent.project, "project").text
    assert "never deploy on Fridays" in md and "always deploy on Fridays" in md


def test_approving_in_bulk_supersedes_too(agent: Agent) -> None:
    old = approved(agent, "only keep results published after 2023")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="only keep results published after 2024"),
    )
    assert new is not None
    done = decisions.candidates_decide(ids=[new.pk], decision="approve", by=None)
    assert done.decided == [new.pk]
    old.refresh_from_db()
    assert (old.status, old.superseded_by_id) == ("superseded", new.pk)


def test_an_edit_that_no_longer_contradicts_supersedes_nothing(staff: Client, agent: Agent) -> None:
    """A contradiction edited into another sentence and saved (approved) leaves the memory
    it no longer contradicts in MEMORY.md; what the edited text contradicts is listed instead."""
    staging = approved(agent, "the staging database runs on port 5432")
    fridays = approved(agent, "never deploy on Fridays")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="the staging database runs on port 5433"),
    )
    assert new is not None
    assert list(new.conflicts_with.values_list("pk", flat=True)) == [staging.pk]
    fields = {"type": "project", "scope": "project", "importance": "0.5", "tags": ""}
    # saved without approving: the card lists what the text contradicts now
    response = staff.post(
        f"/memory/{new.pk}/edit/",
        {**fields, "content": "always deploy on Fridays", "save_only": "1"},
        headers=HTMX,
    )
    assert response.status_code == 200
    assert list(new.conflicts_with.values_list("pk", flat=True)) == [fridays.pk]
    # and edited once more into a sentence that contradicts nothing, then approved
    response = staff.post(
        f"/memory/{new.pk}/edit/",
        {**fields, "content": "the production database runs on port 6000"},
        headers=HTMX,
    )
    assert response.status_code == 200
    new.refresh_from_db()
    staging.refresh_from_db()
    fridays.refresh_from_db()
    assert (new.status, staging.status, fridays.status) == ("approved", "approved", "approved")
    assert new.events.get(action="approved").note == ""
    md = memory_md(agent.project, "project").text
    assert "port 5432" in md and "port 6000" in md and "never deploy on Fridays" in md


def test_a_memory_past_its_ttl_is_neither_repeated_nor_contradicted(agent: Agent) -> None:
    """Before the TTL sweep has run, a memory past its expiry is already out of MEMORY.md and
    search; the lookups of a new proposal leave it out too, so the same sentence proposed
    again is a new candidate (201), not merged into a memory nobody reads."""
    old = approved(agent, "never deploy on Fridays")
    other = approved(agent, "the staging database runs on port 5432")
    now = timezone.now()
    Memory.objects.filter(pk__in=[old.pk, other.pk]).update(expires_at=now)  # the boundary
    again = post_candidate(agent, "never deploy on Fridays")
    assert again.status_code == 201, again.content
    assert again.json()["id"] != old.pk and again.json()["merged"] is False
    opposite = post_candidate(agent, "the staging database runs on port 5433")
    assert opposite.status_code == 201
    assert opposite.json()["conflicts_with"] == []
    old.refresh_from_db()
    assert (old.times_proposed, old.status) == (1, "approved")


def test_rejecting_a_contradiction_leaves_the_old_memory(agent: Agent) -> None:
    old = approved(agent, "the staging database runs on port 5432")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="the staging database runs on port 5433"),
    )
    assert new is not None
    decisions.memory_reject(new, by=None)
    old.refresh_from_db()
    assert old.status == "approved"


def test_the_lifecycle_does_not_propose_merging_a_contradiction(agent: Agent) -> None:
    old = approved(agent, "never deploy on Fridays")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="always deploy on Fridays"),
    )
    assert new is not None
    decisions.memory_approve(new, by=None, keep_both=True)
    # positive control: a real pair of duplicates in the same run is proposed
    a = approved(agent, "Invoices go out on the first working day")
    b = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(
            type="project", content="Invoices go out on the first working day!!"
        ),
    )
    assert b is not None and b.pk == a.pk  # the same sentence: merged at once
    stored = Memory.objects.create(
        project=agent.project,
        type="project",
        content="Invoices go out on the first working day each month",
        status="approved",
        fingerprint="x",
    )
    lifecycle.project_proposals(agent.project)
    merges = Memory.objects.filter(proposal="merge", status="pending")
    targets = [sorted(m.targets.values_list("pk", flat=True)) for m in merges]
    assert sorted([a.pk, stored.pk]) in targets
    assert sorted([old.pk, new.pk]) not in targets


# --- the review card ------------------------------------------------------------------------


def card(html: str, pk: int) -> str:
    found = re.search(
        rf'<article class="candidate card[^"]*" id="candidate-{pk}".*?</article>', html, re.S
    )
    assert found is not None, f"no candidate {pk}"
    return found.group(0)


def test_the_review_card_shows_the_two_side_by_side(staff: Client, agent: Agent) -> None:
    old = approved(agent, "the staging database runs on port 5432")
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="the staging database runs on port 5433"),
    )
    plain = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="Invoices are sent on the 1st"),
    )
    assert new is not None and plain is not None
    html = staff.get("/memory/review/").content.decode()
    shown = card(html, new.pk)
    assert "data-conflicts" in shown
    assert f'data-conflict-with="{old.pk}"' in shown
    assert '<mark class="differs">5433</mark>' in shown
    assert '<mark class="differs">5432</mark>' in shown
    assert "differs in a number, date or version" in shown
    assert 'data-action="keep-both"' in shown
    assert f'title="Approve, superseding #{old.pk}"' in shown
    assert "data-conflicts" not in card(html, plain.pk)  # positive control


def test_keep_both_and_approve_from_the_page(staff: Client, agent: Agent) -> None:
    old = approved(agent, "never deploy on Fridays")
    kept = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="always deploy on Fridays"),
    )
    assert kept is not None
    response = staff.post(f"/memory/{kept.pk}/approve/", {"keep": "both"}, headers=HTMX)
    assert response.status_code == 200
    old.refresh_from_db()
    kept.refresh_from_db()
    assert (old.status, kept.status) == ("approved", "approved")
    other = approved(agent, "the staging database runs on port 5432")
    newer = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="the staging database runs on port 5433"),
    )
    assert newer is not None
    response = staff.post(f"/memory/{newer.pk}/approve/", headers=HTMX)
    assert response.status_code == 200
    other.refresh_from_db()
    assert (other.status, other.superseded_by_id) == ("superseded", newer.pk)
    detail = staff.get(f"/memory/{other.pk}/").content.decode()
    assert "data-superseded-by" in detail and 'data-event="superseded"' in detail
    detail = staff.get(f"/memory/{newer.pk}/").content.decode()
    assert "data-supersedes" in detail and "data-contradicts" in detail
