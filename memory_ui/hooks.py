"""memory_ui's part in the cost app's flow (registered in MemoryUiConfig.ready): turns whose
text arrived go to memory detection through the outbox; the lifecycle runs hourly."""

from __future__ import annotations

from typing import Any

from costboard.hooks import Ingested
from costboard.outbox import MEMORY_QUEUE, Attempt, outbox_add, outbox_handler
from memory_ui.lifecycle import lifecycle_run
from memory_ui.tasks import memory_detect

DETECT = "memory.detect"


def memory_detect_after_ingest(ingested: Ingested) -> None:
    """Queue these turns for memory detection, in the ingest's transaction: the dispatcher
    proposes their candidates after the commit (never in the agent's request)."""
    turn_ids = list(ingested.turns_with_text)
    if turn_ids:
        outbox_add(DETECT, {"turn_ids": turn_ids}, project_id=ingested.project.pk)


@outbox_handler(DETECT, queue=MEMORY_QUEUE)
def _detect_item(payload: dict[str, Any], attempt: Attempt) -> None:
    memory_detect([int(i) for i in payload["turn_ids"]])


def memory_lifecycle_hourly() -> str:
    memories = lifecycle_run()
    return f"memories: {memories.expired} expired, {len(memories.proposals)} proposals"
