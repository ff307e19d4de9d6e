"""The turn of each OTLP span (docs/api.md, "OTLP traces"): one trace is one turn of its
session, numbered once. A replayed trace keeps the turn an earlier export gave it (found by
its steps' event_ids, `otlp:<trace>:<span>`), a new one takes its session's next number. The
reads run in the numbering's transaction (store.py), under the ingest's statement timeout.
"""

from __future__ import annotations

from collections import defaultdict
from functools import reduce
from operator import attrgetter, itemgetter, or_

from django.db import connection
from django.db.models import Max, Q

from costboard.ingest.otlp.mapping import OtlpMapping
from costboard.ingest.schemas import MAX_TURN, StepEvent
from costboard.ingest.writes.moves import TraceMove
from costboard.models import Project, Session, Step, Turn


def with_turns(project: Project, mapping: OtlpMapping) -> tuple[list[StepEvent], list[TraceMove]]:
    """The steps, each numbered with its trace's turn: the turn an earlier export of the same
    trace got (found by its steps' event_ids, `otlp:<trace>:…`), else the session's next
    turns, in order of the traces' first span. A span without a session id joins the session
    of its trace's earlier steps (exporters send a trace's spans as they end, and tool spans
    rarely carry the conversation id), else the `system` session, without a turn. A trace's
    steps stored so in `system` are moved by the export that names its session (the moves
    returned): into the turn of the session its first span naming one names.
    Replay-safe; two exporters racing on one new trace of a session can at worst split it
    into two turns. A session already at the last turn number (2^31 − 1) takes no new trace:
    its spans are rejected in `mapping`."""
    spans = mapping.spans
    known: dict[tuple[str, str], int] = {}
    home: dict[str, str] = {}  # trace → session, for spans without one
    orphans: dict[str, list[str]] = defaultdict(list)  # trace → its steps in `system`
    for trace, home_session, number, event_id in earlier_turns(
        project, {span.trace_id for span in spans}
    ):
        if number is None:
            orphans[trace].append(event_id)
            continue
        home.setdefault(trace, home_session)
        known.setdefault((home_session, trace), number)

    sessions = [span.step.session_id or home.get(span.trace_id) for span in spans]
    first_start: dict[tuple[str, str], int] = {}
    for span, span_session in zip(spans, sessions, strict=True):
        if span_session is not None:
            key = (span_session, span.trace_id)
            first_start[key] = min(first_start.get(key, span.start_ns), span.start_ns)
    if not first_start:
        return [span.step for span in sorted(spans, key=attrgetter("start_ns"))], []

    session_pks = Session.objects.filter(
        project=project, external_id__in=sorted({s for s, _ in first_start})
    )
    top: dict[str, int] = defaultdict(int)
    for row in (
        Turn.objects.filter(project=project, session__in=session_pks)
        .values("session__external_id")
        .annotate(top=Max("number"))
    ):
        top[row["session__external_id"]] = row["top"] or 0
    full: set[tuple[str, str]] = set()  # (session, trace) without a turn number left
    moves: dict[str, TraceMove] = {}
    for (session, trace), _ in sorted(first_start.items(), key=lambda item: (item[1], item[0])):
        if (session, trace) not in known:
            if top[session] >= MAX_TURN:
                full.add((session, trace))
                continue
            top[session] += 1
            known[(session, trace)] = top[session]
        if trace in orphans and trace not in moves:
            number = known[(session, trace)]
            moves[trace] = TraceMove(session, number, tuple(orphans[trace]))

    # in the order the turns were numbered, a trace's spans as the export has them; a span
    # outside any turn (the system session) by its own start
    steps: list[tuple[tuple[int, str, str, int], StepEvent]] = []
    for n, (span, span_session) in enumerate(zip(spans, sessions, strict=True)):
        if span_session is None:
            steps.append(((span.start_ns, "", span.trace_id, n), span.step))
        elif (span_session, span.trace_id) in full:
            span_id = (span.step.event_id or "?").rsplit(":", 1)[-1]
            mapping.rejected += 1
            mapping.errors.append(
                f"span {span_id}: session {span_session!r} has reached turn {MAX_TURN}, the "
                "last: start a new session (gen_ai.conversation.id)"
            )
        else:
            key = (span_session, span.trace_id)
            step = span.step.model_copy(update={"session_id": span_session, "turn": known[key]})
            steps.append(((first_start[key], span_session, span.trace_id, n), step))
    return [step for _, step in sorted(steps, key=itemgetter(0))], list(moves.values())


# The steps of earlier exports of these traces, with their session and turn (NULL: `system`).
# One statement whatever the number of traces: per trace, a probe of step_otlp_event
# (migration 0009: project_id, event_id varchar_pattern_ops, WHERE event_id LIKE 'otlp:%') for
# the range of its event_ids `otlp:<trace>:…` (';' follows ':'), where one LIKE per trace OR-ed
# together took seconds for 10,000 traces, growing with the table. The lateral subquery is
# ordered as that index is (~<~), so it is run per trace and, with sorting off, by that index
# even where the statistics do not know the project yet (they would take a scan of the
# project's every step per trace: 10,000 traces × 10,000 steps past the statement timeout).
EARLIER_TURNS = f"""
SELECT st.id, t.trace,
    (SELECT external_id FROM {Session._meta.db_table} WHERE id = st.session_id),
    (SELECT number FROM {Turn._meta.db_table} WHERE id = st.turn_id),
    st.event_id
FROM unnest(%s::text[]) AS t(trace)
CROSS JOIN LATERAL (
    SELECT id, session_id, turn_id, event_id FROM {Step._meta.db_table}
    WHERE project_id = %s AND event_id LIKE 'otlp:%%'
      AND event_id ~>=~ ('otlp:' || t.trace || ':') AND event_id ~<~ ('otlp:' || t.trace || ';')
    ORDER BY event_id USING ~<~
) AS st
"""
TRACES_PER_QUERY = 200  # SQLite: the traces OR-ed in one statement


def earlier_turns(project: Project, traces: set[str]) -> list[tuple[str, str, int | None, str]]:
    """(trace, session, turn number, event_id) of each stored step of these traces, in the
    order the steps were stored: among those with a turn, a trace's first row is its home
    session, a (trace, session) pair's first row its turn; those without (number None) are
    in `system`. On PostgreSQL inside a transaction (the numbering's: SET LOCAL)."""
    if not traces:
        return []
    found: list[tuple[int, str, str, int | None, str]] = []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('enable_sort', 'off', true)")
            cursor.execute(EARLIER_TURNS, [sorted(traces), project.pk])
            found = cursor.fetchall()
            cursor.execute("SELECT set_config('enable_sort', 'on', true)")
        return [row[1:] for row in sorted(found)]
    ordered = sorted(traces)
    for start in range(0, len(ordered), TRACES_PER_QUERY):
        chunk = ordered[start : start + TRACES_PER_QUERY]
        of_traces = reduce(or_, (Q(event_id__startswith=f"otlp:{t}:") for t in chunk))
        found += [
            (pk, (event_id or "").split(":")[1], session, number, event_id or "")
            for pk, event_id, session, number in Step.objects.filter(
                Q(event_id__startswith="otlp:") & of_traces, project=project
            ).values_list("id", "event_id", "session__external_id", "turn__number")
        ]
    return [row[1:] for row in sorted(found)]
