"""The sessions list (/sessions/) and its CSV (/sessions/export.csv): the same filters, each
checked, the same rows."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import timezone

from costboard.budgets.caps import session_caps
from costboard.dashboards.csv import sessions_csv_chunks
from costboard.dashboards.pagination import KeyedPaginator
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import scope_for
from costboard.dashboards.selectors.sessions import (
    SESSION_SORTS,
    STATE_FILTERS,
    SessionFilters,
    listed_stop,
    model_mix,
    sessions_filtered,
    sessions_total,
)
from costboard.dashboards.selectors.steps import StepNames, step_names
from costboard.dashboards.views.shared import (
    PAGE_SIZE,
    HtmxHttpRequest,
    checked_models,
    csv_refused,
    period_start,
    read_period,
    stops_now,
)
from costboard.replicas import replica_reads


def _session_filters(
    checks: Checks, project_ids: list[int], names: StepNames | None = None
) -> SessionFilters:
    """The sessions list's filters (its CSV's too), each checked; the model names are read
    (`names`, unless given) only when a model filter is."""
    params = checks.params
    period = read_period(params)
    checks.named(period.errors)
    since = period.since
    if "since" not in params:  # given empty (the date cleared, the "All time" link): all time
        since = period_start(period.until)
    sort = checks.sort("sort", SESSION_SORTS, default="-last_active")
    state = checks.choice("state", STATE_FILTERS, what="a session state", blank="any state")
    model = exact = ""
    if checks.get("model").strip() or checks.get("exact").strip():
        model, exact = checked_models(checks, names or step_names(project_ids=project_ids))
    return SessionFilters(
        state=state,
        model=model,
        exact=exact,
        user=checks.get("user").strip(),
        user_id=checks.get("user_id"),  # as stored: exact, not trimmed
        tag=checks.tag("tag"),
        q=checks.get("q").strip(),
        since=since,
        until=period.until,
        sort=sort,
    )


@login_required
@replica_reads
def sessions_list(request: HtmxHttpRequest) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    # the model filter's choices (the full page's), which also check a model asked for
    names = None if request.htmx else step_names(project_ids=scope.project_ids)
    filters = _session_filters(checks, scope.project_ids, names)
    live = checks.switch("live", meaning="refresh the list every 10 seconds")
    stops = stops_now(scope.project_ids)
    sessions = sessions_filtered(project_ids=scope.project_ids, filters=filters, stops=stops)
    # All of them (the "All time" link): counted from the projects' tallies, not row by row
    total = sessions_total(project_ids=scope.project_ids) if filters.everything else None
    page = checks.page(KeyedPaginator(sessions, PAGE_SIZE, count=total))
    mix = model_mix(session_ids=[s.pk for s in page])
    by_id = {b.pk: b for b in stops}
    rows = []
    for s in page:
        caps = session_caps(s)
        rows.append((s, caps, mix.get(s.pk, []), listed_stop(s, caps, by_id)))
    all_time = request.GET.copy()
    all_time.pop("page", None)
    all_time["since"] = ""
    context = {
        "scope": scope,
        "filters": filters,
        "all_time_query": "?" + all_time.urlencode(),
        "filter_errors": checks.errors,
        "page": page,
        "rows": rows,
        "states": list(STATE_FILTERS),
        "live": live,
    }
    template = "costboard/sessions.html"
    if request.htmx:
        template += "#table"
    else:
        context["models"] = names.families if names is not None else []
    return render(request, template, context, status=checks.status)


@login_required
@replica_reads
def sessions_csv(request: HttpRequest) -> HttpResponseBase:
    scope = scope_for(request)
    checks = Checks(request.GET)
    filters = _session_filters(checks, scope.project_ids)
    if checks.errors:
        return csv_refused(request, checks, "sessions")
    stops = stops_now(scope.project_ids)
    sessions = sessions_filtered(project_ids=scope.project_ids, filters=filters, stops=stops)
    projects = {p.pk: p for p in scope.projects}
    by_id = {b.pk: b for b in stops}
    response = StreamingHttpResponse(
        sessions_csv_chunks(sessions, projects, by_id), content_type="text/csv"
    )
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="sessions-{stamp}.csv"'
    return response
