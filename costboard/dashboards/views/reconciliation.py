"""/reconciliation/: Costboard's estimate beside what the providers billed, over a period —
the days side by side in a chart, the largest gaps first, drill-down to a day, a provider
and a model, and the uninstrumented spend (billed with no step behind it) shown apart. The
rules are costboard/billing/reconcile.py's (docs/billing.md, "Reconciliation")."""

from __future__ import annotations

import re
from datetime import date, timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from costboard.billing.reconcile import Line, Wanted, grouped, reconcile, total
from costboard.dashboards import charts
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import scope_for
from costboard.dashboards.views.shared import figures, period_start, read_period

MAX_DAYS = 366
GAPS_SHOWN = 100
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _day(checks: Checks, since: date, until: date) -> date | None:
    """`?day=`: one UTC day of the period to drill into."""
    value = checks.pattern("day", _DAY, what="a day: write it as YYYY-MM-DD, e.g. 2026-11-01")
    if not value:
        return None
    try:
        day = date.fromisoformat(value)
    except ValueError:
        checks.errors["day"] = f"“{value}” is no such date: write it as YYYY-MM-DD"
        return None
    if not since <= day <= until:
        checks.errors["day"] = (
            f"{value} is outside the period shown ({since} to {until}): pick a day in it, "
            "or change From and to"
        )
        return None
    return day


@login_required
def reconciliation_page(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    period = read_period(checks.params)
    checks.named(period.errors)
    today = timezone.now().date()
    until = period.until or today
    since = period.since or period_start(period.until)
    if (until - since).days >= MAX_DAYS:
        checks.errors["since"] = (
            f"at most {MAX_DAYS} days at once: pick a start on or after "
            f"{until - timedelta(days=MAX_DAYS - 1)}"
        )
        since = period_start(until)
    lines = reconcile(Wanted(scope.project_ids, since, until))
    providers = sorted({line.provider for line in lines})
    provider = checks.choice(
        "provider", providers, what="a provider billed in this period", blank="every provider"
    )
    if provider:
        lines = [line for line in lines if line.provider == provider]
    models = sorted({line.model for line in lines if line.model})
    model = checks.choice(
        "model", models, what="a model billed or estimated in this period", blank="every model"
    )
    if model:
        lines = [line for line in lines if line.model == model]
    day = _day(checks, since, until)

    by_day = grouped(lines, ["day"])
    shown: list[Line] = [line for line in lines if day is None or line.day == day]
    gaps = sorted(shown, key=lambda line: (-abs(line.drift_usd), line.day, line.provider))
    uninstrumented = [line for line in shown if line.uninstrumented]
    names = {p.pk: p.name for p in scope.projects}
    context = {
        "scope": scope,
        "since": since,
        "until": until,
        "day": day,
        "provider": provider,
        "model": model,
        "providers": providers,
        "models": models,
        "by_day": by_day,
        "by_provider": grouped(shown, ["provider"]),
        "gaps": gaps[:GAPS_SHOWN],
        "gaps_more": max(0, len(gaps) - GAPS_SHOWN),
        "uninstrumented": uninstrumented,
        "whole": total(shown),
        "several_projects": len({line.project_id for line in lines}) > 1,
        "project_names": names,
        "filter_errors": checks.errors,
        "figures": figures(
            daily=charts.estimated_vs_billed(
                [(str(g.values["day"]), g.estimated_cost_usd, g.billed_cost_usd) for g in by_day]
            )
        ),
    }
    return render(request, "costboard/reconciliation.html", context, status=checks.status)
