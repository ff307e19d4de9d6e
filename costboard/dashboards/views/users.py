"""/users/ and its CSV: spend per end user over a period, sortable."""

from __future__ import annotations

from datetime import date

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from costboard.dashboards.csv import users_csv_text
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import scope_for
from costboard.dashboards.selectors.shared import ZERO
from costboard.dashboards.selectors.users import USER_SORTS, users_spend
from costboard.dashboards.views.shared import PAGE_SIZE, csv_refused, read_days
from costboard.replicas import replica_reads


@login_required
@replica_reads
def users_csv(request: HttpRequest) -> HttpResponse:
    """/users/'s rows as CSV, for the same period and order."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    since, until, sort = _users_period(checks)
    if checks.errors:
        return csv_refused(request, checks, "users")
    rows = users_spend(project_ids=scope.project_ids, since=since, until=until, sort=sort)
    response = HttpResponse(users_csv_text(rows), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="users-{since}-{until}.csv"'
    return response


def _users_period(checks: Checks) -> tuple[date, date, str]:
    since, until = read_days(checks)
    sort = checks.sort("sort", USER_SORTS, default="-cost")
    return since, until, sort


@login_required
@replica_reads
def users_page(request: HttpRequest) -> HttpResponse:
    """Spend, tokens, sessions and steps per end user over a period, sortable, PAGE_SIZE
    users a page (the count and the total of them all); each user linked to their
    sessions."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    since, until, sort = _users_period(checks)
    rows = users_spend(project_ids=scope.project_ids, since=since, until=until, sort=sort)
    page = checks.page(Paginator(rows, PAGE_SIZE))
    filter_errors = checks.errors
    context = {
        "scope": scope,
        "rows": rows,
        "page": page,
        "since": since,
        "until": until,
        "sort": sort,
        "filter_errors": filter_errors,
        "total": sum((r.cost_usd for r in rows), ZERO),
    }
    return render(request, "costboard/users.html", context, status=422 if filter_errors else 200)
