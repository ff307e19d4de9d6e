"""Spend by tag: the tag keys of a period and the spend per value of one, with the untagged
rest (the overview's and /steps/'s tag breakdown)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.db.models import Count, QuerySet, Sum

from costboard.dashboards.selectors.shared import ZERO
from costboard.dashboards.selectors.steps import StepFilter, period_steps
from costboard.models import DailyRollup, Step, TagDailyRollup
from costboard.tag_values import TagValue

TAG_KEYS_SHOWN = 50


@dataclass(frozen=True)
class TagSpend:
    value: str | None  # None: the steps without the key ("untagged")
    calls: int
    tokens: int
    cost_usd: Decimal


def tag_keys(*, project_ids: list[int], since: date, until: date) -> list[str]:
    """The tag keys steps carried between two UTC days, from the per-tag rollups."""
    keys = (
        TagDailyRollup.objects.filter(project_id__in=project_ids, day__gte=since, day__lte=until)
        .values_list("key", flat=True)
        .distinct()
        .order_by("key")
    )
    return list(keys[:TAG_KEYS_SHOWN])


def tag_key_carried(*, project_ids: list[int], since: date, until: date, key: str) -> bool:
    """Whether steps carried the tag key between two UTC days (a key past the TAG_KEYS_SHOWN
    that tag_keys lists)."""
    return TagDailyRollup.objects.filter(
        project_id__in=project_ids, day__gte=since, day__lte=until, key=key
    ).exists()


def spend_by_tag(
    *,
    project_ids: list[int],
    since: date,
    until: date,
    key: str,
    steps: StepFilter = StepFilter(),  # noqa: B008 (frozen)
) -> list[TagSpend]:
    """Spend per value of one tag key between two UTC days, costliest first, and the steps
    without the key as one untagged row (value None): the rows add up to the period's whole
    spend (two queries). With a filter of /steps/, which the tag rollups are not kept by,
    from the period's steps it keeps (one query)."""
    if steps.any:
        return _spend_by_tag_of_steps(period_steps(project_ids, since, until, steps), key)
    rows = (
        TagDailyRollup.objects.filter(
            project_id__in=project_ids, day__gte=since, day__lte=until, key=key
        )
        .values("value")
        .annotate(
            calls=Sum("calls"),
            inp=Sum("input_tokens"),
            out=Sum("output_tokens"),
            cost=Sum("cost_usd"),
        )
        .order_by("-cost", "value")
    )
    tagged = [
        TagSpend(
            value=r["value"],
            calls=r["calls"] or 0,
            tokens=(r["inp"] or 0) + (r["out"] or 0),
            cost_usd=r["cost"] or ZERO,
        )
        for r in rows
    ]
    whole = DailyRollup.objects.filter(
        project_id__in=project_ids, day__gte=since, day__lte=until
    ).aggregate(
        calls=Sum("calls"), inp=Sum("input_tokens"), out=Sum("output_tokens"), cost=Sum("cost_usd")
    )
    # a step has at most one value per key: what the values leave out carries no such tag
    untagged = TagSpend(
        value=None,
        calls=(whole["calls"] or 0) - sum(t.calls for t in tagged),
        tokens=(whole["inp"] or 0) + (whole["out"] or 0) - sum(t.tokens for t in tagged),
        cost_usd=(whole["cost"] or ZERO) - sum((t.cost_usd for t in tagged), ZERO),
    )
    if not (untagged.calls or untagged.tokens or untagged.cost_usd):
        return tagged
    # costliest first, the untagged row among the values
    return sorted([*tagged, untagged], key=lambda t: t.cost_usd, reverse=True)


def _spend_by_tag_of_steps(steps: QuerySet[Step], key: str) -> list[TagSpend]:
    """spend_by_tag over some steps: their value of the tag key (None: without it)."""
    rows = (
        steps.annotate(tag_value=TagValue(key))
        .values("tag_value")
        .annotate(
            calls=Count("*"),
            inp=Sum("input_tokens"),
            out=Sum("output_tokens"),
            cost=Sum("cost_usd"),
        )
        .order_by()
    )
    found = [
        TagSpend(
            value=r["tag_value"],
            calls=r["calls"],
            tokens=(r["inp"] or 0) + (r["out"] or 0),
            cost_usd=r["cost"] or ZERO,
        )
        for r in rows
    ]
    return sorted(found, key=lambda t: (-t.cost_usd, t.value is None, t.value or ""))
