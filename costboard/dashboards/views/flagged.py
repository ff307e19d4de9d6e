"""/flagged/: the flagged sessions and their counts by kind, each row with the caps behind
its flag and, for who may act, the raise-cap form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from costboard.budgets.caps import Caps, session_caps
from costboard.dashboards.forms import RaiseCapForm, suggested_caps
from costboard.dashboards.params import Checks
from costboard.dashboards.scope import Scope, scope_for
from costboard.dashboards.selectors.flagged import (
    FLAG_KINDS,
    CapUse,
    session_cap_reasons,
    session_cap_uses,
    sessions_flagged_counts,
    sessions_flagged_list,
)
from costboard.dashboards.selectors.sessions import SessionStop, session_stop
from costboard.dashboards.views.shared import PAGE_SIZE, HtmxHttpRequest, stops_now
from costboard.models import PeriodBudget, Session
from costboard.replicas import replica_reads


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


def flag_row(
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
@replica_reads
def flagged_page(request: HtmxHttpRequest) -> HttpResponse:
    return flagged_render(request, scope_for(request))


def flagged_render(
    request: HtmxHttpRequest,
    scope: Scope,
    *,
    form: RaiseCapForm | None = None,
    form_session: int | None = None,
    status: int = 200,
) -> HttpResponse:
    stops = stops_now(scope.project_ids)
    checks = Checks(request.GET)
    counts_context = flag_counts(request, scope, stops, checks)
    acknowledged, kind = counts_context["acknowledged"], counts_context["kind"]
    ids = scope.project_ids
    sessions = sessions_flagged_list(
        project_ids=ids, kind=kind, acknowledged=acknowledged, stops=stops
    )
    page = checks.page(Paginator(sessions, PAGE_SIZE))
    can_act = can_act_on_sessions(request.user)
    by_id = {b.pk: b for b in stops}
    rows = [
        flag_row(
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


def flag_counts(
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
        stops=stops_now(scope.project_ids) if stops is None else stops,
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
