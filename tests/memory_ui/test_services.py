"""Proposing, deciding and serving memories: duplicates merged, rejected sentences kept out,
every decision in the history, and MEMORY.md at its caps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from costboard.models import Project
from memory_ui import cleaners
from memory_ui.cleaners import Feedback, MemoryFields, MemoryImport, MemoryInputError, Search
from memory_ui.memory_file import memory_md
from memory_ui.models import Memory, MemoryEvent
from memory_ui.text import fingerprint
from memory_ui.writes import decisions, proposals, retrievals
from memory_ui.writes.decisions import memory_approve, memory_edit, memory_expire, memory_reject
from memory_ui.writes.imports import memories_import
from memory_ui.writes.proposals import candidate_propose
from tests.conftest import make_agent, run_in_threads

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Acme", slug="acme")


@pytest.fixture
def reviewer(db: None) -> Any:
    return get_user_model().objects.create_user("rita", password="pw-rita-123")


MEMORY_FIELDS = ("type", "scope", "importance", "tags", "ttl_days")


def propose(project: Project, content: str, **given: Any) -> Memory | None:
    fields = {name: given.pop(name) for name in MEMORY_FIELDS if name in given}
    fields.setdefault("type", "feedback")
    return candidate_propose(
        project=project, fields=MemoryFields.of(content=content, **fields), now=NOW, **given
    )


def edited(memory: Memory, **changes: Any) -> MemoryFields:
    """The memory's fields with `changes` (as they came) in place of some."""
    now = {name: getattr(memory, name) for name in ("content", *MEMORY_FIELDS)}
    return MemoryFields.of(**{**now, **changes})


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
    assert memory.fingerprint == fingerprint("always use RUFF never black")
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
        memory,
        by=reviewer,
        now=NOW,
        fields=edited(memory, content="Release freeze starts March 4", importance="0.9"),
    )
    edit = memory.events.get(action="edited")
    assert edit.before == {"content": "Release freeze starts March 3", "importance": "0.500"}
    assert edit.after == {"content": "Release freeze starts March 4", "importance": "0.900"}
    assert memory.fingerprint == fingerprint("Release freeze starts March 4")
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
        candidate_propose(project=project, fields=MemoryFields.of(**fields))
    assert error.value.field == field
    assert not Memory.objects.exists() and not MemoryEvent.objects.exists()


@pytest.mark.parametrize(
    ("make", "field", "fault"),
    [
        (lambda: MemoryFields.of(type="user", content="a\x00b"), "content", "NUL"),
        (lambda: MemoryFields.of(type="user", content="x", tags=["ok", "\ud800"]), "tags", "d800"),
        (lambda: MemoryImport.of(type="user", content="\udc00 x"), "content", "dc00"),
        (lambda: Search.of(query="deploy\x00"), "q", "NUL"),
    ],
)
def test_text_postgresql_cannot_hold_is_refused_wherever_it_comes_in(
    make: Callable[[], object], field: str, fault: str
) -> None:
    """The task, imports and the pages build their typed values with the API's own text rule."""
    with pytest.raises(MemoryInputError) as error:
        make()
    assert error.value.field == field and fault in error.value.message


def test_only_pending_candidates_are_decided(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Answer in British English")
    assert memory is not None
    memory_approve(memory, by=reviewer)
    with pytest.raises(decisions.DecisionError):
        memory_reject(memory, by=reviewer)
    with pytest.raises(decisions.DecisionError):
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
            fingerprint=fingerprint(content.format(i=i)),
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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_same_sentence_proposed_at_once_is_one_memory() -> None:
    agent = make_agent("race")
    assert (
        run_in_threads(
            8,
            lambda i: candidate_propose(
                project=agent.project,
                fields=MemoryFields.of(type="feedback", content="Never force-push to main"),
            ),
        )
        == []
    )
    memory = Memory.objects.get()
    assert memory.times_proposed == 8
    assert memory.events.count() == 8


# --- edit and approve in one call -------------------------------------------------------------


def test_edit_with_approve_writes_both_in_order(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Deploys need a green build", ttl_days=10)
    assert memory is not None
    memory = memory_edit(
        memory,
        by=reviewer,
        approve=True,
        now=NOW,
        fields=edited(memory, content="Deploys need CI"),
    )
    assert (memory.status, memory.content, memory.decided_by) == (
        "approved",
        "Deploys need CI",
        reviewer,
    )
    assert memory.expires_at == NOW + timedelta(days=10)
    assert actions(memory) == ["proposed", "edited", "approved"]


def test_edit_with_approve_and_nothing_changed_only_approves(
    project: Project, reviewer: Any
) -> None:
    memory = propose(project, "Deploys need a green build")
    assert memory is not None
    memory = memory_edit(
        memory, by=reviewer, approve=True, fields=edited(memory, content=memory.content)
    )
    assert memory.status == "approved"
    assert actions(memory) == ["proposed", "approved"]


def test_edit_with_approve_of_a_decided_memory_changes_nothing(
    project: Project, reviewer: Any
) -> None:
    memory = propose(project, "Deploys need a green build")
    assert memory is not None
    memory_reject(memory, by=reviewer)
    with pytest.raises(decisions.DecisionError):
        memory_edit(
            memory,
            by=reviewer,
            approve=True,
            fields=edited(memory, content="Something else entirely"),
        )
    memory.refresh_from_db()
    assert (memory.status, memory.content) == ("rejected", "Deploys need a green build")
    assert actions(memory) == ["proposed", "rejected"]


def test_a_refused_field_stores_nothing_even_with_approve(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Deploys need a green build")
    assert memory is not None
    with pytest.raises(MemoryInputError) as error:
        memory_edit(memory, by=reviewer, approve=True, fields=edited(memory, importance="2"))
    assert error.value.field == "importance"
    memory.refresh_from_db()
    assert memory.status == "pending" and actions(memory) == ["proposed"]


# --- bulk decisions ---------------------------------------------------------------------------


def test_candidates_decide_decides_the_pending_and_counts_the_rest(
    project: Project, reviewer: Any
) -> None:
    other = Project.objects.create(name="Other", slug="other")
    a, b, c = (propose(project, text) for text in ("Fact alpha", "Fact bravo", "Fact charlie"))
    theirs = propose(other, "Their fact")
    assert a and b and c and theirs
    memory_reject(c, by=reviewer)
    result = decisions.candidates_decide(
        ids=[c.pk, a.pk, theirs.pk, b.pk, a.pk, 10**9],
        decision="approve",
        by=reviewer,
        project_ids=[project.pk],
        now=NOW,
    )
    assert result.decided == [a.pk, b.pk]
    assert result.skipped == sorted([c.pk, theirs.pk, 10**9])
    statuses = dict(Memory.objects.values_list("pk", "status"))
    assert statuses == {a.pk: "approved", b.pk: "approved", c.pk: "rejected", theirs.pk: "pending"}
    assert MemoryEvent.objects.filter(action="approved", at=NOW).count() == 2


def test_candidates_decide_stops_at_at_most(project: Project, reviewer: Any) -> None:
    texts = ("Invoices go out monthly", "Keep pull requests small", "Logs are kept in UTC")
    memories = [propose(project, text) for text in texts]
    ids = [m.pk for m in memories if m is not None]
    assert len(set(ids)) == 3
    result = decisions.candidates_decide(ids=ids, decision="reject", by=reviewer, at_most=2)
    assert (result.decided, result.skipped) == (ids[:2], ids[2:])
    assert Memory.objects.filter(status="rejected").count() == 2


def test_candidates_decide_refuses_an_unknown_decision(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Fact alpha")
    assert memory is not None
    with pytest.raises(MemoryInputError) as error:
        decisions.candidates_decide(ids=[memory.pk], decision="delete", by=reviewer)
    assert error.value.field == "action"
    assert Memory.objects.get().status == "pending"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_bulk_decisions_at_once_decide_each_candidate_once() -> None:
    agent = make_agent("race")
    ids = []
    for word in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot"):
        memory = candidate_propose(
            project=agent.project, fields=MemoryFields.of(type="user", content=f"Fact {word}")
        )
        assert memory is not None
        ids.append(memory.pk)
    results: list[decisions.Decided] = []

    def decide(i: int) -> None:
        # overlapping halves, in opposite orders: any two threads share some ids
        chosen = ids[: 4 + i % 3] if i % 2 else ids[-(4 + i % 3) :][::-1]
        results.append(
            decisions.candidates_decide(
                ids=chosen, decision="approve" if i % 2 else "reject", by=None
            )
        )

    assert run_in_threads(6, decide) == []
    decided = [pk for result in results for pk in result.decided]
    assert sorted(decided) == sorted(ids)  # each exactly once, by one of them
    for memory in Memory.objects.all():
        assert memory.status in ("approved", "rejected")
        assert actions(memory) == ["proposed", memory.status]


# --- TTL expiry, lifecycle proposals ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_ttl_sweeps_at_once_expire_each_memory_once() -> None:
    agent = make_agent("sweep")
    for word in ("alpha", "bravo", "charlie", "delta", "echo"):
        memory = candidate_propose(
            project=agent.project,
            fields=MemoryFields.of(type="project", content=f"Freeze {word}", ttl_days=1),
        )
        assert memory is not None
        memory_approve(memory, by=None, now=NOW)
    counts: list[int] = []
    later = NOW + timedelta(days=2)
    assert (
        run_in_threads(4, lambda i: counts.append(decisions.memories_expire_due(now=later))) == []
    )
    assert sum(counts) == 5
    assert set(Memory.objects.values_list("status", flat=True)) == {"expired"}
    assert MemoryEvent.objects.filter(action="expired").count() == 5


def test_a_proposal_is_never_merged_into_a_memory_with_its_text(project: Project) -> None:
    kept = approved(project, 1, "Deploys happen on Tuesdays")[0]
    proposal = proposals.proposal_create(
        project=project,
        fields=MemoryFields.of(scope="project", type="user", content="Deploys happen on Tuesdays"),
        kind="merge",
        target_ids=[kept.pk],
        note="merge",
        proposed_by="lifecycle",
        now=NOW,
    )
    assert proposal.pk != kept.pk and proposal.proposal == "merge"
    assert list(proposal.targets.values_list("pk", flat=True)) == [kept.pk]
    event = proposal.events.get()
    assert (event.action, event.actor_name) == ("proposed", "lifecycle")
    assert event.after is not None
    assert event.after["targets"] == [kept.pk] and event.after["status"] == "pending"


def test_a_proposal_needs_a_kind_and_targets(project: Project) -> None:
    fields: dict[str, Any] = {
        "project": project,
        "fields": MemoryFields.of(scope="project", type="user", content="x"),
        "note": "",
        "proposed_by": "lifecycle",
    }
    with pytest.raises(MemoryInputError, match="proposal"):
        proposals.proposal_create(kind="new", target_ids=[1], **fields)
    with pytest.raises(MemoryInputError, match="targets"):
        proposals.proposal_create(kind="evict", target_ids=[], **fields)
    assert not Memory.objects.exists()


def test_a_decided_eviction_is_not_brought_up_to_date(project: Project, reviewer: Any) -> None:
    a, b = approved(project, 2, "fact {i}")
    eviction = proposals.proposal_create(
        project=project,
        fields=MemoryFields.of(
            scope="project", type="user", content="Evict 1 low-value entry: fact 1"
        ),
        kind="evict",
        target_ids=[b.pk],
        note="over the cap",
        proposed_by="lifecycle",
    )
    update: dict[str, Any] = {
        "fields": MemoryFields.of(type="user", content="Evict 2 low-value entries: fact 0; fact 1"),
        "target_ids": [a.pk, b.pk],
        "evidence": "both",
        "note": "now two",
        "proposed_by": "lifecycle",
    }
    updated = proposals.eviction_update(proposal_id=eviction.pk, **update)
    assert updated is not None and updated.times_proposed == 2
    assert set(updated.targets.values_list("pk", flat=True)) == {a.pk, b.pk}
    event = updated.events.get(action="reproposed")
    assert event.before is not None and event.after is not None
    assert event.before["targets"] == [b.pk] and event.after["targets"] == sorted([a.pk, b.pk])
    memory_reject(updated, by=reviewer)
    assert proposals.eviction_update(proposal_id=eviction.pk, **update) is None
    assert actions(updated) == ["proposed", "reproposed", "rejected"]


# --- searches and feedback --------------------------------------------------------------------


def test_feedback_needs_the_projects_memory_and_search(project: Project) -> None:
    other = Project.objects.create(name="Other", slug="other")
    (mine,) = approved(project, 1, "Deploys happen on Tuesdays")
    (theirs,) = approved(other, 1, "Their fact")
    log = retrievals.retrieval_log_record(
        project=project,
        query="deploys " * 100,
        scope="project",
        k=5,
        ranked=[SimpleNamespace(memory_id=mine.pk)],
    )
    assert (len(log.query), log.results, log.memory_ids) == (cleaners.MAX_QUERY, 1, [mine.pk])
    stored = retrievals.memory_feedback_add(
        project=project,
        feedback=Feedback.of(memory_id=mine.pk, useful=True, retrieval_id=log.pk),
        now=NOW,
    )
    assert (stored.memory_id, stored.retrieval_id, stored.useful) == (mine.pk, log.pk, True)
    with pytest.raises(cleaners.NotFound) as missing:
        retrievals.memory_feedback_add(
            project=project, feedback=Feedback.of(memory_id=theirs.pk, useful=False)
        )
    assert missing.value.field == "memory_id"
    with pytest.raises(cleaners.NotFound) as missing:
        retrievals.memory_feedback_add(
            project=other,
            feedback=Feedback.of(memory_id=theirs.pk, useful=False, retrieval_id=log.pk),
        )
    assert missing.value.field == "retrieval_id"
    wrong_types: list[tuple[str, dict[str, Any]]] = [
        ("memory_id", {"memory_id": "12", "useful": True}),
        ("useful", {"memory_id": mine.pk, "useful": "yes"}),
        ("retrieval_id", {"memory_id": mine.pk, "useful": True, "retrieval_id": True}),
    ]
    for field, kwargs in wrong_types:
        with pytest.raises(MemoryInputError) as error:
            retrievals.memory_feedback_add(project=project, feedback=Feedback.of(**kwargs))
        assert error.value.field == field
    assert stored.__class__.objects.count() == 1


# --- approved memories in bulk ----------------------------------------------------------------


def test_an_import_writes_approved_memories_with_their_history(project: Project) -> None:
    rows = memories_import(
        project=project,
        memories=[
            MemoryImport.of(type="reference", content="Runbook is in the wiki", ttl_days=30),
            MemoryImport.of(
                type="user",
                content="  Prefers   short answers ",
                scope="user:ann",
                importance=Decimal("0.8"),
                proposed_at=NOW - timedelta(days=2),
                decided_at=NOW - timedelta(days=1),
            ),
        ],
        actor_name="bench",
        now=NOW,
    )
    runbook, short = (Memory.objects.get(pk=row.pk) for row in rows)
    assert (runbook.status, runbook.decided_at, runbook.expires_at) == (
        "approved",
        NOW,
        NOW + timedelta(days=30),
    )
    assert (short.content, short.scope, short.importance) == (
        "Prefers short answers",
        "user:ann",
        Decimal("0.800"),
    )
    assert short.fingerprint == fingerprint("prefers short answers")
    history = [(e.action, e.actor_name, e.at) for e in short.events.order_by("at", "id")]
    assert history == [
        ("proposed", "bench", NOW - timedelta(days=2)),
        ("approved", "bench", NOW - timedelta(days=1)),
    ]
    assert memory_md(project, "user:ann", now=NOW).text == "[user] Prefers short answers\n"


def test_an_import_with_a_bad_entry_stores_none(project: Project) -> None:
    with pytest.raises(MemoryInputError) as error:
        memories_import(
            project=project,
            memories=[
                MemoryImport.of(type="user", content="Fine"),
                MemoryImport.of(type="user", content="y" * 151),
            ],
        )
    assert error.value.field == "content"
    assert not Memory.objects.exists() and not MemoryEvent.objects.exists()


KEY = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH"


def test_every_memory_text_is_redacted_however_its_fields_are_made(project: Project) -> None:
    """docs/memory.md, "Redaction": the fields a proposal, an edit and an import write are
    redacted where they are made, whichever way, with the kinds found."""
    built = MemoryFields(content=f"Deploy key {KEY}", type="project", tags=("ann@example.com",))
    assert (built.content, built.tags, built.redactions) == (
        "Deploy key [redacted:api_key]",
        ("[redacted:email]",),
        ("api_key", "email"),
    )
    again = MemoryFields.of(content=built.content, type="project", tags=list(built.tags))
    assert (again.content, again.redactions) == (built.content, ())  # a marker stays as it is
    with pytest.raises(MemoryInputError) as refused:
        MemoryFields.of(content="a" * 135 + " password: x", type="user")
    assert (refused.value.field, refused.value.message) == (
        "content",
        "is 165 characters once its secrets are redacted (password); at most 150: say it shorter",
    )


def test_an_edit_and_an_import_store_a_secret_redacted(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Deploys use the staging key")
    assert memory is not None
    memory = memory_edit(
        memory, fields=edited(memory, content=f"Deploys use the key {KEY}"), by=reviewer, now=NOW
    )
    memory.refresh_from_db()
    assert memory.content == "Deploys use the key [redacted:api_key]"
    assert memory.redactions == ["api_key"]
    edit = memory.events.get(action="edited")
    assert edit.note == "redacted: api_key"
    [imported] = memories_import(
        project=project,
        memories=[MemoryImport.of(content="Card on file 4111 1111 1111 1111", type="user")],
        now=NOW,
    )
    imported.refresh_from_db()
    assert (imported.content, imported.redactions) == (
        "Card on file [redacted:card_number]",
        ["card_number"],
    )
    stored = str(list(MemoryEvent.objects.values_list("before", "after", "note")))
    assert KEY not in stored and "4111" not in stored
    assert KEY not in memory_md(project).text


def test_a_pending_candidate_proposed_again_takes_the_newer_type_and_adds_its_tags(
    project: Project,
) -> None:
    """docs/memory.md, "Write policy": nobody has reviewed it yet, so it says what the agent
    says now: the newer type, and the tags of both proposals."""
    first = propose(project, "Deploys go through the release train", type="project", tags=["ci"])
    again = propose(
        project, "deploys go through the release train", type="feedback", tags=["release", "ci"]
    )
    assert first is not None and again is not None and again.pk == first.pk
    again.refresh_from_db()
    assert (again.type, again.tags, again.times_proposed) == ("feedback", ["ci", "release"], 2)
    event = again.events.get(action="reproposed")
    assert event.before == {
        "importance": "0.500",
        "tags": ["ci"],
        "times_proposed": 1,
        "type": "project",
    }
    assert event.after == {
        "importance": "0.550",
        "tags": ["ci", "release"],
        "times_proposed": 2,
        "type": "feedback",
    }


def test_an_approved_memory_proposed_again_differently_asks_a_reviewer(
    project: Project, reviewer: Any
) -> None:
    """A person's decision stands: the memory keeps its reviewed type and tags, and the newer
    ones wait in the queue as an update proposal; approved, it applies them."""
    memory = propose(project, "Deploys go through the release train", type="project", tags=["ci"])
    assert memory is not None
    memory = memory_approve(memory, by=reviewer, now=NOW)
    again = propose(project, "Deploys go through the release train", type="feedback", tags=["rel"])
    assert again is not None and again.pk == memory.pk
    memory.refresh_from_db()
    assert (memory.type, memory.tags, memory.times_proposed) == ("project", ["ci"], 2)
    update = Memory.objects.get(proposal="update")
    assert (update.status, update.type, update.tags, update.content, update.fingerprint) == (
        "pending",
        "feedback",
        ["ci", "rel"],
        "Deploys go through the release train",
        "",
    )
    assert list(update.targets.all()) == [memory]
    # proposed a third time alike: the same update proposal, once more
    propose(project, "Deploys go through the release train", type="feedback", tags=["rel"])
    update.refresh_from_db()
    assert (Memory.objects.filter(proposal="update").count(), update.times_proposed) == (1, 2)
    # as the memory is now: nothing to ask
    propose(project, "Deploys go through the release train", type="project", tags=["ci"])
    assert Memory.objects.filter(proposal="update").count() == 1
    memory_approve(update, by=reviewer, now=NOW)
    memory.refresh_from_db()
    assert (memory.type, memory.tags, memory.status) == ("feedback", ["ci", "rel"], "approved")
    edit = memory.events.get(action="edited")
    assert (edit.before, edit.after, edit.actor) == (
        {"tags": ["ci"], "type": "project"},
        {"tags": ["ci", "rel"], "type": "feedback"},
        reviewer,
    )
    assert memory_md(project, now=NOW).text == "[feedback] Deploys go through the release train\n"


def test_an_update_a_reviewer_rejected_is_not_asked_again(project: Project, reviewer: Any) -> None:
    memory = propose(project, "Deploys go through the release train", type="project")
    assert memory is not None
    memory_approve(memory, by=reviewer, now=NOW)
    propose(project, "Deploys go through the release train", type="feedback")
    memory_reject(Memory.objects.get(proposal="update"), by=reviewer, now=NOW)
    propose(project, "Deploys go through the release train", type="feedback")
    assert list(Memory.objects.filter(proposal="update").values_list("status", flat=True)) == [
        "rejected"
    ]
    # a different update is asked
    propose(project, "Deploys go through the release train", type="reference")
    assert Memory.objects.filter(proposal="update", status="pending").count() == 1


def test_a_candidate_a_reviewer_edited_keeps_the_reviewers_fields(
    project: Project, reviewer: Any
) -> None:
    memory = propose(project, "Deploys go through the release train", type="project")
    assert memory is not None
    memory_edit(memory, fields=edited(memory, type="reference"), by=reviewer, now=NOW)
    propose(project, "Deploys go through the release train", type="feedback")
    memory.refresh_from_db()
    assert (memory.type, memory.status) == ("reference", "pending")
    update = Memory.objects.get(proposal="update")
    assert (update.type, list(update.targets.all())) == ("feedback", [memory])
