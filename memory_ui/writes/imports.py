"""Approved memories imported in bulk (a benchmark's scope, an existing MEMORY.md), each with
its history, in a few statements."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from costboard.models import Project
from memory_ui.cleaners import MemoryImport
from memory_ui.conflicts import frame_key
from memory_ui.models import Memory, MemoryEvent
from memory_ui.text import fingerprint
from memory_ui.writes.decisions import expiry
from memory_ui.writes.history import User, event_fields, snapshot


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
    duplicate check: for a set known to be new and distinct. Each entry's fields were checked
    where it was made (MemoryImport.of)."""
    if not connection.features.can_return_rows_from_bulk_insert:
        raise RuntimeError(f"{connection.vendor} cannot return ids from a bulk insert")
    now = now or timezone.now()
    rows = []
    for entry in memories:
        fields, content = entry.fields, entry.fields.content
        decided = entry.decided_at or now
        memory = Memory(
            project=project,
            type=fields.type,
            content=content,
            scope=fields.scope,
            status=Memory.Status.APPROVED,
            importance=fields.importance,
            source=entry.source,
            tags=list(fields.tags),
            ttl_days=fields.ttl_days,
            fingerprint=fingerprint(content),
            frame_key=frame_key(content),
            redactions=list(fields.redactions),
            proposed_by=actor_name[:150],
            created_at=entry.proposed_at or decided,
            updated_at=decided,
            decided_at=decided,
            decided_by=by if by is not None and by.is_authenticated else None,
        )
        memory.expires_at = expiry(memory, decided)
        rows.append(memory)
    Memory.objects.bulk_create(rows, batch_size=batch_size)
    history = []
    for memory in rows:
        proposed = {**snapshot(memory), "status": Memory.Status.PENDING.value}
        history.append(
            MemoryEvent(
                **event_fields(
                    memory,
                    MemoryEvent.Action.PROPOSED,
                    name=actor_name,
                    after=proposed,
                    note="imported"
                    + (f"; redacted: {', '.join(memory.redactions)}" if memory.redactions else ""),
                    at=memory.created_at,
                )
            )
        )
        history.append(
            MemoryEvent(
                **event_fields(
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
