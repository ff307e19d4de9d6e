"""Session budgets: which caps apply, what state a session is in, and the `<budget>` object.

Caps come from the session, else its project, else the environment (CONTRACT §1, §3).
`warning` once tokens_used ≥ warn × token cap or cost ≥ warn × cost cap; `exhausted` once either
reaches its cap. Crossings are recorded once each, inside the ingest transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypedDict

from django.conf import settings
from django.db import transaction

from costboard.models import SYSTEM_SESSION_ID, BudgetEvent, Project, Session, usd


@dataclass(frozen=True, slots=True)
class Caps:
    token_cap: int
    cost_cap_usd: Decimal
    warn_at_pct: Decimal

    def state(self, tokens_used: int, cost_usd: Decimal) -> str:
        if self.exhausted(tokens_used, cost_usd):
            return Session.State.EXHAUSTED
        if self.warned(tokens_used, cost_usd):
            return Session.State.WARNING
        return Session.State.OK

    def warned(self, tokens_used: int, cost_usd: Decimal) -> bool:
        return (
            tokens_used >= self.warn_at_pct * self.token_cap
            or cost_usd >= self.warn_at_pct * self.cost_cap_usd
        )

    def exhausted(self, tokens_used: int, cost_usd: Decimal) -> bool:
        return tokens_used >= self.token_cap or cost_usd >= self.cost_cap_usd


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def caps_for(
    *,
    project: Project,
    token_cap: int | None,
    cost_cap_usd: Decimal | None,
    system: bool = False,
) -> Caps:
    """The session's own caps, else (for the `system` session) the project's system caps,
    else the project's session caps, else the environment's."""
    system_tokens = project.system_token_cap if system else None
    system_cost = project.system_cost_cap_usd if system else None
    return Caps(
        token_cap=_first(
            token_cap, system_tokens, project.token_cap, settings.COSTBOARD_SESSION_TOKEN_CAP
        ),
        cost_cap_usd=_first(
            cost_cap_usd,
            system_cost,
            project.cost_cap_usd,
            settings.COSTBOARD_SESSION_COST_CAP_USD,
        ),
        warn_at_pct=project.warn_at_pct or settings.COSTBOARD_WARN_AT_PCT,
    )


def session_caps(session: Session, project: Project | None = None) -> Caps:
    return caps_for(
        project=project or session.project,
        token_cap=session.token_cap,
        cost_cap_usd=session.cost_cap_usd,
        system=session.is_system,
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class SessionBudget(TypedDict):
    session_id: str
    state: str
    runaway: bool
    tokens_used: int
    token_cap: int
    cost_usd: str | None
    cost_cap_usd: str | None
    turns: int
    steps: int
    warned_at: str | None
    exhausted_at: str | None


class BudgetFields(Protocol):
    """What a budget is read from: a Session, or ingest's lighter row of the same fields."""

    @property
    def external_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def runaway(self) -> bool: ...
    @property
    def tokens_used(self) -> int: ...
    @property
    def token_cap(self) -> int | None: ...
    @property
    def cost_usd(self) -> Decimal: ...
    @property
    def cost_cap_usd(self) -> Decimal | None: ...
    @property
    def turn_count(self) -> int: ...
    @property
    def step_count(self) -> int: ...
    @property
    def warned_at(self) -> datetime | None: ...
    @property
    def exhausted_at(self) -> datetime | None: ...


def session_budget(session: BudgetFields, project: Project) -> SessionBudget:
    caps = caps_for(
        project=project,
        token_cap=session.token_cap,
        cost_cap_usd=session.cost_cap_usd,
        system=session.external_id == SYSTEM_SESSION_ID,
    )
    return {
        "session_id": session.external_id,
        "state": session.state,
        "runaway": session.runaway,
        "tokens_used": session.tokens_used,
        "token_cap": caps.token_cap,
        "cost_usd": usd(session.cost_usd),
        "cost_cap_usd": usd(caps.cost_cap_usd),
        "turns": session.turn_count,
        "steps": session.step_count,
        "warned_at": _iso(session.warned_at),
        "exhausted_at": _iso(session.exhausted_at),
    }


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    """What a session's budget becomes given its totals, its caps before and after."""

    state: str
    cap_changed: bool
    clear_warned: bool
    clear_exhausted: bool
    warns: bool  # soft_warned is crossed now
    exhausts: bool  # exhausted is crossed now


def runaway_stopped(
    project: Project, runaway_at: datetime | None, acknowledged_at: datetime | None
) -> bool:
    """A runaway session is held at `exhausted` (so its agent stops) until a person
    acknowledges it, if its project says runaways stop."""
    return (
        project.runaway_stops
        and runaway_at is not None
        and (acknowledged_at is None or acknowledged_at < runaway_at)
    )


def budget_decide(
    *,
    old_caps: Caps,
    caps: Caps,
    tokens_used: int,
    cost_usd: Decimal,
    warned_at: datetime | None,
    exhausted_at: datetime | None,
    stopped: bool = False,
) -> BudgetDecision:
    """The state from the totals against the caps (`stopped`: a runaway held at exhausted).
    A crossing no longer true (a cap raised, a runaway acknowledged, a repricing) is cleared
    and may be crossed, and recorded, again; otherwise a crossing is recorded once: only when
    not yet set."""
    warned = caps.warned(tokens_used, cost_usd)
    exhausted = caps.exhausted(tokens_used, cost_usd) or stopped
    cap_changed = caps != old_caps
    clear_warned = warned_at is not None and not warned
    clear_exhausted = exhausted_at is not None and not exhausted
    state = (
        Session.State.EXHAUSTED
        if exhausted
        else Session.State.WARNING
        if warned
        else Session.State.OK
    )
    return BudgetDecision(
        state=state,
        cap_changed=cap_changed,
        clear_warned=clear_warned,
        clear_exhausted=clear_exhausted,
        warns=warned and warned_at is None,
        exhausts=exhausted and exhausted_at is None,
    )


def budget_event(
    *,
    session: Session | int,
    project: Project,
    kind: str,
    at: datetime,
    tokens_used: int,
    cost_usd: Decimal,
    caps: Caps,
    detail: dict[str, object] | None = None,
) -> BudgetEvent:
    session_id = session if isinstance(session, int) else session.pk
    return BudgetEvent(
        project=project,
        session_id=session_id,
        kind=kind,
        at=at,
        tokens_used=tokens_used,
        cost_usd=cost_usd,
        detail=detail or caps_detail(caps),
    )


def caps_detail(caps: Caps) -> dict[str, object]:
    return {
        "token_cap": caps.token_cap,
        "cost_cap_usd": str(caps.cost_cap_usd),
        "warn_at_pct": str(caps.warn_at_pct),
    }


def runaway_stop_detail(caps: Caps, reason: str) -> dict[str, object]:
    """An `exhausted` event's detail when a runaway, not a cap, stopped the session."""
    return {**caps_detail(caps), "reason": "runaway", "runaway": reason}


def cap_change_detail(old_caps: Caps, caps: Caps, old_state: str, state: str) -> dict[str, object]:
    return {
        "token_cap": [old_caps.token_cap, caps.token_cap],
        "cost_cap_usd": [str(old_caps.cost_cap_usd), str(caps.cost_cap_usd)],
        "warn_at_pct": [str(old_caps.warn_at_pct), str(caps.warn_at_pct)],
        "state": [old_state, state],
    }


def session_recheck(
    session_id: int, *, now: datetime, old_caps: Caps | None = None
) -> list[BudgetEvent]:
    """Recompute one session's state after its caps or its cost changed outside ingest
    (an admin edit, a repricing). `old_caps` given means the caps changed from those."""
    with transaction.atomic():
        session = (
            Session.objects.select_for_update(of=("self",))
            .select_related("project")
            .get(pk=session_id)
        )
        caps = session_caps(session)
        stopped = runaway_stopped(session.project, session.runaway_at, session.acknowledged_at)
        decision = budget_decide(
            old_caps=old_caps or caps,
            caps=caps,
            tokens_used=session.tokens_used,
            cost_usd=session.cost_usd,
            warned_at=session.warned_at,
            exhausted_at=session.exhausted_at,
            stopped=stopped,
        )
        events: list[BudgetEvent] = []

        def record(kind: str, detail: dict[str, object] | None = None) -> None:
            events.append(
                budget_event(
                    session=session,
                    project=session.project,
                    kind=kind,
                    at=now,
                    tokens_used=session.tokens_used,
                    cost_usd=session.cost_usd,
                    caps=caps,
                    detail=detail,
                )
            )

        if decision.cap_changed and old_caps is not None:
            record(
                BudgetEvent.Kind.CAP_CHANGED,
                cap_change_detail(old_caps, caps, session.state, decision.state),
            )
        if decision.clear_warned:
            session.warned_at = None
        if decision.clear_exhausted:
            session.exhausted_at = None
        if decision.warns:
            session.warned_at = now
            record(BudgetEvent.Kind.SOFT_WARNED)
        if decision.exhausts:
            session.exhausted_at = now
            by_caps = caps.exhausted(session.tokens_used, session.cost_usd)
            record(
                BudgetEvent.Kind.EXHAUSTED,
                None if by_caps else runaway_stop_detail(caps, session.runaway_reason),
            )
        session.state = decision.state
        session.save(update_fields=["state", "warned_at", "exhausted_at"])
        from costboard.budgets.alerts import announce  # imported here: alerts imports this module

        created = BudgetEvent.objects.bulk_create(events)
        announce(created)
        return created


def session_flag_runaway(
    session_id: int,
    *,
    rule: str,
    evidence: dict[str, object],
    at: datetime,
    reason: str = "",
) -> BudgetEvent | None:
    """Flag a session as runaway once: the row is claimed with a conditional UPDATE, so two
    detectors (or two sweeps) racing on it record one event. Returns the event, or None if the
    session was already flagged. `reason` is the one line people read (default: the rule)."""
    reason = reason or rule
    with transaction.atomic():
        claimed = Session.objects.filter(pk=session_id, runaway_at__isnull=True).update(
            runaway_at=at, runaway_reason=reason[:200]
        )
        if claimed != 1:
            return None
        # the claim locked the row until this transaction ends
        session = Session.objects.select_related("project").get(pk=session_id)
        events = [
            BudgetEvent(
                project=session.project,
                session=session,
                kind=BudgetEvent.Kind.RUNAWAY,
                at=at,
                tokens_used=session.tokens_used,
                cost_usd=session.cost_usd,
                detail={"rule": rule, "reason": reason, "evidence": evidence},
            )
        ]
        if session.project.runaway_stops and session.state != Session.State.EXHAUSTED:
            # the agent is told to stop: its next answer says exhausted
            caps = session_caps(session)
            session.state = Session.State.EXHAUSTED
            session.exhausted_at = session.exhausted_at or at
            session.save(update_fields=["state", "exhausted_at"])
            events.append(
                budget_event(
                    session=session,
                    project=session.project,
                    kind=BudgetEvent.Kind.EXHAUSTED,
                    at=at,
                    tokens_used=session.tokens_used,
                    cost_usd=session.cost_usd,
                    caps=caps,
                    detail=runaway_stop_detail(caps, reason),
                )
            )
        created = BudgetEvent.objects.bulk_create(events)
        from costboard.budgets.alerts import announce  # imported here: alerts imports this module

        announce(created)
        return created[0]
