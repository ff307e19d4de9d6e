"""Daily rollups per end user and per tag, kept at ingest: each equals the sum of its steps,
to the last token and pico-dollar, across batches and concurrent ones; migration 0018 fills
them for what was stored before."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from costboard.models import Step, TagDailyRollup, UserDailyRollup
from tests.conftest import Agent, add_price, make_agent, run_in_threads

pytestmark = pytest.mark.django_db

FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cost_usd")


def step(session_id: str, n: int, **fields: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "step_type": "x",
        "model": "test-sonnet",
        "input_tokens": 100 + n,
        "output_tokens": 7 * n,
        "cache_read_input_tokens": 1000,
        **fields,
    }


def expected() -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
    users: dict[Any, list[Any]] = defaultdict(lambda: [0, 0, 0, Decimal(0), 0])
    tags: dict[Any, list[Any]] = defaultdict(lambda: [0, 0, 0, Decimal(0), 0])
    for s in Step.objects.select_related("session"):
        day = s.timestamp.date()
        sums = [getattr(s, f) for f in FIELDS]
        for target in [users[(s.project_id, day, s.session.user_id)]] + [
            tags[(s.project_id, day, k, v)] for k, v in (s.tags or {}).items()
        ]:
            for i, value in enumerate(sums):
                target[i] += value
            target[4] += 1
    return users, tags


def stored() -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
    users = {
        (r.project_id, r.day, r.user_id): [*(getattr(r, f) for f in FIELDS), r.calls]
        for r in UserDailyRollup.objects.all()
    }
    tags = {
        (r.project_id, r.day, r.key, r.value): [*(getattr(r, f) for f in FIELDS), r.calls]
        for r in TagDailyRollup.objects.all()
    }
    return users, tags


def test_user_and_tag_rollups_equal_their_steps(agent: Agent) -> None:
    add_price("test-sonnet")
    agent.events(
        {"type": "session", "session_id": "a", "user_id": "ann", "tags": {"plan": "pro"}},
        {"type": "session", "session_id": "b", "user_id": "bob"},
        *(step("a", n, tags={"feature": "search"}) for n in range(3)),
        *(step("b", n, tags={"feature": "chat", "plan": "free"}) for n in range(4)),
        step("c", 9),  # a session without a user or tags
        {**step("a", 5), "timestamp": "2026-01-02T10:00:00Z"},  # another day
    )
    agent.events(*(step("a", n) for n in range(2)), *(step("b", 1) for _ in range(3)))
    users, tags = stored()
    want_users, want_tags = expected()
    assert users == want_users and tags == dict(want_tags)
    assert {k[2] for k in users} == {"ann", "bob", ""}
    assert {(k[2], k[3]) for k in tags} == {
        ("feature", "search"),
        ("feature", "chat"),
        ("plan", "pro"),
        ("plan", "free"),
    }
    assert sum(r.calls for r in UserDailyRollup.objects.all()) == Step.objects.count()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_lose_no_count() -> None:
    agent = make_agent("race")
    add_price("test-sonnet")

    def client(i: int) -> None:
        Agent(agent.project, agent.key, agent.client.__class__()).events(
            {"type": "session", "session_id": f"s{i}", "user_id": f"u{i % 3}"},
            *(step(f"s{i}", n, tags={"team": f"t{n % 2}"}) for n in range(20)),
        )

    assert run_in_threads(8, client) == []
    users, tags = stored()
    want_users, want_tags = expected()
    assert users == want_users and tags == dict(want_tags)
    assert sum(r.calls for r in TagDailyRollup.objects.filter(key="team")) == 160


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_them_from_the_stored_steps() -> None:
    agent = make_agent("old")
    add_price("test-sonnet")
    agent.events(
        {"type": "session", "session_id": "a", "user_id": "ann"},
        *(step("a", n, tags={"feature": "search"}) for n in range(3)),
        step("b", 1),
    )
    before = stored()
    UserDailyRollup.objects.all().delete()
    TagDailyRollup.objects.all().delete()
    executor = MigrationExecutor(connection)
    executor.migrate([("costboard", "0017_budget_days")])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert stored() == before
