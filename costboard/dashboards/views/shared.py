"""What the pages' views share: the htmx request type, the page size, the period a page
shows unless asked (PERIOD_DAYS) and its from/to filter, the stop-budgets in force, the model
and tag filters the overview and /steps/ both take, and the 422 a CSV with a bad filter gets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_date
from django_htmx.middleware import HtmxDetails

from costboard.budgets.holds import stops_in_force
from costboard.dashboards.params import Checks
from costboard.dashboards.selectors.steps import StepFilter, StepNames
from costboard.dashboards.selectors.tags import (
    TAG_KEYS_SHOWN,
    spend_by_tag,
    tag_key_carried,
    tag_keys,
)
from costboard.input_limits import FIRST_YEAR, LAST_YEAR
from costboard.models import PeriodBudget

PAGE_SIZE = 50


class HtmxHttpRequest(HttpRequest):
    """A request through django-htmx's middleware (as its docs type it)."""

    htmx: HtmxDetails


def figures(**figures: dict[str, Any]) -> dict[str, Any]:
    """The page's figures, embedded with `json_script` and drawn by static/costboard/charts.js."""
    return figures


def _date(params: QueryDict, name: str) -> tuple[date | None, str]:
    """A date filter and what is wrong with it: no filter (None) if it is absent or not a
    date the data can have (the API refuses timestamps outside FIRST_YEAR..LAST_YEAR, and at
    year 9999 a day's end overflows)."""
    value = params.get(name, "").strip()
    if not value:
        return None, ""
    try:
        day = parse_date(value)
    except ValueError:  # the shape of a date, not a day of the calendar (2026-02-30)
        day = None
    if day is None:
        return None, f"“{value}” is not a date: write it as YYYY-MM-DD, e.g. 2026-11-01"
    if not FIRST_YEAR <= day.year <= LAST_YEAR:
        return None, f"{value} is outside the years {FIRST_YEAR}–{LAST_YEAR} the data can have"
    return day, ""


@dataclass(frozen=True)
class Period:
    """A page's from/to filter as given, and what is wrong with it, by field: a wrong field
    filters nothing and is named in the form."""

    since: date | None
    until: date | None
    errors: dict[str, str]


def read_period(params: QueryDict) -> Period:
    since, since_error = _date(params, "since")
    until, until_error = _date(params, "until")
    errors = {name: e for name, e in (("since", since_error), ("until", until_error)) if e}
    if since and until and since > until:
        errors["until"] = (
            f"{until:%Y-%m-%d} is before the start, {since:%Y-%m-%d}: "
            "pick an end on or after the start (or swap them)"
        )
        since = until = None
    return Period(since=since, until=until, errors=errors)


def stops_now(project_ids: list[int]) -> list[PeriodBudget]:
    """The projects' stop-budgets in force now: the sessions they hold show as stopped
    (docs/budgets.md, "Stopped by a budget")."""
    return stops_in_force(project_ids=project_ids, now=timezone.now())


def tag_breakdown(
    checks: Checks,
    ids: list[int],
    since: date,
    until: date,
    steps: StepFilter = StepFilter(),  # noqa: B008 (frozen)
) -> dict[str, Any]:
    """The tag keys of the period and the spend per value of the one asked for
    (`?tag_key=`), else the first; of the steps `steps` keeps. The keys listed are the first
    TAG_KEYS_SHOWN; any other the period's steps carried is a URL away (one more query)."""
    keys = tag_keys(project_ids=ids, since=since, until=until)
    asked = checks.get("tag_key").strip()
    if (
        asked
        and asked not in keys
        and len(keys) == TAG_KEYS_SHOWN
        and tag_key_carried(project_ids=ids, since=since, until=until, key=asked)
    ):
        keys = [*keys, asked]
    key = checks.choice("tag_key", keys, what="a tag key of this period", blank="the first")
    key = key or (keys[0] if keys else "")
    rows = (
        spend_by_tag(project_ids=ids, since=since, until=until, key=key, steps=steps) if key else []
    )
    return {"tag_keys": keys, "tag_key": key, "tag_rows": rows}


def checked_models(checks: Checks, names: StepNames) -> tuple[str, str]:
    """`?model=` (a family, or an exact name) and `?exact=` (an exact name), checked against
    the names the projects' steps carried."""
    model = checks.choice(
        "model",
        names.model_filters,
        what="a model of these projects' steps",
        blank="any model",
        shown=names.families,
    )
    exact = checks.choice(
        "exact",
        names.models,
        what="an exact model name of these projects' steps",
        blank="every name of the model",
    )
    return model, exact


# Every page shows the last 30 days unless asked otherwise: its reads stay the size of a
# month however long the history grows.
PERIOD_DAYS = 30


def period_start(until: date | None) -> date:
    """The first day of the PERIOD_DAYS that end at `until` (today if none, or later)."""
    today = timezone.now().date()
    return min(today, until or today) - timedelta(days=PERIOD_DAYS - 1)


def read_days(checks: Checks) -> tuple[date, date]:
    """A page's from/to filter with its defaults (until today, since the PERIOD_DAYS that end
    at until), each wrong field named in `checks`. A start after today without an end would
    be a period that runs backwards, shown empty: named, and the default period shown, as the
    API refuses since after until (docs/pages.md, "Parameters")."""
    today = timezone.now().date()
    period = read_period(checks.params)
    checks.named(period.errors)
    until = period.until or today
    since = period.since or period_start(period.until)
    if since > until:  # only a since given after today: read_period checks both given
        checks.errors["since"] = (
            f"{since:%Y-%m-%d} is after today, {until:%Y-%m-%d}, where the period ends "
            "without an end date: pick a start on or before it, or an end (to) on or after it"
        )
        since = period_start(until)
    return since, until


def csv_refused(request: HttpRequest, checks: Checks, page: str) -> HttpResponse:
    """A CSV asked for with a bad filter: no file, but the 422 page naming each bad parameter
    and linking to the list with the same filters, where the form shows them."""
    context = {
        "filter_errors": checks.errors,
        "without": reverse(page) + (f"?{request.GET.urlencode()}" if request.GET else ""),
        "refused_download": True,
    }
    return render(request, "costboard/bad_query.html", context, status=422)
