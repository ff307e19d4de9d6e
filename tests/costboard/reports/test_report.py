"""The showback report's figures: each table's rows for the period are GET /api/v1/spend's
for the same days and grouping, its total the API's total; every line against the period
before, exact to the last digit; the top movers the largest changes either way."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from costboard.models import usd
from costboard.reports.periods import period_of
from costboard.reports.selectors import SpendReport, Table, spend_report
from tests.costboard.reports.showback import SCRIPT, W46, W47, Showback

pytestmark = pytest.mark.django_db

SUMS = (
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "steps",
)


def api_spend(key: str, grouping: str, since: date, until: date) -> dict[str, Any]:
    response = Client().get(
        "/api/v1/spend",
        {"group_by": grouping, "since": str(since), "until": str(until)},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.content
    answer: dict[str, Any] = response.json()
    return answer


def as_api(sums: dict[str, Any]) -> dict[str, Any]:
    return {name: usd(sums[name]) if name == "cost_usd" else sums[name] for name in SUMS}


def week_report(showback: Showback) -> SpendReport:
    return spend_report(
        project=showback.agent.project, period=period_of("week", W47[0]), tag_key="customer"
    )


def test_each_table_is_the_api_for_the_same_days(showback: Showback) -> None:
    report = week_report(showback)
    assert [t.grouping for t in report.tables] == ["tag:customer", "user", "model"]
    for table in report.tables:
        now = api_spend(showback.read_key, table.grouping, *W47)
        then = api_spend(showback.read_key, table.grouping, *W46)
        assert {line.name: as_api(line.current) for line in table.lines if line.in_current} == {
            row[table.grouping]: {name: row[name] for name in SUMS} for row in now["rows"]
        }
        assert {
            line.name: as_api(line.previous) for line in table.lines if line.previous["steps"]
        } == {row[table.grouping]: {name: row[name] for name in SUMS} for row in then["rows"]}
        assert as_api(table.total) == now["total"]
        assert as_api(table.previous_total) == then["total"]
        # the lines only of the period before have nothing now
        assert all(line.current["steps"] == 0 for line in table.lines if not line.in_current)


def lines(table: Table) -> list[tuple[str | None, Decimal, Decimal, Decimal, Decimal | None]]:
    return [
        (line.name, line.cost_usd, line.previous_cost_usd, line.change_usd, line.change_pct)
        for line in table.lines
    ]


def test_every_line_against_the_week_before_to_the_cent(showback: Showback) -> None:
    report = week_report(showback)
    by_tag, by_user, _ = report.tables
    assert lines(by_user) == [
        ("ann", Decimal("6"), Decimal("3"), Decimal("3"), Decimal("100.0")),
        ("carol", Decimal("0.3"), Decimal(0), Decimal("0.3"), None),
        ("", Decimal("0.15"), Decimal(0), Decimal("0.15"), None),
        ("bob", Decimal(0), Decimal("1.5"), Decimal("-1.5"), Decimal("-100.0")),
    ]
    assert lines(by_tag) == [
        ("acme-corp", Decimal("6"), Decimal("3"), Decimal("3"), Decimal("100.0")),
        (SCRIPT, Decimal("0.3"), Decimal(0), Decimal("0.3"), None),
        (None, Decimal("0.15"), Decimal("1.5"), Decimal("-1.35"), Decimal("-90.0")),
    ]
    assert by_tag.lines[-1].label == "(untagged)"
    assert by_user.lines[2].label == "(no user)"
    assert (report.total["cost_usd"], report.previous_total["cost_usd"]) == (
        Decimal("6.45"),
        Decimal("4.5"),
    )
    assert (report.change_usd, report.change_pct) == (Decimal("1.95"), Decimal("43.3"))
    assert report.total["steps"] == 3  # the Monday after is not in the week


def test_the_top_movers_are_the_largest_changes_either_way(showback: Showback) -> None:
    by_tag, by_user, _ = week_report(showback).tables
    assert [(m.name, m.change_usd) for m in by_user.movers] == [
        ("ann", Decimal(3)),
        ("bob", Decimal("-1.5")),
        ("carol", Decimal("0.3")),
        ("", Decimal("0.15")),
    ]
    assert [m.name for m in by_tag.movers] == ["acme-corp", None, SCRIPT]


def test_a_month_against_the_month_before(showback: Showback) -> None:
    report = spend_report(
        project=showback.agent.project, period=period_of("month", date(2026, 11, 3))
    )
    assert (report.period.first, report.period.last) == (date(2026, 11, 1), date(2026, 11, 30))
    assert (report.previous.first, report.previous.last) == (date(2026, 10, 1), date(2026, 10, 31))
    assert [t.grouping for t in report.tables] == ["user", "model"]  # no tag key: no tag table
    # the whole month: both weeks and the Monday after ($7.50 of output)
    assert report.total["cost_usd"] == Decimal("3") + Decimal("1.5") + Decimal("6.45") + Decimal(
        "7.5"
    )
    assert report.previous_total["cost_usd"] == Decimal(0)
    assert report.change_pct is None
    month = api_spend(showback.read_key, "user", date(2026, 11, 1), date(2026, 11, 30))
    assert as_api(report.total) == month["total"]
