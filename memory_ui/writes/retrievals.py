"""Searches logged and feedback on them: the hit-rate figures (/memory/metrics/). The search
itself is a read, memory_ui.ranking."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from django.db import transaction
from django.utils import timezone

from costboard.models import Project
from memory_ui.cleaners import MAX_QUERY, Feedback, NotFound
from memory_ui.models import Memory, MemoryFeedback, RetrievalLog


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


@transaction.atomic
def memory_feedback_add(
    *,
    project: Project,
    feedback: Feedback,
    now: datetime | None = None,
) -> MemoryFeedback:
    """Was a retrieved memory useful? The memory (and the search, if given) must be the
    project's, and one the search returned (NotFound otherwise); the ids themselves were
    checked where they came in."""
    memory_pk, retrieval_pk = feedback.memory_id, feedback.retrieval_id
    memory = Memory.objects.filter(project=project, pk=memory_pk).only("pk").first()
    if memory is None:
        raise NotFound("memory_id", f"no memory {memory_pk} in project {project.slug}")
    retrieval = None
    if retrieval_pk is not None:
        retrieval = RetrievalLog.objects.filter(project=project, pk=retrieval_pk).first()
        if retrieval is None:
            raise NotFound("retrieval_id", f"no search {retrieval_pk} in project {project.slug}")
        if memory_pk not in retrieval.memory_ids:
            # feedback on what a search did not return would count in its hit rate
            raise NotFound(
                "memory_id",
                f"search {retrieval_pk} did not return memory {memory_pk}: rate one of its "
                "results, or leave retrieval_id out",
            )
    return MemoryFeedback.objects.create(
        project=project,
        memory=memory,
        retrieval=retrieval,
        useful=feedback.useful,
        created_at=now or timezone.now(),
    )
