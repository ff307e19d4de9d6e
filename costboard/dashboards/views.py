"""Server-rendered pages (docs/pages.md): login required, scoped to the projects a user may
see, filters in the URL, htmx swapping only the part that changes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    HttpResponseRedirect,
    QueryDict,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_date
from django.views.decorators.http import require_POST
from django_htmx.middleware import HtmxDetails

from costboard.budgets import services
from costboard.budgets.caps import Caps, session_caps
from costboard.budgets.holds import session_held_by, stops_in_force
from costboard.dashboards import charts
from costboard.dashboards.csv import sessions_csv_chunks, users_csv_text
from costboard.dashboards.forms import RaiseCapForm, suggested_caps
from costboard.dashboards.pagination import KeyedPaginator
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import Scope, scope_for
from costboard.dashboards.selectors.budgets import (
    budget_detail,
    budget_in_scope,
    budgets_current,
    budgets_stopped_counts,
)
from costboard.dashboards.selectors.flagged import (
    FLAG_KINDS,
    CapUse,
    session_cap_reasons,
    session_cap_uses,
    sessions_flagged,
    sessions_flagged_counts,
    sessions_flagged_list,
)
from costboard.dashboards.selectors.overview import (
    models_unpriced,
    sessions_costliest,
    spend_by_period,
    usage_breakdown,
)
from costboard.dashboards.selectors.session import session_budget_events, session_detail
from costboard.dashboards.selectors.sessions import (
    SESSION_SORTS,
    STATE_FILTERS,
    SessionFilters,
    SessionStop,
    model_mix,
    session_stop,
    sessions_filtered,
    sessions_total,
)
from costboard.dashboards.selectors.shared import ZERO
from costboard.dashboards.selectors.steps import (
    StepFilter,
    StepNames,
    latency_by_step_type,
    step_names,
    steps_by_type_and_model,
    turn_cost_distribution,
)
from costboard.dashboards.selectors.tags import spend_by_tag, tag_keys
from costboard.dashboards.selectors.users import USER_SORTS, users_spend
from costboard.ingest.schemas import FIRST_YEAR, LAST_YEAR
from costboard.models import PeriodBudget, Session

PAGE_SIZE = 50


class HtmxHttpRequest(HttpRequest):
    """A request through django-htmx's middleware (as its docs type it)."""

    htmx: HtmxDetails


def _figures(**figures: dict[str, Any]) -> dict[str, Any]:
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


def _period(params: QueryDict) -> Period:
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


def _stops(project_ids: list[int]) -> list[PeriodBudget]:
    """The projects' stop-budgets in force now: the sessions they hold show as stopped
    (docs/budgets.md, "Stopped by a budget")."""
    return stops_in_force(project_ids=project_ids, now=timezone.now())


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    ids = scope.project_ids
    today = timezone.now().date()
    since = _period_start(today)
    breakdown = usage_breakdown(project_ids=ids, since=since, until=today)
    flagged, flagged_total = sessions_flagged(project_ids=ids, stops=_stops(ids))
    context = {
        "scope": scope,
        "spend": spend_by_period(project_ids=ids, today=today),
        "breakdown": breakdown,
        "costliest": sessions_costliest(project_ids=ids, since=timezone.now() - timedelta(days=30)),
        "flagged": flagged,
        "flagged_total": flagged_total,
        "budgets": budgets_current(project_ids=ids, now=timezone.now()),
        **_tag_breakdown(checks, ids, since, today),
        "unpriced": (models_unpriced(project_ids=ids) if request.user.is_staff else []),
        "figures": _figures(
            daily=charts.daily_cost_by_model(breakdown),
            step_types=charts.cost_by_step_type(breakdown),
            kinds=charts.tokens_by_kind(breakdown),
        ),
        "filter_errors": checks.errors,
    }
    return render(request, "costboard/overview.html", context, status=checks.status)


def _tag_breakdown(
    checks: Checks,
    ids: list[int],
    since: date,
    until: date,
    steps: StepFilter = StepFilter(),  # noqa: B008 (frozen)
) -> dict[str, Any]:
    """The tag keys of the period and the spend per value of the one asked for
    (`?tag_key=`), else the first; of the steps `steps` keeps."""
    keys = tag_keys(project_ids=ids, since=since, until=until)
    key = checks.choice("tag_key", keys, what="a tag key of this period", blank="the first")
    key = key or (keys[0] if keys else "")
    rows = (
        spend_by_tag(project_ids=ids, since=since, until=until, key=key, steps=steps) if key else []
    )
    return {"tag_keys": keys, "tag_key": key, "tag_rows": rows}


def _models(checks: Checks, names: StepNames) -> tuple[str, str]:
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


def _period_start(until: date | None) -> date:
    """The first day of the PERIOD_DAYS that end at `until` (today if none, or later)."""
    today = timezone.now().date()
    return min(today, until or today) - timedelta(days=PERIOD_DAYS - 1)


def _session_filters(
    checks: Checks, project_ids: list[int], names: StepNames | None = None
) -> SessionFilters:
    """The sessions list's filters (its CSV's too), each checked; the model names are read
    (`names`, unless given) only when a model filter is."""
    params = checks.params
    period = _period(params)
    checks.named(period.errors)
    since = period.since
    if "since" not in params:  # given empty (the date cleared, the "All time" link): all time
        since = _period_start(period.until)
    sort = checks.sort("sort", SESSION_SORTS, default="-last_active")
    state = checks.choice("state", STATE_FILTERS, what="a session state", blank="any state")
    model = exact = ""
    if checks.get("model").strip() or checks.get("exact").strip():
        model, exact = _models(checks, names or step_names(project_ids=project_ids))
    return SessionFilters(
        state=state,
        model=model,
        exact=exact,
        user=checks.get("user").strip(),
        tag=checks.tag("tag"),
        q=checks.get("q").strip(),
        since=since,
        until=period.until,
        sort=sort,
    )


@login_required
def sessions_list(request: HtmxHttpRequest) -> HttpResponse:
    scope = scope_for(request)
    checks = Checks(request.GET)
    # the model filter's choices (the full page's), which also check a model asked for
    names = None if request.htmx else step_names(project_ids=scope.project_ids)
    filters = _session_filters(checks, scope.project_ids, names)
    live = checks.switch("live", meaning="refresh the list every 10 seconds")
    stops = _stops(scope.project_ids)
    sessions = sessions_filtered(project_ids=scope.project_ids, filters=filters, stops=stops)
    # All of them (the "All time" link): counted from the projects' tallies, not row by row
    total = sessions_total(project_ids=scope.project_ids) if filters.everything else None
    page = checks.page(KeyedPaginator(sessions, PAGE_SIZE, count=total))
    mix = model_mix(session_ids=[s.pk for s in page])
    by_id = {b.pk: b for b in stops}
    rows = []
    for s in page:
        caps = session_caps(s)
        stop = session_stop(s, caps, by_id.get(s.held_by_budget))  # type: ignore[attr-defined]
        rows.append((s, caps, mix.get(s.pk, []), stop))
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


def _csv_refused(request: HttpRequest, checks: Checks, page: str) -> HttpResponse:
    """A CSV asked for with a bad filter: no file, but the 422 page naming each bad parameter
    and linking to the list with the same filters, where the form shows them."""
    context = {
        "filter_errors": checks.errors,
        "without": reverse(page) + (f"?{request.GET.urlencode()}" if request.GET else ""),
        "refused_download": True,
    }
    return render(request, "costboard/bad_query.html", context, status=422)


@login_required
def sessions_csv(request: HttpRequest) -> HttpResponseBase:
    scope = scope_for(request)
    checks = Checks(request.GET)
    filters = _session_filters(checks, scope.project_ids)
    if checks.errors:
        return _csv_refused(request, checks, "sessions")
    stops = _stops(scope.project_ids)
    sessions = sessions_filtered(project_ids=scope.project_ids, filters=filters, stops=stops)
    projects = {p.pk: p for p in scope.projects}
    by_id = {b.pk: b for b in stops}
    response = StreamingHttpResponse(
        sessions_csv_chunks(sessions, projects, by_id), content_type="text/csv"
    )
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


def _held(session: Session) -> PeriodBudget | None:
    """The stop-budget holding `session` now, if one does (the API's rule)."""
    return session_held_by(session, _stops([session.project_id]))


@login_required
def session_page(request: HttpRequest, pk: int) -> HttpResponse:
    scope = scope_for(request)
    return _session_render(request, scope, _session_in_scope(scope, pk))


def _session_render(
    request: HttpRequest,
    scope: Scope,
    session: Session,
    *,
    form: RaiseCapForm | None = None,
    status: int = 200,
) -> HttpResponse:
    caps = session_caps(session)
    detail = session_detail(session=session)
    context = {
        "scope": scope,
        "session": session,
        "caps": caps,
        "detail": detail,
        "events": detail.events,
        "flag": _flag_row(session, caps, user=request.user, form=form, held=_held(session)),
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
    return render(request, "costboard/session.html", context, status=status)


@login_required
def steps_page(request: HtmxHttpRequest) -> HttpResponse:
    """The steps of a period by step type and model; the table, its charts and the tag
    breakdown all of the steps the filters keep."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    today = timezone.now().date()
    period = _period(request.GET)
    checks.named(period.errors)
    since = period.since or _period_start(period.until)
    until = period.until or today
    ids = scope.project_ids
    names = step_names(project_ids=ids)
    model, exact = _models(checks, names)
    step_type = checks.choice(
        "step_type",
        names.step_types,
        what="a step type of these projects' steps",
        blank="every step type",
    )
    steps = StepFilter(model=model, exact=exact, step_type=step_type)
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
        "models": names.families,
        "step_types": names.step_types,
        **_tag_breakdown(checks, ids, since, until, steps),
        "figures": _figures(
            latency=charts.latency(latency), turn_costs=charts.turn_cost_histogram(turn_costs)
        ),
        "filter_errors": checks.errors,
    }
    template = "costboard/steps.html"
    if request.htmx:
        template += "#results"
    return render(request, template, context, status=checks.status)


# --- end users --------------------------------------------------------------------------------


@login_required
def users_csv(request: HttpRequest) -> HttpResponse:
    """/users/'s rows as CSV, for the same period and order."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    since, until, sort = _users_period(checks)
    if checks.errors:
        return _csv_refused(request, checks, "users")
    rows = users_spend(project_ids=scope.project_ids, since=since, until=until, sort=sort)
    response = HttpResponse(users_csv_text(rows), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="users-{since}-{until}.csv"'
    return response


def _users_period(checks: Checks) -> tuple[date, date, str]:
    today = timezone.now().date()
    period = _period(checks.params)
    checks.named(period.errors)
    since = period.since or _period_start(period.until)
    until = period.until or today
    sort = checks.sort("sort", USER_SORTS, default="-cost")
    return since, until, sort


@login_required
def users_page(request: HttpRequest) -> HttpResponse:
    """Spend, tokens, sessions and steps per end user over a period, sortable; each user
    linked to their sessions."""
    scope = scope_for(request)
    checks = Checks(request.GET)
    since, until, sort = _users_period(checks)
    rows = users_spend(project_ids=scope.project_ids, since=since, until=until, sort=sort)
    filter_errors = checks.errors
    context = {
        "scope": scope,
        "rows": rows,
        "since": since,
        "until": until,
        "sort": sort,
        "filter_errors": filter_errors,
        "total": sum((r.cost_usd for r in rows), ZERO),
    }
    return render(request, "costboard/users.html", context, status=422 if filter_errors else 200)


# --- period budgets -----------------------------------------------------------------------------


@login_required
def budgets_page(request: HttpRequest) -> HttpResponse:
    """Every period budget of the projects in scope in its current period: its state, spent
    against its limits, its forecast, and how many sessions it stops."""
    scope = scope_for(request)
    now = timezone.now()
    rows = budgets_current(project_ids=scope.project_ids, now=now)
    # each with how many sessions it stops now (None: it stops none now)
    stopped = budgets_stopped_counts(rows=rows, stops=_stops(scope.project_ids))
    context = {"scope": scope, "rows": [(row, stopped.get(row.budget.pk)) for row in rows]}
    return render(request, "costboard/budgets.html", context)


@login_required
def budget_page(request: HttpRequest, pk: int) -> HttpResponse:
    """One period budget: its current period and forecast, its past periods, its crossings
    and the sessions it stops (404 outside the projects in scope)."""
    scope = scope_for(request)
    budget = budget_in_scope(project_ids=scope.project_ids, budget_id=pk)
    if budget is None:
        raise Http404("no such budget")
    detail = budget_detail(budget=budget, stops=_stops([budget.project_id]), now=timezone.now())
    context = {"scope": scope, "budget": budget, "detail": detail, "row": detail.row}
    return render(request, "costboard/budget.html", context)


# --- flagged sessions -----------------------------------------------------------------------


def can_act_on_sessions(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Raising caps and acknowledging: staff, or whoever may change sessions in the admin."""
    if getattr(user, "is_staff", False):
        return True
    return isinstance(user, PermissionsMixin) and user.has_perm("costboard.change_session")


@dataclass(frozen=True)
class FlagRow:
    """A flagged session as its row (and the session page's banner) shows it."""

    session: Session
    caps: Caps
    reasons: list[CapUse]
    uses: list[CapUse]
    form: RaiseCapForm
    can_act: bool
    stop: SessionStop  # its state as its agent is told it, and a budget that stops it

    @property
    def resolved(self) -> bool:
        return self.stop.state == Session.State.OK and not self.session.runaway

    @property
    def held(self) -> bool:
        """Exhausted by a runaway, not by a cap: acknowledging lets it go on."""
        return self.session.state == Session.State.EXHAUSTED and not self.reasons


def _flag_row(
    session: Session,
    caps: Caps,
    *,
    user: AbstractBaseUser | AnonymousUser,
    can_act: bool | None = None,
    form: RaiseCapForm | None = None,
    held: PeriodBudget | None = None,
) -> FlagRow:
    return FlagRow(
        session=session,
        caps=caps,
        reasons=session_cap_reasons(session, caps),
        uses=session_cap_uses(session, caps),
        form=form or RaiseCapForm(caps=caps, initial=suggested_caps(session, caps)),
        can_act=can_act_on_sessions(user) if can_act is None else can_act,
        stop=session_stop(session, caps, held),
    )


@login_required
def flagged_page(request: HtmxHttpRequest) -> HttpResponse:
    return _flagged_render(request, scope_for(request))


def _flagged_render(
    request: HtmxHttpRequest,
    scope: Scope,
    *,
    form: RaiseCapForm | None = None,
    form_session: int | None = None,
    status: int = 200,
) -> HttpResponse:
    stops = _stops(scope.project_ids)
    checks = Checks(request.GET)
    counts_context = _flag_counts(request, scope, stops, checks)
    acknowledged, kind = counts_context["acknowledged"], counts_context["kind"]
    ids = scope.project_ids
    sessions = sessions_flagged_list(
        project_ids=ids, kind=kind, acknowledged=acknowledged, stops=stops
    )
    page = checks.page(Paginator(sessions, PAGE_SIZE))
    can_act = can_act_on_sessions(request.user)
    by_id = {b.pk: b for b in stops}
    rows = [
        _flag_row(
            s,
            session_caps(s),
            user=request.user,
            can_act=can_act,
            form=form if s.pk == form_session else None,
            held=by_id.get(s.held_by_budget),  # type: ignore[attr-defined]
        )
        for s in page
    ]
    context = {
        "scope": scope,
        "page": page,
        "rows": rows,
        **counts_context,
        "can_act": can_act,
        "filter_errors": checks.errors,
    }
    template = "costboard/flagged.html"
    if request.htmx and request.method == "GET":
        template += "#list"
    return render(request, template, context, status=max(status, checks.status))


def _flag_counts(
    request: HttpRequest,
    scope: Scope,
    stops: list[PeriodBudget] | None = None,
    checks: Checks | None = None,
) -> dict[str, Any]:
    """/flagged/'s counts by kind, for the list's filters (kind, acknowledged) in the URL,
    checked (`checks` gets what is wrong with them)."""
    checks = checks or Checks(request.GET)
    acknowledged = checks.switch("acknowledged", meaning="show acknowledged sessions too")
    kind = checks.choice("kind", FLAG_KINDS, what="a kind of flag", blank="every flagged session")
    counts = sessions_flagged_counts(
        project_ids=scope.project_ids,
        acknowledged=acknowledged,
        stops=_stops(scope.project_ids) if stops is None else stops,
    )
    return {
        "counts": counts,
        "kinds": [
            ("runaway", "Runaway", counts.runaway),
            ("exhausted", "Exhausted", counts.exhausted),
            ("warning", "Near cap", counts.warning),
        ],
        "kind": kind,
        "acknowledged": acknowledged,
    }


def _acting_on(request: HttpRequest, pk: int) -> tuple[Scope, Session]:
    """The session an action is for: 403 without the right to act, 404 outside the scope."""
    if not can_act_on_sessions(request.user):
        raise PermissionDenied("Raising caps and acknowledging need the change session right.")
    scope = scope_for(request)
    return scope, _session_in_scope(scope, pk)


def _acted(
    request: HtmxHttpRequest,
    scope: Scope,
    pk: int,
    *,
    form: RaiseCapForm | None = None,
) -> HttpResponse:
    """After an action: its row (or the session page's banner) for htmx, a redirect back for a
    plain form; with the form's errors (422) when it was refused."""
    session = _session_in_scope(scope, pk)
    on_session_page = request.POST.get("render") == "banner"
    status = 422 if form is not None else 200
    if request.htmx:
        caps = session_caps(session)
        row = _flag_row(session, caps, user=request.user, form=form, held=_held(session))
        if on_session_page:
            context = {
                "scope": scope,
                "session": session,
                "caps": caps,
                "flag": row,
                "events": session_budget_events(session=session),
            }
            return render(request, "costboard/_session_flag.html", context, status=status)
        # the row, and the list's counts out of band: an acknowledged session leaves "All"
        context = {"scope": scope, "row": row, "oob": True, **_flag_counts(request, scope)}
        return render(request, "costboard/_flagged_row_acted.html", context, status=status)
    if form is not None:
        if on_session_page:
            return _session_render(request, scope, session, form=form, status=422)
        return _flagged_render(request, scope, form=form, form_session=pk, status=422)
    back = reverse("session", args=[pk]) if on_session_page else reverse("flagged")
    query = request.GET.urlencode()
    return HttpResponseRedirect(f"{back}?{query}" if query else back, status=303)


@login_required
@require_POST
def flagged_raise_cap(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Raise a session's token and/or USD cap: its state is recomputed and a cap_changed
    event recorded."""
    scope, session = _acting_on(request, pk)
    form = RaiseCapForm(request.POST, caps=session_caps(session))
    if form.is_valid():
        token_cap, cost_cap = form.cleaned_data["token_cap"], form.cleaned_data["cost_cap_usd"]
        try:
            # checked again under the session's lock: "higher" than what is saved
            services.session_caps_set(
                session_id=session.pk,
                at=timezone.now(),
                token_cap=services.KEEP if token_cap is None else token_cap,
                cost_cap_usd=services.KEEP if cost_cap is None else cost_cap,
                raise_only=True,
            )
        except services.CapError as error:
            form.add_error(error.field, error.message)
    return _acted(request, scope, session.pk, form=None if form.is_valid() else form)


@login_required
@require_POST
def flagged_acknowledge(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A person saw the session's flags: it leaves the default list until flagged again (and
    a runaway held at exhausted may go on)."""
    scope, session = _acting_on(request, pk)
    services.session_acknowledge(
        session_id=session.pk, by=request.user.get_username(), at=timezone.now()
    )
    return _acted(request, scope, session.pk)


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico: what a browser asks for on a page without an icon link; ours (its hashed
    name is known only once the static files are, so it is looked up per request)."""
    response = HttpResponsePermanentRedirect(static("costboard/favicon.svg"))
    response["Cache-Control"] = "public, max-age=86400"
    return response
