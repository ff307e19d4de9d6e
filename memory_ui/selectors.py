"""Reads for the memory pages: the review queue (with similar approved memories for a whole
page in one query), the memory browser's scopes and groups, a memory's history, and the
metrics; and a scope's memories near a sentence (the one a proposal repeats, the ones it
contradicts, the similar ones beside a candidate). Writes live in memory_ui/writes/."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import reduce
from operator import or_
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    F,
    IntegerField,
    Min,
    Prefetch,
    Q,
    QuerySet,
    Sum,
    When,
)
from django.db.models import Value as V
from django.db.models.expressions import Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from costboard.models import Project
from memory_ui import ranking
from memory_ui.cleaners import Search
from memory_ui.conflicts import frame_key, judge
from memory_ui.memory_file import unexpired
from memory_ui.models import Memory, MemoryEvent, MemoryFeedback, RetrievalLog
from memory_ui.ranking import PORTABLE_SCAN
from memory_ui.text import similarity

REVIEW_PAGE_SIZE = 50
SIMILAR_SHOWN = 3  # a candidate's "Similar approved" aside (views.memory_similar)
SCOPE_CHOICES_SHOWN = 100  # the queue's scope filter lists at most this many scopes
METRICS_DAYS = 30
NEAR_SHOWN = 5  # the contradicted memories a proposal lists at most
# memories of one frame a proposal is compared with at most, newest first: the bound on a
# lookup's work however many memories a scope holds
NEAR_POOL = 50
# "similar existing memories" shown beside a candidate in the review queue
RELATED_SIMILARITY = 0.3
LIVE = (Memory.Status.PENDING, Memory.Status.APPROVED)

# --- the review queue -----------------------------------------------------------------------


def memories_pending(
    *, project_ids: Sequence[int], type: str = "", scope: str = ""
) -> QuerySet[Memory]:
    """Pending candidates, newest first, with what a queue row shows (project, session, turn,
    a proposal's targets) read in the same query or one prefetch."""
    pending = Memory.objects.filter(project_id__in=project_ids, status=Memory.Status.PENDING)
    if type:
        pending = pending.filter(type=type)
    if scope:
        pending = pending.filter(scope=scope)
    targets = Memory.objects.only("id", "type", "content", "status").order_by("pk")
    return (
        pending.select_related("project", "session", "turn")
        .defer(
            "session__metadata",
            "turn__assistant_response",
            "turn__context",
        )
        .prefetch_related(
            Prefetch("targets", queryset=targets),
            Prefetch("conflicts_with", queryset=targets.all(), to_attr="conflicting"),
        )
        .order_by("-created_at", "-pk")
    )


@dataclass(frozen=True)
class PendingCounts:
    by_type: dict[str, int]
    oldest: datetime | None

    @property
    def total(self) -> int:
        return sum(self.by_type.values())


def pending_counts(*, project_ids: Sequence[int], scope: str = "") -> PendingCounts:
    """Pending candidates per type (every type, zeros included) and the oldest one's time."""
    pending = Memory.objects.filter(project_id__in=project_ids, status=Memory.Status.PENDING)
    if scope:
        pending = pending.filter(scope=scope)
    rows = pending.values("type").annotate(n=Count("id"), oldest=Min("created_at")).order_by()
    by_type = dict.fromkeys(Memory.Type.values, 0)
    oldest: datetime | None = None
    for row in rows:
        by_type[row["type"]] = row["n"]
        if oldest is None or row["oldest"] < oldest:
            oldest = row["oldest"]
    return PendingCounts(by_type=by_type, oldest=oldest)


def pending_total(*, project_ids: Sequence[int]) -> int:
    """The nav badge: one COUNT on the queue index."""
    return Memory.objects.filter(project_id__in=project_ids, status=Memory.Status.PENDING).count()


def pending_scopes(*, project_ids: Sequence[int]) -> list[str]:
    """The scopes that have pending candidates, for the queue's scope filter."""
    scopes = (
        Memory.objects.filter(project_id__in=project_ids, status=Memory.Status.PENDING)
        .order_by("scope")
        .values_list("scope", flat=True)
        .distinct()
    )
    return list(scopes[:SCOPE_CHOICES_SHOWN])


def candidate_sentence(memory: Memory) -> str:
    """The sentence a candidate came from: its evidence (as redacted), else its turn's user
    message."""
    if memory.evidence:
        return memory.evidence
    if memory.turn_id is not None and memory.turn is not None:
        return memory.turn.user_message
    return ""


# --- the memory browser ---------------------------------------------------------------------


def memories_approved(
    *, project_ids: Sequence[int], type: str = "", scope: str = ""
) -> QuerySet[Memory]:
    """Approved memories not past their TTL (memory_file.unexpired): what the browser lists
    beside each scope's MEMORY.md. An approved eviction is a decision, not a memory: left
    out, as MEMORY.md leaves it out."""
    approved = Memory.objects.filter(
        unexpired(timezone.now()),
        project_id__in=project_ids,
        status=Memory.Status.APPROVED,
        proposal=Memory.Proposal.NEW,
    )
    if type:
        approved = approved.filter(type=type)
    if scope:
        approved = approved.filter(scope=scope)
    return approved


# within a group, the order MEMORY.md uses: most important, then the newest decision
GROUP_ORDER = ("-importance", "-decided_at", "-pk")


def scope_sections(
    *, project_ids: Sequence[int], type: str = "", scope: str = ""
) -> QuerySet[Any, Any]:
    """(project, scope) pairs with approved memories and how many (rows of project_id, scope,
    n): the browser's sections, each project's "project" scope first."""
    return (
        memories_approved(project_ids=project_ids, type=type, scope=scope)
        .values("project_id", "scope")
        .annotate(
            n=Count("id"),
            shared=Case(
                When(scope="project", then=V(0)), default=V(1), output_field=IntegerField()
            ),
        )
        .order_by("project_id", "shared", "scope")
    )


@dataclass
class TypeGroup:
    type: str
    count: int
    memories: list[Memory] = field(default_factory=list)

    @property
    def more(self) -> int:
        return self.count - len(self.memories)


def type_groups(
    *,
    sections: Iterable[tuple[int, str]],
    type: str = "",
    per_group: int,
) -> dict[tuple[int, str], list[TypeGroup]]:
    """For each (project, scope): its approved memories per type, the first `per_group` of
    each in MEMORY.md's order. Two queries whatever the number of sections."""
    pairs = sorted(set(sections))
    if not pairs:
        return {}
    in_pairs = reduce(or_, (Q(project_id=p, scope=s) for p, s in pairs))
    approved = Memory.objects.filter(
        in_pairs,
        unexpired(timezone.now()),
        status=Memory.Status.APPROVED,
        proposal=Memory.Proposal.NEW,
    )
    if type:
        approved = approved.filter(type=type)
    counts = approved.values("project_id", "scope", "type").annotate(n=Count("id")).order_by()
    groups: dict[tuple[int, str], dict[str, TypeGroup]] = defaultdict(dict)
    for row in counts:
        key = (row["project_id"], row["scope"])
        groups[key][row["type"]] = TypeGroup(type=row["type"], count=row["n"])
    if per_group <= 0:
        return _in_type_order(groups)
    first = approved.annotate(
        rank=Window(
            RowNumber(),
            partition_by=[F("project_id"), F("scope"), F("type")],
            order_by=[
                F("importance").desc(),
                F("decided_at").desc(nulls_last=True),
                F("id").desc(),
            ],
        )
    ).filter(rank__lte=per_group)
    for memory in first.order_by(*GROUP_ORDER):
        group = groups[(memory.project_id, memory.scope)].get(memory.type)
        if group is not None:
            group.memories.append(memory)
    return _in_type_order(groups)


def _in_type_order(
    groups: dict[tuple[int, str], dict[str, TypeGroup]],
) -> dict[tuple[int, str], list[TypeGroup]]:
    order = {name: i for i, name in enumerate(Memory.Type.values)}
    return {
        key: sorted(by_type.values(), key=lambda g: order.get(g.type, 99))
        for key, by_type in groups.items()
    }


RANKED_SHOWN = 50  # ranking's most (its k)


def memories_ranked(
    *, project: Project, search: Search, type: str = ""
) -> list[tuple[Memory, ranking.Ranked]]:
    """What the agent's search (GET /api/v1/memory/search) would return for `search`, best
    first, with the score's components; not logged as a retrieval. Two queries."""
    ranked = ranking.memories_search(project=project, search=search)
    memories = Memory.objects.select_related("project").in_bulk([r.memory_id for r in ranked])
    return [
        (memories[r.memory_id], r)
        for r in ranked
        if r.memory_id in memories and (not type or memories[r.memory_id].type == type)
    ]


def memories_search(
    *, project_ids: Sequence[int], q: str, type: str = "", scope: str = ""
) -> QuerySet[Memory]:
    """Approved memories whose content contains the words asked for (each of them), in
    MEMORY.md's order: the search across projects, where ranking (one project's scope) does
    not apply."""
    found = memories_approved(project_ids=project_ids, type=type, scope=scope)
    for word in q.split()[:10]:
        found = found.filter(content__icontains=word)
    return found.select_related("project").order_by(*GROUP_ORDER)


# --- one memory -----------------------------------------------------------------------------


def memory_in_projects(*, pk: int, project_ids: Sequence[int]) -> Memory | None:
    """One memory with what its row and page show, if it is in one of these projects."""
    return (
        Memory.objects.select_related("project", "session", "turn")
        .filter(pk=pk, project_id__in=project_ids)
        .first()
    )


def memory_history(memory: Memory) -> list[MemoryEvent]:
    return list(memory.events.select_related("actor").order_by("at", "id"))


def memory_targets(memory: Memory) -> list[Memory]:
    """What a lifecycle proposal acts on."""
    return list(memory.targets.order_by("pk"))


def memory_contradicts(memory: Memory) -> list[Memory]:
    """The memories it contradicted when it was proposed, and those that contradict it."""
    return list(
        Memory.objects.filter(Q(conflicted_by=memory) | Q(conflicts_with=memory))
        .distinct()
        .order_by("pk")
    )


def memory_supersedes(memory: Memory) -> list[Memory]:
    """The memories its approval superseded."""
    return list(memory.supersedes.order_by("pk"))


def memory_merged_from(memory: Memory) -> list[Memory]:
    """The memories merged or compressed into this one."""
    return list(memory.merged_from.order_by("pk"))


# --- metrics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """A figure with what it is made of; no denominator, no figure."""

    numerator: int
    denominator: int

    @property
    def value(self) -> Decimal | None:
        if not self.denominator:
            return None
        return Decimal(self.numerator) / Decimal(self.denominator)


@dataclass(frozen=True)
class MemoryMetrics:
    since: datetime
    pending: int
    oldest_pending: datetime | None
    approval: Ratio  # approved / (approved + rejected) decisions in the window
    hit: Ratio  # useful feedback / all feedback in the window
    cleanup: Ratio  # expired in the window / (approved now + expired in the window)
    expired: int
    approved_now: int
    searches: Ratio  # results returned / searches in the window (an average, not a share)
    false_retrieval: Ratio  # not-useful feedback / all feedback in the window

    @property
    def results_per_search(self) -> Decimal | None:
        return self.searches.value


def memory_metrics(*, project_ids: Sequence[int], now: datetime | None = None) -> MemoryMetrics:
    """The metrics page's figures over the last 30 days, in five aggregate queries."""
    now = now or timezone.now()
    since = now - timedelta(days=METRICS_DAYS)
    memories = Memory.objects.filter(project_id__in=project_ids)
    stock = memories.aggregate(
        pending=Count("id", filter=Q(status=Memory.Status.PENDING)),
        oldest=Min("created_at", filter=Q(status=Memory.Status.PENDING)),
        # an approved eviction is not a memory: counted as MEMORY.md and the browser count
        approved=Count("id", filter=Q(status=Memory.Status.APPROVED, proposal="new")),
    )
    decided = Q(action__in=[MemoryEvent.Action.APPROVED, MemoryEvent.Action.REJECTED])
    gone = Q(action__in=[MemoryEvent.Action.EXPIRED, MemoryEvent.Action.EVICTED])
    events = MemoryEvent.objects.filter(
        memory__project_id__in=project_ids, at__gte=since, at__lte=now
    ).aggregate(
        approved=Count("id", filter=Q(action=MemoryEvent.Action.APPROVED)),
        decided=Count("id", filter=decided),
        # a memory expired counts once, however it went (by a person, its TTL, an eviction)
        expired=Count("memory_id", filter=gone, distinct=True),
    )
    feedback = MemoryFeedback.objects.filter(
        project_id__in=project_ids, created_at__gte=since, created_at__lte=now
    ).aggregate(all=Count("id"), useful=Count("id", filter=Q(useful=True)))
    searches = RetrievalLog.objects.filter(
        project_id__in=project_ids, created_at__gte=since, created_at__lte=now
    ).aggregate(n=Count("id"), results=Sum("results"))
    return MemoryMetrics(
        since=since,
        pending=stock["pending"],
        oldest_pending=stock["oldest"],
        approval=Ratio(events["approved"], events["decided"]),
        hit=Ratio(feedback["useful"], feedback["all"]),
        cleanup=Ratio(events["expired"], stock["approved"] + events["expired"]),
        expired=events["expired"],
        approved_now=stock["approved"],
        searches=Ratio(searches["results"] or 0, searches["n"]),
        false_retrieval=Ratio(feedback["all"] - feedback["useful"], feedback["all"]),
    )


# --- a scope's memories near a sentence: what a proposal and the review queue compare ------


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
    PostgreSQL, the same measure in Python elsewhere), most similar first; memories only
    (no lifecycle proposal, approved or not) and none past its TTL.

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
                  AND proposal = %s AND (expires_at IS NULL OR expires_at > %s)
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
                    Memory.Proposal.NEW,
                    timezone.now(),
                    content,
                    limit,
                ],
            )
            return [(m, float(m.sim)) for m in rows]  # type: ignore[attr-defined]
    pool = (
        Memory.objects.filter(
            unexpired(timezone.now()),
            project=project,
            scope=scope,
            status__in=statuses,
            proposal=Memory.Proposal.NEW,
        )
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


def same_sentence_live(
    project_id: int, scope: str, sentence: str, *, exclude: int, now: datetime
) -> Memory | None:
    """Another pending or approved memory of the scope with the same sentence (the
    fingerprint a proposal is matched by, writes.proposals), the approved one first."""
    return (
        Memory.objects.filter(project_id=project_id, scope=scope, fingerprint=sentence)
        .filter(proposal=Memory.Proposal.NEW, status__in=LIVE)
        .filter(unexpired(now))
        .exclude(pk=exclude)
        .order_by("status", "pk")
        .first()
    )


def near_memories(
    project: Project,
    scope: str,
    content: str,
    *,
    exclude: int | None = None,
    now: datetime | None = None,
) -> Near:
    """The scope's live memories of the same frame as `content` (conflicts.frame_key, one
    btree lookup), read as the one it repeats (same claims) or ones it contradicts; an
    approved one past its TTL at `now` is not live, swept or not."""
    key = frame_key(content)
    if not key:
        return Near(duplicate=None, conflicts=[])
    same_frame = (
        Memory.objects.filter(project=project, scope=scope, frame_key=key, status__in=LIVE)
        .filter(unexpired(now or timezone.now()))
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
