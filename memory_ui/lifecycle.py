"""The memory lifecycle: expiry, eviction, merging and compression (docs/memory.md,
"Lifecycle").

Only TTL expiry changes a memory by itself (its TTL was approved with it). Everything else is a
proposal in the review queue — a pending Memory whose `proposal` says what approving it does
(decisions.memory_approve applies it) and whose `targets` are the memories it acts on:

- evict: when a scope's MEMORY.md is over its cap (memory_md(...).cut_count > 0), the
  entries the cap leaves out — the lowest value by MEMORY.md's own order (importance, then the
  newest) — so approving it brings MEMORY.md back within the cap. One pending eviction per
  scope: while it waits, a later run brings its targets up to date rather than adding another.
- merge: two live memories of a scope with trigram similarity ≥ DUPLICATE_SIMILARITY
  (of any type) that do not contradict each other (memory_ui.conflicts); the proposal
  carries the better one's text (higher importance, then the more credible source, then
  proposed more often, then the newer) and type.
- compress: at least 3 live memories of one scope and type, each pair similar ≥
  selectors.RELATED_SIMILARITY (grown greedily from the entry with the most similar
  neighbours, at most MAX_GROUP); the proposal carries the shortest member that has every
  word shared by at least half of the group (else the one with the most of them).
  Groups are found before duplicate pairs, so three copies of a sentence make one proposal.
  A merged or compressed proposal takes the highest importance of its targets, their tags,
  and a TTL only if all of them had one (the longest).

Similarity is text.similarity (pg_trgm's measure) in Python on every database: see
similar_pairs. At most MAX_PENDING merge (and as many compress) proposals wait in a scope;
the runs after a person's decisions propose the rest.

Safe to run twice, and by two workers at once: a memory already targeted by a pending merge
or compress proposal is left out of new ones, an eviction with the same targets is not
proposed again, and the proposals of a project are written under a lock on its row.

This module decides what to propose; the writes are services (decisions.memories_expire_due,
proposals.proposal_create, proposals.eviction_update), each writing the memory and its history
together.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal

from celery import shared_task  # no type hints: each task ignores [untyped-decorator]
from django.db import transaction
from django.utils import timezone

from costboard.models import Project
from memory_ui.cleaners import DEFAULT_IMPORTANCE, MAX_TAGS, MemoryFields
from memory_ui.conflicts import conflict
from memory_ui.memory_file import live_memories, memory_md
from memory_ui.models import MAX_CONTENT, Memory
from memory_ui.ranking import CREDIBILITY, terms
from memory_ui.selectors import RELATED_SIMILARITY
from memory_ui.text import trigrams
from memory_ui.writes import proposals
from memory_ui.writes.decisions import memories_expire_due

log = logging.getLogger(__name__)

PROPOSED_BY = "lifecycle"
MAX_GROUP = 20  # at most this many entries compressed into one
# the lifecycle proposes merging two live memories at least this similar (trigrams); a
# proposal itself is merged only into one that means the same (conflicts.same_meaning)
DUPLICATE_SIMILARITY = 0.6
PAIR_SCAN = 10_000  # a scope's newest live entries compared for merges and compressions
# merge or compress proposals waiting in a scope at most: a queue a person can get through;
# the next run after their decisions proposes more
MAX_PENDING = 25
MAX_NEIGHBOURS = 2 * MAX_GROUP  # similar pairs kept per entry (with those compared before it)


@dataclass
class LifecycleResult:
    expired: int = 0
    evictions: int = 0
    merges: int = 0
    compressions: int = 0
    proposals: list[int] = field(default_factory=list)  # ids of the proposals made or updated

    def add(self, other: LifecycleResult) -> None:
        self.expired += other.expired
        self.evictions += other.evictions
        self.merges += other.merges
        self.compressions += other.compressions
        self.proposals += other.proposals


# --- the live entries of a scope and their similar pairs --------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    pk: int
    type: str
    content: str
    importance: Decimal
    source: str
    times_proposed: int
    tags: list[str]
    ttl_days: int | None
    at: datetime  # decided_at, else created_at

    @property
    def value(self) -> tuple[Decimal, float, int, datetime, int]:
        """What makes one of two duplicates the better one to keep."""
        credibility = CREDIBILITY.get(self.source, 0.0)
        return (self.importance, credibility, self.times_proposed, self.at, self.pk)


def scope_entries(project: Project, scope: str, *, now: datetime) -> dict[int, Entry]:
    rows = live_memories(project, scope, now).values_list(
        "pk",
        "type",
        "content",
        "importance",
        "source",
        "times_proposed",
        "tags",
        "ttl_days",
        "decided_at",
        "created_at",
    )
    return {
        pk: Entry(
            pk=pk,
            type=type_,
            content=content,
            importance=importance,
            source=source,
            times_proposed=times_proposed,
            tags=list(tags or []),
            ttl_days=ttl_days,
            at=decided_at or created_at,
        )
        for (
            pk,
            type_,
            content,
            importance,
            source,
            times_proposed,
            tags,
            ttl_days,
            decided_at,
            created_at,
        ) in rows
    }


Pair = tuple[int, int, float]  # (lower id, higher id, similarity)


def similar_pairs(entries: dict[int, Entry], *, threshold: float) -> list[Pair]:
    """Pairs of entries with trigram similarity ≥ threshold (text.similarity: pg_trgm's
    measure, in Python on every database), most similar first; the scope's newest
    PAIR_SCAN entries at most.

    A set-similarity join with prefix filtering: each entry's trigrams sorted rarest first,
    two entries can reach the threshold only if the first |T| − ⌈threshold·|T|⌉ + 1 of each
    share a trigram, so only those are compared (exact, and far fewer comparisons than every
    pair; the trigram index does not help here, since common trigrams make each lookup read
    most of it). Each entry keeps its MAX_NEIGHBOURS most similar pairs with the entries
    compared before it."""
    newest = sorted(entries.values(), key=lambda e: (e.at, e.pk), reverse=True)[:PAIR_SCAN]
    grams = [(e.pk, trigrams(e.content)) for e in newest]
    grams = [(pk, g) for pk, g in grams if g]
    grams.sort(key=lambda item: (len(item[1]), item[0]))
    frequency: Counter[str] = Counter(g for _, gs in grams for g in gs)
    index: dict[str, list[int]] = {}
    pairs: list[Pair] = []
    for position, (pk, mine) in enumerate(grams):
        size = len(mine)
        least = threshold * size  # an earlier (smaller) set needs at least this many trigrams
        prefix = sorted(mine, key=lambda g: (frequency[g], g))[
            : size - math.ceil(threshold * size - 1e-9) + 1
        ]
        candidates: set[int] = set()
        for gram in prefix:
            postings = index.setdefault(gram, [])
            candidates.update(i for i in postings if len(grams[i][1]) >= least)
            postings.append(position)
        found = []
        for i in candidates:
            other_pk, other = grams[i]
            shared = len(mine & other)
            score = shared / (size + len(other) - shared)
            if score >= threshold:
                found.append((min(pk, other_pk), max(pk, other_pk), score))
        if len(found) > MAX_NEIGHBOURS:  # bounded memory, however alike a scope's entries
            found = heapq.nlargest(MAX_NEIGHBOURS, found, key=lambda p: (p[2], -p[0], -p[1]))
        pairs += found
    pairs.sort(key=lambda p: (-p[2], p[0], p[1]))
    return pairs


# --- choosing ---------------------------------------------------------------------------------


def compress_groups(
    entries: dict[int, Entry], pairs: Iterable[Pair], *, taken: set[int]
) -> list[list[int]]:
    """Groups of ≥ 3 entries of one type, every two of them a similar pair; each entry in one
    group at most, none of `taken`."""
    neighbours: dict[int, dict[int, float]] = {}
    for a, b, score in pairs:
        if a in taken or b in taken or entries[a].type != entries[b].type:
            continue
        neighbours.setdefault(a, {})[b] = score
        neighbours.setdefault(b, {})[a] = score
    used = set(taken)
    groups = []
    for seed in sorted(neighbours, key=lambda pk: (-len(neighbours[pk]), pk)):
        if seed in used or len(neighbours[seed]) < 2:
            continue
        group = [seed]
        near = neighbours[seed]
        for other in sorted(near, key=lambda pk: (-near[pk], pk)):
            if other not in used and all(other in neighbours[m] for m in group):
                group.append(other)
                if len(group) == MAX_GROUP:
                    break
        if len(group) >= 3:
            groups.append(sorted(group))
            used.update(group)
    return groups


def merge_pairs(pairs: Iterable[Pair], *, threshold: float, taken: set[int]) -> list[Pair]:
    """Duplicate pairs, most similar first, each entry in one pair at most, none of `taken`."""
    used = set(taken)
    chosen = []
    for a, b, score in sorted(pairs, key=lambda p: (-p[2], p[0], p[1])):
        if score >= threshold and a not in used and b not in used:
            chosen.append((a, b, score))
            used.update((a, b))
    return chosen


def covering_entry(group: Sequence[Entry]) -> Entry:
    """The shortest entry that has every word shared by at least half of the group; failing
    that, the one with the most of those words (then the shortest)."""
    counts: Counter[str] = Counter()
    for entry in group:
        counts.update(terms(entry.content))
    shared = {word for word, n in counts.items() if 2 * n >= len(group)}
    return min(group, key=lambda e: (len(shared - terms(e.content)), len(e.content), e.pk))


def eviction_content(cut: Sequence[Entry | Memory]) -> str:
    noun = "entry" if len(cut) == 1 else "entries"
    text = f"Evict {len(cut)} low-value {noun}: " + "; ".join(m.content for m in cut)
    return text if len(text) <= MAX_CONTENT else text[: MAX_CONTENT - 1].rstrip() + "…"


# --- proposing --------------------------------------------------------------------------------


def _pending_targets(project: Project, scope: str) -> dict[int, tuple[str, frozenset[int]]]:
    """The scope's pending lifecycle proposals: id → (kind, target ids)."""
    proposals = dict(
        Memory.objects.filter(project=project, scope=scope, status=Memory.Status.PENDING)
        .exclude(proposal=Memory.Proposal.NEW)
        .values_list("pk", "proposal")
    )
    targets: dict[int, set[int]] = {pk: set() for pk in proposals}
    through = Memory.targets.through.objects.filter(from_memory_id__in=list(proposals))
    for source, target in through.values_list("from_memory_id", "to_memory_id"):
        targets[source].add(target)
    return {pk: (proposals[pk], frozenset(targets[pk])) for pk in proposals}


def _propose(
    *,
    project: Project,
    scope: str,
    kind: str,
    type: str,
    content: str,
    targets: Sequence[Entry | Memory],
    importance: Decimal = DEFAULT_IMPORTANCE,
    source: str = Memory.Source.AGENT_INFERRED,
    tags: Sequence[str] = (),
    ttl_days: int | None = None,
    evidence: str = "",
    note: str,
    now: datetime,
) -> Memory:
    fields = MemoryFields.of(
        content=content,
        type=type,
        scope=scope,
        importance=importance,
        tags=list(dict.fromkeys(tags))[:MAX_TAGS],
        ttl_days=ttl_days,
    )
    return proposals.proposal_create(
        project=project,
        kind=kind,
        fields=fields,
        target_ids=[t.pk for t in targets],
        source=source,
        evidence=evidence,
        note=note,
        proposed_by=PROPOSED_BY,
        now=now,
    )


def _listing(entries: Iterable[Entry | Memory]) -> str:
    return "\n".join(f"#{e.pk} [{e.type}] {e.content}" for e in entries)


def _merged_fields(group: Sequence[Entry]) -> dict[str, object]:
    ttls = [e.ttl_days for e in group]
    return {
        "importance": max(e.importance for e in group),
        "tags": [tag for e in group for tag in e.tags],
        # kept only if every entry had one: the longest
        "ttl_days": None if None in ttls else max(t for t in ttls if t is not None),
    }


def scope_merges_propose(
    project: Project,
    scope: str,
    entries: dict[int, Entry],
    pairs: Sequence[Pair],
    *,
    taken: set[int],
    room: int = MAX_PENDING,
    now: datetime,
) -> list[Memory]:
    made: list[Memory] = []
    for a, b, score in merge_pairs(pairs, threshold=DUPLICATE_SIMILARITY, taken=taken):
        if len(made) >= room:
            break
        if conflict(entries[a].content, entries[b].content):
            continue  # two facts that disagree: merging them would lose one
        pair = sorted((entries[a], entries[b]), key=lambda e: e.value, reverse=True)
        better = pair[0]
        made.append(
            _propose(
                project=project,
                scope=scope,
                kind=Memory.Proposal.MERGE,
                type=better.type,
                content=better.content,
                targets=pair,
                source=better.source,
                evidence=f"Duplicates (similarity {score:.2f}):\n{_listing(pair)}",
                note=f"merge 2 duplicates (similarity {score:.2f}) into #{better.pk}'s text",
                now=now,
                **_merged_fields(pair),  # type: ignore[arg-type]
            )
        )
        taken.update((a, b))
    return made


def scope_compressions_propose(
    project: Project,
    scope: str,
    entries: dict[int, Entry],
    pairs: Sequence[Pair],
    *,
    taken: set[int],
    room: int = MAX_PENDING,
    now: datetime,
) -> list[Memory]:
    made: list[Memory] = []
    for group_ids in compress_groups(entries, pairs, taken=taken):
        if len(made) >= room:
            break
        group = [entries[pk] for pk in group_ids]
        chosen = covering_entry(group)
        made.append(
            _propose(
                project=project,
                scope=scope,
                kind=Memory.Proposal.COMPRESS,
                type=chosen.type,
                content=chosen.content,
                targets=group,
                source=chosen.source,
                evidence=f"{len(group)} similar entries:\n{_listing(group)}",
                note=f"compress {len(group)} similar entries into #{chosen.pk}'s text",
                now=now,
                **_merged_fields(group),  # type: ignore[arg-type]
            )
        )
        taken.update(group_ids)
    return made


def scope_eviction_propose(
    project: Project,
    scope: str,
    pending: dict[int, tuple[str, frozenset[int]]],
    *,
    now: datetime,
) -> Memory | None:
    """Propose evicting what MEMORY.md's cap leaves out; None when nothing is cut or the
    pending eviction already says so."""
    md = memory_md(project, scope, now=now)
    if md.cut_count == 0:
        return None
    cut = memory_md(project, scope, now=now, show_cut=md.cut_count).cut
    wanted = frozenset(m.pk for m in cut)
    evictions = sorted(pk for pk, (kind, _) in pending.items() if kind == Memory.Proposal.EVICT)
    if any(pending[pk][1] == wanted for pk in evictions):
        return None
    content = eviction_content(cut)
    kind_counts = Counter(m.type for m in cut)
    majority = kind_counts.most_common(1)[0][0]
    evidence = f"MEMORY.md keeps {md.lines} of {md.total} entries; left out:\n{_listing(cut)}"
    if evictions:  # bring the waiting one up to date
        updated = proposals.eviction_update(
            proposal_id=evictions[-1],
            fields=MemoryFields.of(content=content, type=majority, scope=scope),
            target_ids=sorted(wanted),
            evidence=evidence,
            note=f"MEMORY.md now leaves out {len(cut)} entries",
            proposed_by=PROPOSED_BY,
            now=now,
        )
        if updated is not None:
            return updated
    return _propose(
        project=project,
        scope=scope,
        kind=Memory.Proposal.EVICT,
        type=majority,
        content=content,
        targets=cut,
        evidence=evidence,
        note=f"MEMORY.md is over its cap: {md.cut_count} of {md.total} entries left out",
        now=now,
    )


def scope_proposals(
    project: Project, scope: str, *, now: datetime | None = None
) -> LifecycleResult:
    """The eviction, merge and compression proposals one scope needs now."""
    now = now or timezone.now()
    result = LifecycleResult()
    entries = scope_entries(project, scope, now=now)
    pairs = similar_pairs(entries, threshold=RELATED_SIMILARITY)
    with transaction.atomic():
        # one lifecycle run (and one proposer: proposals.candidate_propose) per project at a time
        Project.objects.select_for_update(no_key=True).filter(pk=project.pk).first()
        pending = _pending_targets(project, scope)
        taken: set[int] = set()
        for kind, targets in pending.values():
            if kind != Memory.Proposal.EVICT:
                taken |= targets
        waiting = Counter(kind for kind, _ in pending.values())
        compressed = scope_compressions_propose(
            project,
            scope,
            entries,
            pairs,
            taken=taken,
            room=MAX_PENDING - waiting[Memory.Proposal.COMPRESS],
            now=now,
        )
        merged = scope_merges_propose(
            project,
            scope,
            entries,
            pairs,
            taken=taken,
            room=MAX_PENDING - waiting[Memory.Proposal.MERGE],
            now=now,
        )
        evicted = scope_eviction_propose(project, scope, pending, now=now)
    result.compressions, result.merges = len(compressed), len(merged)
    result.evictions = 1 if evicted else 0
    result.proposals = [m.pk for m in [*compressed, *merged]] + ([evicted.pk] if evicted else [])
    return result


def project_proposals(project: Project, *, now: datetime | None = None) -> LifecycleResult:
    now = now or timezone.now()
    result = LifecycleResult()
    scopes = (
        Memory.objects.filter(project=project, status=Memory.Status.APPROVED)
        .values_list("scope", flat=True)
        .distinct()
        .order_by("scope")
    )
    for scope in list(scopes):
        result.add(scope_proposals(project, scope, now=now))
    return result


def lifecycle_run(*, now: datetime | None = None) -> LifecycleResult:
    """Everything, in-process: TTL expiry, then each project's proposals."""
    now = now or timezone.now()
    result = LifecycleResult(expired=memories_expire_due(now=now))
    for project in Project.objects.filter(pk__in=_projects_with_memories()).order_by("pk"):
        result.add(project_proposals(project, now=now))
    return result


def _projects_with_memories() -> list[int]:
    return list(
        Memory.objects.filter(status=Memory.Status.APPROVED)
        .values_list("project_id", flat=True)
        .distinct()
        .order_by("project_id")
    )


# --- Celery (beat: CELERY_BEAT_SCHEDULE in settings; the worker imports this in apps.py) ------


@shared_task(soft_time_limit=600, time_limit=660, acks_late=True)  # type: ignore[untyped-decorator]
def memory_ttl_sweep() -> int:
    """Every 15 minutes: expire approved memories past their TTL."""
    expired = memories_expire_due()
    if expired:
        log.info("memory TTL: %s memories expired", expired)
    return expired


@shared_task(soft_time_limit=60, time_limit=70, acks_late=True)  # type: ignore[untyped-decorator]
def memory_proposals_sweep() -> int:
    """Every hour: one memory_proposals task per project with approved memories."""
    project_ids = _projects_with_memories()
    for project_id in project_ids:
        memory_proposals.delay(project_id)
    return len(project_ids)


@shared_task(soft_time_limit=1200, time_limit=1300, acks_late=True)  # type: ignore[untyped-decorator]
def memory_proposals(project_id: int) -> dict[str, object]:
    """A project's eviction, merge and compression proposals (for a person to decide)."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return {}
    result = project_proposals(project)
    if result.proposals:
        log.info("memory lifecycle, project %s: %s", project.slug, asdict(result))
    return asdict(result)
