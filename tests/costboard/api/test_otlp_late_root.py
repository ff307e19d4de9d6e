"""A trace's child spans exported before the root span that names their session
(docs/api.md, "OTLP traces"): OpenTelemetry's batching processor exports spans as they end,
so the calls go out first, without a session, and land in `system`; the root's export then
moves them into its session and turn, with every figure still the sum of its steps."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import Tracer

from costboard.budgets.period_services import period_budget_create
from costboard.ingest.sql import USAGE_COLUMNS
from costboard.models import (
    SYSTEM_SESSION_ID,
    BudgetDay,
    BudgetEvent,
    DailyRollup,
    PeriodLedger,
    Session,
    SessionModelUsage,
    Step,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd
from tests.otlp_spans import CHAT, CHAT_COST, MS, T0, parsed, post_spans, span, spans_of

USAGE = USAGE_COLUMNS  # each figure compared: its token counts and costs
HAIKU_RATES = {"input_mtok": Decimal("0.8"), "output_mtok": Decimal("4")}
HAIKU = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "testco",
    "gen_ai.request.model": "test-haiku",
    "gen_ai.usage.input_tokens": 700,
    "gen_ai.usage.output_tokens": 30,
}
HAIKU_COST = usd(700, HAIKU_RATES["input_mtok"]) + usd(30, HAIKU_RATES["output_mtok"])
# the children carry no session id: only the root names it (and the end user)
CHILD_CHAT = {k: v for k, v in CHAT.items() if k != "gen_ai.conversation.id"}
ROOT = {"gen_ai.conversation.id": "conv-1", "user.id": "alice"}
COST = CHAT_COST + HAIKU_COST
CAP = Decimal("0.002")  # more than the sonnet call's cost, less than the turn's


def agent_turn(tracer: Tracer, *, start: int = T0, session: str = "conv-1") -> None:
    """An agent's turn: a root span naming the session and the user, two LLM calls (one
    failed) and a tool call under it, none of them naming the session."""
    attributes = {**ROOT, "gen_ai.conversation.id": session}
    root = tracer.start_span("invoke_agent", start_time=start, attributes=attributes)
    span(tracer, "chat test-sonnet", CHILD_CHAT, start=start + MS, parent=root)
    span(tracer, "chat test-haiku", HAIKU, start=start + 1600 * MS, parent=root, error="busy")
    span(
        tracer,
        "execute_tool search",
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
        start=start + 1700 * MS,
        ms=250,
        parent=root,
    )
    root.end(end_time=start + 2000 * MS)


def children_and_root(
    build: Callable[[Tracer], object] = agent_turn,
) -> tuple[list[ReadableSpan], list[ReadableSpan]]:
    """The trace's spans as a batching exporter sends them: the children (ended first),
    then the root."""
    spans: list[ReadableSpan] = spans_of(build)
    assert [s.name for s in spans][-1] == "invoke_agent"
    return spans[:-1], spans[-1:]


def priced_agent(slug: str, **project_fields: Any) -> Agent:
    """A project whose session conv-1 is tagged team=a and capped below the turn's cost (so
    its budget is exhausted by the turn's calls together, not by one)."""
    agent = make_agent(slug, **project_fields)
    agent.events(
        {
            "type": "session",
            "session_id": "conv-1",
            "tags": {"team": "a"},
            "cost_cap_usd": str(CAP),
        }
    )
    return agent


@pytest.fixture
def prices(db: None) -> None:
    add_price("test-sonnet")
    add_price("test-haiku", "testco", **HAIKU_RATES)


def usage(row: Any) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in USAGE)


def figures(agent: Agent) -> dict[str, Any]:
    """Every stored figure of the project that a step adds to, keyed without ids."""
    project = agent.project
    sessions = {
        s.external_id: (
            usage(s),
            s.step_count,
            s.error_count,
            s.turn_count,
            s.user_id,
            s.tags,
            s.state,
            s.families,
        )
        for s in Session.objects.filter(project=project)
    }
    turns = {
        (t.session.external_id, t.number): (
            usage(t),
            t.step_count,
            t.error_count,
            t.context_tokens,
            t.fail_peak,
            t.started_at,
            t.last_active_at,
        )
        for t in Turn.objects.filter(project=project).select_related("session")
    }
    mix = {
        (m.session.external_id, m.family, m.model): (m.calls, m.tokens_used, m.cost_usd)
        for m in SessionModelUsage.objects.filter(project=project).select_related("session")
    }
    users = {
        (r.day, r.user_id): (usage(r), r.calls)
        for r in UserDailyRollup.objects.filter(project=project)
    }
    tags = {
        (r.day, r.key, r.value): (usage(r), r.calls)
        for r in TagDailyRollup.objects.filter(project=project)
    }
    daily = {
        (r.day, r.family, r.model, r.step_type): (usage(r), r.calls, r.errors)
        for r in DailyRollup.objects.filter(project=project)
    }
    steps = {
        s.event_id: (s.session.external_id, s.turn.number if s.turn else None, s.user_id, s.tags)
        for s in Step.objects.filter(project=project).select_related("session", "turn")
    }
    events = sorted(
        (e.session.external_id if e.session else "", e.kind, e.at, e.tokens_used, e.cost_usd)
        for e in BudgetEvent.objects.filter(project=project).select_related("session")
    )
    empty_system: tuple[Any, ...] = ((0,) * 5 + (Decimal(0),) * 5, 0, 0, 0, "", {}, "ok")
    if sessions.get(SYSTEM_SESSION_ID, empty_system)[:7] == empty_system:
        sessions.pop(SYSTEM_SESSION_ID, None)  # made by the children, emptied by the root
    return {
        "sessions": sessions,
        "turns": turns,
        "mix": mix,
        "users": users,
        "tags": tags,
        "daily": daily,
        "steps": steps,
        "budget_events": events,
        **period_figures(agent),
    }


def period_figures(agent: Agent) -> dict[str, Any]:
    """The period budgets' ledgers, days and crossings, by budget name (those at zero left
    out: a member the moved steps left), each crossing with its ledger's member."""
    project = agent.project
    ledgers = {
        (row.budget.name, row.period_start, row.member): (
            row.tokens_used,
            row.cost_usd,
            row.state,
            row.warned_at,
            row.exhausted_at,
            row.threshold_crossed,
        )
        for row in PeriodLedger.objects.filter(project=project).select_related("budget")
        if row.tokens_used or row.cost_usd
    }
    days = {
        (d.budget.name, d.day, d.member): (d.tokens_used, d.cost_usd)
        for d in BudgetDay.objects.filter(project=project).select_related("budget")
        if d.tokens_used or d.cost_usd
    }
    recorded = BudgetEvent.objects.filter(project=project, ledger__isnull=False)
    crossings = sorted(
        recorded.values_list(
            "ledger__budget__name",
            "ledger__member",
            "kind",
            "threshold",
            "at",
            "tokens_used",
            "cost_usd",
        )
    )
    return {"ledgers": ledgers, "budget_days": days, "period_crossings": crossings}


def assert_sums_of_steps(agent: Agent) -> None:
    """conv-1's figures are its steps' sums, exactly, and `system` holds none of them."""
    steps = list(Step.objects.filter(project=agent.project))
    session = Session.objects.get(project=agent.project, external_id="conv-1")
    assert len(steps) == 4
    assert all(s.session_id == session.pk for s in steps)
    assert session.cost_usd == sum(s.cost_usd for s in steps) == COST
    assert session.tokens_used == sum(s.input_tokens + s.output_tokens for s in steps) == 880
    assert (session.step_count, session.error_count, session.turn_count) == (4, 1, 1)
    turn = Turn.objects.get(session=session)
    assert all(s.turn_id == turn.pk for s in steps)
    assert (turn.cost_usd, turn.step_count, turn.error_count) == (COST, 4, 1)
    mix = {
        m.model: (m.calls, m.tokens_used, m.cost_usd)
        for m in SessionModelUsage.objects.filter(session=session)
    }
    assert mix == {
        "test-sonnet": (1, 150, CHAT_COST),
        "test-haiku": (1, 730, HAIKU_COST),
        "none": (2, 0, Decimal(0)),
    }
    assert {s.user_id for s in steps} == {"alice"}
    assert all(s.tags == {"team": "a"} for s in steps)
    (user,) = UserDailyRollup.objects.filter(project=agent.project)
    assert (user.user_id, user.cost_usd, user.calls) == ("alice", COST, 4)
    (tag,) = TagDailyRollup.objects.filter(project=agent.project)
    assert (tag.key, tag.value, tag.cost_usd, tag.calls) == ("team", "a", COST, 4)
    system = Session.objects.filter(project=agent.project, external_id=SYSTEM_SESSION_ID).first()
    if system is not None:
        assert (system.cost_usd, system.tokens_used, system.step_count) == (0, 0, 0)
        assert (system.error_count, system.state) == (0, "ok")
        assert not SessionModelUsage.objects.filter(session=system).exists()
    # the session's budget counted the calls: its cap, less than their cost, was reached
    assert COST > CAP > CHAT_COST
    assert session.state == "exhausted"
    kinds = list(BudgetEvent.objects.filter(session=session).values_list("kind", flat=True))
    assert sorted(kinds) == ["exhausted", "soft_warned"]  # each crossing recorded once


def test_the_sdk_exporting_children_then_the_root_stores_the_turn_in_its_session(
    live_server: Any, transactional_db: None
) -> None:
    add_price("test-sonnet")
    add_price("test-haiku", "testco", **HAIKU_RATES)
    split, together = priced_agent("split"), priced_agent("together")
    children, root = children_and_root()
    exporter = OTLPSpanExporter(
        endpoint=live_server.url + "/v1/traces", headers={"x-costboard-key": split.key}
    )
    assert exporter.export(children) == SpanExportResult.SUCCESS
    system = Session.objects.get(project=split.project, external_id=SYSTEM_SESSION_ID)
    assert system.cost_usd == COST  # today's state until the root comes
    assert exporter.export(root) == SpanExportResult.SUCCESS
    exporter.shutdown()
    parsed(post_spans(together, [*children, *root]))

    assert_sums_of_steps(split)
    assert_sums_of_steps(together)
    assert figures(split) == figures(together)


def test_replaying_both_exports_in_any_order_changes_nothing(prices: None) -> None:
    split, together = priced_agent("split"), priced_agent("together")
    children, root = children_and_root()
    parsed(post_spans(split, children))
    parsed(post_spans(split, root))
    parsed(post_spans(together, [*children, *root]))
    assert figures(split) == figures(together)
    before = figures(split)
    for export in (root, children, root, [*root, *children], children):
        parsed(post_spans(split, export))
        assert figures(split) == before
    assert_sums_of_steps(split)


def test_the_root_first_then_the_children_still_join_it(prices: None) -> None:
    split, together = priced_agent("split"), priced_agent("together")
    children, root = children_and_root()
    parsed(post_spans(split, root))
    parsed(post_spans(split, children))
    parsed(post_spans(together, [*children, *root]))
    assert_sums_of_steps(split)
    assert figures(split) == figures(together)


def test_children_exported_one_by_one_then_the_root_all_move(prices: None) -> None:
    split, together = priced_agent("split"), priced_agent("together")
    children, root = children_and_root()
    for child in children:
        parsed(post_spans(split, [child]))
    parsed(post_spans(split, root))
    parsed(post_spans(together, [*children, *root]))
    assert_sums_of_steps(split)
    assert figures(split) == figures(together)


def test_the_root_in_a_later_chunk_of_a_large_export_moves_its_children(
    prices: None, settings: Any
) -> None:
    """The move goes with the chunk that holds the trace's first span of its session."""
    settings.COSTBOARD_OTLP_CHUNK_SPANS = 1
    split, together = priced_agent("split"), priced_agent("together")
    children, root = children_and_root()
    other_children, other_root = children_and_root(
        lambda tracer: agent_turn(tracer, start=T0 + 60_000 * MS)
    )
    parsed(post_spans(split, [*children, *other_children]))
    parsed(post_spans(split, [*other_root, *root]))
    parsed(post_spans(together, [*children, *root, *other_children, *other_root]))
    assert figures(split) == figures(together)
    session = Session.objects.get(project=split.project, external_id="conv-1")
    assert session.cost_usd == sum(s.cost_usd for s in Step.objects.filter(session=session))
    assert session.cost_usd == 2 * COST
    assert Turn.objects.filter(session=session).count() == 2
    assert not Step.objects.filter(session__external_id=SYSTEM_SESSION_ID).exists()


def test_the_system_sessions_budget_no_longer_counts_the_moved_children(prices: None) -> None:
    """`system` exhausted by the children (its own cap) is ok again once they leave it."""
    agent = priced_agent("system-cap", system_cost_cap_usd=Decimal("0.001"))
    children, root = children_and_root()
    parsed(post_spans(agent, children))
    system = Session.objects.get(project=agent.project, external_id=SYSTEM_SESSION_ID)
    assert (system.cost_usd, system.state) == (COST, "exhausted")
    assert system.exhausted_at is not None
    parsed(post_spans(agent, root))
    system.refresh_from_db()
    assert (system.cost_usd, system.state, system.exhausted_at) == (0, "ok", None)
    assert_sums_of_steps(agent)


def test_children_whose_root_never_comes_stay_in_the_system_session(prices: None) -> None:
    agent = priced_agent("orphans")
    children, _ = children_and_root()
    parsed(post_spans(agent, children))
    parsed(post_spans(agent, children))
    system = Session.objects.get(project=agent.project, external_id=SYSTEM_SESSION_ID)
    steps = list(Step.objects.filter(project=agent.project))
    assert len(steps) == 3
    assert all(s.session_id == system.pk and s.turn_id is None for s in steps)
    assert system.cost_usd == sum(s.cost_usd for s in steps) == COST
    assert (system.step_count, system.error_count, system.turn_count) == (3, 1, 0)
    conv = Session.objects.get(project=agent.project, external_id="conv-1")
    assert (conv.cost_usd, conv.step_count, conv.state) == (0, 0, "ok")
    (user,) = UserDailyRollup.objects.filter(project=agent.project)
    assert (user.user_id, user.cost_usd, user.calls) == ("", COST, 3)


def test_a_root_naming_a_session_moves_only_its_own_traces_children(prices: None) -> None:
    agent = priced_agent("two-traces")
    children, root = children_and_root()
    lone_children, _ = children_and_root(lambda tracer: agent_turn(tracer, start=T0 + 60_000 * MS))
    parsed(post_spans(agent, [*children, *lone_children]))
    parsed(post_spans(agent, root))
    session = Session.objects.get(project=agent.project, external_id="conv-1")
    assert session.cost_usd == COST
    system = Session.objects.get(project=agent.project, external_id=SYSTEM_SESSION_ID)
    lone = list(Step.objects.filter(session=system))
    assert {s.event_id for s in lone} == {
        f"otlp:{s.context.trace_id:032x}:{s.context.span_id:016x}" for s in lone_children
    }
    assert system.cost_usd == sum(s.cost_usd for s in lone) == COST
    assert (system.step_count, system.error_count) == (3, 1)
    mix = {m.model: m.calls for m in SessionModelUsage.objects.filter(session=system)}
    assert mix == {"test-sonnet": 1, "test-haiku": 1, "none": 1}
    users = {r.user_id: (r.cost_usd, r.calls) for r in UserDailyRollup.objects.all()}
    assert users == {"": (COST, 3), "alice": (COST, 4)}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_roots_racing_move_the_children_once_beside_other_traffic() -> None:
    """Four exporters send the root at once (a retried export) while two others send the
    children, then the root, of traces of other sessions: the sessions' locks make the later
    roots wait and find the children moved; no deadlock, every figure a sum, once."""
    add_price("test-sonnet")
    add_price("test-haiku", "testco", **HAIKU_RATES)
    split, together = priced_agent("split"), priced_agent("together")
    children, root = children_and_root()
    others = [
        children_and_root(partial(agent_turn, start=T0 + k * MS, session=f"conv-{k}"))
        for k in (2, 3)
    ]
    parsed(post_spans(split, children))

    def work(thread: int) -> None:
        client = Agent(split.project, split.key, split.client.__class__())
        if thread < 4:
            parsed(post_spans(client, root))
        else:
            lone, its_root = others[thread - 4]
            parsed(post_spans(client, lone))
            parsed(post_spans(client, its_root))

    assert run_in_threads(6, work) == []

    parsed(post_spans(together, [*children, *root]))
    for lone, its_root in others:
        parsed(post_spans(together, [*lone, *its_root]))
    assert figures(split) == figures(together)
    for key in ("conv-1", "conv-2", "conv-3"):
        session = Session.objects.get(project=split.project, external_id=key)
        mine = list(Step.objects.filter(session=session))
        assert session.cost_usd == sum(s.cost_usd for s in mine) == COST
        assert (session.step_count, session.turn_count) == (4, 1)
    assert not Step.objects.filter(session__external_id=SYSTEM_SESSION_ID).exists()


BUDGETS = [  # each capped below the trace's cost, above the sonnet call's
    {"name": "alice", "scope": "user", "scope_value": "alice"},
    {"name": "per user", "scope": "user", "scope_value": "*"},
    {"name": "team a", "scope": "tag", "scope_value": "team=a"},
    {"name": "per team", "scope": "tag", "scope_value": "team=*"},
    {"name": "project", "scope": "project"},
]


def budgeted_agent(slug: str) -> Agent:
    """priced_agent with a monthly period budget of each scope, each capped at CAP."""
    agent = priced_agent(slug)
    for fields in BUDGETS:
        period_budget_create(
            project=agent.project, fields={**fields, "cost_limit_usd": str(CAP), "period": "month"}
        )
    return agent


def ledger_of(agent: Agent, name: str, member: str = "") -> PeriodLedger:
    (ledger,) = PeriodLedger.objects.filter(project=agent.project, budget__name=name, member=member)
    return ledger


def test_the_users_and_tags_period_budgets_count_the_moved_children(prices: None) -> None:
    """The children counted toward nobody's user or tag budget in `system` (no user, no
    tags); moved into alice's session tagged team=a, they count toward hers and the tag's,
    exactly as the trace exported whole, each crossing recorded once."""
    split, together = budgeted_agent("split"), budgeted_agent("together")
    children, root = children_and_root()
    parsed(post_spans(split, children))
    assert not PeriodLedger.objects.filter(project=split.project, budget__name="alice").exists()
    assert ledger_of(split, "project").cost_usd == COST
    parsed(post_spans(split, root))
    parsed(post_spans(together, [*children, *root]))

    steps = list(Step.objects.filter(project=split.project))
    assert {s.user_id for s in steps} == {"alice"}
    for name, member in [
        ("alice", ""),
        ("per user", "alice"),
        ("team a", ""),
        ("per team", "a"),
        ("project", ""),
    ]:
        ledger = ledger_of(split, name, member)
        assert ledger.cost_usd == sum(s.cost_usd for s in steps) == COST, name
        assert ledger.tokens_used == 880, name
        assert (ledger.state, ledger.threshold_crossed) == ("exhausted", Decimal("0.8")), name
        kinds = BudgetEvent.objects.filter(ledger=ledger).values_list("kind", "threshold")
        assert sorted(kinds) == [
            ("exhausted", Decimal(0)),
            ("soft_warned", Decimal("0.8")),
            ("threshold", Decimal("0.8")),
        ], name
    assert figures(split) == figures(together)
    before = figures(split)
    for export in (root, children, [*root, *children]):
        parsed(post_spans(split, export))
        assert figures(split) == before


def test_the_moved_children_leave_the_budgets_of_the_user_and_tags_they_had(
    prices: None,
) -> None:
    """`system` of user ops tagged team=ops: the children counted toward ops's and
    team=ops's budgets, exhausting them; moved, they leave those (back to ok, their crossings
    kept: recorded once, never taken back) and count toward alice's and team=a's."""
    split, together = budgeted_agent("split"), budgeted_agent("together")
    Session.objects.create(
        project=split.project, external_id=SYSTEM_SESSION_ID, user_id="ops", tags={"team": "ops"}
    )
    children, root = children_and_root()
    parsed(post_spans(split, children))
    ops = ledger_of(split, "per user", "ops")
    team_ops = ledger_of(split, "per team", "ops")
    for ledger in (ops, team_ops):
        assert (ledger.cost_usd, ledger.tokens_used, ledger.state) == (COST, 880, "exhausted")
    parsed(post_spans(split, root))
    parsed(post_spans(together, [*children, *root]))

    for ledger in (ops, team_ops):
        ledger.refresh_from_db()
        assert (ledger.cost_usd, ledger.tokens_used) == (Decimal(0), 0)
        assert (ledger.state, ledger.exhausted_at, ledger.warned_at) == ("ok", None, None)
        kinds = BudgetEvent.objects.filter(ledger=ledger).values_list("kind", flat=True)
        assert sorted(kinds) == ["exhausted", "soft_warned", "threshold"]
    days = BudgetDay.objects.filter(project=split.project, member="ops")
    assert [(d.tokens_used, d.cost_usd) for d in days] == [(0, Decimal(0))] * 2
    for name, member in [("per user", "alice"), ("per team", "a")]:
        ledger = ledger_of(split, name, member)
        assert (ledger.cost_usd, ledger.tokens_used, ledger.state) == (COST, 880, "exhausted")
    ops_crossings = [c for c in period_figures(split)["period_crossings"] if c[1] == "ops"]
    assert len(ops_crossings) == 6
    mine = period_figures(split)
    mine["period_crossings"] = [c for c in mine["period_crossings"] if c[1] != "ops"]
    assert mine == period_figures(together)
    before = figures(split)
    for export in (root, children, [*root, *children]):
        parsed(post_spans(split, export))
        assert figures(split) == before
