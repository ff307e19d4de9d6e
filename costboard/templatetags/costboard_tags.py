from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from django import template
from django.http import QueryDict
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from costboard import replicas
from costboard.dashboards.selectors.flagged import CapUse
from costboard.models import TOOL_MODEL, BudgetEvent
from costboard.numbers import count_text, tokens_short, usd_text
from costboard.reports.messages import pct_change, usd_change
from costboard.tag_values import EMPTY_VALUE_LABEL, UNTAGGED_LABEL

register = template.Library()


@register.filter
def usd(amount: Decimal | None) -> str:
    """$1,234.56 from a cent up; below, three significant digits ($0.0000844): numbers.py."""
    return usd_text(amount)


@register.filter
def usd_delta(amount: Decimal) -> str:
    """+$1.20, -$0.30, $0.00: a change in USD (the showback report)."""
    return usd_change(amount)


@register.filter
def pct_delta(pct: Decimal | None, new: bool = False) -> str:
    """+25.0 %; "new" (when `new`) for spend with none the period before; else "—"."""
    return pct_change(pct, new=bool(new))


# A page about one thing of one project lists that kind of thing when the project changes.
_SWITCH_TO = {"session": "sessions", "budget": "budgets", "memory-detail": "memory-browser"}


@register.simple_tag(takes_context=True)
def switcher_action(context: template.Context) -> str:
    """Where the project switcher goes: the page you are on, or, from a session's or a
    memory's own page, the list it belongs to (the other project has neither)."""
    request = context.get("request")
    if request is None:
        return ""
    match = request.resolver_match
    name = match.url_name if match is not None else None
    if name in _SWITCH_TO:
        return reverse(_SWITCH_TO[name])
    return str(request.path)


# what the switcher drops: the project it replaces, and the page number of that project's list
_SWITCH_DROPS = frozenset({"project", "page"})


@register.simple_tag(takes_context=True)
def switcher_kept(context: template.Context) -> list[tuple[str, str]] | None:
    """The page's filters the project switcher sends with the project it chose (period,
    state, sort, search, a model or a tag value too: the other project's page shows what
    matches), as (name, value) pairs; none from a page the switcher leaves for a list.
    static/costboard/app.js sends those of the URL at the time instead, which htmx may have
    changed since the page loaded."""
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    if request is None or (match is not None and match.url_name in _SWITCH_TO):
        return None
    return [
        (name, value)
        for name, values in request.GET.lists()
        if name not in _SWITCH_DROPS
        for value in values
    ]


@register.filter
def tag_value_label(value: str | None) -> str:
    """A tag breakdown's first cell: the value as sent, or a label set apart from the values
    (emphasised) for the untagged row (None) and a value sent empty ("")."""
    if value is None:
        return format_html("<em>{}</em>", UNTAGGED_LABEL)
    if value == "":
        return format_html(
            '<em class="muted" title="the tag sent with an empty value">{}</em>',
            EMPTY_VALUE_LABEL,
        )
    return value


TOOL_LABEL = "— (tool)"


@register.filter
def model_label(name: str) -> str:
    """A model or family as pages name it; steps without a model are tool steps."""
    return TOOL_LABEL if name.strip().lower() == TOOL_MODEL else name


@register.filter
def tokens(count: int | None) -> str:
    """117.6k, 250k, 10B (numbers.py)."""
    return tokens_short(count)


@register.simple_tag(takes_context=True)
def qs(context: template.Context, **changes: object) -> str:
    """The current query string with some parameters changed (None or '' drops one), e.g.
    `{% qs sort="-cost" page=None %}`: sorting, paging and filtering keep everything else."""
    request = context.get("request")
    params = request.GET.copy() if request is not None else QueryDict(mutable=True)
    for name, value in changes.items():
        if value is None or value == "":
            params.pop(name, None)
        else:
            params[name] = str(value)
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.filter
def pct(value: float | Decimal | None) -> str:
    if value is None:
        return "—"
    return f"{float(value) * 100:.1f}%"


@register.filter
def ms(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.0f} ms"


@register.filter
def share(part: int | Decimal | None, whole: int | Decimal | None) -> int:
    """part as a whole percentage of whole, for meters (0–100)."""
    if not part or not whole:
        return 0
    return min(100, int(Decimal(part) * 100 / Decimal(whole)))


@register.filter
def dictget(mapping: dict[str, object], key: str) -> object:
    return mapping.get(key)


@register.simple_tag(takes_context=True)
def sort_header(
    context: template.Context,
    key: str,
    label: str,
    numeric: bool = False,
    ascending_first: bool = False,
    swap: bool = True,
) -> str:
    """A column header that sorts by `key`: descending first (a name, `ascending_first`, A to
    Z first), and the other way when clicked again, with an arrow and aria-sort on the
    column sorted. The order now is the context's `filters.sort` (/sessions/) or `sort`
    (/users/); `swap` makes the link swap only #table with htmx."""
    filters = context.get("filters")
    current = str(filters.sort if filters is not None else context.get("sort", ""))
    active = current.lstrip("-") == key
    descending = current.startswith("-")
    if active:
        new_sort = key if descending else f"-{key}"
    else:
        new_sort = key if ascending_first else f"-{key}"
    href = qs(context, sort=new_sort, page=None)
    arrow = (" ▼" if descending else " ▲") if active else ""
    css = ' class="num"' if numeric else ""
    aria = (' aria-sort="descending"' if descending else ' aria-sort="ascending"') if active else ""
    hx = (
        format_html(' hx-get="{}" hx-target="#table" hx-swap="outerHTML" hx-push-url="true"', href)
        if swap
        else ""
    )
    return format_html(
        '<th{}{}><a href="{}"{}>{}{}</a></th>',
        mark_safe(css),  # noqa: S308 — one of two literal attributes above
        mark_safe(aria),  # noqa: S308 — likewise
        href,
        hx,
        label,
        arrow,
    )


@register.filter
def thousands(count: int | None) -> str:
    """91200 → 91,200."""
    return count_text(count)


@register.filter
def percent(fraction: float | Decimal | None) -> str:
    """A whole percent, rounded down (99.9 % is not yet 100 %)."""
    if fraction is None:
        return "—"
    return f"{int(Decimal(str(fraction)) * 100)}%"


@register.filter
def cap_use(use: CapUse) -> str:
    """'tokens 91,200 of 100,000 (91%)' or '$5.02 of $5.00 (100%)'."""
    if use.name == "tokens":
        return f"tokens {use.used:,} of {use.cap:,} ({use.percent}%)"
    used, cap = Decimal(use.used), Decimal(use.cap)
    for places in (2, 3, 4, 6):  # as many decimals as it takes to tell them apart
        unit = Decimal(1).scaleb(-places)
        shown_used, shown_cap = (x.quantize(unit, rounding=ROUND_HALF_UP) for x in (used, cap))
        if shown_used != shown_cap or used == cap:
            break
    return f"${shown_used:,} of ${shown_cap:,} ({use.percent}%)"


@register.filter(name="plain")
def _plain(value: Any) -> str:
    """A value as a person reads it: a list or object as JSON, not Python's repr."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    return str(value)


def _dollars(value: Any) -> str:
    try:
        return usd(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return _plain(value)


def _share(value: Any) -> str:
    try:
        return percent(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return _plain(value)


def _label(key: str) -> str:
    return key.replace("_", " ")


# A budget event's cap fields: (key, label, how the value reads).
_CAP_FIELDS = (
    ("token_cap", "token cap", _plain),
    ("cost_cap_usd", "USD cap", _dollars),
    ("warn_at_pct", "warn at", _share),
)


@register.filter
def event_detail(event: BudgetEvent) -> list[tuple[str, str]]:
    """A budget event's detail as (label, value) pairs to read: a cap change's old → new caps
    and state, a runaway's rule and evidence, a crossing's caps; any other key as it is."""
    detail: dict[str, Any] = event.detail if isinstance(event.detail, dict) else {}
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    if event.kind == BudgetEvent.Kind.CAP_CHANGED:
        for key, label, show in (*_CAP_FIELDS, ("state", "state", _plain)):
            change = detail.get(key)
            if not (isinstance(change, list) and len(change) == 2):
                continue
            used.add(key)
            old, new = change
            if old != new:
                pairs.append((label, f"{show(old)} → {show(new)}"))
            elif key != "warn_at_pct":
                pairs.append((label, f"{show(new)} (unchanged)"))
    elif event.kind == BudgetEvent.Kind.RUNAWAY:
        used.update(("rule", "reason", "evidence"))
        pairs.append(("rule", _plain(detail.get("rule"))))
        if detail.get("reason") and detail.get("reason") != detail.get("rule"):
            pairs.append(("reason", _plain(detail["reason"])))
        evidence = detail.get("evidence")
        if isinstance(evidence, dict):
            pairs.extend((_label(str(k)), _plain(v)) for k, v in evidence.items())
        elif evidence:
            pairs.append(("evidence", _plain(evidence)))
    else:
        if detail.get("reason") == "runaway":
            used.update(("reason", "runaway"))
            pairs.append(("stopped by", f"runaway: {_plain(detail.get('runaway'))}"))
        for key, label, show in _CAP_FIELDS:
            if key in detail:
                used.add(key)
                pairs.append((label, show(detail[key])))
    pairs.extend((_label(str(k)), _plain(v)) for k, v in detail.items() if k not in used)
    return pairs


@register.simple_tag
def read_source_note() -> str:
    """Where the page's data was read, on a page that may read a replica (costboard/replicas.py;
    nothing on the others, nor when no replica is configured)."""
    source = replicas.read_source()
    if source is None:
        return ""
    if source.replica:
        lag = source.lag or Decimal(0)
        return format_html(
            '<p class="read-source muted" data-read-source="replica">'
            "Read from a replica, {} s behind the primary.</p>",
            f"{lag:.1f}",
        )
    return format_html(
        '<p class="read-source muted" data-read-source="{}">'
        "Data is current (read from the primary).</p>",
        "primary",
    )
