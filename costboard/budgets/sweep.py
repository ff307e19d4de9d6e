"""The runaway rules that need a window of time, run by the sweep every minute (Celery beat;
`manage.py guard_sweep` without a broker):

- burn rate: a session's tokens per minute over the last W minutes far above the project's
  normal rate (and above a floor, so a quiet project's small sessions are never flagged);
- projected overrun: at that rate the session reaches one of its caps within T minutes —
  judged only for a session with enough history to project from: at least
  PROJECTION_MIN_STEPS steps over at least PROJECTION_MIN_MINUTES between its first and last
  event (docs/budgets.md, "Runaway rules"); below it the session is watched, not stopped;
- a long session: still active H hours after it started.

The per-turn rules (retry loops, overlong turns) run inside ingest: ingest/turn_rules.py.
Only open sessions active within the window are read, and a session is flagged under its
row lock (`session_flag_runaway`), so two sweeps at once flag it once.

Each pass also resolves the PagerDuty incidents whose budget period rolled over, whose rolling
window has moved past the spend (with no batch since), or whose budget or session is no
longer exhausted: `alerts.incidents_resolve`.

The project's normal rate is the tokens per active session-minute of its sessions seen in
the last 7 days but not within the window (a session counts at least one minute), runaways
left out.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F, Sum, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from costboard.budgets.alerts import incidents_resolve
from costboard.budgets.caps import session_caps
from costboard.budgets.engine import Flag
from costboard.budgets.services import environment_caps_sync, session_flag_runaway
from costboard.models import SYSTEM_SESSION_ID, Project, Session, Step

log = logging.getLogger(__name__)

BURN_RATE = "burn_rate"
PROJECTED_OVERRUN = "projected_overrun"
LONG_SESSION = "long_session"
NORMAL_RATE_DAYS = 7
# A projection needs history: a burst (44k tokens in one second into a fresh session) says
# nothing about the rate the session will keep.
PROJECTION_MIN_STEPS = 5
PROJECTION_MIN_MINUTES = 5


@dataclass(frozen=True, slots=True)
class SweepResult:
    sessions_checked: int
    flagged: dict[str, int]  # rule → sessions flagged by this run


def _per_minute(amount: Decimal | int, minutes: int) -> Decimal:
    return (Decimal(amount) / Decimal(minutes)).quantize(Decimal("0.01"), ROUND_HALF_UP)


def normal_tokens_per_minute(project: Project, now: datetime, since: datetime) -> Decimal | None:
    """Tokens per active session-minute over the project's sessions of the last 7 days that
    were not active since `since` (the window being judged), or None when it has none."""
    active = ExpressionWrapper(
        Greatest(F("last_active_at") - F("started_at"), Value(timedelta(minutes=1))),
        output_field=DurationField(),
    )
    totals = (
        Session.objects.filter(
            project=project,
            last_active_at__gte=now - timedelta(days=NORMAL_RATE_DAYS),
            last_active_at__lte=since,
            runaway_at__isnull=True,
        )
        .exclude(external_id=SYSTEM_SESSION_ID)
        .aggregate(tokens=Sum(F("input_tokens") + F("output_tokens")), minutes=Sum(active))
    )
    tokens, duration = totals["tokens"], totals["minutes"]
    if not tokens or not duration:
        return None
    return Decimal(tokens) / Decimal(duration.total_seconds() / 60)


def _window_usage(session_ids: list[int], since: datetime) -> dict[int, tuple[int, Decimal]]:
    """Tokens and cost of each session's steps since `since` (the step_session_time index)."""
    rows = (
        Step.objects.filter(session_id__in=session_ids, timestamp__gt=since)
        .values("session_id")
        .annotate(tokens=Sum(F("input_tokens") + F("output_tokens")), cost=Sum("cost_usd"))
        .values_list("session_id", "tokens", "cost")
    )
    return {sid: (tokens or 0, cost or Decimal(0)) for sid, tokens, cost in rows}


def projectable(session: Session) -> bool:
    """Enough history for a projected overrun: PROJECTION_MIN_STEPS steps and
    PROJECTION_MIN_MINUTES between the session's first and last event."""
    span = session.last_active_at - session.started_at
    return session.step_count >= PROJECTION_MIN_STEPS and span >= timedelta(
        minutes=PROJECTION_MIN_MINUTES
    )


def _overrun(
    session: Session, tokens: int, cost: Decimal, window: int, limit: int
) -> dict[str, Any] | None:
    """Evidence that at the window's rate a cap is reached within `limit` minutes."""
    caps = session_caps(session)
    candidates: list[tuple[Decimal, str, Decimal, Decimal, Decimal]] = []
    if tokens > 0 and session.tokens_used < caps.token_cap:
        rate = Decimal(tokens) / window
        minutes = Decimal(caps.token_cap - session.tokens_used) / rate
        candidates.append(
            (minutes, "tokens", Decimal(caps.token_cap), Decimal(session.tokens_used), rate)
        )
    if cost > 0 and session.cost_usd < caps.cost_cap_usd:
        rate = cost / window
        minutes = (caps.cost_cap_usd - session.cost_usd) / rate
        candidates.append((minutes, "usd", caps.cost_cap_usd, session.cost_usd, rate))
    if not candidates:
        return None
    minutes, cap_kind, cap, used, rate = min(candidates, key=lambda c: c[0])
    if minutes > limit:
        return None
    return {
        "cap": cap_kind,
        "cap_value": str(cap),
        "used": str(used),
        "per_minute": str(rate.quantize(Decimal("0.000001"), ROUND_HALF_UP)),
        "minutes_to_cap": str(minutes.quantize(Decimal("0.1"), ROUND_HALF_UP)),
        "threshold_minutes": limit,
        "window_minutes": window,
    }


def project_sweep(project: Project, now: datetime) -> tuple[int, dict[str, int]]:
    """Check the project's open sessions active within its window; flag the runaways.
    Returns how many sessions were checked and how many each rule flagged."""
    window = max(project.runaway_burn_window_minutes, 1)
    since = now - timedelta(minutes=window)
    sessions = list(
        Session.objects.filter(
            project=project,
            ended_at__isnull=True,
            runaway_at__isnull=True,
            last_active_at__gt=since,
        ).select_related("project")
    )
    flagged: dict[str, int] = defaultdict(int)
    if not sessions:
        return 0, flagged
    usage = _window_usage([s.pk for s in sessions], since)
    normal: Decimal | None = None
    if project.runaway_burn_factor:
        normal = normal_tokens_per_minute(project, now, since)
    for session in sessions:
        tokens, cost = usage.get(session.pk, (0, Decimal(0)))
        found = _session_rules(project, session, tokens, cost, window, normal, now)
        if found is None:
            continue
        rule, reason, evidence = found
        flag = Flag(at=now, rule=rule, reason=reason, evidence=evidence)
        if session_flag_runaway(session_id=session.pk, flag=flag):
            flagged[rule] += 1
    return len(sessions), flagged


def _session_rules(
    project: Project,
    session: Session,
    tokens: int,
    cost: Decimal,
    window: int,
    normal: Decimal | None,
    now: datetime,
) -> tuple[str, str, dict[str, Any]] | None:
    """The first window rule the session breaks: (rule, reason, evidence), or None."""
    system = session.is_system
    per_minute = Decimal(tokens) / window
    factor = project.runaway_burn_factor
    if factor and not system and per_minute >= project.runaway_burn_floor:
        threshold = factor * normal if normal is not None else Decimal(0)
        if per_minute > threshold:
            evidence: dict[str, Any] = {
                "window_minutes": window,
                "tokens_in_window": tokens,
                "tokens_per_minute": str(_per_minute(tokens, window)),
                "normal_tokens_per_minute": (
                    str(normal.quantize(Decimal("0.01"), ROUND_HALF_UP)) if normal else None
                ),
                "factor": str(factor),
                "floor_tokens_per_minute": project.runaway_burn_floor,
            }
            times = f", {per_minute / normal:.0f}× normal" if normal else ""
            reason = f"burn rate: {per_minute:,.0f} tokens/min over {window} min{times}"
            return BURN_RATE, reason, evidence
    overrun_rule = project.runaway_overrun_minutes and projectable(session)
    if overrun_rule and session.state != Session.State.EXHAUSTED:
        overrun = _overrun(session, tokens, cost, window, project.runaway_overrun_minutes)
        if overrun is not None:
            reason = (
                f"projected overrun: the {overrun['cap']} cap in "
                f"{overrun['minutes_to_cap']} min at the last {window} min's rate"
            )
            return PROJECTED_OVERRUN, reason, overrun
    hours = project.runaway_max_hours
    if hours and not system and now - session.started_at > timedelta(hours=hours):
        active = now - session.started_at
        evidence = {
            "started_at": session.started_at.isoformat(),
            "hours_active": str(
                Decimal(active.total_seconds() / 3600).quantize(Decimal("0.1"), ROUND_HALF_UP)
            ),
            "threshold_hours": hours,
        }
        reason = f"long session: active for {evidence['hours_active']} h (more than {hours} h)"
        return LONG_SESSION, reason, evidence
    return None


def runaway_sweep(now: datetime | None = None) -> SweepResult:
    """One pass over every project's active sessions."""
    now = now or timezone.now()
    environment_caps_sync(at=now)  # new environment defaults since the last pass
    flagged: dict[str, int] = defaultdict(int)
    checked = 0
    for project in Project.objects.order_by("pk"):
        sessions, by_rule = project_sweep(project, now)
        checked += sessions
        for rule, count in by_rule.items():
            flagged[rule] += count
    if flagged:
        log.info("runaway sweep flagged %s", dict(flagged))
    incidents_resolve(now=now)  # periods rolled over since the last pass, and any race's
    return SweepResult(sessions_checked=checked, flagged=dict(flagged))
