"""What happens to memories: proposed (with duplicates merged and rejected sentences kept
out), approved, edited, rejected, expired; and MEMORY.md, the approved memories of a scope as
the agent reads them. Every change is a MemoryEvent; nothing is approved without a person.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as AuthUser
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from costboard.models import Project, Session, Turn
from memory_ui.models import MAX_CONTENT, Memory, MemoryEvent
from memory_ui.text import fingerprint, similarity

MEMORY_MD_LINES = 200
MEMORY_MD_BYTES = 25_000
# near-duplicates: trigram similarity at or above this merges a proposal into a memory
DUPLICATE_SIMILARITY = 0.6
# "similar existing memories" shown beside a candidate in the review queue
RELATED_SIMILARITY = 0.3
REPETITION_BONUS = Decimal("0.05")  # importance added each time a memory is proposed again
DEFAULT_IMPORTANCE = Decimal("0.5")
PORTABLE_SCAN = 2000  # without pg_trgm: how many of a scope's memories are compared
SCOPE = re.compile(r"^(project|user:[\w.@+-]{1,128})$")
LIVE = (Memory.Status.PENDING, Memory.Status.APPROVED)

User = AuthUser | AnonymousUser | None  # who decides (None: the system)


class MemoryInputError(ValueError):
    """Bad input for a memory: which field, and how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def clean_content(content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise MemoryInputError("content", "is required: one sentence of what to remember")
    text = " ".join(content.split())  # one line: MEMORY.md has one entry per line
    if len(text) > MAX_CONTENT:
        raise MemoryInputError(
            "content", f"is {len(text)} characters; at most {MAX_CONTENT}: say it shorter"
        )
    return text


def clean_type(value: Any) -> str:
    if value not in Memory.Type.values:
        raise MemoryInputError("type", f"must be one of {', '.join(Memory.Type.values)}")
    return str(value)


def clean_scope(value: Any) -> str:
    if value is None or value == "":
        return "project"
    if not isinstance(value, str) or not SCOPE.match(value):
        raise MemoryInputError("scope", 'must be "project" or "user:<user_id>"')
    return value


def clean_importance(value: Any) -> Decimal:
    if value is None:
        return DEFAULT_IMPORTANCE
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        number = Decimal(-1)
    if isinstance(value, bool) or not number.is_finite() or not 0 <= number <= 1:
        raise MemoryInputError("importance", "must be a number from 0 to 1, e.g. 0.7")
    return number.quantize(Decimal("0.001"))


def clean_tags(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise MemoryInputError("tags", 'must be a list of strings, e.g. ["billing"]')
    tags = [t.strip()[:40] for t in value if t.strip()]
    if len(tags) > 20:
        raise MemoryInputError("tags", "at most 20 tags")
    return tags


def clean_ttl_days(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 36_500:
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
        memory=memory,
        action=action,
        actor=user if user is not None and user.is_authenticated else None,
        actor_name=_actor_name(user, name),
        before=before,
        after=after,
        note=note[:300],
        at=at,
    )


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
    PostgreSQL, the same measure in Python elsewhere), most similar first."""
    if connection.vendor == "postgresql":
        rows = Memory.objects.raw(
            """
            SELECT *, similarity(lower(content), lower(%s)) AS sim
            FROM memory_ui_memory
            WHERE project_id = %s AND scope = %s AND status = ANY(%s) AND id <> %s
              AND similarity(lower(content), lower(%s)) >= %s
            ORDER BY sim DESC, id
            LIMIT %s
            """,
            [content, project.pk, scope, list(statuses), exclude or 0, content, threshold, limit],
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
    duplicate) pending or approved, that memory proposed once more (its importance raised
    for the repetition); or None when the same sentence was rejected before."""
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
        .exclude(status__in=[Memory.Status.EXPIRED, Memory.Status.MERGED])
        .order_by("status", "pk")
        .first()
    )
    if same is not None and same.status == Memory.Status.REJECTED:
        return None
    note = ""
    if same is None:
        near = similar_memories(project, scope, content, threshold=DUPLICATE_SIMILARITY, limit=1)
        if near:
            same, score = near[0]
            note = f"near-duplicate ({score:.2f}) of a proposal: {content}"
    if same is not None:
        same.times_proposed += 1
        same.importance = min(Decimal(1), max(same.importance, weight) + REPETITION_BONUS)
        same.updated_at = now
        same.save(update_fields=["times_proposed", "importance", "updated_at"])
        _event(same, MemoryEvent.Action.REPROPOSED, name=proposed_by, note=note, at=now)
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
        evidence=evidence[:2000],
        redactions=sorted(set(redactions)),
        proposed_by=proposed_by[:150],
        created_at=now,
        updated_at=now,
    )
    _event(
        memory,
        MemoryEvent.Action.PROPOSED,
        name=proposed_by,
        after=snapshot(memory),
        note=f"redacted: {', '.join(memory.redactions)}" if memory.redactions else "",
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


@transaction.atomic
def memory_edit(memory: Memory, *, by: User, now: datetime | None = None, **changes: Any) -> Memory:
    """Change any of content, type, scope, importance, tags, ttl_days; the event keeps the
    before and after."""
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise MemoryInputError(sorted(unknown)[0], "cannot be edited")
    cleaners = {
        "content": clean_content,
        "type": clean_type,
        "scope": clean_scope,
        "importance": clean_importance,
        "tags": clean_tags,
        "ttl_days": clean_ttl_days,
    }
    cleaned = {name: cleaners[name](value) for name, value in changes.items()}
    now = now or timezone.now()
    memory = _locked(memory)
    before = snapshot(memory)
    for name, value in cleaned.items():
        setattr(memory, name, value)
    memory.fingerprint = fingerprint(memory.content)
    if memory.status == Memory.Status.APPROVED:
        memory.expires_at = _expiry(memory, memory.decided_at or now)
    after = snapshot(memory)
    if after == before:
        return memory
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
    return memory


def _expiry(memory: Memory, since: datetime) -> datetime | None:
    return since + timedelta(days=memory.ttl_days) if memory.ttl_days else None


class DecisionError(ValueError):
    pass


@transaction.atomic
def memory_approve(memory: Memory, *, by: User, now: datetime | None = None) -> Memory:
    """Approve a pending candidate. A lifecycle proposal takes effect: evict expires its
    targets; merge and compress replace their targets with the proposal's text."""
    now = now or timezone.now()
    memory = _locked(memory)
    if memory.status != Memory.Status.PENDING:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not pending")
    targets = list(memory.targets.select_for_update()) if memory.proposal != "new" else []
    if memory.proposal == Memory.Proposal.EVICT:
        for target in targets:
            if target.status == Memory.Status.APPROVED:
                target.status, target.updated_at = Memory.Status.EXPIRED, now
                target.save(update_fields=["status", "updated_at"])
                _event(target, MemoryEvent.Action.EVICTED, user=by, note=memory.content, at=now)
    elif memory.proposal in (Memory.Proposal.MERGE, Memory.Proposal.COMPRESS):
        for target in targets:
            if target.status in LIVE:
                target.status, target.merged_into, target.updated_at = (
                    Memory.Status.MERGED,
                    memory,
                    now,
                )
                target.save(update_fields=["status", "merged_into", "updated_at"])
                _event(target, MemoryEvent.Action.MERGED, user=by, note=memory.content, at=now)
        memory.proposal = Memory.Proposal.NEW  # from now on an ordinary memory
    memory.status = Memory.Status.APPROVED
    memory.decided_at = now
    memory.decided_by = by if by is not None and by.is_authenticated else None
    memory.expires_at = _expiry(memory, now)
    memory.updated_at = now
    memory.save()
    _event(memory, MemoryEvent.Action.APPROVED, user=by, at=now)
    return memory


@transaction.atomic
def memory_reject(memory: Memory, *, by: User, now: datetime | None = None) -> Memory:
    """Reject a pending candidate: its fingerprint keeps the sentence from coming back."""
    now = now or timezone.now()
    memory = _locked(memory)
    if memory.status != Memory.Status.PENDING:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not pending")
    memory.status = Memory.Status.REJECTED
    memory.decided_at = now
    memory.decided_by = by if by is not None and by.is_authenticated else None
    memory.updated_at = now
    memory.save(update_fields=["status", "decided_at", "decided_by", "updated_at"])
    _event(memory, MemoryEvent.Action.REJECTED, user=by, at=now)
    return memory


@transaction.atomic
def memory_expire(
    memory: Memory, *, by: User = None, now: datetime | None = None, note: str = ""
) -> Memory:
    """Take an approved memory out of MEMORY.md and search (by a person, or its TTL)."""
    now = now or timezone.now()
    memory = _locked(memory)
    if memory.status != Memory.Status.APPROVED:
        raise DecisionError(f"memory {memory.pk} is {memory.status}, not approved")
    memory.status = Memory.Status.EXPIRED
    memory.updated_at = now
    memory.save(update_fields=["status", "updated_at"])
    _event(
        memory,
        MemoryEvent.Action.EXPIRED,
        user=by,
        name="ttl" if by is None else "",
        note=note,
        at=now,
    )
    return memory


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
