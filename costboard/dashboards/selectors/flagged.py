"""Flagged sessions: near cap, exhausted, runaway or held by a stop-budget. The overview's
short list, /flagged/'s list and counts, and which caps are behind a flag (a flagged row's
and the session page's banner)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Case, Count, DateTimeField, F, IntegerField, Q, QuerySet, Value, When
from django.db.models.functions import Coalesce, Greatest

from costboard.budgets.caps import Caps
from costboard.budgets.holds import held, held_by, held_since
from costboard.models import PeriodBudget, Session

FLAGGED = Q(state__in=[Session.State.WARNING, Session.State.EXHAUSTED]) | Q(
    runaway_at__isnull=False
)


def sessions_flagged(
    *, project_ids: list[int], limit: int = 12, stops: Sequence[PeriodBudget] = ()
) -> tuple[list[Session], int]:
    """The overview's short list: the first `limit` of /flagged/'s list (open near-cap,
    exhausted, runaway and budget-held sessions not acknowledged since, the most urgent
    first: sessions_flagged_list, each annotated `held_by_budget`) and how many that list
    has, so the two agree (two queries)."""
    flagged = sessions_flagged_list(project_ids=project_ids, stops=stops)
    return list(flagged[:limit]), flagged.count()


# --- flagged sessions page ------------------------------------------------------------------

# Each flagged session under its most urgent kind, so the kinds' counts add up to the list.
FLAG_KINDS: dict[str, Q] = {
    "runaway": Q(runaway_at__isnull=False),
    "exhausted": Q(runaway_at__isnull=True, state=Session.State.EXHAUSTED),
    "warning": Q(runaway_at__isnull=True, state=Session.State.WARNING),
}
# Session.acknowledged negated: never acknowledged, or flagged again since.
UNACKNOWLEDGED = (
    Q(acknowledged_at__isnull=True)
    | Q(runaway_at__gt=F("acknowledged_at"))
    | Q(exhausted_at__gt=F("acknowledged_at"))
    | Q(warned_at__gt=F("acknowledged_at"))
)
_NEVER = Value(datetime(1970, 1, 1, tzinfo=UTC), output_field=DateTimeField())


def unacknowledged(stops: Sequence[PeriodBudget]) -> Q:
    """UNACKNOWLEDGED, and a session a stop-budget began holding after it was acknowledged:
    the hold is a flag of its own (docs/budgets.md, "Stopped by a budget"), which leaves no
    time on the session."""
    return UNACKNOWLEDGED | held_since(stops, "acknowledged_at") if stops else UNACKNOWLEDGED


def _flagged_open(project_ids: list[int], stops: Sequence[PeriodBudget] = ()) -> QuerySet[Session]:
    # FLAGGED is session_flagged_recent's condition: only the (few) flagged rows are read.
    # A stop-budget in force adds the sessions it holds (docs/budgets.md, "Stopped by a budget").
    flagged = FLAGGED | held(stops) if stops else FLAGGED
    return Session.objects.filter(flagged, project_id__in=project_ids, ended_at__isnull=True)


def flag_kinds(stops: Sequence[PeriodBudget]) -> dict[str, Q]:
    """FLAG_KINDS with the sessions `stops` hold counted as exhausted, as their agents are told."""
    if not stops:
        return FLAG_KINDS
    hold = held(stops)
    return {
        "runaway": FLAG_KINDS["runaway"],
        "exhausted": FLAG_KINDS["exhausted"] | (Q(runaway_at__isnull=True) & hold),
        "warning": FLAG_KINDS["warning"] & ~hold,
    }


def sessions_flagged_list(
    *,
    project_ids: list[int],
    kind: str = "",
    acknowledged: bool = False,
    stops: Sequence[PeriodBudget] = (),
) -> QuerySet[Session]:
    """The flagged page: open near-cap, exhausted (or held by a stop-budget) and runaway
    sessions, runaway first, then exhausted, then near cap, each the newest flag first.
    Acknowledged ones (nothing flagged since) only with `acknowledged`; `kind` keeps one of
    FLAG_KINDS. Each is annotated `held_by_budget`: the stop-budget holding it, or None."""
    sessions = _flagged_open(project_ids, stops)
    if not acknowledged:
        sessions = sessions.filter(unacknowledged(stops))
    kinds = flag_kinds(stops)
    if kind in kinds:
        sessions = sessions.filter(kinds[kind])
    urgency = Case(
        When(runaway_at__isnull=False, then=Value(0)),
        When(state=Session.State.EXHAUSTED, then=Value(1)),
        When(held(stops), then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    # Greatest is NULL on SQLite if any argument is: a missing flag counts as long ago.
    latest_flag = Greatest(
        Coalesce("runaway_at", _NEVER),
        Coalesce("exhausted_at", _NEVER),
        Coalesce("warned_at", _NEVER),
    )
    return (
        sessions.select_related("project")
        .alias(urgency=urgency, latest_flag=latest_flag)
        .annotate(held_by_budget=held_by(stops))
        .order_by("urgency", "-latest_flag", "-last_active_at", "-id")
    )


@dataclass(frozen=True)
class FlaggedCounts:
    runaway: int
    exhausted: int
    warning: int
    acknowledged: int  # of all open flagged sessions, shown or not

    @property
    def total(self) -> int:
        return self.runaway + self.exhausted + self.warning


def sessions_flagged_counts(
    *, project_ids: list[int], acknowledged: bool = False, stops: Sequence[PeriodBudget] = ()
) -> FlaggedCounts:
    """How many sessions the flagged page lists per kind, and how many are acknowledged (one
    query)."""
    open_flags = unacknowledged(stops)
    listed = Q() if acknowledged else open_flags
    counts = _flagged_open(project_ids, stops).aggregate(
        **{name: Count("pk", filter=kind & listed) for name, kind in flag_kinds(stops).items()},
        acknowledged=Count("pk", filter=~open_flags),
    )
    return FlaggedCounts(**{name: value or 0 for name, value in counts.items()})


@dataclass(frozen=True)
class CapUse:
    """How much of one cap a session has used."""

    name: str  # "tokens" or "USD"
    used: int | Decimal
    cap: int | Decimal

    @property
    def fraction(self) -> Decimal:
        if not self.cap:
            return Decimal(1 if self.used else 0)
        return Decimal(self.used) / Decimal(self.cap)

    @property
    def percent(self) -> int:
        """Whole percent, rounded down: 99.9 % used is not yet the cap."""
        return int(self.fraction * 100)

    @property
    def reached(self) -> bool:
        return self.used >= self.cap


def session_cap_uses(session: Session, caps: Caps) -> list[CapUse]:
    """Its use of each cap, the fullest first."""
    uses = [
        CapUse("tokens", session.tokens_used, caps.token_cap),
        CapUse("USD", session.cost_usd, caps.cost_cap_usd),
    ]
    return sorted(uses, key=lambda use: -use.fraction)


def session_cap_reasons(session: Session, caps: Caps) -> list[CapUse]:
    """The caps behind its state: those reached when exhausted, those past the warning level
    when near cap (else the fullest: the caps changed since); none when ok, nor when a
    runaway, not a cap, holds it at exhausted."""
    if session.state == Session.State.OK:
        return []
    uses = session_cap_uses(session, caps)
    if session.state == Session.State.EXHAUSTED:
        crossed = [use for use in uses if use.reached]
        if not crossed and session.runaway:
            return []
    else:
        crossed = [use for use in uses if use.used >= caps.warn_at_pct * use.cap]
    return crossed or uses[:1]
