from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django import template
from django.http import QueryDict
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def usd(amount: Decimal | None) -> str:
    """$1,234.56 from a cent up; below, three significant digits in fixed point ($0.0000844)."""
    if amount is None:
        return "—"
    amount = Decimal(amount)
    if amount == 0:
        return "$0.00"
    if abs(amount) >= Decimal("0.01"):
        return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"
    places = 2 - amount.copy_abs().adjusted()  # three significant digits
    text = f"{amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):f}"
    return f"${text.rstrip('0')}"


@register.filter
def tokens(count: int | None) -> str:
    if count is None:
        return "—"
    for unit, size in (("B", 1_000_000_000), ("M", 1_000_000), ("k", 1_000)):
        if abs(count) >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


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
def sort_header(context: template.Context, key: str, label: str, numeric: bool = False) -> str:
    """A column header that sorts by `key`, descending first, toggling when already sorted."""
    filters = context["filters"]
    active = filters.sort_key == key
    new_sort = key if active and filters.descending else f"-{key}"
    href = qs(context, sort=new_sort, page=None)
    arrow = (" ▼" if filters.descending else " ▲") if active else ""
    css = ' class="num"' if numeric else ""
    aria = (
        (' aria-sort="descending"' if filters.descending else ' aria-sort="ascending"')
        if active
        else ""
    )
    return format_html(
        '<th{}{}><a href="{}" hx-get="{}" hx-target="#table" hx-swap="outerHTML" '
        'hx-push-url="true">{}{}</a></th>',
        mark_safe(css),
        mark_safe(aria),
        href,
        href,
        label,
        arrow,
    )
