"""A batch's turns: read as they stand, ids reserved for the missing (`turns_ensure`), then
each written once after the steps with their sums, text and retry-loop streaks, checking the
per-turn runaway rules (`turns_update`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from costboard.budgets.engine import Flag
from costboard.ingest.plan import PricedStep, TurnTouch, steps_sum
from costboard.ingest.sql import USAGE, USAGE_COLUMNS, json_text
from costboard.ingest.turn_rules import TurnStreaks, turn_check
from costboard.models import Project, Turn
from costboard.sql_arrays import Column, Dialect

TURN_TABLE = Turn._meta.db_table


@dataclass(slots=True)
class _TurnNow:
    """A turn as it stood before the batch (a new one: as made, empty)."""

    id: int
    session_key: str
    number: int
    step_count: int
    streaks: TurnStreaks
    new: bool = False


def turns_ensure(
    cursor: Any,
    sql: Dialect,
    project: Project,
    session_ids: dict[str, int],
    turns: dict[tuple[str, int], TurnTouch],
) -> dict[tuple[str, int], _TurnNow]:
    """The touched turns as they stand: a read; the missing ones get ids reserved (their
    steps carry them), and turns_update inserts them after the steps with their final
    values, so a new turn is written once. Their sessions are locked (sessions_lock), and
    every writer of a turn holds its session's lock, so no other batch makes or changes them
    meanwhile; turns_update writes each once."""
    if not turns:
        return {}
    by_id = {v: k for k, v in session_ids.items()}
    ordered = sorted(turns.values(), key=lambda t: (session_ids[t.session_key], t.number))
    with_v, params = sql.rows(
        [("session_id", "bigint"), ("number", "integer")],
        [[session_ids[t.session_key], t.number] for t in ordered],
    )
    cursor.execute(
        f"""
        {with_v}
        SELECT t.id, t.session_id, t.number, t.step_count,
               t.fail_streak, t.fail_peak, t.repeat_sig, t.repeat_streak, t.repeat_peak
        FROM {TURN_TABLE} t JOIN v ON t.session_id = v.session_id AND t.number = v.number
        """,
        params,
    )
    result: dict[tuple[str, int], _TurnNow] = {}
    for id_, session_id, number, step_count, *streaks in cursor.fetchall():
        key = by_id[session_id]
        result[(key, number)] = _TurnNow(id_, key, number, step_count, TurnStreaks(*streaks))
    missing = [t for t in ordered if (t.session_key, t.number) not in result]
    if missing:
        for touch, id_ in zip(
            missing, sql.ids_reserve(cursor, TURN_TABLE, len(missing)), strict=True
        ):
            result[(touch.session_key, touch.number)] = _TurnNow(
                id_, touch.session_key, touch.number, 0, TurnStreaks(), new=True
            )
    return result


def turns_replayed_drop(
    turns_now: dict[tuple[str, int], _TurnNow],
    turns: dict[tuple[str, int], TurnTouch],
    named: set[tuple[str, int]],
) -> None:
    """Forget the new turns no accepted event `named` (touches_retime's): only replays named
    them (a step's or a turn event's event_id sent again under another turn number), and a
    replay changes nothing (docs/api.md, "Idempotency"), so no empty turn is made for it; its
    reserved id goes unused."""
    for key in [key for key, turn in turns_now.items() if turn.new and key not in named]:
        del turns_now[key], turns[key]


def turns_update(
    cursor: Any,
    sql: Dialect,
    project: Project,
    session_ids: dict[str, int],
    turns_now: dict[tuple[str, int], _TurnNow],
    turns: dict[tuple[str, int], TurnTouch],
    inserted: list[PricedStep],
) -> dict[str, Flag]:
    """Each touched turn's one write of the batch: its times, its messages and context, the
    sums of its inserted steps (a replay refused by the insert is not among them), the
    largest prompt (context pressure), and its retry-loop streaks advanced over those steps;
    an update of those that existed, an insert of the new ones (their ids reserved by
    turns_ensure). Returns the per-turn runaway rules broken, by session key (the first
    turn's, in turn order)."""
    if not turns_now:
        return {}
    new_steps: dict[tuple[str, int], list[PricedStep]] = defaultdict(list)
    for step in inserted:
        if step.turn_no is not None:
            new_steps[(step.session_key, step.turn_no)].append(step)
    flags: dict[str, Flag] = {}
    values = []
    new_values = []
    for key in sorted(turns_now, key=lambda k: turns_now[k].id):
        turn, touch = turns_now[key], turns[key]
        added = new_steps.get(key, [])
        streaks = turn.streaks
        largest = None
        if added:
            if len(added) > 1:
                added.sort(key=_BY_TS)
            streaks, flag = turn_check(project, turn.number, streaks, added, turn.step_count)
            if flag is not None and turn.session_key not in flags:
                flags[turn.session_key] = flag
            largest = added[0] if len(added) == 1 else max(added, key=_BY_PROMPT)
        counted = steps_sum(added)
        row = [
            turn.id,
            sql.dt(touch.first if touch.timed else None),
            sql.dt(touch.last if touch.timed else None),
            touch.user_message,
            touch.assistant_response,
            json_text(touch.context),
            *sql.usage(counted),
            len(added),
            counted[10],
            largest.prompt_tokens if largest else 0,
            largest.context_window if largest else None,
            streaks.fail_streak,
            streaks.fail_peak,
            streaks.repeat_sig,
            streaks.repeat_streak,
            streaks.repeat_peak,
        ]
        if turn.new:
            new_values.append([*row, session_ids[turn.session_key], turn.number])
        else:
            values.append(row)
    if new_values:
        _turns_insert(cursor, sql, project, new_values)
    if values:
        _turns_write(cursor, sql, values)
    return flags


def _turns_insert(cursor: Any, sql: Dialect, project: Project, values: list[list[Any]]) -> None:
    """Insert the batch's new turns as turns_update would leave them had they been made
    empty first: rows of _TURN_UPDATE_COLUMNS, then the session id and the number."""
    with_v, params = sql.rows(
        [*_TURN_UPDATE_COLUMNS, ("session_id", "bigint"), ("number", "integer")], values
    )
    usage = ", ".join(USAGE_COLUMNS)
    streaks = ", ".join(_STREAK_COLUMNS)
    cursor.execute(
        f"""
        {with_v}
        INSERT INTO {TURN_TABLE} (id, project_id, session_id, number, started_at, last_active_at,
                                  user_message, assistant_response, context, {usage},
                                  step_count, error_count, context_tokens, context_window,
                                  {streaks})
        SELECT v.id, %s, v.session_id, v.number, v.started_at, v.last_active_at,
               COALESCE(v.user_message, ''), COALESCE(v.assistant_response, ''),
               {sql.jsonb("v.context")}, {usage}, v.d_steps, v.d_errors, v.context_tokens,
               CASE WHEN v.context_tokens > 0 THEN v.context_window END, {streaks}
        FROM v WHERE true
        """,
        [*params, project.pk],
    )


def _turns_write(cursor: Any, sql: Dialect, values: list[list[Any]]) -> None:
    """Update the batch's turns that existed: rows of _TURN_UPDATE_COLUMNS."""
    with_v, params = sql.rows(_TURN_UPDATE_COLUMNS, values)
    sums = ",\n".join(f"{c} = {TURN_TABLE}.{c} + v.{c}" for c in USAGE_COLUMNS)
    streak_columns = ",\n".join(f"{c} = v.{c}" for c in _STREAK_COLUMNS)
    # user_message and assistant_response are '' or NULL when not given: keep what is stored.
    cursor.execute(
        f"""
        {with_v}
        UPDATE {TURN_TABLE} SET
            started_at = COALESCE({sql.least}({TURN_TABLE}.started_at, v.started_at),
                                  {TURN_TABLE}.started_at),
            last_active_at = COALESCE({sql.greatest}({TURN_TABLE}.last_active_at,
                                                     v.last_active_at),
                                      {TURN_TABLE}.last_active_at),
            user_message = COALESCE(NULLIF(v.user_message, ''), {TURN_TABLE}.user_message),
            assistant_response = COALESCE(NULLIF(v.assistant_response, ''),
                                          {TURN_TABLE}.assistant_response),
            context = COALESCE({sql.jsonb("v.context")}, {TURN_TABLE}.context),
            context_window = CASE WHEN v.context_tokens > {TURN_TABLE}.context_tokens
                                  THEN v.context_window
                                  ELSE {TURN_TABLE}.context_window END,
            context_tokens = {sql.greatest}({TURN_TABLE}.context_tokens, v.context_tokens),
            {sums},
            step_count = {TURN_TABLE}.step_count + v.d_steps,
            error_count = {TURN_TABLE}.error_count + v.d_errors,
            {streak_columns}
        FROM v
        WHERE {TURN_TABLE}.id = v.id
        """,
        params,
    )


_BY_TS = attrgetter("ts")


_BY_PROMPT = attrgetter("prompt_tokens")


_STREAK_COLUMNS = ["fail_streak", "fail_peak", "repeat_sig", "repeat_streak", "repeat_peak"]


_TURN_UPDATE_COLUMNS: list[Column] = [
    ("id", "bigint"),
    ("started_at", "timestamptz"),
    ("last_active_at", "timestamptz"),
    ("user_message", "text"),
    ("assistant_response", "text"),
    ("context", "text"),
    *USAGE,
    ("d_steps", "integer"),
    ("d_errors", "integer"),
    ("context_tokens", "bigint"),
    ("context_window", "integer"),
    ("fail_streak", "integer"),
    ("fail_peak", "integer"),
    ("repeat_sig", "bigint"),
    ("repeat_streak", "integer"),
    ("repeat_peak", "integer"),
]
