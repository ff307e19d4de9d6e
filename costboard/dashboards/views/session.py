"""One session's page (/sessions/<pk>/): its turns, charts and budget events, and its flag
banner with the raise-cap form when it is flagged."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from costboard.budgets.caps import Caps, session_caps
from costboard.budgets.holds import session_held_by
from costboard.dashboards import charts
from costboard.dashboards.forms import RaiseCapForm
from costboard.dashboards.scope import Scope, scope_for
from costboard.dashboards.selectors.session import session_detail
from costboard.dashboards.views.flagged import flag_row
from costboard.dashboards.views.shared import figures, stops_now
from costboard.models import PeriodBudget, Session
from costboard.pricing.explain import price_explanations
from costboard.replicas import replica_reads


def session_in_scope(scope: Scope, pk: int) -> Session:
    session = (
        Session.objects.select_related("project", "parent")
        .filter(pk=pk, project_id__in=scope.project_ids)
        .first()
    )
    if session is None:
        raise Http404("no such session")
    return session


def stop_holding(session: Session) -> PeriodBudget | None:
    """The stop-budget holding `session` now, if one does (the API's rule)."""
    return session_held_by(session, stops_now([session.project_id]))


@login_required
@replica_reads
def session_page(request: HttpRequest, pk: int) -> HttpResponse:
    scope = scope_for(request)
    return session_render(request, scope, session_in_scope(scope, pk))


def session_render(
    request: HttpRequest,
    scope: Scope,
    session: Session,
    *,
    form: RaiseCapForm | None = None,
    status: int = 200,
) -> HttpResponse:
    caps = session_caps(session)
    detail = session_detail(session=session)
    shown = [step for view in detail.turns for step in view.steps] + detail.loose_steps
    context = {
        "explanations": price_explanations(shown),
        "scope": scope,
        "session": session,
        "caps": caps,
        "detail": detail,
        "events": detail.events,
        "flag": flag_row(session, caps, user=request.user, form=form, held=stop_holding(session)),
        "budget_figures": budget_figures(session, caps, detail.cumulative),
        "figures": figures(per_turn=charts.cost_per_turn(detail.cost_by_turn)),
    }
    return render(request, "costboard/session.html", context, status=status)


def budget_figures(
    session: Session, caps: Caps, cumulative: list[tuple[datetime, int]]
) -> dict[str, Any]:
    """The session's charts drawn against its caps (its dials and cumulative tokens): the
    page's, and drawn again with the caps a raise set."""
    return figures(
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
            cumulative, cap=caps.token_cap, warn_at=caps.warn_at_pct
        ),
    )
