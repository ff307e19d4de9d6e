"""MEMORY.md: the approved memories of a scope as the agent reads them, one `[type] content`
line each, under its caps; and the scope's live memories it is made of, which search reads
too."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from costboard.models import Project
from memory_ui.models import Memory

MEMORY_MD_LINES = 200
MEMORY_MD_BYTES = 25_000


def unexpired(now: datetime) -> Q:
    """Not past its TTL at `now`: no expires_at, or one still ahead. At expires_at a memory
    is out, as the TTL sweep (decisions.memories_expire_due) takes it then; until the sweep
    has run, MEMORY.md, search, the browser and a proposal's lookups leave it out alike."""
    return Q(expires_at__isnull=True) | Q(expires_at__gt=now)


def live_memories(project: Project, scope: str, now: datetime | None = None) -> Any:
    """A scope's approved memories that have not expired: what MEMORY.md and search read."""
    now = now or timezone.now()
    return Memory.objects.filter(
        unexpired(now),
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
