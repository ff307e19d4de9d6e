"""A batch planned before its transaction: each step priced and given its family, and what
each session and turn is touched by (`batch_plan`); then the accepted session and turn events
folded in (`other_events_apply`). No I/O but the rate-table check: the statements of writes/
and rollups.py carry what this computes, and the hottest loop of ingest is kept flat here on
purpose."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from costboard.ingest.schemas import Event, SessionEvent, StepEvent, TurnEvent, usage_tier
from costboard.ingest.turn_rules import step_signature
from costboard.models import STANDARD_TIER, SYSTEM_SESSION_ID, Project, service_tier_word
from costboard.money import pico_usd
from costboard.pricing.families import price_families, step_classify
from costboard.pricing.rates import Audio, RateTable, audio_of, rate_table
from costboard.sql_arrays import Dialect


@dataclass(slots=True)
class PricedStep:
    session_key: str
    turn_no: int | None
    event_id: str | None
    ts: datetime
    day: date  # UTC: the day of its rollups
    step_type: str
    model: str
    family: str  # what pages group it under
    provider: str
    service_tier: str  # as sent (or read from its usage), lower case; standard by default
    duration_ms: int | None
    success: bool
    error: str
    metadata: dict[str, Any] | None
    tags: dict[str, str] | None  # its own; its session's are merged under them at insert
    price_id: int | None
    cache_creation_1h_input_tokens: int
    audio: Audio  # its audio tokens (`rates.audio_of`): NO_AUDIO for nearly every step
    # What the step adds to its turn, session and rollups, in Totals' field order: tokens,
    # then USD in pico-dollars (exact ints: sums are int additions), errors, unpriced, ms.
    counts: tuple[int, ...]
    context_window: int | None  # of its model, from the rate table (context pressure)
    sig: int  # what makes two steps of a turn "the same step" (turn_rules); 0 outside turns

    @property
    def prompt_tokens(self) -> int:
        """The prompt's size: input, cache reads and cache writes."""
        return self.counts[0] + self.counts[2] + self.counts[3]

    @property
    def cost_pico(self) -> int:
        return self.counts[9]

    # what the budget engine reads of a spend (only to time a crossing: sums come summed)
    @property
    def at(self) -> datetime:
        return self.ts

    @property
    def tokens(self) -> int:
        """Tokens used: input + output."""
        return self.counts[0] + self.counts[1]

    @property
    def cost_usd(self) -> Decimal:
        return pico_usd(self.counts[9])


@dataclass(slots=True)
class Totals:
    """Sums of a group of steps (USD in pico-dollars)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_input_pico: int = 0
    cost_output_pico: int = 0
    cost_cache_read_pico: int = 0
    cost_cache_write_pico: int = 0
    cost_pico: int = 0
    errors: int = 0
    unpriced: int = 0
    duration_ms: int = 0
    steps: int = 0

    @classmethod
    def of(cls, steps: list[PricedStep]) -> Totals:
        totals = cls(*steps_sum(steps))
        totals.steps = len(steps)
        return totals

    def usage_values(self, sql: Dialect) -> Sequence[Any]:
        return sql.usage(
            (
                self.input_tokens,
                self.output_tokens,
                self.cache_read_input_tokens,
                self.cache_creation_input_tokens,
                self.reasoning_tokens,
                self.cost_input_pico,
                self.cost_output_pico,
                self.cost_cache_read_pico,
                self.cost_cache_write_pico,
                self.cost_pico,
            )
        )


_NO_COUNTS = (0,) * 13


def steps_sum(steps: Sequence[PricedStep]) -> tuple[int, ...]:
    """The column sums of these steps' counts, in PricedStep.counts' order (zip and sum run in C: a
    fraction of adding step by step). A session's or a turn's share of a wide batch, most of
    them one step, is read as this tuple, with no Totals built for each."""
    if len(steps) == 1:
        return steps[0].counts
    if not steps:
        return _NO_COUNTS
    return tuple(map(sum, zip(*(s.counts for s in steps), strict=True)))


@dataclass(slots=True)
class SessionTouch:
    key: str
    first: datetime
    last: datetime
    user_id: str | None = None
    parent_key: str | None = None
    token_cap: int | None = None
    cost_cap_usd: Decimal | None = None
    caps_given: bool = False
    ended_at: datetime | None = None
    metadata: dict[str, Any] | None = None
    tags: dict[str, str] | None = None
    event_at: datetime | None = None
    timed: bool = True  # False: touched by replays alone (its times are left as stored)


@dataclass(slots=True)
class TurnTouch:
    session_key: str
    number: int
    first: datetime
    last: datetime
    user_message: str | None = None
    assistant_response: str | None = None
    context: dict[str, Any] | None = None
    timed: bool = True  # False: touched by replays alone (its times are left as stored)


def batch_plan(
    events: list[Event], now: datetime, project: Project
) -> tuple[
    dict[str, SessionTouch],
    dict[tuple[str, int], TurnTouch],
    list[PricedStep],
    list[SessionEvent | TurnEvent],
    int,
]:
    """Price the steps and gather what each session and turn is touched by (no I/O but the
    rate-table check). The hottest loop of ingest: kept flat on purpose."""
    table = rate_table()
    families = price_families(table.rates, key=table)
    sessions: dict[str, SessionTouch] = {}
    turns: dict[tuple[str, int], TurnTouch] = {}
    steps: list[PricedStep] = []
    others: list[SessionEvent | TurnEvent] = []
    seen_ids: set[str] = set()
    duplicates = 0

    for event in events:
        if event.event_id is not None:
            if event.event_id in seen_ids:
                duplicates += 1
                continue
            seen_ids.add(event.event_id)
        ts = utc_at(event, now)
        if isinstance(event, StepEvent):
            key = event.session_id or SYSTEM_SESSION_ID
            _touch_session(sessions, key, ts)
            if event.turn is not None:
                _touch_turn(turns, key, event.turn, ts)
            steps.append(_step(event, key, ts, table, families, project.pk))
        elif isinstance(event, TurnEvent):
            _touch_session(sessions, event.session_id, ts)
            _touch_turn(turns, event.session_id, event.turn, ts)
            others.append(event)
        else:
            _touch_session(sessions, event.session_id, ts)
            if event.parent_session_id:
                _touch_session(sessions, event.parent_session_id, ts)
            others.append(event)
    return sessions, turns, steps, others, duplicates


def utc_at(event: Event, now: datetime) -> datetime:
    """When the event happened, in UTC: the day of its rollups and its month partition, and
    the time psycopg sends cheapest (a parsed offset's tzinfo is asked for its offset value
    by value, in Python)."""
    ts = event.at(now)
    return ts if ts.tzinfo is UTC else ts.astimezone(UTC)


def _touch_session(sessions: dict[str, SessionTouch], key: str, ts: datetime) -> None:
    touch = sessions.get(key)
    if touch is None:
        sessions[key] = SessionTouch(key, ts, ts)
    elif ts < touch.first:
        touch.first = ts
    elif ts > touch.last:
        touch.last = ts


def _touch_turn(
    turns: dict[tuple[str, int], TurnTouch], key: str, number: int, ts: datetime
) -> None:
    touch = turns.get((key, number))
    if touch is None:
        turns[(key, number)] = TurnTouch(key, number, ts, ts)
    elif ts < touch.first:
        touch.first = ts
    elif ts > touch.last:
        touch.last = ts


def _step(
    event: StepEvent,
    key: str,
    ts: datetime,
    table: RateTable,
    families: dict[int, str],
    project_id: int,
) -> PricedStep:
    if event.usage is None:  # the common case: the token fields as sent
        inp = event.input_tokens or 0
        out = event.output_tokens or 0
        read = event.cache_read_input_tokens or 0
        write = event.cache_creation_input_tokens or 0
        write_1h = 0
        reasoning = event.reasoning_tokens or 0
        audio = audio_of(
            event.input_audio_tokens or 0,
            event.cache_audio_read_tokens or 0,
            event.output_audio_tokens or 0,
        )
    else:
        t = event.tokens()
        inp, out, read = t.input_tokens, t.output_tokens, t.cache_read_input_tokens
        write, write_1h = t.cache_creation_input_tokens, t.cache_creation_1h_input_tokens
        reasoning = t.reasoning_tokens
        audio = audio_of(t.input_audio_tokens, t.cache_audio_read_tokens, t.output_audio_tokens)
    tier = event.service_tier
    if tier is not None:
        tier = service_tier_word(tier)
    elif event.usage is None:
        tier = STANDARD_TIER
    else:
        sent = usage_tier(event.usage)
        tier = STANDARD_TIER if sent is None else service_tier_word(sent)
    provider = event.provider or ""
    (price_id, c_in, c_out, c_read, c_write), family, unpriced = step_classify(
        table,
        families,
        event.model,
        provider,
        ts,
        inp,
        out,
        read,
        write,
        write_1h,
        tier,
        project_id,
        audio,
    )
    duration = None if event.duration_ms is None else round(event.duration_ms)
    window = sig = None
    if event.turn is not None:
        window = table.windows.get(price_id) if price_id is not None else None
        sig = step_signature(event.step_type, event.model, inp + read + write)
    counts = (
        inp,
        out,
        read,
        write,
        reasoning,
        c_in,
        c_out,
        c_read,
        c_write,
        c_in + c_out + c_read + c_write,
        0 if event.success else 1,  # counts, summed as ints (errors, unpriced)
        1 if unpriced else 0,
        duration or 0,
    )
    return PricedStep(
        key,
        event.turn,
        event.event_id,
        ts,
        ts.date(),  # in UTC (batch_plan)
        event.step_type,
        event.model,
        family,
        provider,
        tier,
        duration,
        event.success,
        event.error or "",
        event.metadata,
        event.tags,
        price_id,
        write_1h,
        audio,
        counts,
        window,
        sig or 0,
    )


def other_events_apply(
    events: list[SessionEvent | TurnEvent],
    sessions: dict[str, SessionTouch],
    turns: dict[tuple[str, int], TurnTouch],
    now: datetime,
) -> None:
    """Fold accepted session and turn events into their touches, later events winning."""
    for event in events:
        ts = utc_at(event, now)
        if isinstance(event, TurnEvent):
            turn = turns[(event.session_id, event.turn)]
            if event.user_message is not None:
                turn.user_message = event.user_message
            if event.assistant_response is not None:
                turn.assistant_response = event.assistant_response
            if event.context is not None:
                turn.context = event.context
            continue
        touch = sessions[event.session_id]
        touch.event_at = ts
        if event.user_id is not None:
            touch.user_id = event.user_id
        if event.parent_session_id is not None:
            touch.parent_key = event.parent_session_id
        if event.token_cap is not None:
            touch.token_cap = event.token_cap
            touch.caps_given = True
        if event.cost_cap_usd is not None:
            touch.cost_cap_usd = event.cost_cap_usd
            touch.caps_given = True
        if event.ended:
            touch.ended_at = ts
        if event.metadata is not None:
            touch.metadata = {**(touch.metadata or {}), **event.metadata}
        if event.tags is not None:
            touch.tags = {**(touch.tags or {}), **event.tags}


def touches_retime(
    sessions: dict[str, SessionTouch],
    turns: dict[tuple[str, int], TurnTouch],
    accepted: list[SessionEvent | TurnEvent],
    inserted: list[PricedStep],
    now: datetime,
    *,
    made: set[tuple[str, int]],
) -> set[tuple[str, int]]:
    """Time each touched session and turn by the batch's accepted events alone, once some were
    replays (a replay changes nothing: without `timestamp` it is timed when it arrives, and
    would make its session look active again); one touched by replays alone is left as stored
    (`timed`). The turns the batch `made` keep their times (they are inserted with them).
    Returns the turns the accepted events name: one made for replays alone is none of them."""
    timed_sessions: dict[str, SessionTouch] = {}
    timed_turns: dict[tuple[str, int], TurnTouch] = {}
    for step in inserted:  # batch_plan's touches, of what was accepted
        _touch_session(timed_sessions, step.session_key, step.ts)
        if step.turn_no is not None:
            _touch_turn(timed_turns, step.session_key, step.turn_no, step.ts)
    for event in accepted:
        ts = utc_at(event, now)
        _touch_session(timed_sessions, event.session_id, ts)
        if isinstance(event, TurnEvent):
            _touch_turn(timed_turns, event.session_id, event.turn, ts)
        elif event.parent_session_id:
            _touch_session(timed_sessions, event.parent_session_id, ts)
    for key, touch in sessions.items():
        _retimed(touch, timed_sessions.get(key))
    for number, turn in turns.items():
        if number not in made:
            _retimed(turn, timed_turns.get(number))
    return set(timed_turns)


def touches_widen(
    sessions: dict[str, SessionTouch],
    turns: dict[tuple[str, int], TurnTouch],
    steps: Sequence[PricedStep],
) -> None:
    """Widen the timed touches of these steps' sessions and turns to their times (steps
    moved into them from `system`, writes/moves.py)."""
    for step in steps:
        touch = sessions.get(step.session_key)
        if touch is not None and touch.timed:
            touch.first, touch.last = min(touch.first, step.ts), max(touch.last, step.ts)
        turn = turns.get((step.session_key, step.turn_no or 0))
        if turn is not None and turn.timed:
            turn.first, turn.last = min(turn.first, step.ts), max(turn.last, step.ts)


def _retimed(touch: SessionTouch | TurnTouch, timed: SessionTouch | TurnTouch | None) -> None:
    if timed is None:
        touch.timed = False
    else:
        touch.first, touch.last = timed.first, timed.last


def step_tags(step: PricedStep, session_tags: dict[str, dict[str, str]]) -> dict[str, str] | None:
    """A step's tags: its session's, its own merged over them; None when it has none."""
    inherited = session_tags.get(step.session_key)
    if not step.tags:
        return inherited or None
    return {**inherited, **step.tags} if inherited else step.tags
