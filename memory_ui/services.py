"""What happens to memories: proposed (with duplicates merged and rejected sentences kept
out), approved (one at a time or many at once), edited, rejected, expired (by a person or the
TTL); the lifecycle's evict/merge/compress proposals; searches logged and feedback on them;
approved memories imported in bulk; and MEMORY.md, the approved memories of a scope as the
agent reads them.

Every write of Memory, MemoryEvent, RetrievalLog and MemoryFeedback is here and nowhere else
(tests/memory_ui/test_writes.py scans for one): each function takes keyword arguments, runs
in its own transaction, locks the rows it decides on, and writes the MemoryEvent of every
change it makes — whose `after` holds what changed, so replaying a memory's events gives its
status and content now. Nothing is approved without a person.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as AuthUser
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from costboard.models import Project, Session, Turn
from memory_ui.conflicts import frame_key, judge
from memory_ui.models import MAX_CONTENT, Memory, MemoryEvent, MemoryFeedback, RetrievalLog
from memory_ui.text import fingerprint, similarity

MEMORY_MD_LINES = 200
MEMORY_MD_BYTES = 25_000
# the lifecycle proposes merging two live memories at least this similar (trigrams); a
# proposal itself is merged only into one that means the same (conflicts.same_meaning)
DUPLICATE_SIMILARITY = 0.6
NEAR_SHOWN = 5  # the contradicted memories a proposal lists at most
# memories of one frame a proposal is compared with at most, newest first: the bound on a
# lookup's work however many memories a scope holds
NEAR_POOL = 50
# "similar existing memories" shown beside a candidate in the review queue
RELATED_SIMILARITY = 0.3
REPETITION_BONUS = Decimal("0.05")  # importance added each time a memory is proposed again
DEFAULT_IMPORTANCE = Decimal("0.5")
PORTABLE_SCAN = 2000  # without pg_trgm: how many of a scope's memories are compared
# matched with fullmatch: `$` alone lets a trailing newline through ("user:a\n")
SCOPE = re.compile(r"^(project|user:[\w.@+-]{1,128})$")
LIVE = (Memory.Status.PENDING, Memory.Status.APPROVED)
MAX_TAGS = 20
MAX_TTL_DAYS = 36_500  # a hundred years
MAX_QUERY = 500  # RetrievalLog.query's length
EXPIRE_BATCH = 5000  # TTL expiries in one sweep at most

User = AuthUser | AnonymousUser | None  # who decides (None: the system)


class MemoryInputError(ValueError):
    """Bad input for a memory: which field, and how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# The API hands these what it parsed from JSON, as it came: each is checked at run time too,
# whatever its annotation says.


def clean_content(content: str) -> str:
    if not isinstance(content, str) or not content.strip():
        raise MemoryInputError("content", "is required: one sentence of what to remember")
    text = " ".join(content.split())  # one line: MEMORY.md has one entry per line
    if len(text) > MAX_CONTENT:
        raise MemoryInputError(
            "content", f"is {len(text)} characters; at most {MAX_CONTENT}: say it shorter"
        )
    return text


def clean_type(value: str) -> str:
    if value not in Memory.Type.values:
        raise MemoryInputError("type", f"must be one of {', '.join(Memory.Type.values)}")
    return str(value)


def clean_scope(value: str | None) -> str:
    if value is None or value == "":
        return "project"
    if not isinstance(value, str) or not SCOPE.fullmatch(value):
        raise MemoryInputError("scope", 'must be "project" or "user:<user_id>"')
    return value


def clean_importance(value: Decimal | float | str | None) -> Decimal:
    if value is None:
        return DEFAULT_IMPORTANCE
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        number = Decimal(-1)
    if isinstance(value, bool) or not number.is_finite() or not 0 <= number <= 1:
        raise MemoryInputError("importance", "must be a number from 0 to 1, e.g. 0.7")
    return number.quantize(Decimal("0.001"))


def clean_tags(value: Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise MemoryInputError("tags", 'must be a list of strings, e.g. ["billing"]')
    tags = [t.strip()[:40] for t in value if t.strip()]
    if len(tags) > MAX_TAGS:
        raise MemoryInputError("tags", f"at most {MAX_TAGS} tags")
    return tags


def clean_ttl_days(value: int | str | None) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTL_DAYS:
        raise MemoryInputError("ttl_days", "must be a whole number of days from 1 to 36500")
    return value


def _actor_name(user: User, fallback: str = "") -> str:
    if user is not None and user.is_authenticated:
        return user.get_username()
    return fallback


def _event(
    memory: Memory,
    action: str,
    *,
    user: User = None,
    name: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    note: str = "",
    at: datetime,
) -> MemoryEvent:
    return MemoryEvent.objects.create(
        **_event_fields(
            memory, action, user=user, name=name, before=before, after=after, note=note, at=at
        )
    )


def _event_fields(
    memory: Memory,
    action: str,
    *,
    user: User = None,
    name: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    note: str = "",
    at: datetime,
) -> dict[str, Any]:
    return {
        "memory": memory,
        "action": action,
        "actor": user if user is not None and user.is_authenticated else None,
        "actor_name": _actor_name(user, name),
        "before": before,
        "after": after,
        "note": note[:300],
        "at": at,
    }


def similar_memories(
    project: Project,
    scope: str,
    content: str,
    *,
    threshold: float = RELATED_SIMILARITY,
    statuses: Sequence[str] = LIVE,
    exclude: int | None = None,
    limit: int = 3,
) -> list[tuple[Memory, float]]:
    """A scope's memories most like `content`, with their similarity (pg_trgm's on
    PostgreSQL, the same measure in Python elsewhere), most similar first.

    On PostgreSQL the GiST trigram index over lower(content) (migration 0004) answers it,
    nearest first (`<->`), only rows at least `threshold` similar (`%`, with
    pg_trgm.similarity_threshold set for this transaction): it reads the few nearest rows,
    not the scope."""
    if connection.vendor == "postgresql":
        with transaction.atomic():
            trigram_threshold(threshold)
            rows = Memory.objects.raw(
                """
                SELECT *, similarity(lower(content), lower(%s)) AS sim
                FROM memory_ui_memory
                WHERE lower(content) %% lower(%s)
                  AND project_id = %s AND scope = %s AND status = ANY(%s) AND id <> %s
                ORDER BY lower(content) <-> lower(%s), id
                LIMIT %s
                """,
                [
                    content,
                    content,
                    project.pk,
                    scope,
                    list(statuses),
                    exclude or 0,
                    content,
                    limit,
                ],
            )
            return [(m, float(m.sim)) for m in rows]  # type: ignore[attr-defined]
    pool = (
        Memory.objects.filter(project=project, scope=scope, status__in=statuses)
        .exclude(pk=exclude or 0)
        .order_by("-updated_at")[:PORTABLE_SCAN]
    )
    scored = [(m, similarity(content, m.content)) for m in pool]
    scored = [(m, s) for m, s in scored if s >= threshold]
    scored.sort(key=lambda pair: (-pair[1], pair[0].pk))
    return scored[:limit]


def trigram_threshold(threshold: float) -> None:
    """pg_trgm's `%` threshold for the rest of this transaction (PostgreSQL only)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('pg_trgm.similarity_threshold', %s, true)", [str(threshold)]
        )


@dataclass(frozen=True, slots=True)
class Near:
    """What a proposal is to the memories nearest it: the one it repeats (same meaning),
    and the ones it contradicts, each with why."""

    duplicate: tuple[Memory, float] | None
    conflicts: list[tuple[Memory, str]]


def near_memories(
    project: Project, scope: str, content: str, *, exclude: int | None = None
) -> Near:
    """The scope's live memories of the same frame as `content` (conflicts.frame_key, one
    btree lookup), read as the one it repeats (same claims) or ones it contradicts."""
    key = frame_key(content)
    if not key:
        return Near(duplicate=None, conflicts=[])
    same_frame = (
        Memory.objects.filter(project=project, scope=scope, frame_key=key, status__in=LIVE)
        .filter(proposal=Memory.Proposal.NEW)
        .exclude(pk=exclude or 0)
        .only("id", "content", "status")
        .order_by("-updated_at", "-pk")[:NEAR_POOL]
    )
    duplicate: tuple[Memory, float] | None = None
    found: list[tuple[Memory, str]] = []
    for memory in same_frame:
        verdict = judge(content, memory.content)
        if verdict:
            if len(found) < NEAR_SHOWN:
                found.append((memory, verdict))
        elif verdict == "" and duplicate is None:
            duplicate = (memory, similarity(content, memory.content))
    return Near(duplicate=duplicate, conflicts=found)


@transaction.atomic
def candidate_propose(
    *,
    project: Project,
    type: str,
    content: str,
    scope: str = "project",
    importance: Decimal | float | str | None = None,
    source: str = Memory.Source.AGENT_INFERRED,
    session: Session | None = None,
    turn: Turn | None = None,
    evidence: str = "",
    redactions: Iterable[str] = (),
    proposed_by: str = "",
    tags: list[str] | None = None,
    ttl_days: int | None = None,
    now: datetime | None = None,
) -> Memory | None:
    """A pending candidate; or, when the scope already has the same sentence (or a near
    duplicate that means the same) pending or approved, that memory proposed once more (its
    importance raised for the repetition); or None when the same sentence was rejected before.

    A sentence near-identical to a live memory but for a number, a date, a version, a
    negation or an opposite (memory_ui.conflicts) is never merged: it is a new candidate whose
    `conflicts_with` lists the memories it contradicts, for a person to decide between."""
    now = now or timezone.now()
    content = clean_content(content)
    type = clean_type(type)
    scope = clean_scope(scope)
    weight = clean_importance(importance)
    tags = clean_tags(tags)
    ttl_days = clean_ttl_days(ttl_days)
    fp = fingerprint(content)
    # one proposer at a time per project (a row lock that doesn't block ingest's inserts)
    Project.objects.select_for_update(no_key=True).filter(pk=project.pk).first()
    same = (
        Memory.objects.filter(project=project, scope=scope, fingerprint=fp)
        # a lifecycle proposal (evict/merge/compress) rejected is not its sentence rejected
        .filter(proposal=Memory.Proposal.NEW)
        .exclude(status__in=[Memory.Status.EXPIRED, Memory.Status.MERGED, Memory.Status.SUPERSEDED])
        .order_by("status", "pk")
        .first()
    )
    if same is not None and same.status == Memory.Status.REJECTED:
        return None
    note = ""
    contradicts: list[tuple[Memory, str]] = []
    if same is None:
        near = near_memories(project, scope, content)
        contradicts = near.conflicts
        if near.duplicate is not None:
            same, score = near.duplicate
            note = f"near-duplicate ({score:.2f}) of a proposal: {content}"
    if same is not None:
        # a reviewer may be deciding on it or editing it now: wait for its row, read it again
        same = Memory.objects.select_for_update().filter(pk=same.pk).first()
        if same is not None and same.status == Memory.Status.REJECTED and same.fingerprint == fp:
            return None
        if same is not None and same.status not in LIVE:
            same = None  # decided meanwhile: this sentence is new again
    if same is not None:
        same.times_proposed += 1
        same.importance = min(Decimal(1), max(same.importance, weight) + REPETITION_BONUS)
        same.updated_at = now
        same.save(update_fields=["times_proposed", "importance", "updated_at"])
        _event(
            same,
            MemoryEvent.Action.REPROPOSED,
            name=proposed_by,
            after={"times_proposed": same.times_proposed, "importance": str(same.importance)},
            note=note,
            at=now,
        )
        return same
    memory = Memory.objects.create(
        project=project,
        type=type,
        content=content,
        scope=scope,
        importance=weight,
        source=source,
        tags=tags,
        ttl_days=ttl_days,
        session=session,
        turn=turn,
        fingerprint=fp,
        frame_key=frame_key(content),
        evidence=evidence[:2000],
        redactions=sorted(set(redactions)),
        proposed_by=proposed_by[:150],
        created_at=now,
        updated_at=now,
    )
    notes = [f"redacted: {', '.join(memory.redactions)}"] if memory.redactions else []
    if contradicts:
        memory.conflicts_with.set([other for other, _ in contradicts])
        notes += [f"contradicts #{other.pk} ({why})" for other, why in contradicts]
    _event(
        memory,
        MemoryEvent.Action.PROPOSED,
        name=proposed_by,
        after=snapshot(memory),
        note="; ".join(notes),
        at=now,
    )
    return memory


EDITABLE = ("content", "type", "scope", "importance", "tags", "ttl_days")


def snapshot(memory: Memory) -> dict[str, Any]:
    return {
        "content": memory.content,
        "type": memory.type,
        "scope": memory.scope,
        "importance": str(memory.importance),
        "tags": list(memory.tags),
        "ttl_days": memory.ttl_days,
        "status": memory.status,
    }


def _locked(memory: Memory) -> Memory:
    return Memory.objects.select_for_update().get(pk=memory.pk)


def _cleaned(changes: dict[str, Any]) -> dict[str, Any]:
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise MemoryInputError(sorted(unknown)[0], "cannot be edited")
    cleaners: dict[str, Callable[[Any], Any]] = {
        "content": clean_content,
        "type": clean_type,
        "scope": clean_scope,
        "importance": clean_importance,
        "tags": clean_tags,
        "ttl_days": clean_ttl_days,
    }
    return {name: cleaners[name](value) for name, value in changes.items()}


@transaction.atomic
def memory_edit(
    memory: Memory,
    *,
    by: User,
    approve: bool = False,
    now: datetime | None = None,
    **changes: Any,
) -> Memory:
    """Change any of content, type, scope, importance, tags, ttl_days; the event keeps the
    before and after. With `approve`, a pending candidate is approved in the same transaction
    (the review queue's "Save and approve"): both or neither, and DecisionError if it was
    decided meanwhile."""
    cleaned = _cleaned(changes)
    now = now or timezone.now()
    memory = _locked(memory)
    if approve and memory.status != Memory.Status.PENDING:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not pending")
    before = snapshot(memory)
    for name, value in cleaned.items():
        setattr(memory, name, value)
    memory.fingerprint = fingerprint(memory.content)
    memory.frame_key = frame_key(memory.content)
    if memory.status == Memory.Status.APPROVED:
        memory.expires_at = _expiry(memory, memory.decided_at or now)
    after = snapshot(memory)
    if after != before:
        memory.updated_at = now
        memory.save()
        changed = {k for k in after if after[k] != before[k]}
        _event(
            memory,
            MemoryEvent.Action.EDITED,
            user=by,
            before={k: before[k] for k in sorted(changed)},
            after={k: after[k] for k in sorted(changed)},
            at=now,
        )
    if approve:
        memory = _approve_locked(memory, by=by, now=now)
    return memory


def _expiry(memory: Memory, since: datetime) -> datetime | None:
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
    _event(
        target,
        action,
        user=user,
        name=actor_name,
        after={"status": status, link: by.pk},
        note=by.content,
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
                _event(
                    target,
                    MemoryEvent.Action.EVICTED,
                    user=by,
                    name=actor_name,
                    after={"status": target.status},
                    note=memory.content,
                    at=now,
                )
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
    memory.expires_at = _expiry(memory, now)
    memory.updated_at = now
    memory.save()
    _event(
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
    _event(memory, MemoryEvent.Action.REJECTED, user=by, after={"status": memory.status}, at=now)
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
    _event(
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


# --- lifecycle proposals (memory_ui.lifecycle decides what to propose) -------------------------


@transaction.atomic
def proposal_create(
    *,
    project: Project,
    scope: str,
    kind: str,
    type: str,
    content: str,
    target_ids: Sequence[int],
    importance: Decimal = DEFAULT_IMPORTANCE,
    source: str = Memory.Source.AGENT_INFERRED,
    tags: Sequence[str] = (),
    ttl_days: int | None = None,
    evidence: str = "",
    note: str,
    proposed_by: str,
    now: datetime | None = None,
) -> Memory:
    """A pending evict, merge or compress proposal acting on `target_ids`, for a person to
    decide (memory_approve applies it). Unlike candidate_propose it is never merged into a
    memory with the same text: a merge proposal carries one of its targets' text."""
    if kind not in (Memory.Proposal.EVICT, Memory.Proposal.MERGE, Memory.Proposal.COMPRESS):
        raise MemoryInputError("proposal", "must be evict, merge or compress")
    if not target_ids:
        raise MemoryInputError("targets", "a proposal acts on at least one memory")
    now = now or timezone.now()
    content = clean_content(content)
    # one proposer at a time per project, as candidate_propose (re-entrant for the lifecycle)
    Project.objects.select_for_update(no_key=True).filter(pk=project.pk).first()
    memory = Memory.objects.create(
        project=project,
        type=clean_type(type),
        content=content,
        scope=clean_scope(scope),
        importance=clean_importance(importance),
        source=source,
        tags=clean_tags(tags),
        ttl_days=clean_ttl_days(ttl_days),
        # an eviction is not a sentence to remember; a merge or compression becomes one
        fingerprint="" if kind == Memory.Proposal.EVICT else fingerprint(content),
        frame_key="" if kind == Memory.Proposal.EVICT else frame_key(content),
        evidence=evidence[:2000],
        proposal=kind,
        proposed_by=proposed_by[:150],
        created_at=now,
        updated_at=now,
    )
    memory.targets.set(target_ids)
    _event(
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
    type: str,
    content: str,
    target_ids: Sequence[int],
    evidence: str,
    note: str,
    proposed_by: str,
    now: datetime | None = None,
) -> Memory | None:
    """Bring a waiting eviction proposal up to date (what MEMORY.md's cap cuts now), its
    history keeping the before and after; None if it is no longer a pending eviction (decided
    meanwhile: the caller proposes a new one)."""
    now = now or timezone.now()
    memory = (
        Memory.objects.select_for_update()
        .filter(pk=proposal_id, status=Memory.Status.PENDING, proposal=Memory.Proposal.EVICT)
        .first()
    )
    if memory is None:
        return None
    before = {**snapshot(memory), "targets": sorted(memory.targets.values_list("pk", flat=True))}
    memory.content, memory.type = clean_content(content), clean_type(type)
    memory.evidence = evidence[:2000]
    memory.times_proposed += 1
    memory.updated_at = now
    memory.save(update_fields=["content", "type", "evidence", "times_proposed", "updated_at"])
    memory.targets.set(target_ids)
    _event(
        memory,
        MemoryEvent.Action.REPROPOSED,
        name=proposed_by,
        before=before,
        after={**snapshot(memory), "targets": sorted(target_ids)},
        note=note,
        at=now,
    )
    return memory


# --- searches and feedback: the hit-rate figures ----------------------------------------------


class _Retrieved(Protocol):
    @property
    def memory_id(self) -> int: ...


@transaction.atomic
def retrieval_log_record(
    *, project: Project, query: str, scope: str, k: int, ranked: Sequence[_Retrieved]
) -> RetrievalLog:
    """Log one search and what it returned (ranking.Ranked results); its id comes back to the
    agent for feedback."""
    return RetrievalLog.objects.create(
        project=project,
        query=query[:MAX_QUERY],
        scope=scope,
        k=k,
        results=len(ranked),
        memory_ids=[r.memory_id for r in ranked],
    )


class NotFound(LookupError):
    """An id that is not the project's: which field, and what was asked."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _whole_number(field: str, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MemoryInputError(field, f"must be the id of {what} (a whole number); got {value!r}")
    return value


@transaction.atomic
def memory_feedback_add(
    *,
    project: Project,
    memory_id: object,
    useful: object,
    retrieval_id: object = None,
    now: datetime | None = None,
) -> MemoryFeedback:
    """Was a retrieved memory useful? The memory (and the search, if given) must be the
    project's. Its values are JSON as the API parsed it (object): each is checked here."""
    memory_pk = _whole_number("memory_id", memory_id, "the memory")
    if not isinstance(useful, bool):
        raise MemoryInputError("useful", "is required: true if the memory helped, else false")
    retrieval_pk = (
        None
        if retrieval_id is None
        else _whole_number("retrieval_id", retrieval_id, "the search (its retrieval_id)")
    )
    memory = Memory.objects.filter(project=project, pk=memory_pk).only("pk").first()
    if memory is None:
        raise NotFound("memory_id", f"no memory {memory_pk} in project {project.slug}")
    retrieval = None
    if retrieval_pk is not None:
        retrieval = RetrievalLog.objects.filter(project=project, pk=retrieval_pk).first()
        if retrieval is None:
            raise NotFound("retrieval_id", f"no search {retrieval_pk} in project {project.slug}")
    return MemoryFeedback.objects.create(
        project=project,
        memory=memory,
        retrieval=retrieval,
        useful=useful,
        created_at=now or timezone.now(),
    )


# --- approved memories in bulk ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryImport:
    """One approved memory to import, with when it was proposed and decided."""

    type: str
    content: str
    scope: str = "project"
    importance: Decimal = DEFAULT_IMPORTANCE
    source: str = Memory.Source.AGENT_INFERRED
    tags: tuple[str, ...] = ()
    ttl_days: int | None = None
    proposed_at: datetime | None = None  # default: decided_at
    decided_at: datetime | None = None  # default: now


@transaction.atomic
def memories_import(
    *,
    project: Project,
    memories: Sequence[MemoryImport],
    by: User = None,
    actor_name: str = "import",
    now: datetime | None = None,
    batch_size: int = 2000,
) -> list[Memory]:
    """Approved memories in bulk (a benchmark's scope of 10,000, an existing MEMORY.md), each
    with its history — proposed, then approved — in one transaction and a few statements. No
    duplicate check: for a set known to be new and distinct."""
    if not connection.features.can_return_rows_from_bulk_insert:
        raise RuntimeError(f"{connection.vendor} cannot return ids from a bulk insert")
    now = now or timezone.now()
    rows = []
    for entry in memories:
        content = clean_content(entry.content)
        decided = entry.decided_at or now
        memory = Memory(
            project=project,
            type=clean_type(entry.type),
            content=content,
            scope=clean_scope(entry.scope),
            status=Memory.Status.APPROVED,
            importance=clean_importance(entry.importance),
            source=entry.source,
            tags=clean_tags(entry.tags),
            ttl_days=clean_ttl_days(entry.ttl_days),
            fingerprint=fingerprint(content),
            frame_key=frame_key(content),
            proposed_by=actor_name[:150],
            created_at=entry.proposed_at or decided,
            updated_at=decided,
            decided_at=decided,
            decided_by=by if by is not None and by.is_authenticated else None,
        )
        memory.expires_at = _expiry(memory, decided)
        rows.append(memory)
    Memory.objects.bulk_create(rows, batch_size=batch_size)
    history = []
    for memory in rows:
        proposed = {**snapshot(memory), "status": Memory.Status.PENDING.value}
        history.append(
            MemoryEvent(
                **_event_fields(
                    memory,
                    MemoryEvent.Action.PROPOSED,
                    name=actor_name,
                    after=proposed,
                    note="imported",
                    at=memory.created_at,
                )
            )
        )
        history.append(
            MemoryEvent(
                **_event_fields(
                    memory,
                    MemoryEvent.Action.APPROVED,
                    user=by,
                    name=actor_name,
                    after={"status": memory.status},
                    at=memory.decided_at or now,
                )
            )
        )
    MemoryEvent.objects.bulk_create(history, batch_size=batch_size)
    return rows


def live_memories(project: Project, scope: str, now: datetime | None = None) -> Any:
    """A scope's approved memories that have not expired: what MEMORY.md and search read."""
    now = now or timezone.now()
    return Memory.objects.filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now),
        project=project,
        scope=scope,
        status=Memory.Status.APPROVED,
        proposal=Memory.Proposal.NEW,
    )


@dataclass(frozen=True, slots=True)
class MemoryMd:
    text: str
    lines: int
    bytes: int
    total: int  # live entries in the scope
    cut: list[Memory]  # the first few the cap left out
    cut_count: int


def memory_line(memory: Memory) -> str:
    return f"[{memory.type}] {memory.content}"


def memory_md(
    project: Project, scope: str = "project", *, now: datetime | None = None, show_cut: int = 5
) -> MemoryMd:
    """MEMORY.md: one `[type] content` line per live entry, most important first (then the
    newest), at most 200 lines and 25,000 bytes (UTF-8, newlines counted), cut at a line
    boundary. At most 200 entries fit, so at most 200 (+ a few to show as cut) are read."""
    live = live_memories(project, scope, now).order_by("-importance", "-decided_at", "-pk")
    rows = list(live.only("id", "type", "content", "importance")[: MEMORY_MD_LINES + show_cut])
    lines: list[str] = []
    size = 0
    kept = 0
    for memory in rows[:MEMORY_MD_LINES]:
        line = memory_line(memory)
        line_bytes = len(line.encode()) + 1
        if size + line_bytes > MEMORY_MD_BYTES:
            break
        lines.append(line)
        size += line_bytes
        kept += 1
    total = len(rows) if len(rows) < MEMORY_MD_LINES + show_cut else live.count()
    return MemoryMd(
        text="".join(f"{line}\n" for line in lines),
        lines=kept,
        bytes=size,
        total=total,
        cut=rows[kept : kept + show_cut],
        cut_count=total - kept,
    )
