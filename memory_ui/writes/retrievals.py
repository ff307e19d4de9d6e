"""Searches logged and feedback on them: the hit-rate figures (/memory/metrics/). The search
itself is a read, memory_ui.ranking."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from django.db import transaction
from django.utils import timezone

from costboard.models import Project
from memory_ui.cleaners import (
    MAX_QUERY,
    MemoryInputError,
    NotFound,
)
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
