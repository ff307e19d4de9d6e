"""The sessions list and its CSV: the filters, sorts and states they take, the rows with the
stop-budget holding each, their model mix, and the total counted from the tallies."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from django.db.models import F, Q, QuerySet, Sum
from django.db.models.lookups import Exact

from costboard.budgets.caps import Caps, stop_verdict
from costboard.budgets.holds import held, held_by
from costboard.dashboards.selectors.flagged import FLAGGED
from costboard.dashboards.selectors.shared import FamilyTally, FamilyUsage, day_start
from costboard.models import DailyRollup, IngestTally, PeriodBudget, Session, SessionModelUsage
from costboard.tag_values import TagValue

SESSION_SORTS = {
    "last_active": "last_active_at",
    "started": "started_at",
    "cost": "cost_usd",
    "tokens": "tokens_total",
    "turns": "turn_count",
    "steps": "step_count",
    "session": "external_id",
}
STATE_FILTERS = {
    "ok": Q(state=Session.State.OK, runaway_at__isnull=True),
    "warning": Q(state=Session.State.WARNING),
    "exhausted": Q(state=Session.State.EXHAUSTED),
    "runaway": Q(runaway_at__isnull=False),
    "flagged": FLAGGED,
    # what a stop-budget in force stops (its stopped_by is "budget:<id>"): state_filter
    "stopped": Q(pk__in=[]),
}


def state_filter(state: str, stops: Sequence[PeriodBudget]) -> Q:
    """A state filter of the sessions list, with the sessions `stops` hold in the state their
    agents are told: exhausted (and flagged), no longer ok or near cap; `stopped` keeps those a
    budget stops (not exhausted by their own caps)."""
    if not stops:
        return STATE_FILTERS[state]
    hold = held(stops)
    own = Q(state=Session.State.EXHAUSTED)
    return {
        "ok": STATE_FILTERS["ok"] & ~hold,
        "warning": STATE_FILTERS["warning"] & ~hold,
        "exhausted": own | hold,
        "flagged": FLAGGED | hold,
        "stopped": hold & ~own,
    }.get(state, STATE_FILTERS[state])


@dataclass(frozen=True)
class SessionStop:
    """A session's state as its agent is told it (costboard/budgets/caps.py, stop_verdict) and
    the stop-budget that stops it, when that is what does."""

    state: str
    stopped_by: str | None  # "session", "runaway", "budget:<id>" or None
    budget: PeriodBudget | None


def session_stop(session: Session, caps: Caps, budget: PeriodBudget | None) -> SessionStop:
    """`session`'s SessionStop, `budget` the stop-budget holding it (holds.session_held_by)."""
    state, stopped_by = stop_verdict(
        state=session.state,
        runaway=session.runaway,
        tokens_used=session.tokens_used,
        cost_usd=session.cost_usd,
        caps=caps,
        stopped_by_budget=budget.pk if budget is not None else None,
    )
    by_budget = stopped_by is not None and stopped_by.startswith("budget:")
    return SessionStop(state=state, stopped_by=stopped_by, budget=budget if by_budget else None)


def listed_stop(session: Session, caps: Caps, stops: Mapping[int, PeriodBudget]) -> SessionStop:
    """session_stop of a session read for a list, annotated `held_by_budget` (holds.held_by):
    its holding budget found among `stops`, the stop-budgets in force by id."""
    held = stops.get(session.held_by_budget)  # type: ignore[attr-defined]
    return session_stop(session, caps, held)


@dataclass(frozen=True)
class SessionFilters:
    state: str = ""
    model: str = ""  # a family (or an exact name: links from before families still work)
    exact: str = ""  # an exact model name
    user: str = ""  # the start of a user_id: the list's search box
    user_id: str = ""  # one user_id exactly: the links to a user's sessions (/users/)
    tag: str = ""  # key=value: sessions with that tag
    q: str = ""
    since: date | None = None
    until: date | None = None
    sort: str = "-last_active"

    @property
    def sort_key(self) -> str:
        return self.sort.lstrip("-")

    @property
    def everything(self) -> bool:
        """No filter and no period: every session of the projects, in some order."""
        return not any(
            (
                self.state,
                self.model,
                self.exact,
                self.user,
                self.user_id,
                self.tag,
                self.q,
                self.since,
                self.until,
            )
        )

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")


def sessions_filtered(
    *, project_ids: list[int], filters: SessionFilters, stops: Sequence[PeriodBudget] = ()
) -> QuerySet[Session]:
    """The sessions list's rows, each annotated `held_by_budget`: the id of the first of
    `stops` (the projects' stop-budgets in force, holds.stops_in_force) holding it, or None."""
    sessions = Session.objects.filter(project_id__in=project_ids)
    if filters.state in STATE_FILTERS:
        sessions = sessions.filter(state_filter(filters.state, stops))
    if filters.exact:  # an exact name (within the family `model`, if given)
        usage = SessionModelUsage.objects.filter(model=filters.exact)
        if filters.model:
            usage = usage.filter(Q(family=filters.model) | Q(model=filters.model))
        sessions = sessions.filter(pk__in=usage.values("session_id"))
    elif filters.model and _is_family(project_ids, filters.model):
        # a test on each row of the period: no join of the model mix, whatever its history
        sessions = sessions.filter(families__has_key=filters.model)
    elif filters.model:  # an exact name, as links had it before families
        usage = SessionModelUsage.objects.filter(model=filters.model)
        sessions = sessions.filter(pk__in=usage.values("session_id"))
    if filters.user:  # a prefix: "acme-" finds acme-1, acme-2…
        sessions = sessions.filter(user_id__startswith=filters.user)
    if filters.user_id:  # exactly: bob's sessions, not bobby's
        sessions = sessions.filter(user_id=filters.user_id)
    if filters.tag:
        key, _, value = filters.tag.partition("=")
        # a key transform built by name (not a lookup path: a key may hold "__"), compared as
        # text: `tag_value=` takes JSON equality, which on SQLite reads the value as JSON
        sessions = sessions.annotate(tag_value=TagValue(key)).filter(Exact(F("tag_value"), value))
    if filters.q:
        sessions = sessions.filter(external_id__icontains=filters.q)
    if filters.since:
        sessions = sessions.filter(last_active_at__gte=day_start(filters.since))
    if filters.until:
        sessions = sessions.filter(last_active_at__lt=day_start(filters.until) + timedelta(days=1))
    column = SESSION_SORTS.get(filters.sort_key, "last_active_at")
    if column == "tokens_total":
        sessions = sessions.alias(tokens_total=F("input_tokens") + F("output_tokens"))
    order = f"-{column}" if filters.descending else column
    sessions = sessions.annotate(held_by_budget=held_by(stops))
    return sessions.select_related("project").order_by(order, "-id" if filters.descending else "id")


def sessions_total(*, project_ids: list[int]) -> int:
    """How many sessions the projects have, from their tallies: the sessions ingest made less
    those deleted (a few hundred rows over a year, where counting the sessions themselves
    reads every one of them)."""
    total = IngestTally.objects.filter(project_id__in=project_ids).aggregate(
        n=Sum(F("sessions_made") - F("sessions_deleted"))
    )["n"]
    return int(total or 0)


def _is_family(project_ids: list[int], name: str) -> bool:
    """Whether the projects' steps have a family of this name (else it is an exact name)."""
    return DailyRollup.objects.filter(project_id__in=project_ids, family=name).exists()


def model_mix(*, session_ids: Iterable[int]) -> dict[int, list[FamilyUsage]]:
    """Each session's model families with their exact names, costliest first (one query for
    a page of sessions)."""
    tallies: dict[int, FamilyTally] = defaultdict(FamilyTally)
    rows = SessionModelUsage.objects.filter(session_id__in=list(session_ids)).values_list(
        "session_id", "family", "model", "calls", "cost_usd"
    )
    for session_id, family, model, calls, cost in rows:
        tallies[session_id].add(family, model, calls, cost)
    return {session_id: tally.ordered() for session_id, tally in tallies.items()}
