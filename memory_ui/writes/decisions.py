"""What a person (or the TTL) decides on a memory: edited, approved (one at a time or many at
once; a lifecycle proposal taking effect, a contradicted memory superseded), rejected,
expired. Nothing is approved without a person. Each decision locks the rows it decides on and
refuses one decided meanwhile (DecisionError)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from costboard.models import Project
from memory_ui.cleaners import MemoryFields, MemoryInputError
from memory_ui.conflicts import frame_key
from memory_ui.models import Memory, MemoryEvent
from memory_ui.selectors import LIVE, near_memories, same_sentence_live
from memory_ui.text import fingerprint
from memory_ui.writes.history import User, event_record, snapshot

EXPIRE_BATCH = 5000  # TTL expiries in one sweep at most


def _locked(memory: Memory) -> Memory:
    return Memory.objects.select_for_update().get(pk=memory.pk)


@transaction.atomic
def memory_edit(
    memory: Memory,
    *,
    fields: MemoryFields,
    by: User,
    approve: bool = False,
    now: datetime | None = None,
) -> Memory:
    """Give the memory `fields` (content, type, scope, importance, tags, ttl_days, checked
    where they came in); the event keeps the before and after of those that changed. With
    `approve`, a pending candidate is approved in the same transaction (the review queue's
    "Save and approve"): both or neither, and DecisionError if it was decided meanwhile.
    Only a pending or approved memory is edited: a rejected sentence keeps its text (which
    keeps it from coming back), and one expired, merged or superseded keeps its history's.
    A pending candidate's `conflicts_with` is read again for its new text and scope, so
    approving it supersedes what it contradicts as edited, and nothing else. A new text or
    scope that another live memory of that scope already says is refused (MemoryInputError
    naming it), nothing saved."""
    now = now or timezone.now()
    # one editor or proposer at a time per project, as proposals lock it: two edits into one
    # sentence see each other (_refuse_a_twin)
    Project.objects.select_for_update(no_key=True).filter(pk=memory.project_id).first()
    memory = _locked(memory)
    if approve and memory.status != Memory.Status.PENDING:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not pending")
    if memory.status not in LIVE:
        raise DecisionError(f"memory {memory.pk} is {memory.status}: it is not edited")
    before = snapshot(memory)
    sentence_before, scope_before = memory.fingerprint, memory.scope
    memory.content, memory.type, memory.scope = fields.content, fields.type, fields.scope
    memory.importance, memory.tags = fields.importance, list(fields.tags)
    memory.ttl_days = fields.ttl_days
    # what this edit's redaction took out (cleaners.MemoryFields), beside what was before
    memory.redactions = sorted({*memory.redactions, *fields.redactions})
    if memory.proposal not in (Memory.Proposal.EVICT, Memory.Proposal.UPDATE):  # no sentences
        memory.fingerprint = fingerprint(memory.content)
        memory.frame_key = frame_key(memory.content)
    if memory.proposal == Memory.Proposal.NEW and (
        memory.fingerprint != sentence_before or memory.scope != scope_before
    ):
        _refuse_a_twin(memory, content_changed=memory.fingerprint != sentence_before, now=now)
    if memory.status == Memory.Status.APPROVED:
        memory.expires_at = expiry(memory, memory.decided_at or now)
    after = snapshot(memory)
    if after != before:
        memory.updated_at = now
        memory.save()
        if memory.status == Memory.Status.PENDING and memory.proposal == Memory.Proposal.NEW:
            near = near_memories(
                memory.project, memory.scope, memory.content, exclude=memory.pk, now=now
            )
            memory.conflicts_with.set([other for other, _ in near.conflicts])
        changed = {k for k in after if after[k] != before[k]}
        event_record(
            memory,
            MemoryEvent.Action.EDITED,
            user=by,
            before={k: before[k] for k in sorted(changed)},
            after={k: after[k] for k in sorted(changed)},
            note=f"redacted: {', '.join(fields.redactions)}" if fields.redactions else "",
            at=now,
        )
    if approve:
        memory = _approve_locked(memory, by=by, now=now)
    return memory


def _refuse_a_twin(memory: Memory, *, content_changed: bool, now: datetime) -> None:
    """An edit may not make a memory the same sentence as another live one of its scope:
    approved (or once approved), the two would be the same line twice in MEMORY.md."""
    twin = same_sentence_live(
        memory.project_id, memory.scope, memory.fingerprint, exclude=memory.pk, now=now
    )
    if twin is not None:
        raise MemoryInputError(
            "content" if content_changed else "scope",
            f"memory #{twin.pk} of scope {twin.scope} already says this (“{twin.content}”): "
            "reject or expire one of them, or merge them, rather than make them the same",
        )


def expiry(memory: Memory, since: datetime) -> datetime | None:
    return since + timedelta(days=memory.ttl_days) if memory.ttl_days else None


class DecisionError(ValueError):
    pass


@transaction.atomic
def memory_approve(
    memory: Memory,
    *,
    by: User,
    now: datetime | None = None,
    actor_name: str = "",
    keep_both: bool = False,
) -> Memory:
    """Approve a pending candidate. A lifecycle proposal takes effect: evict expires its
    targets; merge and compress replace their targets with the proposal's text. A candidate
    that contradicts live memories (`conflicts_with`) supersedes them — they leave MEMORY.md
    and search, their history kept — unless `keep_both`. `actor_name` names a decider who is
    not a login (by=None), e.g. the demo's reviewer."""
    now = now or timezone.now()
    memory = _locked(memory)
    if memory.status != Memory.Status.PENDING:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not pending")
    return _approve_locked(memory, by=by, now=now, actor_name=actor_name, keep_both=keep_both)


def _supersede_locked(
    memory: Memory, *, by: User, now: datetime, actor_name: str, keep_both: bool
) -> str:
    """The contradicted memories of a candidate being approved: superseded by it, or (with
    `keep_both`) left as they are. Returns the note for the approval's event."""
    others = list(memory.conflicts_with.select_for_update().filter(status__in=LIVE).order_by("pk"))
    if not others:
        return ""
    listed = ", ".join(f"#{other.pk}" for other in others)
    if keep_both:
        return f"kept beside {listed}, which it contradicts"
    for other in others:
        _replaced(other, by=memory, link="superseded_by", user=by, actor_name=actor_name, now=now)
    return f"supersedes {listed}"


_REPLACED = {
    "superseded_by": (Memory.Status.SUPERSEDED, MemoryEvent.Action.SUPERSEDED),
    "merged_into": (Memory.Status.MERGED, MemoryEvent.Action.MERGED),
}


def _replaced(
    target: Memory, *, by: Memory, link: str, user: User, actor_name: str, now: datetime
) -> None:
    """`target` out of use, replaced by `by` (superseded by a newer fact, or merged into a
    proposal's text), with its history event; its caller holds its lock."""
    status, action = _REPLACED[link]
    target.status, target.updated_at = status, now
    setattr(target, link, by)
    target.save(update_fields=["status", link, "updated_at"])
    event_record(
        target,
        action,
        user=user,
        name=actor_name,
        after={"status": status, link: by.pk},
        note=by.content,
        at=now,
    )


def _updated(target: Memory, update: Memory, *, user: User, actor_name: str, now: datetime) -> None:
    """An update proposal approved: `target` takes its type and tags, with the edit's event;
    its caller holds both locks."""
    before = snapshot(target)
    target.type, target.tags = update.type, list(update.tags)
    after = snapshot(target)
    changed = sorted(k for k in after if after[k] != before[k])
    if not changed:
        return
    target.updated_at = now
    target.save(update_fields=["type", "tags", "updated_at"])
    event_record(
        target,
        MemoryEvent.Action.EDITED,
        user=user,
        name=actor_name,
        before={k: before[k] for k in changed},
        after={k: after[k] for k in changed},
        note=f"update proposal #{update.pk}",
        at=now,
    )


def _approve_locked(
    memory: Memory, *, by: User, now: datetime, actor_name: str = "", keep_both: bool = False
) -> Memory:
    """memory_approve's work on a pending memory its caller has locked."""
    note = ""
    if memory.proposal == Memory.Proposal.NEW:
        note = _supersede_locked(memory, by=by, now=now, actor_name=actor_name, keep_both=keep_both)
    targets = list(memory.targets.select_for_update()) if memory.proposal != "new" else []
    if memory.proposal == Memory.Proposal.EVICT:
        for target in targets:
            if target.status == Memory.Status.APPROVED:
                target.status, target.updated_at = Memory.Status.EXPIRED, now
                target.save(update_fields=["status", "updated_at"])
                event_record(
                    target,
                    MemoryEvent.Action.EVICTED,
                    user=by,
                    name=actor_name,
                    after={"status": target.status},
                    note=memory.content,
                    at=now,
                )
    elif memory.proposal == Memory.Proposal.UPDATE:
        for target in targets:
            if target.status in LIVE:
                _updated(target, memory, user=by, actor_name=actor_name, now=now)
    elif memory.proposal in (Memory.Proposal.MERGE, Memory.Proposal.COMPRESS):
        for target in targets:
            if target.status in LIVE:
                _replaced(
                    target, by=memory, link="merged_into", user=by, actor_name=actor_name, now=now
                )
        memory.proposal = Memory.Proposal.NEW  # from now on an ordinary memory
    memory.status = Memory.Status.APPROVED
    memory.decided_at = now
    memory.decided_by = by if by is not None and by.is_authenticated else None
    memory.expires_at = expiry(memory, now)
    memory.updated_at = now
    memory.save()
    event_record(
        memory,
        MemoryEvent.Action.APPROVED,
        user=by,
        name=actor_name,
        after={"status": memory.status},
        note=note,
        at=now,
    )
    return memory


@transaction.atomic
def memory_reject(memory: Memory, *, by: User, now: datetime | None = None) -> Memory:
    """Reject a pending candidate: its fingerprint keeps the sentence from coming back."""
    now = now or timezone.now()
    memory = _locked(memory)
    if memory.status != Memory.Status.PENDING:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not pending")
    return _reject_locked(memory, by=by, now=now)


def _reject_locked(memory: Memory, *, by: User, now: datetime) -> Memory:
    memory.status = Memory.Status.REJECTED
    memory.decided_at = now
    memory.decided_by = by if by is not None and by.is_authenticated else None
    memory.updated_at = now
    memory.save(update_fields=["status", "decided_at", "decided_by", "updated_at"])
    event_record(
        memory, MemoryEvent.Action.REJECTED, user=by, after={"status": memory.status}, at=now
    )
    return memory


DECISIONS = ("approve", "reject")


@dataclass(frozen=True, slots=True)
class Decided:
    """What a bulk decision did: the ids decided, and the ids asked for but skipped (decided
    meanwhile, not in the projects allowed, gone, or past `at_most`)."""

    decision: str
    decided: list[int]
    skipped: list[int]


@transaction.atomic
def candidates_decide(
    *,
    ids: Iterable[int],
    decision: str,
    by: User,
    project_ids: Sequence[int] | None = None,
    at_most: int | None = None,
    now: datetime | None = None,
) -> Decided:
    """Approve or reject many pending candidates in one transaction (the review queue's
    "Approve selected" / "Reject selected"). Each is locked (in id order, so two bulk
    decisions cannot deadlock) and decided only if still pending; the rest are skipped and
    counted. `project_ids` limits it to the decider's projects; `at_most` bounds the work."""
    if decision not in DECISIONS:
        raise MemoryInputError("action", 'must be "approve" or "reject"')
    now = now or timezone.now()
    wanted = sorted(set(ids))
    considered = wanted if at_most is None else wanted[:at_most]
    rows = Memory.objects.select_for_update().filter(pk__in=considered)
    if project_ids is not None:
        rows = rows.filter(project_id__in=project_ids)
    decided = []
    for memory in rows.order_by("pk"):
        if memory.status != Memory.Status.PENDING:
            continue
        if decision == "approve":
            _approve_locked(memory, by=by, now=now)
        else:
            _reject_locked(memory, by=by, now=now)
        decided.append(memory.pk)
    done = set(decided)
    return Decided(decision=decision, decided=decided, skipped=[i for i in wanted if i not in done])


@transaction.atomic
def memory_expire(
    memory: Memory, *, by: User = None, now: datetime | None = None, note: str = ""
) -> Memory:
    """Take an approved memory out of MEMORY.md and search (by a person, or its TTL)."""
    now = now or timezone.now()
    memory = _locked(memory)
    if memory.status != Memory.Status.APPROVED:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not approved")
    return _expire_locked(memory, by=by, now=now, note=note)


def _expire_locked(memory: Memory, *, by: User, now: datetime, note: str) -> Memory:
    memory.status = Memory.Status.EXPIRED
    memory.updated_at = now
    memory.save(update_fields=["status", "updated_at"])
    event_record(
        memory,
        MemoryEvent.Action.EXPIRED,
        user=by,
        name="ttl" if by is None else "",
        after={"status": memory.status},
        note=note,
        at=now,
    )
    return memory


def memories_expire_due(*, now: datetime | None = None, limit: int = EXPIRE_BATCH) -> int:
    """Expire approved memories past their expires_at (by nobody: the TTL), each in its own
    transaction. Each is claimed under a row lock with the condition checked again, so two
    sweeps expire it once."""
    now = now or timezone.now()
    due = list(
        Memory.objects.filter(status=Memory.Status.APPROVED, expires_at__lte=now)
        .order_by("expires_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    expired = 0
    for pk in due:
        with transaction.atomic():
            memory = (
                Memory.objects.select_for_update()
                .filter(pk=pk, status=Memory.Status.APPROVED, expires_at__lte=now)
                .first()
            )
            if memory is None:
                continue  # expired, edited or decided meanwhile
            note = f"TTL of {memory.ttl_days} days ran out" if memory.ttl_days else "TTL ran out"
            _expire_locked(memory, by=None, now=now, note=note)
            expired += 1
    return expired
