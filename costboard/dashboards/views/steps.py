"""/steps/: a period's steps by step type and model; the table, its charts and the tag
breakdown all of the steps the filters keep."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render

from costboard.dashboards import charts
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import scope_for
from costboard.dashboards.selectors.steps import (
    StepFilter,
    latency_by_step_type,
    service_tiers,
    step_names,
    steps_by_type_and_model,
    turn_cost_distribution,
)
from costboard.dashboards.views.shared import (
    HtmxHttpRequest,
    checked_models,
    figures,
    read_days,
    tag_breakdown,
)
from costboard.models import MAX_TIER_LENGTH, TIER_WORD, service_tier_word
from costboard.replicas import replica_reads


@login_required
@replica_reads
def steps_page(request: HtmxHttpRequest) -> HttpResponse:
    """The steps of a period by step type and model; the table, its charts and the tag
    breakdown all of the steps the filters keep."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    since, until = read_days(checks)
    ids = scope.project_ids
    names = step_names(project_ids=ids)
    model, exact = checked_models(checks, names)
    step_type = checks.choice(
        "step_type",
        names.step_types,
        what="a step type of these projects' steps",
        blank="every step type",
    )
    tier = checks.pattern(
        "tier",
        TIER_WORD,
        what="a service tier: standard, flex, priority, batch or a provider's word (letters, "
        f"digits, _ . - :, at most {MAX_TIER_LENGTH} characters); leave it out for every tier",
    )
    tier = service_tier_word(tier) if tier else ""
    by_tier = checks.switch("by_tier", meaning="split the rows by service tier")
    steps = StepFilter(model=model, exact=exact, step_type=step_type, tier=tier, by_tier=by_tier)
    rows = steps_by_type_and_model(project_ids=ids, since=since, until=until, steps=steps)
    latency = latency_by_step_type(project_ids=ids, since=since, until=until, steps=steps)
    turn_costs = turn_cost_distribution(project_ids=ids, since=since, until=until, steps=steps)

    by_type: dict[str, list[int]] = {}
    for row in rows:
        calls_errors = by_type.setdefault(row.step_type, [0, 0])
        calls_errors[0] += row.calls
        calls_errors[1] += row.errors
    context = {
        "scope": scope,
        "rows": rows,
        "latency": latency,
        "error_rates": [
            (name, calls, errors, errors / calls if calls else 0.0)
            for name, (calls, errors) in sorted(by_type.items())
        ],
        "since": since,
        "until": until,
        "given": request.GET,
        "model": model,
        "exact": exact,
        "step_type": step_type,
        "tier": tier,
        "by_tier": by_tier,
        "tiers": service_tiers(),
        "models": names.families,
        "step_types": names.step_types,
        **tag_breakdown(checks, ids, since, until, steps),
        "figures": figures(
            latency=charts.latency(latency), turn_costs=charts.turn_cost_histogram(turn_costs)
        ),
        "filter_errors": checks.errors,
    }
    template = "costboard/steps.html"
    if request.htmx:
        template += "#results"
    return render(request, template, context, status=checks.status)
