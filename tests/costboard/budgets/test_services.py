"""The budget services: each change outside ingest (caps, acknowledgement, runaway flag) is
decided by the engine under the session's lock and recorded once."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from costboard.budgets import services
from costboard.budgets.engine import Flag
from costboard.dashboards.selectors import flagged as selectors
from costboard.models import BudgetEvent, Project, Session
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, run_in_threads

pytestmark = pytest.mark.django_db


def kinds(session: Session) -> list[str]:
    return list(
        BudgetEvent.objects.filter(session=session).order_by("id").values_list("kind", flat=True)
    )


def flagged(agent: Agent) -> list[str]:
    return list(
        selectors.sessions_flagged_list(project_ids=[agent.project.pk]).values_list(
            "external_id", flat=True
        )
    )


def runaway_ahead_of_our_clock(agent: Agent) -> Session:
    """A retry loop whose steps carry an agent's clock five minutes ahead of ours."""
    ahead = timezone.now() + timedelta(minutes=5)
    agent.events(
        *[
            {
                "session_id": "s",
                "turn": 1,
                "step_type": "search",
                "model": "test-sonnet",
                "input_tokens": 100 + n,
                "success": False,
                "error": "502",
                "timestamp": (ahead + timedelta(seconds=n)).isoformat(),
            }
            for n in range(5)
        ]
    )
    session = Session.objects.get(external_id="s")
    assert (session.state, session.runaway) == ("exhausted", True)
    return session


def test_an_acknowledgement_holds_whatever_the_agents_clock_and_a_later_cap_change(
    agent: Agent, priced: Any
) -> None:
    session = runaway_ahead_of_our_clock(agent)
    assert flagged(agent) == ["s"]  # positive control: listed before the acknowledgement

    services.session_acknowledge(session_id=session.pk, by="ops", at=timezone.now())
    session.refresh_from_db()
    assert (session.state, session.exhausted_at, session.acknowledged_by) == ("ok", None, "ops")
    assert flagged(agent) == []

    # an unrelated change of the project's caps: the session's state is decided again
    project = Project.objects.get(pk=agent.project.pk)
    services.project_caps_set(project=project, changes={"cost_cap_usd": Decimal("50")})
    outbox_dispatch()
    session.refresh_from_db()
    assert session.state == "ok" and flagged(agent) == []
    assert kinds(session) == ["runaway", "exhausted", "cap_changed"]
    change = BudgetEvent.objects.get(session=session, kind="cap_changed")
    assert change.detail["cost_cap_usd"] == ["5.00", "50.0000"]

    # and the agent goes on: its next step is answered ok, nothing recorded again
    answer = agent.events(
        {"session_id": "s", "step_type": "search", "model": "test-sonnet", "input_tokens": 10}
    )
    assert answer["sessions"]["s"]["state"] == "ok"
    assert kinds(session) == ["runaway", "exhausted", "cap_changed"]


def test_a_raise_is_checked_against_the_cap_in_effect_under_the_lock(
    agent: Agent, priced: Any
) -> None:
    agent.events({"type": "session", "session_id": "s", "token_cap": 1000})
    session = Session.objects.get(external_id="s")
    with pytest.raises(services.CapError) as refused:
        services.session_caps_set(
            session_id=session.pk, at=timezone.now(), token_cap=1000, raise_only=True
        )
    assert refused.value.field == "token_cap" and "1,000" in refused.value.message
    session.refresh_from_db()
    assert session.token_cap == 1000 and kinds(session) == []  # nothing half-stored

    services.session_caps_set(
        session_id=session.pk, at=timezone.now(), token_cap=1001, raise_only=True
    )
    session.refresh_from_db()
    assert session.token_cap == 1001 and kinds(session) == ["cap_changed"]


def test_clearing_a_sessions_cap_inherits_the_projects(agent: Agent, priced: Any) -> None:
    agent.events(
        {"type": "session", "session_id": "s", "token_cap": 1000},
        {"session_id": "s", "step_type": "x", "model": "test-sonnet", "input_tokens": 900},
    )
    session = Session.objects.get(external_id="s")
    assert session.state == "warning"
    services.session_caps_set(session_id=session.pk, at=timezone.now(), token_cap=None)
    session.refresh_from_db()
    assert (session.token_cap, session.state, session.warned_at) == (None, "ok", None)
    change = BudgetEvent.objects.get(session=session, kind="cap_changed")
    assert change.detail["token_cap"] == [1000, 100_000]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_flags_racing_record_one_runaway(agent: Agent, priced: Any) -> None:
    agent.events({"session_id": "s", "step_type": "x", "model": "test-sonnet", "input_tokens": 5})
    session = Session.objects.get(external_id="s")
    results: list[BudgetEvent | None] = []

    def flag(index: int) -> None:
        at = timezone.now()
        results.append(
            services.session_flag_runaway(
                session_id=session.pk, flag=Flag(at=at, rule=f"rule-{index}", reason="loop")
            )
        )

    assert run_in_threads(4, flag) == []
    assert sum(event is not None for event in results) == 1
    assert kinds(session).count("runaway") == 1
    assert kinds(session).count("exhausted") == 1  # held: the project stops runaways


def test_new_environment_defaults_are_applied_by_the_sweep_once(
    agent: Agent, priced: Any, settings: Any
) -> None:
    from costboard.budgets.sweep import runaway_sweep

    agent.project.runaway_overrun_minutes = 0  # only the caps speak here
    agent.project.save()
    agent.events(
        {"session_id": "inherits", "step_type": "x", "model": "test-sonnet", "input_tokens": 900},
        {"type": "session", "session_id": "own", "token_cap": 100_000},
        {"session_id": "own", "step_type": "x", "model": "test-sonnet", "input_tokens": 900},
    )
    runaway_sweep()  # the defaults as migrated: nothing to do
    assert BudgetEvent.objects.count() == 0

    settings.COSTBOARD_SESSION_TOKEN_CAP = 1000  # a restart with a lower default
    runaway_sweep()
    inherits = Session.objects.get(external_id="inherits")
    assert (inherits.state, kinds(inherits)) == ("warning", ["cap_changed", "soft_warned"])
    change = BudgetEvent.objects.get(session=inherits, kind="cap_changed")
    assert change.detail["token_cap"] == [100_000, 1000]
    own = Session.objects.get(external_id="own")
    assert (own.state, kinds(own)) == ("ok", [])  # its own cap: untouched

    runaway_sweep()  # the same defaults again: decided once
    assert kinds(inherits) == ["cap_changed", "soft_warned"]
