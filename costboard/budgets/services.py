"""Writes to session budgets outside ingest: a cap changed (admin, raise cap, project or
environment defaults), a repricing, a runaway flagged by the sweep, an acknowledgement.

Each locks its session, asks the budget engine (engine.py) what the change means, applies
the outcome and records its crossings as BudgetEvents — in one transaction, whose commit
hands the alertable ones to alerts. Ingest applies the same engine to a batch in its own
statement (ingest/service.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from django.db import transaction
from django.utils import timezone

from costboard.budgets.alerts import announce, incidents_resolve
from costboard.budgets.caps import Caps, caps_for, environment_caps, session_caps
from costboard.budgets.engine import Crossing, Flag, Ledger, Outcome, budget_decide
from costboard.models import SYSTEM_SESSION_ID, BudgetEvent, EnvironmentCaps, Project, Session
from costboard.outbox import Attempt, outbox_add, outbox_handler

# What a budget change writes of a session: only these, and only here and in ingest.
BUDGET_FIELDS = [
    "state",
    "warned_at",
    "exhausted_at",
    "runaway_at",
    "runaway_reason",
    "acknowledged_at",
]


CAP_PLACES = Decimal("0.0001")  # a USD cap is kept to 4 places
RECHECK = "budgets.recheck"  # outbox kind
PROJECT_CAP_FIELDS = (
    "token_cap",
    "cost_cap_usd",
    "warn_at_pct",
    "system_token_cap",
    "system_cost_cap_usd",
)


class _Keep:
    """A cap left as it is (None means "inherit", so it can't mean "unchanged")."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()


class CapError(ValueError):
    """A refused cap change: the field and what to send instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def budget_events_of(
    crossings: Iterable[Crossing], *, project: Project, session_id: int, caps: Caps
) -> list[BudgetEvent]:
    """The crossings as BudgetEvents (unsaved); a crossing without a detail records the caps
    it crossed."""
    return [
        BudgetEvent(
            project=project,
            session_id=session_id,
            kind=crossing.kind,
            at=crossing.at,
            tokens_used=crossing.tokens_used,
            cost_usd=crossing.cost_usd,
            detail=crossing.detail if crossing.detail is not None else caps.describe(),
        )
        for crossing in crossings
    ]


def _locked(session_id: int) -> Session:
    return (
        Session.objects.select_for_update(of=("self",)).select_related("project").get(pk=session_id)
    )


def _apply(session: Session, outcome: Outcome, caps: Caps, *fields: str) -> list[BudgetEvent]:
    """Write the outcome to the locked session (its budget fields and `fields`), record its
    crossings, and announce them once the transaction commits."""
    ledger = outcome.ledger
    session.state = ledger.state
    session.warned_at = ledger.warned_at
    session.exhausted_at = ledger.exhausted_at
    session.runaway_at = ledger.runaway_at
    session.runaway_reason = ledger.runaway_reason[:200]
    session.acknowledged_at = ledger.acknowledged_at
    session.save(update_fields=[*BUDGET_FIELDS, *fields])
    events = BudgetEvent.objects.bulk_create(
        budget_events_of(
            outcome.crossings, project=session.project, session_id=session.pk, caps=caps
        )
    )
    announce(events)
    return events


def _decide(session: Session, **inputs: Any) -> tuple[Outcome, Caps]:
    """What the engine makes of the locked session with its caps as they are now and
    `inputs` (at, old_limits, flag, acknowledged_at)."""
    caps = session_caps(session)
    outcome = budget_decide(
        ledger=Ledger.of(session),
        limits=caps,
        stops_runaways=session.project.runaway_stops,
        **inputs,
    )
    return outcome, caps


def session_recheck(
    *, session_id: int, at: datetime, old_caps: Caps | None = None
) -> list[BudgetEvent]:
    """Decide a session's state again after its caps or its cost changed outside ingest (a
    project's caps, a repricing). `old_caps`: the caps changed from these."""
    with transaction.atomic():
        session = _locked(session_id)
        outcome, caps = _decide(session, old_limits=old_caps, at=at)
        return _apply(session, outcome, caps)


def session_caps_set(
    *,
    session_id: int,
    at: datetime,
    token_cap: int | _Keep | None = KEEP,
    cost_cap_usd: Decimal | _Keep | None = KEEP,
    raise_only: bool = False,
) -> list[BudgetEvent]:
    """Set a session's own caps (None: inherit the project's) and decide its state, recording
    a cap_changed event when the caps in effect change. `raise_only` refuses a cap that is
    not above the one in effect (CapError), checked under the session's lock."""
    with transaction.atomic():
        session = _locked(session_id)
        old_caps = session_caps(session)
        if raise_only:
            if isinstance(token_cap, int) and token_cap <= old_caps.token_cap:
                raise CapError(
                    "token_cap",
                    f"Token cap: must be higher than the current cap of {old_caps.token_cap:,} "
                    "(this raises it; lower caps in the admin).",
                )
            if isinstance(cost_cap_usd, Decimal) and cost_cap_usd <= old_caps.cost_cap_usd:
                raise CapError(
                    "cost_cap_usd",
                    "USD cap: must be higher than the current cap of "
                    f"${old_caps.cost_cap_usd:,.2f} (this raises it; lower caps in the admin).",
                )
        changed = []
        if not isinstance(token_cap, _Keep):
            session.token_cap = token_cap
            changed.append("token_cap")
        if not isinstance(cost_cap_usd, _Keep):
            # as the column keeps it (4 places), so the event records what is stored
            session.cost_cap_usd = (
                None if cost_cap_usd is None else cost_cap_usd.quantize(CAP_PLACES)
            )
            changed.append("cost_cap_usd")
        outcome, caps = _decide(session, old_limits=old_caps, at=at)
        return _apply(session, outcome, caps, *changed)


def session_acknowledge(*, session_id: int, by: str, at: datetime) -> list[BudgetEvent]:
    """A person saw the session's flags: it leaves the flagged list until flagged again, a
    runaway held at exhausted may go on, and the PagerDuty incident it opened is resolved."""
    with transaction.atomic():
        session = _locked(session_id)
        outcome, caps = _decide(session, acknowledged_at=at, at=at)
        session.acknowledged_by = by[:150]
        events = _apply(session, outcome, caps, "acknowledged_by")
        incidents_resolve(now=at, session_id=session_id)
        return events


def session_flag_runaway(*, session_id: int, flag: Flag) -> BudgetEvent | None:
    """Flag a session as runaway, once: under its lock, a session already flagged records
    nothing (two sweeps racing on it record one event). Returns the runaway event, or None."""
    with transaction.atomic():
        session = _locked(session_id)
        outcome, caps = _decide(session, flag=flag, at=flag.at)
        if not outcome.changed:
            return None
        events = _apply(session, outcome, caps)
        return next(e for e in events if e.kind == BudgetEvent.Kind.RUNAWAY)


def project_caps_set(*, project: Project, changes: dict[str, Any]) -> dict[str, Any] | None:
    """Save a project's edited caps (`changes`: field → new value) and, once committed, have
    its sessions' states decided again. Returns the caps as they were (read under the
    project's lock), or None when no cap changed."""
    unknown = set(changes) - set(PROJECT_CAP_FIELDS)
    if unknown:
        raise ValueError(f"not cap fields: {sorted(unknown)}")
    with transaction.atomic():
        locked = Project.objects.select_for_update().get(pk=project.pk)
        before = {name: getattr(locked, name) for name in PROJECT_CAP_FIELDS}
        if all(before[name] == value for name, value in changes.items()):
            return None
        for name, value in changes.items():
            setattr(locked, name, value)
            setattr(project, name, value)
        locked.save(update_fields=list(changes))
        # JSON for the task: token caps as ints, amounts as decimal strings
        old = {
            name: value if value is None or name.endswith("token_cap") else str(value)
            for name, value in before.items()
        }

        outbox_add(RECHECK, {"project_id": project.pk, "old": old}, project_id=project.pk)
        return before


def project_budgets_recheck(*, project_id: int, old: dict[str, Any], at: datetime) -> int:
    """After a project's caps changed from `old`: decide again the state of each session
    whose caps in effect changed (each under its own lock). Returns how many."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return 0
    old_project = Project(
        token_cap=old.get("token_cap"), system_token_cap=old.get("system_token_cap")
    )
    for name in ("cost_cap_usd", "system_cost_cap_usd", "warn_at_pct"):
        setattr(old_project, name, None if old.get(name) is None else Decimal(old[name]))
    return _sessions_recheck(project, at=at, old_project=old_project)


def _sessions_recheck(
    project: Project,
    *,
    at: datetime,
    old_project: Project | None = None,
    old_env: Caps | None = None,
) -> int:
    """Decide again each session of `project` whose caps in effect differ under its old
    caps (`old_project`) or the environment's old defaults (`old_env`)."""
    changed = 0
    sessions = Session.objects.filter(project=project).values_list(
        "pk", "external_id", "token_cap", "cost_cap_usd"
    )
    for session_id, external_id, token_cap, cost_cap in sessions.iterator(chunk_size=2000):
        system = external_id == SYSTEM_SESSION_ID
        old_caps = caps_for(
            project=old_project or project,
            token_cap=token_cap,
            cost_cap_usd=cost_cap,
            system=system,
            defaults=old_env,
        )
        if old_caps != caps_for(
            project=project, token_cap=token_cap, cost_cap_usd=cost_cap, system=system
        ):
            session_recheck(session_id=session_id, at=at, old_caps=old_caps)
            changed += 1
    return changed


def environment_caps_sync(*, at: datetime) -> int:
    """If the environment's default caps differ from those the sessions were last decided
    with (a restart with new COSTBOARD_SESSION_* values), decide again every session that
    inherits them, once: the change is claimed with a conditional UPDATE, so two sweeps at
    once do it once. Returns how many sessions were decided again."""
    env = environment_caps()
    stored = EnvironmentCaps.objects.filter(pk=1).first()
    if stored is None:  # the first start: nothing was decided with other defaults
        EnvironmentCaps.objects.get_or_create(
            pk=1,
            defaults={
                "token_cap": env.token_cap,
                "cost_cap_usd": env.cost_cap_usd,
                "warn_at_pct": env.warn_at_pct,
            },
        )
        return 0
    old_env = Caps(stored.token_cap, stored.cost_cap_usd, stored.warn_at_pct)
    if old_env == env:
        return 0
    claimed = EnvironmentCaps.objects.filter(
        pk=1,
        token_cap=stored.token_cap,
        cost_cap_usd=stored.cost_cap_usd,
        warn_at_pct=stored.warn_at_pct,
    ).update(token_cap=env.token_cap, cost_cap_usd=env.cost_cap_usd, warn_at_pct=env.warn_at_pct)
    if claimed != 1:
        return 0  # another sweep took it
    return sum(
        _sessions_recheck(project, at=at, old_env=old_env)
        for project in Project.objects.order_by("pk")
    )


# Not atomic: each session is rechecked under its own lock, and a second run decides the same.
@outbox_handler(RECHECK, lease_seconds=3600, atomic=False)
def _recheck_item(payload: dict[str, Any], attempt: Attempt) -> None:
    project_budgets_recheck(
        project_id=int(payload["project_id"]), old=payload["old"], at=timezone.now()
    )
