"""`events_ingest`: a validated batch → stored, priced, rolled up, budgets decided.

One transaction, a fixed number of statements whatever the batch size:

1. find which sessions are missing (a read that locks nothing) and create them (an insert
   that skips any made meanwhile), then lock all touched ones in key order (so concurrent
   batches lock in the same order) and read their totals and caps as they are now;
2. record the event_ids of session and turn events (replays are skipped);
3. read the touched turns and reserve ids for the missing ones (their sessions' locks keep
   them to this batch);
4. record the steps' event_ids as receipts (one table keyed (project, event_id), beside the
   month partitions: a replay is skipped whatever month its timestamp is in, and a
   concurrent replay waits on the key and is counted once) and insert the fresh steps (on
   PostgreSQL into their month partitions, made before the transaction if missing), and move
   the stored `system` steps of the OTLP traces this batch names a session for into their
   session and turn (`trace_moves`, writes/moves.py: from here on read beside the inserted
   steps, and taken out of `system`'s sums, model mix and user and tag rollups, and out of
   the user and tag period budgets they counted toward there (into those they count toward
   now, step 6); never counted again in the daily rollups, the latency histograms, the
   tally or the project's and keys' period budgets, which counted them once already); then
   write each touched turn once — an update of those found, an insert of the new ones with
   their final values: the inserted steps' sums, its messages, and its retry-loop streaks
   advanced over those steps, checking the per-turn runaway rules (turn_rules);
5. add the inserted steps to their sessions' per-model usage (the model mix: rows of
   sessions this batch holds locked, so no other batch waits on them);
6. ask the budgets, once (costboard/budgets/batch.py, `batch_budgets`): every session's
   caps and the budget engine's decision (state, crossings, runaway flag), the period
   budgets the steps count toward, the stop verdict; their crossings recorded as
   BudgetEvents and announced;
7. write each touched session once: the inserted steps' sums and the new turns, with its
   budget as decided, returning the sessions' new state for the response;
8. add the inserted steps to the daily rollups and the latency histograms, with their users'
   and tags' daily rollups, and the batch's events to the project's ingest tally (/metrics)
   — the hottest rows, touched last so their locks are short. Every caller's events are
   counted (the API's, OTLP's, the demo's), once.

Everything is priced in Python before the transaction begins (a cached rate table), and each
step given its model family (costboard/pricing/families.py); a step without a model (a tool
call, a retrieval: model `none`) is never priced and never counted unpriced. On
PostgreSQL every statement carries its rows as one typed array per column, unnested, with
server-side binding: the SQL text is the same for every batch and nothing is interpolated.
Numbers and plain text go as array literals, a column of NULLs as an empty array (unnest
pads it): cheaper to build than psycopg's binary arrays, element by element in Python.

This module only orchestrates, and answers. The modules it calls, each with one job: plan.py
(pricing and the touches, before the transaction), sql.py (the usage columns and the
transaction's settings; the dialect and the arrays are costboard/sql_arrays.py's), writes/
(receipts, sessions, turns, steps: each row written once) and rollups.py (the shared sums,
run last); the budgets answer one question, costboard/budgets/batch.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from costboard.budgets.batch import BatchSpend, StepMoved, batch_budgets
from costboard.budgets.caps import SessionBudget
from costboard.hooks import Ingested, after_ingest_run
from costboard.ingest.plan import (
    SessionTouch,
    batch_plan,
    other_events_apply,
    step_tags,
    touches_retime,
    touches_widen,
    utc_at,
)
from costboard.ingest.rollups import (
    attribution_statements,
    hot_run,
    hot_statements,
    model_usage_upsert,
)
from costboard.ingest.schemas import Event, SessionEvent, StepEvent, TurnEvent
from costboard.ingest.sql import ingest_settings, sums_in_range
from costboard.ingest.writes.moves import MovedStep, TraceMove, steps_move
from costboard.ingest.writes.receipts import receipts_insert
from costboard.ingest.writes.sessions import session_spends, sessions_lock, sessions_update
from costboard.ingest.writes.steps import steps_insert
from costboard.ingest.writes.turns import turns_ensure, turns_replayed_drop, turns_update
from costboard.models import SYSTEM_SESSION_ID, BudgetEvent, Project
from costboard.partitions import step_default_hold, step_partitions_cover
from costboard.projects import ingest_tally_statement
from costboard.sql_arrays import Dialect


@dataclass
class IngestResult:
    accepted: int
    duplicates: int
    sessions: dict[str, SessionBudget]
    budget_events: list[BudgetEvent] = field(default_factory=list)
    # the period budgets the batch touched, each in the period it touched (`<period budget>`)
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # touched sessions left out of `sessions` because they may go on (flagged_only)
    sessions_ok: int = 0


def step_months_ready(events: Sequence[Event], now: datetime) -> None:
    """Make the month partitions these events' steps go to (PostgreSQL), each in a
    transaction of its own. events_ingest does this itself before its transaction; a caller
    that holds a batch in a transaction of its own (an Idempotency-Key's, a whole OTLP
    request's) calls this first, with the `now` it then gives events_ingest. Made inside the
    caller's transaction, a partition's locks would be held to its end: a batch of the same
    sessions would lock them and wait on the new partition, and this one then on them — a
    deadlock, one of the two lost."""
    if connection.vendor != "postgresql":
        return
    days = {utc_at(event, now).date() for event in events if isinstance(event, StepEvent)}
    if days:
        step_partitions_cover(days=days, now=now)


def events_ingest(
    *,
    project: Project,
    events: list[Event],
    now: datetime | None = None,
    key_prefix: str = "",
    flagged_only: bool = False,
    trace_moves: Sequence[TraceMove] = (),
) -> IngestResult:
    """Store a validated batch all or nothing; see the module docstring for the statements.
    `key_prefix`: the API key that sent it (its api_key budgets count it). `flagged_only`:
    answer only for the touched sessions that are not ok (`Prefer: return=minimal`), the
    others counted in `sessions_ok`. `trace_moves` (OTLP's): stored steps of `system` to
    move into the turns of this batch's traces, with their sums (writes/moves.py)."""
    now = now or timezone.now()
    sessions, turns, steps, others, duplicates = batch_plan(events, now, project)
    moves = [move for move in trace_moves if (move.session_id, move.turn) in turns]
    if moves and SYSTEM_SESSION_ID not in sessions:
        # locked with the batch's sessions, in key order; its times left as they are
        sessions[SYSTEM_SESSION_ID] = SessionTouch(SYSTEM_SESSION_ID, now, now, timed=False)
    sql = Dialect()
    hot = hot_statements(sql, project, steps)
    if steps and sql.postgres:
        step_partitions_cover(days={step.day for step in steps}, now=now)

    with sums_in_range(len(events)), transaction.atomic(), sql.cursor() as cursor:
        ingest_settings(cursor)
        if steps and sql.postgres:
            step_default_hold(cursor, days={step.day for step in steps}, now=now)
        rows, sessions_made = sessions_lock(cursor, sql, project, sessions)
        accepted_others, dup_others = receipts_insert(cursor, sql, project, others, now)
        duplicates += dup_others
        other_events_apply(accepted_others, sessions, turns, now)
        session_ids = {key: row["id"] for key, row in rows.items()}
        session_tags = _session_tags(rows, sessions)
        turns_now = turns_ensure(cursor, sql, project, session_ids, turns)
        turn_ids = {key: turn.id for key, turn in turns_now.items()}
        users = _users_of(rows, sessions)
        inserted = steps_insert(
            cursor, sql, project, session_ids, turn_ids, steps, session_tags, users
        )
        if len(inserted) < len(steps):
            duplicates += len(steps) - len(inserted)
            hot = hot_statements(sql, project, inserted)
        moved = steps_move(cursor, sql, project, moves, session_ids, turn_ids, session_tags, users)
        moved_steps = [m.step for m in moved]
        if len(inserted) < len(steps) or dup_others:
            made = {key for key, turn in turns_now.items() if turn.new}
            timed = [*inserted, *moved_steps]
            named = touches_retime(sessions, turns, accepted_others, timed, now, made=made)
            turns_replayed_drop(turns_now, turns, named)
        touches_widen(sessions, turns, moved_steps)
        runaways = turns_update(
            cursor, sql, project, session_ids, turns_now, turns, [*inserted, *moved_steps]
        )
        model_usage_upsert(cursor, sql, project, session_ids, inserted, moved)
        hot += attribution_statements(sql, project, inserted, users, session_tags, moved)
        adds = session_spends(rows, sessions, inserted, runaways, now, moved_steps)
        verdict = batch_budgets(
            BatchSpend(
                project=project,
                sessions=[add.spend for add in adds.values()],
                steps=inserted,
                key_prefix=key_prefix,
                user_of=users,
                step_tags=lambda step: step_tags(step, session_tags),
                session_tags=session_tags,
                now=now,
                moved=[_moved_spend(m, users, session_tags) for m in moved],
            )
        )
        new_turns = Counter(turn.session_key for turn in turns_now.values() if turn.new)
        touched = sessions_update(cursor, sql, rows, sessions, adds, verdict.ledgers, new_turns)
        after_ingest_run(Ingested(project, _turns_with_text(accepted_others, turn_ids)))
        accepted = len(others) - dup_others + len(inserted)
        day = now.astimezone(UTC).date()
        hot.append(
            ingest_tally_statement(
                project.pk,
                day,
                accepted=accepted,
                duplicates=duplicates,
                sessions_made=sessions_made,
            )
        )
        hot_run(cursor, hot)
    answer = verdict.answer(touched, flagged_only=flagged_only)
    return IngestResult(
        accepted=accepted,
        duplicates=duplicates,
        sessions=answer.sessions,
        budget_events=verdict.events,
        budgets=answer.budgets,
        sessions_ok=answer.sessions_ok,
    )


def _moved_spend(
    moved: MovedStep, users: dict[str, str], session_tags: dict[str, dict[str, str]]
) -> StepMoved:
    """A moved step as the period budgets match it: by the user and tags it had in `system`,
    and by those it has now (its session's user; its tags as steps_move stored them)."""
    step = moved.step
    return StepMoved(
        step_id=moved.step_id,
        step=step,
        user_before=moved.old_user,
        tags_before=moved.old_tags,
        user_after=users[step.session_key],
        tags_after=step_tags(step, session_tags),
    )


def _users_of(rows: dict[str, dict[str, Any]], sessions: dict[str, SessionTouch]) -> dict[str, str]:
    """Each touched session's end user as it stands after this batch ("" for none)."""
    return {
        key: touch.user_id if touch.user_id is not None else rows[key]["user_id"]
        for key, touch in sessions.items()
    }


def _session_tags(
    rows: dict[str, dict[str, Any]], sessions: dict[str, SessionTouch]
) -> dict[str, dict[str, str]]:
    """Each touched session's tags after this batch's session events (theirs merged over the
    stored ones): what its steps carry, under their own."""
    tags = {}
    for key, row in rows.items():
        given = sessions[key].tags
        merged = {**row["tags"], **given} if given else row["tags"]
        if merged:
            tags[key] = merged
    return tags


def _turns_with_text(
    events: list[SessionEvent | TurnEvent], turn_ids: dict[tuple[str, int], int]
) -> list[int]:
    """The turns whose text arrived in this batch (for memory detection, after commit)."""
    return sorted(
        {
            turn_ids[(event.session_id, event.turn)]
            for event in events
            if isinstance(event, TurnEvent) and (event.user_message or event.assistant_response)
        }
    )
