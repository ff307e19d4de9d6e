"""Celery tasks of the memory review queue: take ids, fetch the rows again, call a service."""

from __future__ import annotations

import logging

from celery import shared_task  # no type hints: each task ignores [untyped-decorator]

from costboard.models import Turn
from memory_ui.cleaners import MemoryFields, MemoryInputError
from memory_ui.detect import detect
from memory_ui.writes.proposals import candidate_propose

log = logging.getLogger(__name__)

DETECTOR = "detector"  # proposed_by of the candidates this task proposes


@shared_task(soft_time_limit=120, time_limit=150, acks_late=True)  # type: ignore[untyped-decorator]
def memory_detect(turn_ids: list[int]) -> int:
    """Propose the memory candidates found in these turns' messages (pending: a person
    decides). Turns that are gone are skipped; returns how many candidates were proposed."""
    proposed = 0
    turns = Turn.objects.filter(pk__in=turn_ids).select_related("session", "project")
    for turn in turns.order_by("pk"):
        session = turn.session
        for candidate in detect(turn.user_message, turn.assistant_response):
            user_scoped = candidate.type == "user" and session.user_id
            try:  # the detector's candidate checked as any input is, here where it comes in
                fields = MemoryFields.of(
                    content=candidate.content,
                    type=candidate.type,
                    scope=f"user:{session.user_id}" if user_scoped else "project",
                    importance=candidate.importance,
                )
            except MemoryInputError as error:
                # e.g. a user_id a scope can't hold: skip this one, keep the turn's others
                log.warning("memory candidate of turn %s skipped: %s", turn.pk, error)
                continue
            memory = candidate_propose(
                project=turn.project,
                fields=fields,
                source=candidate.source,
                session=session,
                turn=turn,
                evidence=candidate.evidence,
                redactions=list(candidate.redactions),
                proposed_by=DETECTOR,
            )
            if memory is not None:
                proposed += 1
    log.info("memory detection: %s candidates from %s turns", proposed, len(turn_ids))
    return proposed
