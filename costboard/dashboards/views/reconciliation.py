"""/reconciliation/: Costboard's estimate beside what the providers billed, over a period —
the days side by side in a chart, the largest gaps first, drill-down to a day, a provider
and a model, and the uninstrumented spend (billed with no step behind it) shown apart. The
rules are costboard/billing/reconcile.py's (docs/billing.md, "Reconciliation")."""

from __future__ import annotations

import re
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from costboard.billing.proposals import (
    Proposal,
    adjustment_in_force,
    drift_proposals,
    repricing_pending,
)
from costboard.billing.reconcile import Line, Wanted, grouped, reconcile, total
from costboard.dashboards import charts
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import scope_for
from costboard.dashboards.views.shared import figures, period_start, read_days
from costboard.input_limits import amount_fault
from costboard.pricing.services import PriceError, adjustment_set
from costboard.replicas import replica_reads

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


def can_adjust_prices(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Applying a proposed adjustment: staff who may add and change price adjustments in the
    admin (a superuser may)."""
    return (
        getattr(user, "is_staff", False)
        and isinstance(user, PermissionsMixin)
        and user.has_perms(["costboard.add_priceadjustment", "costboard.change_priceadjustment"])
    )


@login_required
@replica_reads
def reconciliation_page(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _page(request: HttpRequest, apply_error: str = "", status: int = 200) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    since, until = read_days(checks)
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
    pending = repricing_pending(scope.project_ids)
    # the proposals read the whole period's days (never one day's drill-down)
    proposals: list[Proposal] = [] if pending else drift_proposals(lines, adjustment_in_force)
    slugs = {p.pk: p.slug for p in scope.projects}
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
        "proposals": proposals,
        "repricing_pending": pending,
        "can_adjust": can_adjust_prices(request.user),
        "project_slugs": slugs,
        "apply_error": apply_error,
        "figures": figures(
            daily=charts.estimated_vs_billed(
                [(str(g.values["day"]), g.estimated_cost_usd, g.billed_cost_usd) for g in by_day]
            )
        ),
    }
    return render(
        request, "costboard/reconciliation.html", context, status=max(checks.status, status)
    )


@login_required
@require_POST
def reconciliation_adjust(request: HttpRequest) -> HttpResponse:
    """Apply a proposed adjustment (the page's button): record it through the pricing
    services, which reprice the steps it covers through the outbox; back to the page."""
    if not can_adjust_prices(request.user):
        raise PermissionDenied("Applying an adjustment needs the right to add price adjustments.")
    scope = scope_for(request)
    form = request.POST
    project = next((p for p in scope.projects if p.slug == form.get("adjust_project")), None)
    error = ""
    digits = amount_fault(form.get("percent", ""), example="-12")
    if digits is not None:  # Decimal() would read "１２" as 12
        return _page(request, apply_error=f"percent: {digits}", status=422)
    try:
        percent = Decimal(form.get("percent", ""))
        since = date.fromisoformat(form.get("since", ""))
    except (InvalidOperation, ValueError):
        error = "percent: a percentage on list such as -12, and since: a day YYYY-MM-DD"
    else:
        if project is None:
            error = "adjust_project: no such project; reload the page and apply again"
        elif not form.get("family", "").strip():
            error = "family: the model family the proposal names, e.g. claude-sonnet-4-5"
        else:
            try:
                adjustment_set(
                    provider=form.get("provider", ""),
                    family=form.get("family", ""),
                    project_id=project.pk,
                    percent=percent,
                    effective_from=since,
                    note=form.get("note", "")[:200] or "proposed by /reconciliation/",
                )
            except PriceError as fault:
                field = "since" if fault.field == "effective_from" else fault.field  # the form's
                error = f"{field}: {fault.message}"
    if error:
        return _page(request, apply_error=error, status=422)
    back = reverse("reconciliation")
    query = request.GET.urlencode()
    return HttpResponseRedirect(f"{back}?{query}" if query else back, status=303)
