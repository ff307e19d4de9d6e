"""Rollup invariant: after any sequence of batches, every turn, session and daily rollup equals
the sums over its steps, exactly (and a session's families are its steps'), and every step's
cost equals its tokens × the rates. Steps sent under several names of one model land in their
family's rollups; tool steps (no model) cost nothing and are never unpriced."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from costboard.budgets.caps import session_caps
from costboard.budgets.engine import threshold_state
from costboard.ingest.latency import latency_bucket
from costboard.ingest.schemas import validate_event
from costboard.ingest.service import events_ingest
from costboard.models import (
    DailyRollup,
    LatencyRollup,
    ModelPrice,
    Project,
    Session,
    SessionModelUsage,
    Step,
    Turn,
)
from tests.conftest import add_price

pytestmark = pytest.mark.slow

START = datetime(2026, 11, 1, 22, 0, tzinfo=UTC)
RATES = {
    "rollup-a": (Decimal("3"), Decimal("15"), Decimal("0.3"), Decimal("3.75")),
    "rollup-b": (Decimal("0.15"), Decimal("0.6"), Decimal("0.075"), Decimal("0.15")),
}

# Each name a step may be sent as → its family (and the price row it is priced by, if any).
FAMILIES = {
    "rollup-a": "rollup-a",
    "rollup-a-2024-08-06": "rollup-a",
    "openai/rollup-a": "rollup-a",
    "rollup-b": "rollup-b",
    "ROLLUP-B": "rollup-b",
    "rollup-unknown": "rollup-unknown",
    "rollup-unknown-20250101": "rollup-unknown",
    "none": "none",  # a tool step
}

step_events = st.fixed_dictionaries(
    {
        "step_type": st.sampled_from(["intent", "search", "response", "compress"]),
        "model": st.sampled_from(list(FAMILIES)),
        "input_tokens": st.integers(0, 300_000),
        "output_tokens": st.integers(0, 20_000),
        "cache_read_input_tokens": st.integers(0, 500_000),
        "cache_creation_input_tokens": st.integers(0, 50_000),
        "reasoning_tokens": st.integers(0, 5_000),
        "duration_ms": st.integers(0, 60_000),
        "success": st.booleans(),
        "minute": st.integers(0, 60 * 30),
    },
    optional={
        "session_id": st.sampled_from(["s1", "s2", "s3"]),
        "turn": st.integers(1, 4),
        "event_id": st.sampled_from([f"e{i}" for i in range(25)]),
    },
)
session_events = st.fixed_dictionaries(
    {"type": st.just("session"), "session_id": st.sampled_from(["s1", "s2", "s3"])},
    optional={
        "token_cap": st.integers(1, 2_000_000),
        "cost_cap_usd": st.decimals(min_value=0, max_value=50, places=2),
    },
)
batches = st.lists(
    st.lists(
        st.one_of(step_events, step_events, step_events, session_events), min_size=1, max_size=25
    ),
    min_size=1,
    max_size=6,
)


def _event(raw: dict[str, Any]) -> Any:
    raw = dict(raw)
    if "minute" in raw:
        raw["timestamp"] = (START + timedelta(minutes=raw.pop("minute"))).isoformat()
    if "cost_cap_usd" in raw:
        raw["cost_cap_usd"] = str(raw["cost_cap_usd"])
    event, errors = validate_event(0, raw)
    assert not errors, errors
    return event


FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "cost_input_usd",
    "cost_output_usd",
    "cost_cache_read_usd",
    "cost_cache_write_usd",
    "cost_usd",
)


def _sums(steps: list[Step]) -> dict[str, Any]:
    sums: dict[str, Any] = {name: 0 for name in FIELDS}
    for step in steps:
        for name in FIELDS:
            sums[name] += getattr(step, name)
    return sums


class RollupInvariantTests(TestCase):
    def setUp(self) -> None:
        from costboard.pricing.rates import forget_rate_table

        forget_rate_table()
        self.project = Project.objects.create(name="Rollups", slug="rollups")
        for model, (inp, out, cr, cw) in RATES.items():
            add_price(
                model, input_mtok=inp, output_mtok=out, cache_read_mtok=cr, cache_write_mtok=cw
            )

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(batches=batches)
    def test_rollups_equal_the_sums_of_their_steps(self, batches: list[list[dict]]) -> None:
        for batch in batches:
            events_ingest(project=self.project, events=[_event(e) for e in batch])

        steps = list(Step.objects.filter(project=self.project))
        event_ids = [s.event_id for s in steps if s.event_id]
        assert len(event_ids) == len(set(event_ids))

        for step in steps:
            assert step.family == FAMILIES[step.model]
            price = ModelPrice.objects.filter(model=step.family).first()
            if price is None:
                assert step.price_id is None and step.cost_usd == 0
                continue
            assert step.price_id == price.pk
            # every RATES row sets its cache rates
            assert price.cache_read_mtok is not None and price.cache_write_mtok is not None
            expected = (
                Decimal(step.input_tokens) * price.input_mtok
                + Decimal(step.output_tokens) * price.output_mtok
                + Decimal(step.cache_read_input_tokens) * price.cache_read_mtok
                + Decimal(step.cache_creation_input_tokens) * price.cache_write_mtok
            ) / Decimal(1_000_000)
            assert step.cost_usd == expected

        by_session: dict[int, list[Step]] = defaultdict(list)
        by_turn: dict[int, list[Step]] = defaultdict(list)
        by_rollup: dict[tuple[Any, ...], list[Step]] = defaultdict(list)
        for step in steps:
            by_session[step.session_id].append(step)
            if step.turn_id:
                by_turn[step.turn_id].append(step)
            day = step.timestamp.astimezone(UTC).date()
            by_rollup[(day, step.family, step.model, step.step_type)].append(step)

        for session in Session.objects.filter(project=self.project):
            mine = by_session.get(session.pk, [])
            assert {n: getattr(session, n) for n in FIELDS} == _sums(mine)
            assert session.step_count == len(mine)
            assert session.error_count == sum(not s.success for s in mine)
            assert session.turn_count == Turn.objects.filter(session=session).count()
            # the families the model filter tests: its steps', kept across batches
            assert session.families == {s.family: True for s in mine}
            caps = session_caps(session)
            assert session.state == threshold_state(caps, session.tokens_used, session.cost_usd)
            assert (session.warned_at is not None) >= (session.state != "ok")
            assert (session.exhausted_at is not None) >= (session.state == "exhausted")

        for turn in Turn.objects.filter(session__project=self.project):
            mine = by_turn.get(turn.pk, [])
            assert {n: getattr(turn, n) for n in FIELDS} == _sums(mine)
            assert turn.step_count == len(mine)

        rollups = DailyRollup.objects.filter(project=self.project)
        assert {(r.day, r.family, r.model, r.step_type) for r in rollups} == set(by_rollup)
        for rollup in rollups:
            mine = by_rollup[(rollup.day, rollup.family, rollup.model, rollup.step_type)]
            assert {n: getattr(rollup, n) for n in FIELDS} == _sums(mine)
            assert rollup.calls == len(mine)
            assert rollup.errors == sum(not s.success for s in mine)
            assert rollup.unpriced_calls == sum(s.price_id is None and not s.is_tool for s in mine)
            assert rollup.duration_ms == sum(s.duration_ms or 0 for s in mine)
        tool_rollups = [r for r in rollups if r.family == "none"]
        assert all(r.cost_usd == 0 and r.unpriced_calls == 0 for r in tool_rollups)

        by_model: dict[tuple[int, str, str], list[Step]] = defaultdict(list)
        for step in steps:
            by_model[(step.session_id, step.family, step.model)].append(step)
        usage = SessionModelUsage.objects.filter(session__project=self.project)
        assert {(u.session_id, u.family, u.model) for u in usage} == set(by_model)
        for row in usage:
            mine = by_model[(row.session_id, row.family, row.model)]
            assert row.calls == len(mine)
            assert row.tokens_used == sum(s.input_tokens + s.output_tokens for s in mine)
            assert row.cost_usd == sum((s.cost_usd for s in mine), Decimal(0))

        histogram: dict[tuple[Any, ...], int] = defaultdict(int)
        for step in steps:
            if step.duration_ms is not None:
                day = step.timestamp.astimezone(UTC).date()
                histogram[(day, step.step_type, latency_bucket(step.duration_ms))] += 1
        stored = {
            (r.day, r.step_type, r.bucket): r.calls
            for r in LatencyRollup.objects.filter(project=self.project)
        }
        assert stored == histogram
