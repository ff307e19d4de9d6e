"""/users/'s reads: spend, tokens, steps and sessions per end user over a period."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from django.db.models import Count, Sum

from costboard.dashboards.selectors.shared import ZERO, day_start
from costboard.models import Session, UserDailyRollup

USER_SORTS = {
    "user": "user_id",
    "cost": "cost_usd",
    "tokens": "tokens",
    "sessions": "sessions",
    "steps": "steps",
}


@dataclass(frozen=True)
class UserSpend:
    user_id: str
    cost_usd: Decimal
    input_tokens: int
    output_tokens: int
    steps: int
    sessions: int

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def per_step(self) -> Decimal | None:
        return self.cost_usd / self.steps if self.steps else None


def users_spend(
    *, project_ids: list[int], since: date, until: date, sort: str = "-cost"
) -> list[UserSpend]:
    """Spend, tokens and steps per end user between two UTC days, from the per-user daily
    rollups, with the sessions each started in those days (two queries). Sorted by `sort`
    (a USER_SORTS key, "-" for descending)."""
    sums = (
        UserDailyRollup.objects.filter(project_id__in=project_ids, day__gte=since, day__lte=until)
        .values("user_id")
        .annotate(
            cost=Sum("cost_usd"),
            inp=Sum("input_tokens"),
            out=Sum("output_tokens"),
            calls=Sum("calls"),
        )
    )
    started = dict(
        Session.objects.filter(
            project_id__in=project_ids,
            # the same sessions (one is last active when or after it starts), found through
            # session_recent's range rather than a scan of every session there has been
            last_active_at__gte=day_start(since),
            started_at__gte=day_start(since),
            started_at__lt=day_start(until + timedelta(days=1)),
        )
        .values("user_id")
        .annotate(n=Count("id"))
        .values_list("user_id", "n")
    )
    rows = [
        UserSpend(
            user_id=row["user_id"],
            cost_usd=row["cost"] or ZERO,
            input_tokens=row["inp"] or 0,
            output_tokens=row["out"] or 0,
            steps=row["calls"] or 0,
            sessions=started.get(row["user_id"], 0),
        )
        for row in sums
    ]
    name = sort.lstrip("-")
    field_name = USER_SORTS.get(name, "cost_usd")
    rows.sort(key=lambda r: (getattr(r, field_name), r.user_id), reverse=sort.startswith("-"))
    return rows
