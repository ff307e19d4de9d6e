"""Steps moved out of the `system` session into the session and turn of their trace
(docs/api.md, "OTLP traces"): an OTLP exporter sends a trace's spans as they end, so its
calls often arrive before the span that names their session and are stored in `system`
without a turn; the batch that brings that span moves them (`steps_move`). Two statements
whatever their number: a locking read, then one update. What they added to `system` is then
taken out of it and added to their session, turn and rollups by the batch's own writes, which
read the moved steps beside the inserted ones (costboard/ingest/service.py), and out of the
user and tag period budgets they counted toward there into those they count toward now
(costboard/budgets/period_ledgers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

from costboard.ingest.plan import PricedStep, step_tags
from costboard.ingest.sql import USAGE_COLUMNS, json_text
from costboard.ingest.turn_rules import step_signature
from costboard.models import SYSTEM_SESSION_ID, Project, Step
from costboard.pricing.families import is_tool_model
from costboard.pricing.rates import audio_of, pico, rate_table
from costboard.sql_arrays import Dialect

STEP_TABLE = Step._meta.db_table


@dataclass(frozen=True, slots=True)
class TraceMove:
    """The steps of a trace stored in `system` without a turn (by event_id), to move into
    the trace's turn `turn` of `session_id`: the batch holds a step of that turn."""

    session_id: str
    turn: int
    event_ids: tuple[str, ...]


@dataclass(slots=True)
class MovedStep:
    """A step moved: its id, as it now is (`step`: its new session and turn, its own tags),
    and the user and tags it was rolled up and counted under in `system`."""

    step_id: int
    step: PricedStep
    old_user: str
    old_tags: dict[str, str] | None


_READ = (
    "id",
    "event_id",
    "timestamp",
    "step_type",
    "model",
    "family",
    "provider",
    "service_tier",
    *USAGE_COLUMNS,  # its five token counts, then its five costs, in Totals' order
    "cache_creation_1h_input_tokens",
    "input_audio_tokens",
    "cache_audio_read_tokens",
    "output_audio_tokens",
    "success",
    "error",
    "duration_ms",
    "price_id",
    "user_id",
    "tags",
)


def steps_move(
    cursor: Any,
    sql: Dialect,
    project: Project,
    moves: list[TraceMove],
    session_ids: dict[str, int],
    turn_ids: dict[tuple[str, int], int],
    session_tags: dict[str, dict[str, str]],
    users: dict[str, str],
) -> list[MovedStep]:
    """Move the steps these moves name that are still in `system` without a turn (a
    concurrent batch may have moved them: its session locks make this one wait, and its read
    then finds them gone) into their trace's session and turn, each with that session's user
    and tags under its own. `system` and the sessions are locked by the caller, and every
    writer of a session's steps holds its lock, so the rows read are the rows updated."""
    system_id = session_ids.get(SYSTEM_SESSION_ID)
    moves = [m for m in moves if (m.session_id, m.turn) in turn_ids]
    if system_id is None or not moves:
        return []
    target = {event_id: move for move in moves for event_id in move.event_ids}
    found = list(
        Step.objects.select_for_update(of=("self",))
        .filter(
            project=project, session_id=system_id, turn__isnull=True, event_id__in=sorted(target)
        )
        .order_by("event_id")
        .values_list(*_READ)
    )
    if not found:
        return []
    windows = rate_table().windows
    system_tags = session_tags.get(SYSTEM_SESSION_ID, {})
    system_user = users.get(SYSTEM_SESSION_ID, "")
    moved: list[MovedStep] = []
    values: list[list[Any]] = []
    for row in found:
        values_of = dict(zip(_READ, row, strict=True))
        move = target[values_of["event_id"]]
        stored_tags: dict[str, str] | None = values_of["tags"] or None
        # its own tags: those its `system` session did not give it
        own = {k: v for k, v in (stored_tags or {}).items() if system_tags.get(k) != v} or None
        step = _priced(values_of, move, own, windows)
        old_user = values_of["user_id"] or system_user
        moved.append(MovedStep(values_of["id"], step, old_user, stored_tags))
        values.append(
            [
                values_of["id"],
                sql.dt(step.ts),
                session_ids[move.session_id],
                turn_ids[(move.session_id, move.turn)],
                users[move.session_id],
                json_text(step_tags(step, session_tags)),
            ]
        )
    with_v, params = sql.rows(
        [
            ("id", "bigint"),
            ("ts", "timestamptz"),
            ("session_id", "bigint"),
            ("turn_id", "bigint"),
            ("user_id", "text"),
            ("tags", "text"),
        ],
        values,
    )
    # on PostgreSQL the time beside the id picks each step's month partition
    month = f'AND {STEP_TABLE}."timestamp" = v.ts' if sql.postgres else ""
    cursor.execute(
        f"""
        {with_v}
        UPDATE {STEP_TABLE} SET session_id = v.session_id, turn_id = v.turn_id,
            user_id = v.user_id, tags = {sql.jsonb("v.tags")}
        FROM v
        WHERE {STEP_TABLE}.id = v.id {month}
        """,
        params,
    )
    return moved


def _priced(
    row: dict[str, Any], move: TraceMove, tags: dict[str, str] | None, windows: dict[int, int]
) -> PricedStep:
    """A stored step as ingest prices one (plan._step), in its new session and turn."""
    price_id, model = row["price_id"], row["model"]
    ts = row["timestamp"].astimezone(UTC)
    counts = (
        *(row[name] for name in USAGE_COLUMNS[:5]),
        *(pico(row[name]) for name in USAGE_COLUMNS[5:]),  # 12 decimal places: exact
        0 if row["success"] else 1,
        1 if price_id is None and not is_tool_model(model) else 0,
        row["duration_ms"] or 0,
    )
    inp, read, write = counts[0], counts[2], counts[3]
    return PricedStep(
        move.session_id,
        move.turn,
        row["event_id"],
        ts,
        ts.date(),
        row["step_type"],
        model,
        row["family"],
        row["provider"],
        row["service_tier"],
        row["duration_ms"],
        row["success"],
        row["error"],
        None,
        tags,
        price_id,
        row["cache_creation_1h_input_tokens"],
        audio_of(
            row["input_audio_tokens"] or 0,
            row["cache_audio_read_tokens"] or 0,
            row["output_audio_tokens"] or 0,
        ),
        counts,
        windows.get(price_id) if price_id is not None else None,
        step_signature(row["step_type"], model, inp + read + write),
    )
