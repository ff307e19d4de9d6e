"""The period budgets' pages: /budgets/ (each in its current period) and /budgets/<pk>/."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from costboard.dashboards.scope import scope_for
from costboard.dashboards.selectors.budgets import (
    alert_channels_failing,
    budget_detail,
    budget_in_scope,
    budgets_current,
    budgets_stopped_counts,
)
from costboard.dashboards.views.shared import stops_now
from costboard.replicas import replica_reads


@login_required
@replica_reads
def budgets_page(request: HttpRequest) -> HttpResponse:
    """Every period budget of the projects in scope in its current period: its state, spent
    against its limits, its forecast, and how many sessions it stops; and the projects' alert
    channels whose deliveries fail."""
    scope = scope_for(request)
    now = timezone.now()
    rows = budgets_current(project_ids=scope.project_ids, now=now)
    # each with how many sessions it stops now (None: it stops none now)
    stopped = budgets_stopped_counts(rows=rows, stops=stops_now(scope.project_ids))
    context = {
        "scope": scope,
        "rows": [(row, stopped.get(row.budget.pk)) for row in rows],
        "alerts_failing": alert_channels_failing(project_ids=scope.project_ids, now=now),
    }
    return render(request, "costboard/budgets.html", context)


@login_required
@replica_reads
def budget_page(request: HttpRequest, pk: int) -> HttpResponse:
    """One period budget: its current period and forecast, its past periods, its crossings
    and the sessions it stops (404 outside the projects in scope)."""
    scope = scope_for(request)
    budget = budget_in_scope(project_ids=scope.project_ids, budget_id=pk)
    if budget is None:
        raise Http404("no such budget")
    detail = budget_detail(budget=budget, stops=stops_now([budget.project_id]), now=timezone.now())
    context = {"scope": scope, "budget": budget, "detail": detail, "row": detail.row}
    return render(request, "costboard/budget.html", context)
