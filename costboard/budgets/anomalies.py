"""Spend anomalies (docs/budgets.md, "Spend anomalies"), checked by the sweep (Celery beat,
`manage.py guard_sweep`): a project's spend today (the UTC day so far), or one tag value's,
more than k standard deviations above its mean over the trailing 14 complete UTC days and
above the project's floor in dollars raises one `anomaly` alert, explained in words:

    "$41.20 today against $6.10 ± $2.30 over 14 days; 78 % from customer=acme"

- The days judged against: the 14 UTC days before today, from the first of them with spend
  in that series (days before it are before the project or the tag value spent; a day after it
  without spend counts as $0). At least 7 days with spend, else nothing is judged: a day whose
  rows all cost $0 (tool steps, a model no price covers) is not one.
- Mean and the sample standard deviation (n − 1) in Decimal; the day must beat
  mean + k × stddev and the floor, both strictly.
- The whole project first. When it is anomalous, its alert names the tag value whose share of
  the spend rose most (today's share against its share of the days judged): a tag that carries
  every step (`env=prod`) never outranks the customer that spiked. When it is not, each tag
  value that is anomalous on its own is alerted: a small customer's spike in a big project.
- Once per project, tag value and day, whatever the concurrency: the row's unique constraint
  (`anomaly_once`) refuses a second, and only the sweep whose insert won queues its alert.

Reads only the daily rollups (DailyRollup, TagDailyRollup), never the steps: per project one
query when nothing today is above the floor, at most four otherwise.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from costboard.budgets.alerts import ANOMALY_DISPATCH
from costboard.models import DailyRollup, Project, SpendAnomaly, TagDailyRollup
from costboard.outbox import outbox_add

log = logging.getLogger(__name__)

HISTORY_DAYS = 14
MIN_HISTORY_DAYS = 7  # days with spend (above $0) among the 14, for a mean to mean something
ZERO = Decimal(0)
_STORED = Decimal("1e-12")  # money's places (costboard/models/fields.py)
_CENT = Decimal("0.01")

Tag = tuple[str, str]  # (key, value)


@dataclass(frozen=True, slots=True)
class Judged:
    """A series' day against the days before it."""

    spend: Decimal
    mean: Decimal
    stddev: Decimal
    days: int  # how many days the mean is over

    def above(self, k: Decimal, floor: Decimal) -> bool:
        return self.spend > floor and self.spend - self.mean > k * self.stddev


def series_judged(today: date, spend: Decimal, by_day: dict[date, Decimal]) -> Judged | None:
    """`spend` today against `by_day` (the series' spend of the days before, rows only), or
    None when fewer than MIN_HISTORY_DAYS of the 14 have spend: a row of $0 is no spend."""
    window = [today - timedelta(days=n) for n in range(HISTORY_DAYS, 0, -1)]
    seen = [d for d in window if by_day.get(d, ZERO) > 0]
    if len(seen) < MIN_HISTORY_DAYS:
        return None
    values = [by_day.get(d, ZERO) for d in window if d >= seen[0]]
    mean = sum(values, ZERO) / len(values)
    variance = sum(((v - mean) ** 2 for v in values), ZERO) / (len(values) - 1)
    return Judged(spend=spend, mean=mean, stddev=variance.sqrt(), days=len(values))


def _dollars(amount: Decimal) -> str:
    return f"${amount.quantize(_CENT, ROUND_HALF_UP):,}"


def _percent(share: Decimal) -> str:
    return f"{(share * 100).quantize(Decimal(1), ROUND_HALF_UP)} %"


def explanation(judged: Judged) -> str:
    """ "$41.20 today against $6.10 ± $2.30 over 14 days" """
    return (
        f"{_dollars(judged.spend)} today against {_dollars(judged.mean)} ± "
        f"{_dollars(judged.stddev)} over {judged.days} days"
    )


def top_contributor(
    project_today: Decimal,
    project_days: dict[date, Decimal],
    tags_today: dict[Tag, Decimal],
    tag_days: dict[Tag, dict[date, Decimal]],
    since: date,
) -> tuple[Tag, Decimal] | None:
    """The tag value whose share of the project's spend rose most today against the days
    since `since` (ties: the larger spend, then the name), and its share of today's spend;
    None when no share rose."""
    if project_today <= 0:
        return None
    before = sum((v for d, v in project_days.items() if d >= since), ZERO)
    rises: list[tuple[Decimal, Decimal, Tag]] = []
    for tag, spend in tags_today.items():
        tag_before = sum((v for d, v in tag_days.get(tag, {}).items() if d >= since), ZERO)
        rise = spend / project_today - (tag_before / before if before > 0 else ZERO)
        if rise > 0:
            rises.append((rise, spend, tag))
    if not rises:
        return None
    _, spend, tag = min(rises, key=lambda r: (-r[0], -r[1], r[2]))
    return tag, spend / project_today


@dataclass(frozen=True, slots=True)
class _Found:
    tag: Tag | None  # None: the whole project
    judged: Judged
    top: tuple[Tag, Decimal] | None
    text: str
    k: Decimal


def _tag_rows(project: Project, days: list[date], tags: set[Tag]) -> dict[Tag, dict[date, Decimal]]:
    """These tag values' spend per day (rollup rows only)."""
    rows = TagDailyRollup.objects.filter(
        project=project,
        day__in=days,
        key__in={k for k, _ in tags},
        value__in={v for _, v in tags},
    ).values_list("key", "value", "day", "cost_usd")
    found: dict[Tag, dict[date, Decimal]] = defaultdict(dict)
    for key, value, day, cost in rows:
        if (key, value) in tags:
            found[(key, value)][day] = cost
    return found


def project_anomalies(project: Project, today: date) -> list[_Found]:
    """What is anomalous in this project today and not yet recorded."""
    k, floor = project.anomaly_k, project.anomaly_floor_usd
    if k is None:
        return []
    first = today - timedelta(days=HISTORY_DAYS)
    by_day = dict(
        DailyRollup.objects.filter(project=project, day__gte=first, day__lte=today)
        .values("day")
        .annotate(cost=Sum("cost_usd"))
        .order_by()
        .values_list("day", "cost")
    )
    spend = by_day.pop(today, None) or ZERO
    if spend <= floor:  # nor can any tag value's be (each is part of it)
        return []
    recorded = set(
        SpendAnomaly.objects.filter(project=project, day=today).values_list("tag_key", "tag_value")
    )
    if ("", "") in recorded:  # the project's own, raised earlier today, named its top tag
        return []
    tags_today = {
        (key, value): cost
        for key, value, cost in TagDailyRollup.objects.filter(project=project, day=today)
        .values_list("key", "value", "cost_usd")
        .order_by()
    }
    judged = series_judged(today, spend, by_day)
    days = [first + timedelta(days=n) for n in range(HISTORY_DAYS)]
    if judged is not None and judged.above(k, floor):
        history = _tag_rows(project, days, set(tags_today))
        since = today - timedelta(days=judged.days)
        top = top_contributor(spend, by_day, tags_today, history, since)
        text = explanation(judged)
        if top is not None:
            text += f"; {_percent(top[1])} from {top[0][0]}={top[0][1]}"
        return [_Found(None, judged, top, text, k)]
    candidates = {t for t, cost in tags_today.items() if cost > floor and t not in recorded}
    if not candidates:
        return []
    history = _tag_rows(project, days, candidates)
    found = []
    for tag in sorted(candidates):
        tag_judged = series_judged(today, tags_today[tag], history.get(tag, {}))
        if tag_judged is None or not tag_judged.above(k, floor):
            continue
        share = tags_today[tag] / spend
        text = (
            f"{tag[0]}={tag[1]}: {explanation(tag_judged)}; {_percent(share)} of the "
            f"project's {_dollars(spend)}"
        )
        found.append(_Found(tag, tag_judged, (tag, share), text, k))
    return found


def _recorded(project: Project, today: date, found: _Found, now: datetime) -> SpendAnomaly | None:
    """Store the anomaly and queue its alert, in one transaction; None if another sweep
    recorded it first (the unique constraint, not a read, decides)."""
    tag_key, tag_value = found.tag or ("", "")
    top = found.top
    try:
        with transaction.atomic():
            anomaly = SpendAnomaly.objects.create(
                project=project,
                tag_key=tag_key,
                tag_value=tag_value,
                day=today,
                spend_usd=found.judged.spend.quantize(_STORED),
                mean_usd=found.judged.mean.quantize(_STORED),
                stddev_usd=found.judged.stddev.quantize(_STORED),
                history_days=found.judged.days,
                k=found.k,
                floor_usd=project.anomaly_floor_usd,
                top_tag=f"{top[0][0]}={top[0][1]}" if top else "",
                top_share=top[1].quantize(Decimal("0.0001"), ROUND_HALF_UP) if top else None,
                explanation=found.text[:400],
                at=now,
            )
            outbox_add(ANOMALY_DISPATCH, {"anomaly_ids": [anomaly.pk]}, project_id=project.pk)
    except IntegrityError:  # a racing sweep recorded it: its alert is that sweep's
        return None
    return anomaly


def anomaly_sweep(*, now: datetime | None = None) -> int:
    """Check every project's spend today (module docstring); record and alert each anomaly
    once. Safe to run twice or at once. Returns how many were recorded by this run."""
    now = now or timezone.now()
    today = now.astimezone(UTC).date()
    made = 0
    for project in Project.objects.filter(anomaly_k__isnull=False).order_by("pk"):
        for found in project_anomalies(project, today):
            anomaly = _recorded(project, today, found, now)
            if anomaly is not None:
                made += 1
                log.info("spend anomaly in %s: %s", project.slug, anomaly.explanation)
    return made
