"""The per-turn runaway rules, run inside ingest: retry loops (failures in a row, the same step
again and again) and overlong turns; and each turn's context pressure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from costboard.models import BudgetEvent, ModelPrice, Session, Turn
from tests.conftest import Agent, add_price

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def step(n: int, *, turn: int = 1, ok: bool = True, prompt: int | None = None, **extra: Any):
    """The n-th step of session `s` (one second apart); by default each prompt is bigger
    than the last, as a healthy agent's conversation grows."""
    return {
        "session_id": "s",
        "turn": turn,
        "step_type": extra.pop("step_type", "response"),
        "model": "test-sonnet",
        "input_tokens": prompt if prompt is not None else 1000 + 37 * n,
        "output_tokens": 20,
        "success": ok,
        "error": "" if ok else f"502 from the order service (attempt {n})",
        "timestamp": (T0 + timedelta(seconds=n)).isoformat(),
        "event_id": f"s-{turn}-{n}",
        **extra,
    }


def runaway_events(agent: Agent) -> list[BudgetEvent]:
    return list(BudgetEvent.objects.filter(project=agent.project, kind="runaway"))


def test_five_failures_in_a_row_flag_a_retry_loop_once(agent: Agent, priced: Any) -> None:
    first = agent.events(*[step(n, ok=False) for n in range(4)])
    assert first["sessions"]["s"]["runaway"] is False
    assert runaway_events(agent) == []

    second = agent.events(step(4, ok=False), step(5, ok=False))  # the fifth, across batches
    assert second["sessions"]["s"]["runaway"] is True
    # the agent is told to stop: far below its caps, its state is exhausted
    assert second["sessions"]["s"]["state"] == "exhausted"
    assert second["sessions"]["s"]["exhausted_at"] == (T0 + timedelta(seconds=4)).isoformat()
    [event] = runaway_events(agent)
    assert event.at == T0 + timedelta(seconds=4)  # the step that made it five
    assert event.tokens_used == sum(1000 + 37 * n + 20 for n in range(5))
    assert event.detail == {
        "rule": "retry_loop",
        "reason": "retry loop: 5 failed steps in a row in turn 1",
        "evidence": {
            "turn": 1,
            "failed_in_a_row": 5,
            "threshold": 5,
            "step_type": "response",
            "model": "test-sonnet",
            "last_error": "502 from the order service (attempt 4)",
        },
    }
    session = Session.objects.get(external_id="s")
    assert session.runaway_at == event.at
    assert session.runaway_reason == "retry loop: 5 failed steps in a row in turn 1"

    agent.events(*[step(n, ok=False) for n in range(6, 20)])  # it goes on: still one event
    assert len(runaway_events(agent)) == 1
    budget = agent.budget("s").json()
    assert budget["runaway"] is True
    assert [e["kind"] for e in budget["events"]] == ["runaway", "exhausted"]
    assert budget["events"][0]["detail"]["rule"] == "retry_loop"
    stop = budget["events"][1]
    assert stop["at"] == budget["events"][0]["at"]
    assert stop["tokens_used"] == event.tokens_used
    assert stop["detail"] == {
        "token_cap": 100_000,
        "cost_cap_usd": "5.00",
        "warn_at_pct": "0.8",
        "reason": "runaway",
        "runaway": "retry loop: 5 failed steps in a row in turn 1",
    }


def test_acknowledging_a_runaway_lets_it_go_on(agent: Agent, priced: Any) -> None:
    from django.utils import timezone

    from costboard.budgets.services import session_recheck

    agent.events(*[step(n, ok=False) for n in range(5)])
    session = Session.objects.get(external_id="s")
    assert (session.state, session.runaway) == ("exhausted", True)
    session.acknowledged_at = timezone.now()
    session.save()
    session_recheck(session_id=session.pk, at=timezone.now())
    session.refresh_from_db()
    assert (session.state, session.exhausted_at, session.runaway) == ("ok", None, True)
    answer = agent.events(*[step(n, ok=False) for n in range(5, 12)])
    assert answer["sessions"]["s"]["state"] == "ok"  # flagged once: not stopped again
    kinds = list(BudgetEvent.objects.values_list("kind", flat=True).order_by("id"))
    assert kinds == ["runaway", "exhausted"]


def test_a_project_may_flag_runaways_without_stopping_them(agent: Agent, priced: Any) -> None:
    agent.project.runaway_stops = False
    agent.project.save()
    answer = agent.events(*[step(n, ok=False) for n in range(5)])
    assert answer["sessions"]["s"]["runaway"] is True
    assert answer["sessions"]["s"]["state"] == "ok"
    assert [e.kind for e in BudgetEvent.objects.all()] == ["runaway"]


def test_failures_broken_by_a_success_or_spread_over_turns_stay_quiet(
    agent: Agent, priced: Any
) -> None:
    steps = [step(n, ok=False) for n in range(4)] + [step(4)]
    steps += [step(n, ok=False) for n in range(5, 9)]
    steps += [step(n, turn=2, ok=False) for n in range(9, 13)]
    answer = agent.events(*steps)
    assert answer["sessions"]["s"]["runaway"] is False
    assert runaway_events(agent) == []
    turn = Turn.objects.get(number=1)
    assert (turn.fail_streak, turn.fail_peak) == (4, 4)


def test_a_replayed_batch_does_not_lengthen_the_streak(agent: Agent, priced: Any) -> None:
    batch = [step(n, ok=False) for n in range(3)]
    agent.events(*batch)
    replay = agent.events(*batch)
    assert replay["duplicates"] == 3
    turn = Turn.objects.get(number=1)
    assert (turn.fail_streak, turn.step_count, turn.error_count) == (3, 3, 3)
    assert agent.events(step(3, ok=False))["sessions"]["s"]["runaway"] is False
    assert agent.events(step(4, ok=False))["sessions"]["s"]["runaway"] is True


def test_the_same_step_eight_times_in_a_row_is_a_retry_loop(agent: Agent, priced: Any) -> None:
    seven = [step(n, prompt=4200, step_type="search") for n in range(7)]
    assert agent.events(*seven)["sessions"]["s"]["runaway"] is False
    answer = agent.events(step(7, prompt=4200, step_type="search"))
    assert answer["sessions"]["s"]["runaway"] is True
    [event] = runaway_events(agent)
    assert event.detail["evidence"] == {
        "turn": 1,
        "same_step_in_a_row": 8,
        "threshold": 8,
        "step_type": "search",
        "model": "test-sonnet",
        "prompt_tokens": 4200,
    }


def test_growing_prompts_are_not_the_same_step(agent: Agent, priced: Any) -> None:
    agent.events(*[step(n, step_type="search") for n in range(30)])
    assert runaway_events(agent) == []
    # positive control: the same prompt size eight times in a row is
    agent.events(*[step(n, turn=2, step_type="search", prompt=5000) for n in range(30, 38)])
    assert [e.detail["rule"] for e in runaway_events(agent)] == ["retry_loop"]


def test_a_turn_of_more_than_fifty_steps_is_a_correction_cycle(agent: Agent, priced: Any) -> None:
    assert agent.events(*[step(n) for n in range(50)])["sessions"]["s"]["runaway"] is False
    assert agent.events(step(50))["sessions"]["s"]["runaway"] is True
    [event] = runaway_events(agent)
    assert event.detail["rule"] == "turn_steps"
    assert event.detail["evidence"] == {"turn": 1, "steps": 51, "threshold": 50}
    assert event.at == T0 + timedelta(seconds=50)


def test_thresholds_are_the_projects(agent: Agent, priced: Any) -> None:
    agent.project.runaway_failed_steps = 0  # off
    agent.project.runaway_turn_steps = 3
    agent.project.save()
    agent.events(*[step(n, ok=False) for n in range(3)])
    assert runaway_events(agent) == []
    agent.events(step(3, ok=False))
    [event] = runaway_events(agent)
    assert event.detail["rule"] == "turn_steps"


@pytest.mark.parametrize(
    ("field", "turn_steps", "extra", "rule", "evidence"),
    [
        ("runaway_failed_steps", 4, {"ok": False}, "retry_loop", {"failed_in_a_row": 5}),
        ("runaway_repeated_steps", 6, {"prompt": 4200}, "retry_loop", {"same_step_in_a_row": 7}),
        ("runaway_turn_steps", 30, {}, "turn_steps", {"steps": 31}),
    ],
)
def test_a_threshold_lowered_below_a_turns_run_flags_its_next_step(
    agent: Agent,
    priced: Any,
    field: str,
    turn_steps: int,
    extra: dict[str, Any],
    rule: str,
    evidence: dict[str, int],
) -> None:
    # a turn under the thresholds; then the admin lowers one below where the turn stands
    agent.events(*[step(n, **extra) for n in range(turn_steps)])
    assert runaway_events(agent) == []
    setattr(agent.project, field, 3)
    agent.project.save()
    answer = agent.events(step(turn_steps, **extra))
    assert answer["sessions"]["s"]["runaway"] is True
    [event] = runaway_events(agent)
    assert event.at == T0 + timedelta(seconds=turn_steps)  # its next step, not never
    assert event.detail["rule"] == rule
    assert {k: event.detail["evidence"][k] for k in evidence} == evidence
    assert event.detail["evidence"]["threshold"] == 3


@pytest.mark.parametrize(
    ("prompt", "pressure", "summarize"),
    [(160_000, Decimal("0.8"), True), (159_999, Decimal("0.799995"), False)],
)
def test_each_turn_keeps_its_largest_prompt_against_the_context_window(
    agent: Agent, priced: ModelPrice, prompt: int, pressure: Decimal, summarize: bool
) -> None:
    priced.context_window = 200_000
    priced.save()
    add_price("test-unwindowed")
    agent.events(
        step(0, prompt=1000),
        # its prompt: input + cache reads + cache writes
        step(1, prompt=prompt - 60_000, cache_read_input_tokens=50_000)
        | {"cache_creation_input_tokens": 10_000},
        step(2, prompt=5000),
        step(3, prompt=900_000, model="test-unwindowed", turn=2),
    )
    turn = Turn.objects.get(number=1)
    assert (turn.context_tokens, turn.context_window) == (prompt, 200_000)
    assert turn.context_pressure == pressure
    assert turn.should_summarize is summarize
    agent.events(step(4, prompt=2000))  # a smaller prompt later changes nothing
    turn.refresh_from_db()
    assert turn.context_tokens == prompt
    unknown = Turn.objects.get(number=2)
    assert (unknown.context_tokens, unknown.context_window) == (900_000, None)
    assert unknown.should_summarize is False
