"""memory_ui's part in the cost app's flow (registered in MemoryUiConfig.ready): turns whose
text arrived go to memory detection after ingest commits; the lifecycle runs hourly."""

from __future__ import annotations

from django.db import transaction

from costboard.hooks import Ingested
from memory_ui.lifecycle import lifecycle_run
from memory_ui.tasks import memory_detect


def memory_detect_after_ingest(ingested: Ingested) -> None:
    """After commit, a Celery task proposes candidates from these turns (it never slows the
    agent's request)."""
    turn_ids = list(ingested.turns_with_text)
    if not turn_ids:
        return

    def enqueue() -> None:
        memory_detect.delay(turn_ids)

    transaction.on_commit(enqueue, robust=True)


def memory_lifecycle_hourly() -> str:
    memories = lifecycle_run()
    return f"memories: {memories.expired} expired, {len(memories.proposals)} proposals"
