"""Which week or month a report is of: ISO weeks Monday to Sunday and calendar months, the last
complete one in the project's budget timezone (its project-wide period budget's, else UTC)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from costboard.models import PeriodBudget
from costboard.reports.periods import (
    ended_at,
    last_complete,
    past_periods,
    period_of,
    period_parse,
    project_timezone,
)
from tests.conftest import make_agent


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_a_week_runs_monday_to_sunday_and_is_named_by_its_iso_week() -> None:
    week = period_of("week", date(2026, 11, 19))
    assert (week.first, week.last, week.label) == (
        date(2026, 11, 16),
        date(2026, 11, 22),
        "2026-W47",
    )
    assert week.previous.label == "2026-W46"
    # ISO week 1 of 2027 begins on Monday 2027-01-04; the days before are 2026-W53
    assert period_of("week", date(2027, 1, 2)).label == "2026-W53"
    assert period_parse("week", "2026-W53").first == date(2026, 12, 28)


def test_months_are_calendar_months() -> None:
    feb = period_of("month", date(2028, 2, 10))
    assert (feb.first, feb.last, feb.label) == (date(2028, 2, 1), date(2028, 2, 29), "2028-02")
    assert feb.previous.first == date(2028, 1, 1)
    assert period_of("month", date(2026, 1, 31)).previous.label == "2025-12"


def test_the_last_complete_week_in_utc_and_in_other_timezones() -> None:
    # Monday 05:00 UTC: W47 is over in UTC, not yet in Los Angeles (Sunday 21:00 there)
    monday = at("2026-11-23T05:00:00")
    assert last_complete("week", now=monday, tz_name="UTC").label == "2026-W47"
    assert last_complete("week", now=monday, tz_name="America/Los_Angeles").label == "2026-W46"
    # Sunday noon UTC is Monday 01:00 in Auckland (UTC+13 in November): W47 is over there,
    # but not its Sunday as a UTC day, whose spend the report counts: W46 until UTC midnight
    sunday = at("2026-11-22T12:00:00")
    assert last_complete("week", now=sunday, tz_name="UTC").label == "2026-W46"
    assert last_complete("week", now=sunday, tz_name="Pacific/Auckland").label == "2026-W46"
    utc_midnight = at("2026-11-23T00:00:00")
    assert last_complete("week", now=utc_midnight, tz_name="Pacific/Auckland").label == "2026-W47"
    assert ended_at(period_of("week", date(2026, 11, 16)), "Pacific/Auckland") == utc_midnight
    assert ended_at(period_of("week", date(2026, 11, 16)), "America/Los_Angeles") == at(
        "2026-11-23T08:00:00"
    )


def test_the_last_complete_month_in_utc_and_los_angeles() -> None:
    now = at("2026-12-01T03:00:00")  # Nov 30, 19:00 in Los Angeles
    assert last_complete("month", now=now, tz_name="UTC").label == "2026-11"
    assert last_complete("month", now=now, tz_name="America/Los_Angeles").label == "2026-10"
    assert [p.label for p in past_periods("month", now=now, tz_name="UTC", count=3)] == [
        "2026-11",
        "2026-10",
        "2026-09",
    ]


@pytest.mark.django_db
def test_the_budget_timezone_is_the_project_budgets_else_utc() -> None:
    project = make_agent("acme").project
    assert project_timezone(project) == "UTC"
    PeriodBudget.objects.create(
        project=project,
        name="per user",
        scope=PeriodBudget.Scope.USER,
        scope_value="*",
        timezone="Asia/Tokyo",
        token_limit=1,
    )
    assert project_timezone(project) == "UTC"  # a user budget's timezone is not the project's
    PeriodBudget.objects.create(
        project=project, name="monthly", timezone="America/Los_Angeles", token_limit=1
    )
    PeriodBudget.objects.create(
        project=project, name="later", timezone="Europe/Berlin", token_limit=1
    )
    assert project_timezone(project) == "America/Los_Angeles"  # the oldest


@pytest.mark.parametrize(
    ("kind", "label", "why"),
    [
        ("week", "2026-47", "YYYY-Www"),
        ("week", "2026-W54", "YYYY-Www"),
        ("month", "2026-13", "YYYY-MM"),
        ("month", "2026-W47", "YYYY-MM"),
        ("week", "1969-W52", "1970 to 2999"),
        ("month", "3000-01", "1970 to 2999"),
    ],
)
def test_a_label_not_a_period_says_the_form(kind: str, label: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        period_parse(kind, label)
