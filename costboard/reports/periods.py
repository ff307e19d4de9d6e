"""Which week or month a report is of: ISO weeks (Monday–Sunday) and calendar months, complete
in the project's budget timezone.

A project has no timezone of its own; its budget timezone is the timezone of its project-wide
period budget (the oldest, if several), else UTC. The timezone decides when a period is
complete and so which one is the last complete; the spend of each of its dates is that UTC
day's rollup, which is what `GET /api/v1/spend` reads for the same dates (docs/reports.md,
"Periods"). So a period is complete once it is over in the timezone and its last UTC day is
over too: ahead of UTC (Berlin, Tokyo) its local end comes while that day still runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from costboard.budgets.periods import zone
from costboard.input_limits import FIRST_YEAR, LAST_YEAR
from costboard.models import PeriodBudget, Project, SpendReportDelivery

WEEK, MONTH = SpendReportDelivery.Period.WEEK.value, SpendReportDelivery.Period.MONTH.value
KINDS = (WEEK, MONTH)
_WEEK_LABEL = re.compile(r"([0-9]{4})-W([0-9]{2})")
_MONTH_LABEL = re.compile(r"([0-9]{4})-([0-9]{2})")
# the years a period may be in: those every date of the API and the pages may be in
YEARS = range(FIRST_YEAR, LAST_YEAR + 1)


@dataclass(frozen=True, slots=True)
class ReportPeriod:
    """A week (Monday to Sunday) or a calendar month: its first and last date, both included."""

    kind: str
    first: date
    last: date

    @property
    def label(self) -> str:
        """2026-W47 (the ISO week) or 2026-11."""
        if self.kind == WEEK:
            year, week, _ = self.first.isocalendar()
            return f"{year}-W{week:02d}"
        return f"{self.first:%Y-%m}"

    @property
    def title(self) -> str:
        """ "week 2026-W47" or "month 2026-11", as subjects say it."""
        return f"{self.kind} {self.label}"

    @property
    def previous(self) -> ReportPeriod:
        return period_of(self.kind, self.first - timedelta(days=1))

    @property
    def next_first(self) -> date:
        return self.last + timedelta(days=1)


def period_of(kind: str, day: date) -> ReportPeriod:
    """The week or month `day` is in."""
    if kind == WEEK:
        first = day - timedelta(days=day.weekday())
        return ReportPeriod(WEEK, first, first + timedelta(days=6))
    if kind == MONTH:
        first = day.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
        return ReportPeriod(MONTH, first, after - timedelta(days=1))
    raise ValueError(f"{kind!r} is not a report period: use week or month")


def project_timezone(project: Project) -> str:
    """The project's budget timezone: its project-wide period budget's (the oldest), else UTC."""
    names = PeriodBudget.objects.filter(project=project, scope=PeriodBudget.Scope.PROJECT).order_by(
        "pk"
    )
    return names.values_list("timezone", flat=True).first() or "UTC"


def _local_today(now: datetime, tz_name: str) -> date:
    """Today in the timezone, or in UTC if that is earlier: the day whose period is not over
    (a period's figures are UTC days', and a UTC day still running would be reported short)."""
    return min(now.astimezone(zone(tz_name)).date(), now.astimezone(UTC).date())


def last_complete(kind: str, *, now: datetime, tz_name: str) -> ReportPeriod:
    """The last week or month that has ended in the timezone at `now`."""
    return period_of(kind, _local_today(now, tz_name)).previous


def ended_at(period: ReportPeriod, tz_name: str) -> datetime:
    """When the period ends (midnight after its last day in the timezone, or in UTC if that
    is later: its last UTC day is over then), in UTC."""
    tz: ZoneInfo = zone(tz_name)
    local = datetime.combine(period.next_first, time.min, tzinfo=tz).astimezone(UTC)
    return max(local, datetime.combine(period.next_first, time.min, tzinfo=UTC))


def past_periods(kind: str, *, now: datetime, tz_name: str, count: int) -> list[ReportPeriod]:
    """The last `count` complete weeks or months, the latest first."""
    periods = [last_complete(kind, now=now, tz_name=tz_name)]
    while len(periods) < count:
        periods.append(periods[-1].previous)
    return periods


def period_parse(kind: str, label: str) -> ReportPeriod:
    """The period a label names (2026-W47 for a week, 2026-11 for a month); ValueError saying
    the form otherwise."""
    found = (_WEEK_LABEL if kind == WEEK else _MONTH_LABEL).fullmatch(label)
    if found and int(found[1]) not in YEARS:
        raise ValueError(
            f"“{label[:20]}” is not in the years {YEARS[0]} to {YEARS[-1]}: pick a {kind} in them"
        )
    if kind == WEEK:
        if found:
            try:
                monday = date.fromisocalendar(int(found[1]), int(found[2]), 1)
            except ValueError:
                pass
            else:
                return period_of(WEEK, monday)
        raise ValueError(f"“{label[:20]}” is not a week: write it as YYYY-Www, e.g. 2026-W47")
    if found and 1 <= int(found[2]) <= 12:
        return period_of(MONTH, date(int(found[1]), int(found[2]), 1))
    raise ValueError(f"“{label[:20]}” is not a month: write it as YYYY-MM, e.g. 2026-11")
