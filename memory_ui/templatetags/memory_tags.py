"""Template helpers of the memory pages: a candidate's words marked in its sentence, the nav's
pending badge, an edit's before and after."""

from __future__ import annotations

import json
import re
from typing import Any

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from memory_ui import selectors
from memory_ui.conflicts import conflict
from memory_ui.models import MemoryEvent
from memory_ui.text import normalize

register = template.Library()

_WORD = re.compile(r"\w+", re.UNICODE)
# words too common to be worth marking in a sentence
_COMMON = frozenset(
    {
        *("the", "and", "for", "are", "but", "not", "you", "your", "with", "this", "that"),
        *("from", "have", "has", "was", "were", "will", "would", "should", "can", "could"),
        *("our", "its", "they", "them", "their", "his", "her", "she", "him", "who", "what"),
        *("when", "where", "which", "use", "uses", "used", "all", "any", "one"),
    }
)


@register.filter
def highlight(sentence: str, content: str) -> SafeString:
    """The sentence, escaped, with the words it shares with the candidate in <mark>."""
    words = {w for w in normalize(content or "").split() if len(w) >= 3 and w not in _COMMON}
    text = sentence or ""
    out: list[str] = []
    last = 0
    for match in _WORD.finditer(text):
        if normalize(match.group(0)) in words:
            out.append(escape(text[last : match.start()]))
            out.append(f"<mark>{escape(match.group(0))}</mark>")
            last = match.end()
    out.append(escape(text[last:]))
    return mark_safe("".join(out))  # noqa: S308 — every piece escaped above


# a number with its inner separators ("3.11", "2026-03-01") or a word: what differs is marked
_TERM = re.compile(r"\d+(?:[.,:/-]\d+)*|\w+", re.UNICODE)


@register.filter
def differing(text: str, other: str) -> SafeString:
    """`text`, escaped, with the words and numbers `other` lacks in <mark>: where a
    contradicting pair differs ("port <mark>5433</mark>")."""
    theirs = {t.casefold() for t in _TERM.findall(other or "")}
    text = text or ""
    out: list[str] = []
    last = 0
    for match in _TERM.finditer(text):
        if match.group(0).casefold() not in theirs:
            out.append(escape(text[last : match.start()]))
            out.append(f'<mark class="differs">{escape(match.group(0))}</mark>')
            last = match.end()
    out.append(escape(text[last:]))
    return mark_safe("".join(out))  # noqa: S308 — every piece escaped above


@register.filter
def contradiction(new: str, old: str) -> str:
    """Why `new` contradicts `old` ("differs in a number, date or version"), or ""."""
    return conflict(new or "", old or "") or ""


@register.simple_tag(takes_context=True)
def memory_pending(context: template.Context) -> int | None:
    """Pending candidates in the chosen project(s), for the nav badge: the page's own count
    when it has one, else one COUNT on the queue index."""
    known = context.get("nav_pending")
    if known is not None:
        return int(known)
    scope = context.get("scope")
    if not scope:
        return None
    request = context.get("request")
    cached = getattr(request, "_memory_pending", None)  # the nav and the tabs ask once
    if cached is None:
        cached = selectors.pending_total(project_ids=scope.project_ids)
        if request is not None:
            request._memory_pending = cached
    return int(cached)


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "—"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@register.filter
def changes(event: MemoryEvent) -> list[tuple[str, str, str]]:
    """An event's (field, before, after) for each field it changed; a proposal's fields as
    they were proposed."""
    before = event.before if isinstance(event.before, dict) else {}
    after = event.after if isinstance(event.after, dict) else {}
    if not before:
        return []
    keys = [k for k in (*before, *[k for k in after if k not in before])]
    return [(k.replace("_", " "), _shown(before.get(k)), _shown(after.get(k))) for k in keys]


@register.filter
def proposed_fields(event: MemoryEvent) -> list[tuple[str, str]]:
    after = event.after if isinstance(event.after, dict) else {}
    return [(k.replace("_", " "), _shown(v)) for k, v in after.items() if k != "status"]


@register.filter
def similarity_pct(value: float) -> str:
    return f"{value * 100:.0f}%"


@register.filter
def ratio(value: Any) -> str:
    """A share as a percent with one decimal, or a dash without data."""
    if value is None:
        return "—"
    return f"{float(value) * 100:.1f}%"
