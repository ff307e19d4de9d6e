"""The sweep's window rules (burn rate, projected overrun, long sessions), retention, and the
`system` session's own caps. Time is frozen with time-machine; the sweep reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db.models import Sum

from costboard import tasks
from costboard.budgets.sweep import runaway_sweep
from costboard.models import BudgetEvent, DailyRollup, IdempotentRequest, Session, Step, Turn
from costboard.retention import retention_sweep
from tests.conftest import Agent, make_agent, run_in_threads
from tests.waiting import wait_until

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def steps(
    session: str, count: int, *, tokens: int, start: datetime, every: timedelta, prefix: str = ""
) -> list[dict[str, Any]]:
    """`count` steps of `tokens` input tokens each (prompts growing by one token, so never
    "the same step"), one every `every` from `start`."""
    return [
        {
            "session_id": session,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": tokens + i,
            "timestamp": (start + i * every).isoformat(),
            "event_id": f"{prefix or session}-{i}",
        }
        for i in range(count)
    ]


def history(agent: Agent) -> None:
    """The project's normal: ten sessions two days ago, each 1,000 tokens over 10 minutes
    (plus a few from the growing prompts): about 100 tokens per minute."""
    for n in range(10):
        start = NOW - timedelta(days=2, hours=n)
        agent.events(*steps(f"old-{n}", 11, tokens=90, start=start, every=timedelta(minutes=1)))


def runaway(agent: Agent) -> list[BudgetEvent]:
    return list(BudgetEvent.objects.filter(project=agent.project, kind="runaway").order_by("id"))


@pytest.fixture
def clock() -> Any:
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def test_a_burn_far_above_normal_is_flagged_and_a_healthy_session_is_not(
    agent: Agent, priced: Any, clock: Any
) -> None:
    history(agent)
    # 25,000 tokens a minute for the last 10 minutes; a cap high enough not to matter
    agent.events({"type": "session", "session_id": "hot", "token_cap": 10_000_000})
    agent.events(
        *steps(
            "hot", 10, tokens=25_000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1)
        )
    )
    agent.events(
        *steps("calm", 10, tokens=300, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1))
    )
    result = runaway_sweep()
    assert result.flagged == {"burn_rate": 1}
    [event] = runaway(agent)
    hot = Session.objects.get(external_id="hot")
    assert event.session_id == hot.pk and event.at == NOW == hot.runaway_at
    tokens = sum(25_000 + i for i in range(10))
    normal = Decimal(sum(90 + i for i in range(11)) * 10) / Decimal(10 * 10)  # per minute
    evidence = event.detail["evidence"]
    assert evidence == {
        "window_minutes": 10,
        "tokens_in_window": tokens,
        "tokens_per_minute": "25004.50",
        "normal_tokens_per_minute": str(normal.quantize(Decimal("0.01"))),
        "factor": "10.00",
        "floor_tokens_per_minute": 20_000,
    }
    assert hot.runaway_reason.startswith("burn rate: 25,004 tokens/min over 10 min, ")
    assert not Session.objects.get(external_id="calm").runaway


def test_a_fast_session_of_a_busy_project_stays_under_the_floor(
    agent: Agent, priced: Any, clock: Any
) -> None:
    """No history (no normal rate): only the floor decides, and 15,000 a minute is below it."""
    agent.events({"type": "session", "session_id": "s", "token_cap": 10_000_000})
    agent.events(
        *steps("s", 10, tokens=15_000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1))
    )
    assert runaway_sweep().flagged == {}
    # positive control: 25,000 a minute is above it
    agent.events(
        *steps("t", 10, tokens=25_000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1))
    )
    assert runaway_sweep().flagged == {"burn_rate": 1}


def test_a_session_on_course_to_its_cap_within_the_limit_is_flagged(
    agent: Agent, priced: Any, clock: Any
) -> None:
    agent.events({"type": "session", "session_id": "s", "token_cap": 100_000})
    earlier = NOW - timedelta(hours=1)
    agent.events(*steps("s", 1, tokens=70_000, start=earlier, every=timedelta(0), prefix="a"))
    # 20,045 tokens over the last 10 minutes: 2,004.5 a minute, 9,955 left: 5 min to the cap
    agent.events(
        *steps("s", 10, tokens=2000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1))
    )
    assert runaway_sweep().flagged == {"projected_overrun": 1}
    [event] = runaway(agent)
    assert event.detail["rule"] == "projected_overrun"
    assert event.detail["evidence"] == {
        "cap": "tokens",
        "cap_value": "100000",
        "used": "90045",
        "per_minute": "2004.500000",
        "minutes_to_cap": "5.0",
        "threshold_minutes": 30,
        "window_minutes": 10,
    }


def test_the_same_rate_far_from_the_cap_is_quiet(agent: Agent, priced: Any, clock: Any) -> None:
    agent.events({"type": "session", "session_id": "s", "token_cap": 1_000_000})
    agent.events(
        *steps("s", 10, tokens=2000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1))
    )
    assert runaway_sweep().flagged == {}
    # positive control: the same rate 15 minutes from its cap
    agent.events({"type": "session", "session_id": "near", "token_cap": 50_000})
    agent.events(
        *steps(
            "near", 10, tokens=2000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=1)
        )
    )
    assert runaway_sweep().flagged == {"projected_overrun": 1}


def test_a_burst_into_a_fresh_session_is_watched_not_stopped(
    agent: Agent, priced: Any, clock: Any
) -> None:
    """The smoke test a new user runs: 44,000 of a fresh session's 100,000 tokens within one
    second. At the window's rate that is 4,400 a minute, the cap 12.7 minutes away — but two
    steps one second apart are no history to project from (PROJECTION_MIN_STEPS steps over
    PROJECTION_MIN_MINUTES, docs/budgets.md, "Runaway rules")."""
    agent.events({"type": "session", "session_id": "smoke", "token_cap": 100_000})
    agent.events(
        *steps("smoke", 2, tokens=22_000, start=NOW - timedelta(seconds=1), every=timedelta(0))
    )
    # even five steps, all within that second, are one burst
    agent.events(
        *steps("burst", 5, tokens=8_800, start=NOW - timedelta(seconds=1), every=timedelta(0))
    )
    assert runaway_sweep().flagged == {}
    for name in ("smoke", "burst"):
        session = Session.objects.get(external_id=name)
        assert (session.state, session.runaway_at) == ("ok", None)
    assert agent.budget("smoke").json()["state"] == "ok"
    # positive control: five steps over five minutes at the same pace toward the cap is history
    agent.events({"type": "session", "session_id": "steady", "token_cap": 100_000})
    agent.events(
        *steps(
            "steady",
            5,
            tokens=8_800,
            start=NOW - timedelta(minutes=5),
            every=timedelta(minutes=1.25),
        )
    )
    assert runaway_sweep().flagged == {"projected_overrun": 1}
    assert Session.objects.get(external_id="steady").runaway_at == NOW
    # and a long span with too few steps is not: two steps ten minutes apart
    agent.events({"type": "session", "session_id": "sparse", "token_cap": 100_000})
    agent.events(
        *steps(
            "sparse", 2, tokens=22_000, start=NOW - timedelta(minutes=9), every=timedelta(minutes=9)
        )
    )
    assert runaway_sweep().flagged == {}


def test_a_session_active_for_more_than_eight_hours_is_flagged(
    agent: Agent, priced: Any, clock: Any
) -> None:
    for name, hours in (("long", 9), ("shorter", 7)):
        agent.events(
            *steps(
                name,
                1,
                tokens=100,
                start=NOW - timedelta(hours=hours),
                every=timedelta(0),
                prefix=f"{name}-a",
            )
        )
        agent.events(
            *steps(
                name,
                1,
                tokens=100,
                start=NOW - timedelta(minutes=1),
                every=timedelta(0),
                prefix=f"{name}-b",
            )
        )
    # idle for an hour: not active, not checked
    agent.events(
        *steps(
            "idle", 1, tokens=100, start=NOW - timedelta(hours=12), every=timedelta(0), prefix="i-a"
        )
    )
    agent.events(
        *steps(
            "idle", 1, tokens=100, start=NOW - timedelta(hours=1), every=timedelta(0), prefix="i-b"
        )
    )
    result = runaway_sweep()
    assert result.flagged == {"long_session": 1}
    assert result.sessions_checked == 2
    [event] = runaway(agent)
    assert event.session is not None and event.session.external_id == "long"
    assert event.detail["evidence"] == {
        "started_at": (NOW - timedelta(hours=9)).isoformat(),
        "hours_active": "9.0",
        "threshold_hours": 8,
    }


def test_rules_are_the_projects_and_ended_sessions_are_not_checked(
    agent: Agent, priced: Any, clock: Any
) -> None:
    agent.project.runaway_max_hours = 0  # off
    agent.project.save()
    agent.events(
        *steps(
            "long",
            2,
            tokens=100,
            start=NOW - timedelta(hours=30),
            every=timedelta(hours=30) - timedelta(minutes=1),
        )
    )
    other = make_agent("other", runaway_max_hours=2)
    other.events(
        *steps(
            "ended",
            2,
            tokens=100,
            start=NOW - timedelta(hours=5),
            every=timedelta(hours=5) - timedelta(minutes=1),
        )
    )
    other.events({"type": "session", "session_id": "ended", "ended": True})
    assert runaway_sweep().flagged == {}
    # positive control: with the rule on, the same long session is flagged (the ended one not)
    agent.project.runaway_max_hours = 8
    agent.project.save()
    assert runaway_sweep().flagged == {"long_session": 1}


def test_the_sweep_run_twice_or_at_once_flags_once(agent: Agent, priced: Any, clock: Any) -> None:
    agent.events(
        *steps(
            "long",
            2,
            tokens=100,
            start=NOW - timedelta(hours=9),
            every=timedelta(hours=9) - timedelta(minutes=1),
        )
    )
    assert runaway_sweep().flagged == {"long_session": 1}
    assert runaway_sweep().flagged == {}
    call_command("guard_sweep")
    assert len(runaway(agent)) == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_sweeps_racing_flag_once(priced: Any) -> None:
    agent = make_agent("race")
    for n in range(20):
        agent.events(
            *steps(
                f"long-{n}",
                2,
                tokens=100,
                start=NOW - timedelta(hours=9),
                every=timedelta(hours=9) - timedelta(minutes=1),
            )
        )
    results: list[dict[str, int]] = []
    assert run_in_threads(2, lambda _: results.append(runaway_sweep(now=NOW).flagged)) == []
    assert sum(r.get("long_session", 0) for r in results) == 20
    assert len(runaway(agent)) == 20
    assert Session.objects.filter(project=agent.project, runaway_at=NOW).count() == 20


@pytest.mark.slow
def test_a_worker_runs_the_sweep(celery_worker: dict[str, str], priced: Any) -> None:
    """The beat's task through the broker: a long session started 9 hours ago is flagged."""
    agent = make_agent("worker")
    now = datetime.now(UTC)
    agent.events(
        *steps(
            "long",
            2,
            tokens=100,
            start=now - timedelta(hours=9),
            every=timedelta(hours=9) - timedelta(seconds=30),
        )
    )
    tasks.runaway_sweep.delay()
    [event] = wait_until(lambda: runaway(agent), what="the worker's sweep to flag the session")
    assert event.detail["rule"] == "long_session"


def test_retention_deletes_old_steps_and_old_budget_state_but_keeps_the_totals(
    agent: Agent, priced: Any, clock: Any
) -> None:
    agent.project.retention_days = 30
    agent.project.save()
    old, recent = NOW - timedelta(days=40), NOW - timedelta(days=10)
    agent.events(
        {"type": "session", "session_id": "gone", "token_cap": 1000, "timestamp": old.isoformat()}
    )
    agent.events(
        *[
            s | {"turn": 1}
            for s in steps("gone", 3, tokens=400, start=old, every=timedelta(minutes=1))
        ]
    )
    agent.events(
        {
            "type": "session",
            "session_id": "gone",
            "ended": True,
            "timestamp": (old + timedelta(hours=1)).isoformat(),
        }
    )
    agent.events(
        {"type": "session", "session_id": "open", "token_cap": 1000, "timestamp": old.isoformat()}
    )
    agent.events(*steps("open", 2, tokens=450, start=old, every=timedelta(minutes=1)))
    agent.events(
        *steps("open", 2, tokens=450, start=recent, every=timedelta(minutes=1), prefix="open-new")
    )
    totals = DailyRollup.objects.aggregate(Sum("input_tokens"), Sum("cost_usd"))
    sessions = {
        s.external_id: (s.tokens_used, s.cost_usd, s.step_count) for s in Session.objects.all()
    }
    assert BudgetEvent.objects.filter(session__external_id="gone").count() == 2

    result = retention_sweep()
    assert (result.steps_deleted, result.budget_events_deleted) == (5, 2)
    assert list(Step.objects.values_list("event_id", flat=True).order_by("event_id")) == [
        "open-new-0",
        "open-new-1",
    ]
    assert DailyRollup.objects.aggregate(Sum("input_tokens"), Sum("cost_usd")) == totals
    assert {
        s.external_id: (s.tokens_used, s.cost_usd, s.step_count) for s in Session.objects.all()
    } == sessions
    assert Turn.objects.get(session__external_id="gone").step_count == 3
    assert not BudgetEvent.objects.filter(session__external_id="gone").exists()
    assert BudgetEvent.objects.filter(session__external_id="open").count() == 2  # still open
    again = retention_sweep()
    assert (again.steps_deleted, again.budget_events_deleted) == (0, 0)


def test_idempotency_keys_are_kept_48_hours_then_deleted_by_the_hourly_sweep(
    agent: Agent, clock: Any
) -> None:
    def send(key: str) -> Any:
        return agent.client.post(
            "/api/v1/events",
            {"step_type": "search", "model": "m", "session_id": "s", "input_tokens": 10},
            content_type="application/json",
            headers={"Authorization": f"Bearer {agent.key}", "Idempotency-Key": key},
        )

    assert send("old").status_code == 200
    clock.shift(timedelta(hours=24))
    assert send("newer").status_code == 200
    clock.shift(timedelta(hours=24, minutes=1))  # "old" is 48 h 1 min old, "newer" 24 h 1 min

    assert send("newer")["Idempotent-Replayed"] == "true"  # kept at least 24 h
    result = retention_sweep()
    assert result.idempotency_keys_deleted == 1
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == ["newer"]
    assert retention_sweep().idempotency_keys_deleted == 0
    # once forgotten, the key is a new one: sent again, the batch is ingested again
    assert "Idempotent-Replayed" not in send("old")
    assert Session.objects.get(project=agent.project, external_id="s").input_tokens == 30


def test_without_retention_everything_is_kept(agent: Agent, priced: Any, clock: Any) -> None:
    agent.events(
        *steps("s", 2, tokens=100, start=NOW - timedelta(days=400), every=timedelta(days=1))
    )
    assert retention_sweep().steps_deleted == 0
    assert Step.objects.count() == 2


def test_the_system_session_has_caps_of_its_own(agent: Agent, priced: Any) -> None:
    agent.project.token_cap = 1000
    agent.project.system_token_cap = 50_000
    agent.project.save()
    answer = agent.events(
        {"step_type": "embed", "model": "test-sonnet", "input_tokens": 2000},
        {"session_id": "chat", "step_type": "x", "model": "test-sonnet", "input_tokens": 2000},
    )
    assert answer["sessions"]["system"]["token_cap"] == 50_000
    assert answer["sessions"]["system"]["state"] == "ok"
    assert answer["sessions"]["chat"]["token_cap"] == 1000
    assert answer["sessions"]["chat"]["state"] == "exhausted"
    agent.project.system_token_cap = None  # then the project's session cap applies to it too
    agent.project.save()
    assert agent.budget("system").json()["token_cap"] == 1000


@pytest.mark.parametrize("every", ["-5", "1.5", "soon", "１２"])
def test_every_that_is_not_a_number_of_seconds_is_refused_naming_it(every: str) -> None:
    """A negative --every swept every second (its due test always true) instead of refusing."""
    with pytest.raises(CommandError, match=r"--every.*not a number of seconds.*--every 60"):
        call_command("guard_sweep", "--every", every)
