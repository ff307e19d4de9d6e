"""One session's page: its turns with their steps, loose steps, charts, forks and budget
events, each read bounded whatever the session's size."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import F, Sum
from django.db.models.functions import Coalesce, Trunc

from costboard.dashboards.selectors.shared import ZERO
from costboard.models import BudgetEvent, Session, Step, Turn


@dataclass
class TurnView:
    turn: Turn
    steps: list[Step] = field(default_factory=list)


MAX_TURNS_SHOWN = 100
MAX_TURN_STEPS_SHOWN = 5000
MAX_LOOSE_STEPS_SHOWN = 200
MAX_POINTS = 2000


@dataclass
class SessionDetail:
    session: Session
    turns: list[TurnView]
    turns_hidden: int
    loose_steps: list[Step]
    loose_more: bool  # there are earlier steps outside a turn than those shown
    cumulative: list[tuple[datetime, int]]
    cost_by_turn: dict[str, dict[int, Decimal]]
    forks: list[Session]
    events: list[BudgetEvent]
    # The latest turn, when its prompt nears its model's context window, and that model.
    summarize_turn: Turn | None = None
    summarize_model: str = ""


def _prompt_tokens(step: Step) -> int:
    return step.input_tokens + step.cache_read_input_tokens + step.cache_creation_input_tokens


def _largest_prompt_model(turn: Turn, steps: list[Step]) -> str:
    """The model of the turn's largest prompt (the one its context pressure is of): from the
    steps shown, else one query."""
    if steps:
        return max(steps, key=_prompt_tokens).model
    largest = (
        Step.objects.filter(session_id=turn.session_id, turn=turn)
        .alias(
            prompt=F("input_tokens")
            + F("cache_read_input_tokens")
            + F("cache_creation_input_tokens")
        )
        .order_by("-prompt", "id")
        .values_list("model", flat=True)
        .first()
    )
    return largest or ""


def session_detail(*, session: Session) -> SessionDetail:
    """A session's turns with their steps, its charts' data, forks and budget events: a fixed
    number of queries, each bounded whatever the session's size (a project's `system` budget
    can gather millions of steps)."""
    turn_count = session.turn_count
    turns = list(Turn.objects.filter(session=session).order_by("-number")[:MAX_TURNS_SHOWN])
    turns.reverse()
    views = {t.pk: TurnView(turn=t) for t in turns}
    loaded = 0
    if views:
        turn_steps = Step.objects.filter(session=session, turn_id__in=list(views)).order_by(
            "timestamp", "id"
        )
        for step in turn_steps[:MAX_TURN_STEPS_SHOWN]:
            views[step.turn_id].steps.append(step)  # type: ignore[index]
            loaded += 1
    loose = list(
        Step.objects.filter(session=session, turn__isnull=True).order_by("-timestamp", "-id")[
            : MAX_LOOSE_STEPS_SHOWN + 1
        ]
    )
    loose_more = len(loose) > MAX_LOOSE_STEPS_SHOWN
    loose = loose[:MAX_LOOSE_STEPS_SHOWN]
    loose.reverse()

    by_turn: dict[str, dict[int, Decimal]] = defaultdict(dict)
    for row in (
        Step.objects.filter(session=session, turn_id__in=list(views))
        .values("turn__number", "step_type")
        .annotate(cost=Coalesce(Sum("cost_usd"), ZERO))
        .order_by()
    ):
        by_turn[row["step_type"]][row["turn__number"]] = row["cost"]

    summarize = turns[-1] if turns and turns[-1].should_summarize else None
    summarize_model = ""
    if summarize is not None:
        # The latest turn's steps are the last loaded: some may be cut when the limit is hit.
        shown = views[summarize.pk].steps if loaded < MAX_TURN_STEPS_SHOWN else []
        summarize_model = _largest_prompt_model(summarize, shown)

    return SessionDetail(
        session=session,
        turns=list(views.values()),
        turns_hidden=max(0, turn_count - len(turns)),
        loose_steps=loose,
        loose_more=loose_more,
        cumulative=session_cumulative_tokens(session=session),
        cost_by_turn=dict(by_turn),
        forks=list(session.forks.order_by("started_at")[:50]),
        events=session_budget_events(session=session),
        summarize_turn=summarize,
        summarize_model=summarize_model,
    )


def session_budget_events(*, session: Session) -> list[BudgetEvent]:
    """Its crossings, cap changes and runaway flags, oldest first."""
    return list(BudgetEvent.objects.filter(session=session).order_by("at", "id"))


def session_cumulative_tokens(*, session: Session) -> list[tuple[datetime, int]]:
    """Tokens used over time: per step up to MAX_POINTS steps, else summed per minute, hour or
    day (whichever keeps the points under MAX_POINTS) in SQL, so a long session is not read
    step by step. It ends at the session's tokens_used: the tokens of steps retention
    deleted (the oldest; the session keeps their total) are carried under the kept ones."""
    steps = Step.objects.filter(session=session)
    if session.step_count <= MAX_POINTS:
        rows = steps.order_by("timestamp", "id").values_list(
            "timestamp", "input_tokens", "output_tokens"
        )
        points, running = [], 0
        for ts, inp, out in rows:
            running += inp + out
            points.append((ts, running))
        return _with_deleted(session, points)
    span = session.last_active_at - session.started_at
    unit = next((kind for kind, width in _BUCKETS if span / width <= MAX_POINTS), "day")
    buckets = (
        steps.annotate(at=Trunc("timestamp", unit, tzinfo=UTC))
        .values("at")
        .annotate(tokens=Sum(F("input_tokens") + F("output_tokens")))
        .order_by("at")
    )
    points, running = [], 0
    for row in buckets:
        running += row["tokens"] or 0
        points.append((row["at"], running))
    return _with_deleted(session, points)


def _with_deleted(
    session: Session, points: list[tuple[datetime, int]]
) -> list[tuple[datetime, int]]:
    """The running totals raised by the tokens of the session's steps no longer stored
    (deleted by retention, docs/operations.md "Retention"), so the last is its tokens_used;
    with none kept, one point at its last activity."""
    deleted = session.tokens_used - (points[-1][1] if points else 0)
    if deleted <= 0:
        return points
    if not points:
        return [(session.last_active_at, session.tokens_used)]
    return [(at, running + deleted) for at, running in points]


_BUCKETS = [("minute", timedelta(minutes=1)), ("hour", timedelta(hours=1))]
