"""The overview (/): spend by period, the month's charts, the costliest and flagged sessions,
the spend anomalies of the last 7 days, the budgets, the alert channels failing, the tag
breakdown and, for staff, the unpriced models; and /favicon.ico."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import render
from django.templatetags.static import static
from django.utils import timezone

from costboard.budgets.caps import session_caps
from costboard.dashboards import charts
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import scope_for
from costboard.dashboards.selectors.budgets import alert_channels_failing, budgets_current
from costboard.dashboards.selectors.flagged import sessions_flagged
from costboard.dashboards.selectors.overview import (
    anomalies_recent,
    models_unpriced,
    sessions_costliest,
    spend_by_period,
    usage_breakdown,
)
from costboard.dashboards.selectors.sessions import SessionStop, listed_stop
from costboard.dashboards.selectors.shared import day_start
from costboard.dashboards.views.shared import figures, period_start, stops_now, tag_breakdown
from costboard.models import Session
from costboard.replicas import replica_reads


@login_required
@replica_reads
def overview(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    ids = scope.project_ids
    today = timezone.now().date()
    since = period_start(today)
    breakdown = usage_breakdown(project_ids=ids, since=since, until=today)
    stops = stops_now(ids)
    flagged, flagged_total = sessions_flagged(project_ids=ids, stops=stops)
    by_id = {b.pk: b for b in stops}

    def stopped(sessions: Iterable[Session]) -> list[tuple[Session, SessionStop]]:
        """Each with its state as its agent is told it: held by a stop-budget, exhausted."""
        return [(s, listed_stop(s, session_caps(s), by_id)) for s in sessions]

    anomalies, anomalies_total = anomalies_recent(
        project_ids=ids, since=timezone.now() - timedelta(days=7)
    )
    context = {
        "scope": scope,
        "spend": spend_by_period(project_ids=ids, today=today),
        "breakdown": breakdown,
        # the same 30 UTC days as the tiles, /sessions/ and GET /api/v1/spend
        "costliest": stopped(
            sessions_costliest(project_ids=ids, since=day_start(since), stops=stops)
        ),
        "flagged": stopped(flagged),
        "flagged_total": flagged_total,
        "anomalies": anomalies,
        "anomalies_total": anomalies_total,
        "budgets": budgets_current(project_ids=ids, now=timezone.now()),
        "alerts_failing": alert_channels_failing(project_ids=ids, now=timezone.now()),
        **tag_breakdown(checks, ids, since, today),
        "unpriced": (models_unpriced(project_ids=ids) if request.user.is_staff else []),
        "figures": figures(
            daily=charts.daily_cost_by_model(breakdown),
            step_types=charts.cost_by_step_type(breakdown),
            kinds=charts.tokens_by_kind(breakdown),
        ),
        "filter_errors": checks.errors,
    }
    return render(request, "costboard/overview.html", context, status=checks.status)


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico: what a browser asks for on a page without an icon link; ours (its hashed
    name is known only once the static files are, so it is looked up per request)."""
    response = HttpResponsePermanentRedirect(static("costboard/favicon.svg"))
    response["Cache-Control"] = "public, max-age=86400"
    return response
