"""The showback report of one project and period (reads only): spend by a tag key, by user and
by model, each row against the period before, with the top movers (docs/reports.md).

Every figure is costboard/reports/spend.py's, the sums `GET /api/v1/spend` answers with: a
table's rows for the period are the API's rows for the same days and grouping, its total the
API's total."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from costboard.models import Project, TagDailyRollup
from costboard.reports.periods import ReportPeriod
from costboard.reports.spend import SUMS, spend_rows, spend_total
from costboard.tag_values import EMPTY_VALUE_LABEL, UNTAGGED_LABEL

MOVERS = 5  # the top movers shown per table
COUNTS = (*SUMS[1:], "steps")
_TENTH = Decimal("0.1")


def _zero() -> dict[str, Any]:
    return {"cost_usd": Decimal(0)} | dict.fromkeys(COUNTS, 0)


def change_pct(current: Decimal, previous: Decimal) -> Decimal | None:
    """The change as a percentage of the previous figure, to a tenth; None when there was none
    before (new spend has no percentage)."""
    if not previous:
        return None
    return ((current - previous) * 100 / previous).quantize(_TENTH, rounding=ROUND_HALF_UP)


def name_label(grouping: str, name: str | None) -> str:
    """A group's name as the report shows it: the steps without the tag, the sessions
    without a user and the steps without a model family named as such."""
    if name is None:
        return UNTAGGED_LABEL
    if not name:
        if grouping == "user":
            return "(no user)"
        return EMPTY_VALUE_LABEL if grouping.startswith("tag:") else "(none)"
    return name


@dataclass(frozen=True, slots=True)
class Line:
    """One group's spend in the period and the one before (each a spend row's sums)."""

    name: str | None  # the user, the model family or the tag's value; None: untagged
    label: str  # the name as the report shows it
    current: dict[str, Any]
    previous: dict[str, Any]
    in_current: bool  # a row of the period's spend (not only of the one before)

    @property
    def cost_usd(self) -> Decimal:
        return Decimal(self.current["cost_usd"])

    @property
    def previous_cost_usd(self) -> Decimal:
        return Decimal(self.previous["cost_usd"])

    @property
    def change_usd(self) -> Decimal:
        return self.cost_usd - self.previous_cost_usd

    @property
    def change_pct(self) -> Decimal | None:
        return change_pct(self.cost_usd, self.previous_cost_usd)


@dataclass(frozen=True, slots=True)
class Table:
    """A grouping's lines, costliest first (then the ones gone since the period before), its
    totals, and its top movers (the largest changes in USD, either way)."""

    grouping: str  # "tag:<key>", "user" or "model"
    title: str
    lines: list[Line]
    total: dict[str, Any]
    previous_total: dict[str, Any]
    movers: list[Line] = field(default_factory=list)

    @property
    def change_usd(self) -> Decimal:
        return Decimal(self.total["cost_usd"]) - Decimal(self.previous_total["cost_usd"])

    @property
    def change_pct(self) -> Decimal | None:
        return change_pct(Decimal(self.total["cost_usd"]), Decimal(self.previous_total["cost_usd"]))


@dataclass(frozen=True, slots=True)
class SpendReport:
    project: Project
    period: ReportPeriod
    previous: ReportPeriod
    tag_key: str
    tables: list[Table]

    @property
    def total(self) -> dict[str, Any]:
        """The period's whole spend: every table's total is this (the API's `total`)."""
        return self.tables[0].total

    @property
    def previous_total(self) -> dict[str, Any]:
        return self.tables[0].previous_total

    @property
    def change_usd(self) -> Decimal:
        return self.tables[0].change_usd

    @property
    def change_pct(self) -> Decimal | None:
        return self.tables[0].change_pct


def _table(
    project_id: int, grouping: str, title: str, period: ReportPeriod, previous: ReportPeriod
) -> Table:
    now_rows = spend_rows(
        project_id=project_id, names=[grouping], since=period.first, until=period.last
    )
    then_rows = spend_rows(
        project_id=project_id, names=[grouping], since=previous.first, until=previous.last
    )
    then = {row[grouping]: row for row in then_rows}
    lines = [
        Line(
            row[grouping],
            name_label(grouping, row[grouping]),
            row,
            then.get(row[grouping], _zero()),
            in_current=True,
        )
        for row in now_rows
    ]
    seen = {row[grouping] for row in now_rows}
    gone = [
        Line(row[grouping], name_label(grouping, row[grouping]), _zero(), row, in_current=False)
        for row in then_rows
        if row[grouping] not in seen
    ]
    lines.sort(key=lambda line: (-line.cost_usd, line.name is None, line.name or ""))
    gone.sort(key=lambda line: (-line.previous_cost_usd, line.name is None, line.name or ""))
    moved = [line for line in [*lines, *gone] if line.change_usd]
    moved.sort(key=lambda line: (-abs(line.change_usd), line.name is None, line.name or ""))
    return Table(
        grouping=grouping,
        title=title,
        lines=[*lines, *gone],
        total=spend_total(now_rows),
        previous_total=spend_total(then_rows),
        movers=moved[:MOVERS],
    )


def spend_report(*, project: Project, period: ReportPeriod, tag_key: str = "") -> SpendReport:
    """The report of `project` for `period`: by `tag_key` (no tag table when blank), by user,
    by model, each against the period before. Two or three queries per table."""
    previous = period.previous
    groupings = [("user", "By user"), ("model", "By model")]
    if tag_key:
        groupings.insert(0, (f"tag:{tag_key}", f"By tag {tag_key}"))
    tables = [_table(project.pk, name, title, period, previous) for name, title in groupings]
    return SpendReport(
        project=project, period=period, previous=previous, tag_key=tag_key, tables=tables
    )


def report_tag_keys(*, project: Project, since: date, until: date) -> list[str]:
    """The tag keys the project's steps carried between two UTC days (one query)."""
    keys = (
        TagDailyRollup.objects.filter(project=project, day__gte=since, day__lte=until)
        .values_list("key", flat=True)
        .distinct()
        .order_by("key")
    )
    return list(keys[:100])
