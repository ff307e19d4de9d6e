"""Storing an export's mapped spans (docs/api.md, "OTLP traces"): their turns numbered
(turns.py), then the steps ingested in bounded chunks, each its own transaction, so one
export never holds the locks of its sessions and rollups for all its spans (issue 31). A
chunk the database cannot take is `OtlpUnavailable`, whose message says how many spans were
stored: the exporter retries the export, its stored spans then duplicates. A chunk that would
take a stored sum out of range is the export's fault: its spans are rejected (partialSuccess
counts them and says why), the other chunks stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from costboard.ingest.otlp.mapping import OtlpMapping
from costboard.ingest.otlp.turns import with_turns
from costboard.ingest.schemas import Event, SessionEvent, StepEvent, SumsOutOfRange
from costboard.ingest.service import events_ingest, step_months_ready
from costboard.ingest.sql import database_outage, ingest_settings
from costboard.ingest.writes.moves import TraceMove
from costboard.models import Project


class OtlpUnavailable(Exception):
    """The database could not take a chunk (down, or a statement past the ingest timeout):
    the export is to be retried, its stored chunks then duplicates."""


def otlp_store(project: Project, mapping: OtlpMapping, key_prefix: str) -> None:
    """Number the spans' turns, then store them in chunks of at most
    COSTBOARD_OTLP_CHUNK_SPANS spans, each its own transaction, so no export holds one
    transaction (and its sessions' and rollups' locks) for all its spans.

    A retried export stores nothing twice: a step's event_id is `otlp:<trace>:<span>`, so a
    stored span is a duplicate (step receipts), and the turns of its traces are found by those
    steps. The chunks go in the order the turns were numbered (each session's new traces by
    their first span), so the traces a failed export left unstored are numbered on the retry
    as they were the first time. Raises OtlpUnavailable naming what was stored."""
    with transaction.atomic(), connection.cursor() as cursor:
        ingest_settings(cursor)  # the numbering's reads under the ingest's statement timeout
        try:
            steps, moves = with_turns(project, mapping)
        except OperationalError as exc:
            if not database_outage(exc):
                raise
            raise OtlpUnavailable(f"{_unavailable(exc)}: nothing stored; retry the export") from exc
    if not steps:
        return
    chunks = _chunks(mapping, steps, moves, settings.COSTBOARD_OTLP_CHUNK_SPANS)
    # their months' partitions made first, each in a transaction of its own (step_months_ready)
    now = timezone.now()
    step_months_ready(steps, now)
    done = 0
    for number, chunk in enumerate(chunks, start=1):
        try:
            events_ingest(
                project=project,
                events=chunk.events,
                now=now,
                key_prefix=key_prefix,
                trace_moves=chunk.moves,
            )
        except SumsOutOfRange as exc:
            # the chunk's fault, not the database's: its spans are rejected (partialSuccess
            # says so, and why), the others stored; a retry would be refused the same way
            mapping.rejected += chunk.spans
            mapping.errors.append(f"{chunk.spans} spans of chunk {number}: {exc}")
            continue
        except OperationalError as exc:
            if not database_outage(exc):
                raise
            raise OtlpUnavailable(
                f"{_unavailable(exc)} in chunk {number} of {len(chunks)}: {done} of "
                f"{len(steps)} spans stored; retry the export (the stored spans are "
                "recognised and not stored again)"
            ) from exc
        done += chunk.spans


def _unavailable(exc: OperationalError) -> str:
    cause = exc.__cause__
    if isinstance(cause, psycopg.errors.QueryCanceled):
        timeout = settings.COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS
        return f"a statement took longer than the ingest's statement timeout ({timeout} ms)"
    return "the database is unavailable"


@dataclass
class _Chunk:
    events: list[Event]
    spans: int
    moves: list[TraceMove]


def _chunks(
    mapping: OtlpMapping, steps: list[StepEvent], moves: list[TraceMove], size: int
) -> list[_Chunk]:
    """The steps (in with_turns's order) in chunks of at most `size`, each starting with a
    session event naming the end user (_session_users) of each session whose first step it
    holds, and carrying the moves (from `system`) of the turns whose first step it holds:
    they are moved in the transaction that stores their turn's span."""
    users = _session_users(mapping, steps)
    move_of = {(move.session_id, move.turn): move for move in moves}
    chunks = []
    seen: set[str] = set()
    for start in range(0, len(steps), size):
        part = steps[start : start + size]
        sessions = {step.session_id for step in part if step.session_id is not None} - seen
        seen |= sessions
        named: list[Event] = [user for user in users if user.session_id in sessions]
        turns = {
            (step.session_id, step.turn)
            for step in part
            if step.session_id is not None and step.turn is not None
        }
        here = [move_of.pop(turn) for turn in sorted(turns & move_of.keys())]
        chunks.append(_Chunk(events=[*named, *part], spans=len(part), moves=here))
    return chunks


def _session_users(mapping: OtlpMapping, steps: list[StepEvent]) -> list[SessionEvent]:
    """A session event setting the end user of each session whose spans name one (`user.id`,
    `llm.user`, …; the latest span's wins). Spans in the `system` session keep their user in
    their step's metadata only: that session is the project's, not one user's."""
    user_of = {span.step.event_id: (span.start_ns, span.user_id) for span in mapping.spans}
    latest: dict[str, tuple[int, str]] = {}
    for step in steps:
        start, user = user_of.get(step.event_id, (0, None))
        if step.session_id is None or not user:
            continue
        if step.session_id not in latest or latest[step.session_id][0] <= start:
            latest[step.session_id] = (start, user)
    return [
        SessionEvent(type="session", session_id=session, user_id=user)
        for session, (_, user) in sorted(latest.items())
    ]
