"""Server-rendered pages (CONTRACT §6): login required, scoped to the projects a user may see,
filters in the URL, htmx swapping only the part that changes."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.dateparse import parse_date
from django_htmx.middleware import HtmxDetails

from costboard import charts, selectors
from costboard.budgets import caps_for, session_caps
from costboard.models import SYSTEM_SESSION_ID, Project, Session, usd
from costboard.scope import Scope, scope_for

PAGE_SIZE = 50


class HtmxHttpRequest(HttpRequest):
    """A request through django-htmx's middleware (as its docs type it)."""

    htmx: HtmxDetails


def _figures(**figures: dict[str, Any]) -> dict[str, Any]:
    """The page's figures, embedded with `json_script` and drawn by static/costboard/charts.js."""
    return figures


def _date(params: QueryDict, name: str) -> date | None:
    value = params.get(name, "")
    try:
        return parse_date(value) if value else None
    except ValueError:
        return None


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    ids = scope.project_ids
    today = timezone.now().date()
    since = today - timedelta(days=29)
    breakdown = selectors.usage_breakdown(project_ids=ids, since=since, until=today)
    flagged, flagged_total = selectors.sessions_flagged(project_ids=ids)
    context = {
        "scope": scope,
        "spend": selectors.spend_by_period(project_ids=ids, today=today),
        "breakdown": breakdown,
        "costliest": selectors.sessions_costliest(
            project_ids=ids, since=timezone.now() - timedelta(days=30)
        ),
        "flagged": flagged,
        "flagged_total": flagged_total,
        "unpriced": (selectors.models_unpriced(project_ids=ids) if request.user.is_staff else []),
        "figures": _figures(
            daily=charts.daily_cost_by_model(breakdown),
            step_types=charts.cost_by_step_type(breakdown),
            kinds=charts.tokens_by_kind(breakdown),
        ),
    }
    return render(request, "costboard/overview.html", context)


def _session_filters(params: QueryDict) -> selectors.SessionFilters:
    sort = params.get("sort", "-last_active")
    if sort.lstrip("-") not in selectors.SESSION_SORTS:
        sort = "-last_active"
    state = params.get("state", "")
    return selectors.SessionFilters(
        state=state if state in selectors.STATE_FILTERS else "",
        model=params.get("model", "").strip(),
        user=params.get("user", "").strip(),
        q=params.get("q", "").strip(),
        since=_date(params, "since"),
        until=_date(params, "until"),
        sort=sort,
    )


@login_required
def sessions_list(request: HtmxHttpRequest) -> HttpResponse:
    scope = scope_for(request)
    filters = _session_filters(request.GET)
    sessions = selectors.sessions_filtered(project_ids=scope.project_ids, filters=filters)
    page = Paginator(sessions, PAGE_SIZE).get_page(request.GET.get("page"))
    mix = selectors.model_mix(session_ids=[s.pk for s in page])
    rows = [(s, session_caps(s), mix.get(s.pk, [])) for s in page]
    context = {
        "scope": scope,
        "filters": filters,
        "page": page,
        "rows": rows,
        "states": list(selectors.STATE_FILTERS),
        "live": request.GET.get("live") == "1",
    }
    template = "costboard/sessions.html"
    if request.htmx:
        template += "#table"
    else:
        context["models"] = selectors.models_seen(project_ids=scope.project_ids)
    return render(request, template, context)


CSV_COLUMNS = [
    "project",
    "session_id",
    "user_id",
    "state",
    "runaway",
    "tokens_used",
    "token_cap",
    "cost_usd",
    "cost_cap_usd",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "turns",
    "steps",
    "errors",
    "started_at",
    "last_active_at",
    "ended_at",
]


# Read as tuples, not Session instances: building models (and decoding their JSON metadata)
# was half the time of a large export.
CSV_FIELDS = (
    "project_id",
    "external_id",
    "user_id",
    "state",
    "runaway_at",
    "input_tokens",
    "output_tokens",
    "token_cap",
    "cost_usd",
    "cost_cap_usd",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "turn_count",
    "step_count",
    "error_count",
    "started_at",
    "last_active_at",
    "ended_at",
)
CSV_CHUNK_ROWS = 500  # rows per chunk sent: one chunk per row costs more than the rows


def _csv_rows(sessions: QuerySet[Session], projects: dict[int, Project]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    rows = sessions.values_list(*CSV_FIELDS).iterator(chunk_size=2000)
    for count, row in enumerate(rows, start=1):
        (
            project_id,
            external_id,
            user_id,
            state,
            runaway_at,
            input_tokens,
            output_tokens,
            token_cap,
            cost_usd,
            cost_cap_usd,
            cache_read,
            cache_write,
            turns,
            steps,
            errors,
            started_at,
            last_active_at,
            ended_at,
        ) = row
        project = projects[project_id]
        caps = caps_for(
            project=project,
            token_cap=token_cap,
            cost_cap_usd=cost_cap_usd,
            system=external_id == SYSTEM_SESSION_ID,
        )
        writer.writerow(
            [
                project.slug,
                external_id,
                user_id,
                state,
                runaway_at is not None,
                input_tokens + output_tokens,
                caps.token_cap,
                usd(cost_usd),
                usd(caps.cost_cap_usd),
                input_tokens,
                output_tokens,
                cache_read,
                cache_write,
                turns,
                steps,
                errors,
                started_at.isoformat(),
                last_active_at.isoformat(),
                ended_at.isoformat() if ended_at else "",
            ]
        )
        if count % CSV_CHUNK_ROWS == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


@login_required
def sessions_csv(request: HttpRequest) -> StreamingHttpResponse:
    scope = scope_for(request)
    sessions = selectors.sessions_filtered(
        project_ids=scope.project_ids, filters=_session_filters(request.GET)
    )
    projects = {p.pk: p for p in scope.projects}
    response = StreamingHttpResponse(_csv_rows(sessions, projects), content_type="text/csv")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="sessions-{stamp}.csv"'
    return response


def _session_in_scope(scope: Scope, pk: int) -> Session:
    session = (
        Session.objects.select_related("project", "parent")
        .filter(pk=pk, project_id__in=scope.project_ids)
        .first()
    )
    if session is None:
        raise Http404("no such session")
    return session


@login_required
def session_page(request: HttpRequest, pk: int) -> HttpResponse:
    scope = scope_for(request)
    session = _session_in_scope(scope, pk)
    caps = session_caps(session)
    detail = selectors.session_detail(session=session)
    context = {
        "scope": scope,
        "session": session,
        "caps": caps,
        "detail": detail,
        "figures": _figures(
            tokens_gauge=charts.gauge(
                title="tokens",
                value=session.tokens_used,
                cap=caps.token_cap,
                warn_at=caps.warn_at_pct,
                usd=False,
            ),
            cost_gauge=charts.gauge(
                title="USD",
                value=session.cost_usd,
                cap=caps.cost_cap_usd,
                warn_at=caps.warn_at_pct,
                usd=True,
            ),
            cumulative=charts.cumulative_tokens(
                detail.cumulative, cap=caps.token_cap, warn_at=caps.warn_at_pct
            ),
            per_turn=charts.cost_per_turn(detail.cost_by_turn),
        ),
    }
    return render(request, "costboard/session.html", context)


@login_required
def steps_page(request: HtmxHttpRequest) -> HttpResponse:
    scope = scope_for(request)
    today = timezone.now().date()
    since = _date(request.GET, "since") or today - timedelta(days=29)
    until = _date(request.GET, "until") or today
    model = request.GET.get("model", "").strip()
    step_type = request.GET.get("step_type", "").strip()
    ids = scope.project_ids
    rows = selectors.steps_by_type_and_model(
        project_ids=ids, since=since, until=until, model=model, step_type=step_type
    )
    latency = selectors.latency_by_step_type(
        project_ids=ids, since=since, until=until, step_type=step_type
    )
    turn_costs = selectors.turn_cost_distribution(project_ids=ids, since=since, until=until)
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
        "model": model,
        "step_type": step_type,
        "models": selectors.models_seen(project_ids=ids),
        "figures": _figures(
            latency=charts.latency(latency), turn_costs=charts.turn_cost_histogram(turn_costs)
        ),
    }
    template = "costboard/steps.html"
    if request.htmx:
        template += "#results"
    return render(request, template, context)
