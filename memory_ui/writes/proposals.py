"""What becomes a pending memory: a candidate proposed (with duplicates merged and rejected
sentences kept out, contradictions listed), and the lifecycle's evict/merge/compress
proposals (memory_ui.lifecycle decides what to propose; memory_approve applies them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from costboard.models import Project, Session, Turn
from memory_ui.cleaners import MAX_TAGS, MemoryFields, MemoryInputError
from memory_ui.conflicts import frame_key
from memory_ui.memory_file import unexpired
from memory_ui.models import Memory, MemoryEvent
from memory_ui.selectors import LIVE, near_memories
from memory_ui.text import fingerprint
from memory_ui.writes.history import event_record, snapshot

REPETITION_BONUS = Decimal("0.05")  # importance added each time a memory is proposed again
NOT_NEW = (
    Memory.Proposal.EVICT,
    Memory.Proposal.MERGE,
    Memory.Proposal.COMPRESS,
    Memory.Proposal.UPDATE,
)
NOT_A_SENTENCE = (Memory.Proposal.EVICT, Memory.Proposal.UPDATE)


@transaction.atomic
def candidate_propose(
    *,
    project: Project,
    fields: MemoryFields,
    source: str = Memory.Source.AGENT_INFERRED,
    session: Session | None = None,
    turn: Turn | None = None,
    evidence: str = "",
    redactions: Iterable[str] = (),
    proposed_by: str = "",
    now: datetime | None = None,
) -> Memory | None:
    """A pending candidate; or, when the scope already has the same sentence (or a near
    duplicate that means the same) pending or approved, that memory proposed once more (its
    importance raised for the repetition); or None when the same sentence was rejected before.

    A sentence near-identical to a live memory but for a number, a date, a version, a
    negation or an opposite (memory_ui.conflicts) is never merged: it is a new candidate whose
    `conflicts_with` lists the memories it contradicts, for a person to decide between.
    `fields` were checked where they came in (memory_ui.cleaners)."""
    now = now or timezone.now()
    content, scope, weight = fields.content, fields.scope, fields.importance
    fp = fingerprint(content)
    # one proposer at a time per project (a row lock that doesn't block ingest's inserts)
    Project.objects.select_for_update(no_key=True).filter(pk=project.pk).first()
    same = (
        Memory.objects.filter(project=project, scope=scope, fingerprint=fp)
        # a lifecycle proposal (evict/merge/compress) rejected is not its sentence rejected
        .filter(proposal=Memory.Proposal.NEW)
        .exclude(status__in=[Memory.Status.EXPIRED, Memory.Status.MERGED, Memory.Status.SUPERSEDED])
        .filter(unexpired(now))  # past its TTL, even before the sweep: out of MEMORY.md
        .order_by("status", "pk")
        .first()
    )
    if same is not None and same.status == Memory.Status.REJECTED:
        return None
    note = ""
    contradicts: list[tuple[Memory, str]] = []
    if same is None:
        near = near_memories(project, scope, content, now=now)
        contradicts = near.conflicts
        if near.duplicate is not None:
            same, score = near.duplicate
            note = f"near-duplicate ({score:.2f}) of a proposal: {content}"
    if same is not None:
        # a reviewer may be deciding on it or editing it now: wait for its row, read it again
        same = Memory.objects.select_for_update().filter(unexpired(now), pk=same.pk).first()
        if same is not None and same.status == Memory.Status.REJECTED and same.fingerprint == fp:
            return None
        if same is not None and same.status not in LIVE:
            same = None  # decided meanwhile: this sentence is new again
    if same is not None:
        return _proposed_again(same, fields=fields, note=note, proposed_by=proposed_by, now=now)
    memory = Memory.objects.create(
        project=project,
        type=fields.type,
        content=content,
        scope=scope,
        importance=weight,
        source=source,
        tags=list(fields.tags),
        ttl_days=fields.ttl_days,
        session=session,
        turn=turn,
        fingerprint=fp,
        frame_key=frame_key(content),
        evidence=evidence[:2000],
        redactions=sorted({*redactions, *fields.redactions}),
        proposed_by=proposed_by[:150],
        created_at=now,
        updated_at=now,
    )
    notes = [f"redacted: {', '.join(memory.redactions)}"] if memory.redactions else []
    if contradicts:
        memory.conflicts_with.set([other for other, _ in contradicts])
        notes += [f"contradicts #{other.pk} ({why})" for other, why in contradicts]
    event_record(
        memory,
        MemoryEvent.Action.PROPOSED,
        name=proposed_by,
        after=snapshot(memory),
        note="; ".join(notes),
        at=now,
    )
    return memory


def _proposed_again(
    same: Memory, *, fields: MemoryFields, note: str, proposed_by: str, now: datetime
) -> Memory:
    """`same` (locked, live) proposed once more: its importance raised. The newer proposal's
    type and its tags (added to those it has) are what the agent says now: a candidate nobody
    has reviewed takes them; one a person approved or edited keeps its reviewed fields, and
    the change waits for a person as an update proposal (docs/memory.md, "Write policy")."""
    tags = list(dict.fromkeys([*same.tags, *fields.tags]))[:MAX_TAGS]
    changed = {"type": fields.type, "tags": tags}
    changed = {k: v for k, v in changed.items() if getattr(same, k) != v}
    reviewed = (
        same.status != Memory.Status.PENDING
        or same.events.filter(action=MemoryEvent.Action.EDITED).exists()
    )
    before = {"times_proposed": same.times_proposed, "importance": str(same.importance)}
    same.times_proposed += 1
    same.importance = min(Decimal(1), max(same.importance, fields.importance) + REPETITION_BONUS)
    same.updated_at = now
    after = {"times_proposed": same.times_proposed, "importance": str(same.importance)}
    if changed and not reviewed:
        before |= {k: getattr(same, k) for k in changed}
        after |= changed
        for name, value in changed.items():
            setattr(same, name, value)
    same.save(update_fields=["times_proposed", "importance", "updated_at", "type", "tags"])
    event_record(
        same,
        MemoryEvent.Action.REPROPOSED,
        name=proposed_by,
        before=before if len(before) > 2 else None,
        after=after,
        note=note,
        at=now,
    )
    if changed and reviewed:
        _update_propose(
            same,
            type=fields.type,
            tags=tags,
            proposed_by=proposed_by,
            now=now,
        )
    return same


def _update_propose(
    target: Memory,
    *,
    type: str,
    tags: list[str],
    proposed_by: str,
    now: datetime,
) -> Memory | None:
    """A pending update proposal giving `target` this type and these tags (the one already
    waiting for it brought up to date); None when a reviewer rejected this very update."""
    existing = list(
        Memory.objects.select_for_update()
        .filter(
            project_id=target.project_id,
            proposal=Memory.Proposal.UPDATE,
            targets=target,
            status__in=[Memory.Status.PENDING, Memory.Status.REJECTED],
        )
        .order_by("pk")
    )
    if any(
        m.status == Memory.Status.REJECTED and (m.type, m.tags) == (type, tags) for m in existing
    ):
        return None
    waiting = next((m for m in existing if m.status == Memory.Status.PENDING), None)
    if waiting is not None:
        before = {"type": waiting.type, "tags": list(waiting.tags)}
        waiting.type, waiting.tags = type, tags
        waiting.times_proposed += 1
        waiting.updated_at = now
        waiting.save(update_fields=["type", "tags", "times_proposed", "updated_at"])
        event_record(
            waiting,
            MemoryEvent.Action.REPROPOSED,
            name=proposed_by,
            before=before,
            after={"type": type, "tags": tags, "times_proposed": waiting.times_proposed},
            at=now,
        )
        return waiting
    fields = MemoryFields(
        content=target.content,
        type=type,
        scope=target.scope,
        importance=target.importance,
        tags=tuple(tags),
        ttl_days=target.ttl_days,
    )
    return proposal_create(
        project=target.project,
        kind=Memory.Proposal.UPDATE,
        fields=fields,
        target_ids=[target.pk],
        note=f"#{target.pk} ({target.status}) proposed again as {type}"
        + (f" with tags {', '.join(tags)}" if tags else "")
        + ": a person decides",
        proposed_by=proposed_by,
        now=now,
    )


# --- lifecycle proposals (memory_ui.lifecycle decides what to propose) -------------------------


@transaction.atomic
def proposal_create(
    *,
    project: Project,
    kind: str,
    fields: MemoryFields,
    target_ids: Sequence[int],
    source: str = Memory.Source.AGENT_INFERRED,
    evidence: str = "",
    note: str,
    proposed_by: str,
    now: datetime | None = None,
) -> Memory:
    """A pending evict, merge or compress proposal acting on `target_ids`, for a person to
    decide (memory_approve applies it). Unlike candidate_propose it is never merged into a
    memory with the same text: a merge proposal carries one of its targets' text."""
    if kind not in NOT_NEW:
        raise MemoryInputError("proposal", "must be evict, merge, compress or update")
    if not target_ids:
        raise MemoryInputError("targets", "a proposal acts on at least one memory")
    now = now or timezone.now()
    content = fields.content
    # one proposer at a time per project, as candidate_propose (re-entrant for the lifecycle)
    Project.objects.select_for_update(no_key=True).filter(pk=project.pk).first()
    memory = Memory.objects.create(
        project=project,
        type=fields.type,
        content=content,
        scope=fields.scope,
        importance=fields.importance,
        source=source,
        tags=list(fields.tags),
        ttl_days=fields.ttl_days,
        # an eviction or update is not a sentence to remember; a merge or compression becomes one
        fingerprint="" if kind in NOT_A_SENTENCE else fingerprint(content),
        frame_key="" if kind in NOT_A_SENTENCE else frame_key(content),
        evidence=evidence[:2000],
        proposal=kind,
        proposed_by=proposed_by[:150],
        created_at=now,
        updated_at=now,
    )
    memory.targets.set(target_ids)
    event_record(
        memory,
        MemoryEvent.Action.PROPOSED,
        name=proposed_by,
        after={**snapshot(memory), "targets": sorted(target_ids)},
        note=note,
        at=now,
    )
    return memory


@transaction.atomic
def eviction_update(
    *,
    proposal_id: int,
    fields: MemoryFields,
    target_ids: Sequence[int],
    evidence: str,
    note: str,
    proposed_by: str,
    now: datetime | None = None,
) -> Memory | None:
    """Bring a waiting eviction proposal up to date (what MEMORY.md's cap cuts now: its
    content and type from `fields`), its history keeping the before and after; None if it is
    no longer a pending eviction (decided meanwhile: the caller proposes a new one)."""
    now = now or timezone.now()
    memory = (
        Memory.objects.select_for_update()
        .filter(pk=proposal_id, status=Memory.Status.PENDING, proposal=Memory.Proposal.EVICT)
        .first()
    )
    if memory is None:
        return None
    before = {**snapshot(memory), "targets": sorted(memory.targets.values_list("pk", flat=True))}
    memory.content, memory.type = fields.content, fields.type
    memory.evidence = evidence[:2000]
    memory.times_proposed += 1
    memory.updated_at = now
    memory.save(update_fields=["content", "type", "evidence", "times_proposed", "updated_at"])
    memory.targets.set(target_ids)
    event_record(
        memory,
        MemoryEvent.Action.REPROPOSED,
        name=proposed_by,
        before=before,
        after={**snapshot(memory), "targets": sorted(target_ids)},
        note=note,
        at=now,
    )
    return memory
