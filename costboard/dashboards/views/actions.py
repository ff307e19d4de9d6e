"""What a person does to a flagged session, from /flagged/ or the session page's banner: raise
its caps, acknowledge it. Each answers with the row (or banner) for htmx, else a redirect back."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from costboard.budgets import services
from costboard.budgets.caps import session_caps
from costboard.dashboards.forms import RaiseCapForm
from costboard.dashboards.scope import Scope, scope_for
from costboard.dashboards.selectors.session import (
    session_budget_events,
    session_cumulative_tokens,
)
from costboard.dashboards.views.flagged import (
    can_act_on_sessions,
    flag_counts,
    flag_row,
    flagged_render,
)
from costboard.dashboards.views.session import (
    budget_figures,
    session_in_scope,
    session_render,
    stop_holding,
)
from costboard.dashboards.views.shared import HtmxHttpRequest
from costboard.models import Session


def _acting_on(request: HttpRequest, pk: int) -> tuple[Scope, Session]:
    """The session an action is for: 403 without the right to act, 404 outside the scope."""
    if not can_act_on_sessions(request.user):
        raise PermissionDenied("Raising caps and acknowledging need the change session right.")
    scope = scope_for(request)
    return scope, session_in_scope(scope, pk)


def _acted(
    request: HtmxHttpRequest,
    scope: Scope,
    pk: int,
    *,
    form: RaiseCapForm | None = None,
) -> HttpResponse:
    """After an action: its row (or the session page's banner) for htmx, a redirect back for a
    plain form; with the form's errors (422) when it was refused."""
    session = session_in_scope(scope, pk)
    on_session_page = request.POST.get("render") == "banner"
    status = 422 if form is not None else 200
    if request.htmx:
        caps = session_caps(session)
        row = flag_row(session, caps, user=request.user, form=form, held=stop_holding(session))
        if on_session_page:
            context = {
                "scope": scope,
                "session": session,
                "caps": caps,
                "flag": row,
                "events": session_budget_events(session=session),
                # its dials and cumulative chart, drawn against the caps now
                "budget_figures": budget_figures(
                    session, caps, session_cumulative_tokens(session=session)
                ),
            }
            return render(request, "costboard/_session_flag.html", context, status=status)
        # the row, and the list's counts out of band: an acknowledged session leaves "All"
        context = {"scope": scope, "row": row, "oob": True, **flag_counts(request, scope)}
        return render(request, "costboard/_flagged_row_acted.html", context, status=status)
    if form is not None:
        if on_session_page:
            return session_render(request, scope, session, form=form, status=422)
        return flagged_render(request, scope, form=form, form_session=pk, status=422)
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
