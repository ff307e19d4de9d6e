"""A memory's history: the MemoryEvent row every change writes beside it, and the snapshot of
the fields an event records, so that folding a memory's events' `after` in order gives its
status and content now (tests/memory_ui/test_writes.py replays them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as AuthUser

from memory_ui.models import Memory, MemoryEvent

User = AuthUser | AnonymousUser | None  # who decides (None: the system)


def _actor_name(user: User, fallback: str = "") -> str:
    if user is not None and user.is_authenticated:
        return user.get_username()
    return fallback


def event_record(
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
        **event_fields(
            memory, action, user=user, name=name, before=before, after=after, note=note, at=at
        )
    )


def event_fields(
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
