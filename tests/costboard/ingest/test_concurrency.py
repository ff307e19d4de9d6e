"""Concurrent ingest loses no count and records each crossing once.

Each thread has its own database connection and posts through the real view; on PostgreSQL
(CI) the requests really interleave, on SQLite they queue for the database lock.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from costboard.dashboards.selectors.sessions import sessions_total
from costboard.models import BudgetEvent, DailyRollup, Session, Step
from costboard.projects import sessions_tally_check
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_sixteen_threads_across_warning_and_cap_lose_nothing() -> None:
    agent = make_agent("busy")
    add_price("test-sonnet")
    # 16 threads × 5 batches × 5 steps = 400 steps of 100 tokens = 40,000 tokens against a
    # 30,000 cap: the warning (24,000) and the cap are both crossed while threads race.
    agent.events({"type": "session", "session_id": "hot", "token_cap": 30_000})
    states: list[str] = []

    def work(thread: int) -> None:
        for batch in range(5):
            events = [
                {
                    "session_id": "hot",
                    "turn": thread + 1,
                    "step_type": "response",
                    "model": "test-sonnet",
                    # 50…70 input tokens: a growing prompt, not one step retried (a runaway)
                    "input_tokens": 50 + 5 * i,
                    "output_tokens": 40,
                    "cache_read_input_tokens": 1000,
                    "event_id": f"t{thread}-b{batch}-s{i}",
                }
                for i in range(5)
            ]
            body = Agent(agent.project, agent.key, agent.client.__class__()).events(*events)
            states.append(body["sessions"]["hot"]["state"])

    assert run_in_threads(16, work) == []

    session = Session.objects.get(external_id="hot")
    assert session.step_count == 400
    assert session.tokens_used == 40_000
    assert session.cache_read_input_tokens == 400_000
    per_step = usd(60, Decimal(3)) + usd(40, Decimal(15)) + usd(1000, Decimal("0.3"))
    assert session.cost_usd == per_step * 400
    assert session.turn_count == 16
    assert session.state == "exhausted"
    assert session.runaway_at is None
    kinds = sorted(BudgetEvent.objects.filter(session=session).values_list("kind", flat=True))
    assert kinds == ["exhausted", "soft_warned"]
    warned = BudgetEvent.objects.get(session=session, kind="soft_warned")
    exhausted = BudgetEvent.objects.get(session=session, kind="exhausted")
    assert session.warned_at == warned.at and session.exhausted_at == exhausted.at
    # the totals recorded at each crossing are those of the step that crossed (100 tokens)
    assert 24_000 <= warned.tokens_used < 24_100
    assert 30_000 <= exhausted.tokens_used < 30_100
    assert Step.objects.count() == 400
    rollup = DailyRollup.objects.get()
    assert (rollup.calls, rollup.input_tokens, rollup.cost_usd) == (400, 24_000, per_step * 400)
    assert "ok" in states and "exhausted" in states


@pytest.mark.slow
def test_a_batch_replayed_concurrently_is_stored_once() -> None:
    agent = make_agent("replay")
    add_price("test-sonnet")
    batch = [
        {
            "session_id": f"s{i % 3}",
            "step_type": "x",
            "model": "test-sonnet",
            "input_tokens": 100 + i,
            "event_id": f"e{i}",
        }
        for i in range(50)
    ]
    results: list[tuple[int, int]] = []

    def work(_: int) -> None:
        body = Agent(agent.project, agent.key, agent.client.__class__()).events(*batch)
        results.append((body["accepted"], body["duplicates"]))

    assert run_in_threads(6, work) == []
    assert sorted(results) == [(0, 50)] * 5 + [(50, 0)]
    assert Step.objects.count() == 50
    total = sum(100 + i for i in range(50))
    assert sum(s.input_tokens for s in Session.objects.all()) == total
    assert DailyRollup.objects.get().input_tokens == total


def test_sessions_made_by_racing_batches_are_counted_once() -> None:
    """Eight threads name the same 40 new sessions at once (each batch a different order of
    them): each session is made by one batch, and the project's tally counts it once, the
    count the all-time sessions list shows."""
    agent = make_agent("racing")
    keys = [f"s{i}" for i in range(40)]

    def work(thread: int) -> None:
        order = keys[thread:] + keys[:thread]
        events = [{"session_id": key, "step_type": "x", "model": "m"} for key in order]
        Agent(agent.project, agent.key, agent.client.__class__()).events(*events)

    assert run_in_threads(8, work) == []
    assert Session.objects.filter(project=agent.project).count() == 40
    assert sessions_total(project_ids=[agent.project.pk]) == 40
    assert sessions_tally_check() == {}  # nothing to put right
