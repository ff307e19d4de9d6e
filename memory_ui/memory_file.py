"""MEMORY.md: the approved memories of a scope as the agent reads them, one `[type] content`
line each, under its caps; and the scope's live memories it is made of, which search reads
too."""

from __future__ import annotations

import re
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


_BACKTICKS = re.compile(r"`+")


def _own_line(content: str) -> str:
    """`content` with what Markdown would carry onto the next lines escaped: a backtick run
    no run of its length closes on this line (a code span would swallow the entries after
    it), and a `<` no `>` follows (raw HTML, a comment). What closes on its line stays."""
    runs = list(_BACKTICKS.finditer(content))
    open_runs = []
    index = 0
    while index < len(runs):
        run = runs[index]
        closing = next(
            (j for j in range(index + 1, len(runs)) if len(runs[j].group()) == len(run.group())),
            None,
        )
        if closing is None:
            open_runs.append(run)
            index += 1
        else:
            index = closing + 1
    for run in reversed(open_runs):
        content = content[: run.start()] + "\\`" * len(run.group()) + content[run.end() :]
    return "".join(
        "\\<" if char == "<" and ">" not in content[at:] else char
        for at, char in enumerate(content)
    )


def memory_line(memory: Memory) -> str:
    """One entry: `[type] content` on one line (content has no newline: cleaners.clean_content),
    its Markdown kept from reaching into the next entries."""
    return f"[{memory.type}] {_own_line(memory.content)}"


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
