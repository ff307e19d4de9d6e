"""/reports/ and its CSV: the showback report of one project for any past week or month — the
same tables as the email (costboard/reports/), by a tag key, by user and by model, each
against the period before with its top movers (docs/reports.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from costboard.dashboards.params import Checks
from costboard.dashboards.scope import Scope, scope_for
from costboard.dashboards.views.shared import csv_refused
from costboard.models import Project
from costboard.replicas import replica_reads
from costboard.reports.messages import report_csv, report_csv_name, report_query
from costboard.reports.periods import (
    KINDS,
    WEEK,
    ReportPeriod,
    last_complete,
    past_periods,
    period_parse,
    project_timezone,
)
from costboard.reports.selectors import SpendReport, report_tag_keys, spend_report
from costboard.tag_values import TAG_KEY

# the periods the selector offers (any other past one is a URL away)
PERIODS_OFFERED = {"week": 26, "month": 24}


@dataclass(frozen=True)
class Asked:
    project: Project
    tz_name: str
    periods: list[ReportPeriod]
    tag_keys: list[str]
    report: SpendReport
    kinds: tuple[str, ...] = KINDS  # each a link keeping the project and tag key


def _asked(scope: Scope, checks: Checks) -> Asked | None:
    """The report the query asks for, its bad parameters named in `checks`; None when the user
    sees no project."""
    project = scope.current or (scope.projects[0] if scope.projects else None)
    if project is None:
        return None
    kind = checks.choice("period", KINDS, what="a report period", blank="week") or WEEK
    tz_name = project_timezone(project)
    now = timezone.now()
    periods = past_periods(kind, now=now, tz_name=tz_name, count=PERIODS_OFFERED[kind])
    period = periods[0]
    label = checks.get("at").strip()
    if label:
        try:
            chosen = period_parse(kind, label)
        except ValueError as exc:
            checks.errors["at"] = str(exc)
        else:
            if chosen.first > last_complete(kind, now=now, tz_name=tz_name).first:
                checks.errors["at"] = (
                    f"{chosen.label} is not over yet in {tz_name}: pick a past {kind}, "
                    f"{periods[0].label} or before"
                )
            else:
                period = chosen
    keys = report_tag_keys(project=project, since=period.previous.first, until=period.last)
    offered = {*keys, *([project.report_tag_key] if project.report_tag_key else [])}
    # any tag key events may carry, as `spend_report --tag` takes it: the link in a report sent
    # by a key none of the two periods' steps have opens that report (all of it untagged)
    asked_tag = checks.get("tag").strip()
    if TAG_KEY.fullmatch(asked_tag):
        offered.add(asked_tag)
    tag = checks.choice(
        "tag",
        offered,
        what="a tag key (up to 64 of a-z 0-9 _ . -)",
        blank="the project's report tag key",
        shown=sorted(offered),
    )
    tag_key = tag or project.report_tag_key
    report = spend_report(project=project, period=period, tag_key=tag_key)
    return Asked(project, tz_name, periods, sorted(offered), report)


@login_required
@replica_reads
def reports_page(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    asked = _asked(scope, checks)
    context: dict[str, Any] = {"scope": scope, "asked": asked, "filter_errors": checks.errors}
    if asked is not None:
        context["report"] = asked.report
        context["csv_query"] = report_query(asked.report)
    return render(request, "costboard/reports.html", context, status=checks.status)


@login_required
@replica_reads
def reports_csv(request: HttpRequest) -> HttpResponse:
    """The page's report as CSV: the email's attachment, for any past period."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    asked = _asked(scope, checks)
    if asked is None:
        raise Http404("no project to report on")
    if checks.errors:
        return csv_refused(request, checks, "reports")
    response = HttpResponse(report_csv(asked.report), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{report_csv_name(asked.report)}"'
    return response
