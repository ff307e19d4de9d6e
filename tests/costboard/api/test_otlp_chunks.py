"""Large OTLP exports in bounded chunks, and ingest's statement timeout (docs/api.md,
"OTLP traces" and "Limits"): each chunk of at most COSTBOARD_OTLP_CHUNK_SPANS spans is its
own transaction; a chunk the database cannot take answers 503 with Retry-After, the chunks
before it stay stored, and the exporter's retry stores every span exactly once, its turns
numbered as the first attempt numbered them and every rollup and budget equal to the sum of
its steps."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import Client
from google.rpc import status_pb2
from opentelemetry.trace import Tracer

from costboard.budgets.period_services import period_budget_create
from costboard.ingest.otlp import store as otlp_store
from costboard.ingest.otlp.turns import EARLIER_TURNS
from costboard.ingest.schemas import StepEvent
from costboard.ingest.service import events_ingest
from costboard.models import (
    BudgetEvent,
    DailyRollup,
    PeriodLedger,
    Session,
    Step,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from tests.conftest import Agent, add_price, make_agent
from tests.otlp_spans import CHAT, MS, PROTOBUF, T0, parsed, post_spans, span, spans_of

pytestmark = pytest.mark.django_db

on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a statement timeout is PostgreSQL's"
)
SPANS = 10
SESSIONS = ("conv-a", "conv-b", "conv-c")
TOKENS = ("input_tokens", "output_tokens", "cache_read_input_tokens")
MONEY = ("cost_usd",)


def export(tracer: Tracer) -> None:
    """SPANS chat spans, each its own trace (so its own turn), dealt to three sessions with
    a user and a tag each, in time order."""
    for k in range(SPANS):
        session = SESSIONS[k % 3]
        attrs = {
            **CHAT,
            "gen_ai.conversation.id": session,
            "user.id": f"user-{session}",
            "costboard.tag.team": f"team-{k % 2}",
        }
        span(tracer, "chat test-sonnet", attrs, start=T0 + k * 10 * MS, ms=5)


@pytest.fixture
def chunked(agent: Agent, settings: Any) -> Agent:
    add_price("test-sonnet")
    settings.COSTBOARD_OTLP_CHUNK_SPANS = 2  # 10 spans: 5 chunks
    return agent


@contextmanager
def chunk_fails(monkeypatch: pytest.MonkeyPatch, number: int) -> Iterator[list[int]]:
    """Chunk `number` of the next export meets a database that cannot take it (an outage, as
    the driver reports a lost connection); the others go through. Yields each chunk's spans."""
    real = events_ingest  # what the store calls, from the ingest service
    sizes: list[int] = []

    def ingest(**kwargs: Any) -> Any:
        sizes.append(sum(isinstance(e, StepEvent) for e in kwargs["events"]))
        if len(sizes) == number:
            raise OperationalError("server closed the connection unexpectedly")
        return real(**kwargs)

    monkeypatch.setattr(otlp_store, "events_ingest", ingest)
    yield sizes
    monkeypatch.setattr(otlp_store, "events_ingest", real)


def unavailable(response: Any) -> str:
    """The message of a 503 with Retry-After and a google.rpc.Status UNAVAILABLE body."""
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert response["Content-Type"] == PROTOBUF
    status = status_pb2.Status()
    status.ParseFromString(response.content)
    assert status.code == 14  # UNAVAILABLE: OTLP exporters retry it
    return status.message


def turns_of(agent: Agent) -> dict[str, tuple[str, int]]:
    """Each stored step's span → its session and turn number."""
    rows = Step.objects.filter(project=agent.project).values_list(
        "event_id", "session__external_id", "turn__number"
    )
    return {str(event_id).rsplit(":", 1)[1]: (session, turn) for event_id, session, turn in rows}


def sums(rows: Any) -> dict[str, Any]:
    totals: dict[str, Any] = {name: 0 for name in (*TOKENS, *MONEY)}
    for row in rows:
        for name in totals:
            totals[name] += getattr(row, name)
    return totals


def assert_rollups_equal_their_steps(agent: Agent) -> None:
    project = agent.project
    steps = list(Step.objects.filter(project=project).select_related("session"))
    event_ids = [s.event_id for s in steps]
    assert len(event_ids) == len(set(event_ids)) == SPANS  # every span, once
    for session in Session.objects.filter(project=project):
        mine = [s for s in steps if s.session_id == session.pk]
        assert sums([session]) == sums(mine)
        assert session.step_count == len(mine)
        assert session.turn_count == Turn.objects.filter(session=session).count() == len(mine)
        assert session.user_id == f"user-{session.external_id}"
    for turn in Turn.objects.filter(project=project):
        mine = [s for s in steps if s.turn_id == turn.pk]
        assert sums([turn]) == sums(mine) and turn.step_count == len(mine) == 1
    assert sums(DailyRollup.objects.filter(project=project)) == sums(steps)
    assert sum(r.calls for r in DailyRollup.objects.filter(project=project)) == SPANS
    by_user: dict[str, list[Step]] = defaultdict(list)
    by_tag: dict[tuple[str, str], list[Step]] = defaultdict(list)
    for step in steps:
        by_user[step.session.user_id].append(step)
        for key, value in (step.tags or {}).items():
            by_tag[(key, value)].append(step)
    users = UserDailyRollup.objects.filter(project=project)
    assert {r.user_id: (sums([r]), r.calls) for r in users} == {
        user: (sums(mine), len(mine)) for user, mine in by_user.items()
    }
    tags = TagDailyRollup.objects.filter(project=project)
    assert {(r.key, r.value): (sums([r]), r.calls) for r in tags} == {
        tag: (sums(mine), len(mine)) for tag, mine in by_tag.items()
    }


def test_a_large_export_is_stored_in_chunks_each_its_own_transaction(
    transactional_db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_price("test-sonnet")
    agent = make_agent("chunks")
    settings.COSTBOARD_OTLP_CHUNK_SPANS = 3
    real = events_ingest  # what the store calls, from the ingest service
    calls: list[tuple[int, bool]] = []  # each chunk's spans; whether a transaction was open

    def ingest(**kwargs: Any) -> Any:
        steps = sum(isinstance(e, StepEvent) for e in kwargs["events"])
        calls.append((steps, connection.in_atomic_block))
        return real(**kwargs)

    monkeypatch.setattr(otlp_store, "events_ingest", ingest)
    assert parsed(post_spans(agent, spans_of(export))).partial_success.rejected_spans == 0
    # 3 + 3 + 3 + 1 spans, none inside a transaction another chunk shares
    assert calls == [(3, False), (3, False), (3, False), (1, False)]
    assert_rollups_equal_their_steps(agent)


def test_a_retry_after_chunk_3_of_5_failed_stores_every_span_once(
    chunked: Agent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 150 tokens a span: warned at 560 (in chunk 2), exhausted at 700 (in chunk 3)
    budget = period_budget_create(
        project=chunked.project,
        fields={"name": "all time", "period": "total", "token_limit": 700, "action": "warn"},
    )
    spans = spans_of(export)
    with chunk_fails(monkeypatch, 3) as sizes:
        message = unavailable(post_spans(chunked, spans))
    assert sizes == [2, 2, 2]
    assert message == (
        "the database is unavailable in chunk 3 of 5: 4 of 10 spans stored; retry the export "
        "(the stored spans are recognised and not stored again)"
    )
    # the operator is told too: which project, what the database did
    [warning] = [r.getMessage() for r in caplog.records if r.name == "costboard.api.otlp"]
    assert warning == f"OTLP export for project {chunked.project.slug} answered 503: {message}"
    # the first two chunks stayed, whole: their steps, sessions and budget
    assert Step.objects.filter(project=chunked.project).count() == 4
    ledger = PeriodLedger.objects.get(budget=budget)
    assert (ledger.tokens_used, ledger.state) == (600, "warning")

    answer = parsed(post_spans(chunked, spans))  # the exporter's retry
    assert answer.partial_success.rejected_spans == 0
    assert_rollups_equal_their_steps(chunked)
    steps = Step.objects.filter(project=chunked.project)
    ledger.refresh_from_db()
    assert ledger.tokens_used == sum(s.input_tokens + s.output_tokens for s in steps) == 1500
    assert ledger.cost_usd == sum((s.cost_usd for s in steps), Decimal(0))
    assert ledger.state == "exhausted"
    # each crossing decided once, in the chunk that made it, never again on the retry
    events = BudgetEvent.objects.filter(ledger__budget=budget)
    assert Counter(e.kind for e in events) == {"soft_warned": 1, "threshold": 1, "exhausted": 1}

    # the turns are numbered as one clean export of the same spans numbers them
    clean = make_agent("clean")
    assert parsed(post_spans(clean, spans)).partial_success.rejected_spans == 0
    assert turns_of(chunked) == turns_of(clean)
    assert sorted(n for _, n in turns_of(chunked).values()) == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]


def test_a_session_first_met_in_a_later_chunk_gets_its_user_there(
    chunked: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session event naming a session's user goes with the chunk holding its first
    step: a session of the unstored chunks is not made (userless, stepless) by chunk 1."""

    def late_session(tracer: Tracer) -> None:
        export(tracer)
        attrs = {**CHAT, "gen_ai.conversation.id": "conv-late", "user.id": "late"}
        span(tracer, "chat", attrs, start=T0 + 1000 * MS)

    with chunk_fails(monkeypatch, 6):
        unavailable(post_spans(chunked, spans_of(late_session)))
    assert Session.objects.filter(project=chunked.project).count() == 3
    assert not Session.objects.filter(external_id="conv-late").exists()


def test_a_failure_before_any_chunk_is_stored_says_nothing_was(
    chunked: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    with chunk_fails(monkeypatch, 1):
        message = unavailable(post_spans(chunked, spans_of(export)))
    assert "in chunk 1 of 5: 0 of 10 spans stored" in message
    assert not Step.objects.filter(project=chunked.project).exists()


@contextmanager
def row_locked(table: str, pk: int) -> Iterator[None]:
    """Another connection holds a row lock on table's row `pk` until the block ends, as a
    long transaction of another client would (at most 10 s: without a timeout of its own,
    ingest then goes on rather than waiting for ever)."""
    other = connection.get_new_connection(connection.get_connection_params())
    try:
        with other.cursor() as cursor:
            cursor.execute("SET idle_in_transaction_session_timeout = '10s'")
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [pk])  # noqa: S608 — a model table
        yield
    finally:
        if not other.closed:
            other.rollback()
            other.close()


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_a_chunk_past_the_statement_timeout_is_503_and_the_retry_completes(
    settings: Any,
) -> None:
    add_price("test-sonnet")
    agent = make_agent("timeout")
    settings.COSTBOARD_OTLP_CHUNK_SPANS = 2
    settings.COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS = 200
    # conv-c's first span is the export's third: it is met in chunk 2
    agent.events({"type": "session", "session_id": "conv-c"})
    late = Session.objects.get(project=agent.project, external_id="conv-c")
    spans = spans_of(export)
    with row_locked(Session._meta.db_table, late.pk):
        message = unavailable(post_spans(agent, spans))
    assert message == (
        "a statement took longer than the ingest's statement timeout (200 ms) in chunk 2 of "
        "5: 2 of 10 spans stored; retry the export (the stored spans are recognised and not "
        "stored again)"
    )
    # chunk 2 rolled back whole: no step of it, no turn, no usage on its sessions
    assert Step.objects.filter(project=agent.project).count() == 2
    assert Turn.objects.filter(project=agent.project).count() == 2
    late.refresh_from_db()
    assert (late.step_count, late.turn_count, late.tokens_used) == (0, 0, 0)

    assert parsed(post_spans(agent, spans)).partial_success.rejected_spans == 0
    assert_rollups_equal_their_steps(agent)


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_an_events_batch_past_the_statement_timeout_is_503_and_stores_nothing(
    settings: Any,
) -> None:
    add_price("test-sonnet")
    agent = make_agent("timeout")
    settings.COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS = 200
    step = {"session_id": "s", "step_type": "x", "model": "test-sonnet", "input_tokens": 10}
    agent.events(step)
    session = Session.objects.get(project=agent.project, external_id="s")
    client = Client(raise_request_exception=False)  # as a server answers: the handler's 503
    with row_locked(Session._meta.db_table, session.pk):
        response = client.post(
            "/api/v1/events",
            {"events": [step, {**step, "session_id": "other"}]},
            content_type="application/json",
            headers={"Authorization": f"Bearer {agent.key}"},
        )
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["errors"][0]["field"] == "database"
    assert Step.objects.filter(project=agent.project).count() == 1
    assert not Session.objects.filter(external_id="other").exists()
    assert agent.post({"events": [step]}).status_code == 200


@on_postgres
def test_earlier_turns_probe_the_otlp_index_per_trace_even_for_a_project_new_to_the_statistics(
    chunked: Agent,
) -> None:
    """The numbering's lookup of earlier exports' steps is one range probe of step_otlp_event
    per trace, never a read of the project's steps compared with every trace: the planner
    takes the project for empty (it is new since the last ANALYZE), where any plan looks
    cheap."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # before the project has any step
    assert parsed(post_spans(chunked, spans_of(export))).partial_success.rejected_spans == 0
    traces = sorted({str(s.event_id).split(":")[1] for s in Step.objects.all()})
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('enable_sort', 'off', true)")
        cursor.execute(
            f"EXPLAIN (ANALYZE, COSTS OFF) {EARLIER_TURNS}", [traces, chunked.project.pk]
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Join Filter" not in plan and "Materialize" not in plan, plan
    probes = [line for line in plan.splitlines() if "Index Cond" in line and "~>=~" in line]
    assert probes, plan
    assert f"loops={SPANS}" in plan


# A rate the rate table takes ($400,000 a million output tokens) at the API's most tokens a
# step (10^12): $4·10^11 a span, so a third in one session or day passes numeric(24, 12).
DEAR_OUTPUT_MTOK = Decimal(400_000)
HUGE = 10**12


def dear(tracer: Tracer, session: str, k: int, model: str = "dear-model") -> None:
    attrs = {
        **CHAT,
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.conversation.id": session,
        "gen_ai.usage.input_tokens": 0,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "gen_ai.usage.cache_creation.input_tokens": 0,
        "gen_ai.usage.output_tokens": HUGE if model == "dear-model" else 50,
    }
    span(tracer, f"chat {model}", attrs, start=T0 + k * 10 * MS, ms=5)


@on_postgres
def test_a_chunk_past_the_sums_is_rejected_and_the_others_stored(
    agent: Agent, settings: Any
) -> None:
    add_price("dear-model", output_mtok=DEAR_OUTPUT_MTOK)
    add_price("test-sonnet")
    settings.COSTBOARD_OTLP_CHUNK_SPANS = 2

    def build(tracer: Tracer) -> None:
        for k in range(4):  # conv-a: chunk 1 ($8·10^11) stored, chunk 2 would pass 10^12
            dear(tracer, "conv-a", k)
        for k in range(4, 6):  # conv-b, another model: chunk 3, stored
            dear(tracer, "conv-b", k, model="test-sonnet")

    spans = spans_of(build)
    for attempt in range(2):  # the exporter's retry: refused the same way, nothing twice
        answer = parsed(post_spans(agent, spans))
        assert answer.partial_success.rejected_spans == 2, attempt
        message = answer.partial_success.error_message
        assert "2 spans of chunk 2: the batch would take a stored sum past" in message
        assert Step.objects.count() == 4
    conv_a = Session.objects.get(external_id="conv-a")
    step_cost = HUGE * DEAR_OUTPUT_MTOK / 1_000_000
    assert (
        conv_a.cost_usd
        == 2 * step_cost
        == sum(Step.objects.filter(session=conv_a).values_list("cost_usd", flat=True))
    )
    assert Session.objects.get(external_id="conv-b").step_count == 2
