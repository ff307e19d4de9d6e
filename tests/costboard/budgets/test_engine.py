"""The budget engine on its own: no database, no clock. A hypothesis state machine runs any
sequence of spends, cap changes, runaway flags and acknowledgements through `budget_decide`
and checks after each step that every crossing is recorded once, the state is what the
totals and caps say, and an acknowledgement is not undone by anything but a new flag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from costboard.budgets.caps import Caps
from costboard.budgets.engine import (
    CAP_CHANGED,
    EXHAUSTED,
    EXHAUSTED_KIND,
    OK,
    RUNAWAY,
    SOFT_WARNED,
    WARNING,
    Crossing,
    Flag,
    Ledger,
    Spend,
    budget_decide,
    limits_reached,
    reached,
    threshold_state,
)
from costboard.budgets.periods import PeriodLimits

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
CAPS = Caps(token_cap=1000, cost_cap_usd=Decimal("1.00"), warn_at_pct=Decimal("0.8"))


def spend(seconds: int, tokens: int, cost: str = "0") -> Spend:
    return Spend(at=T0 + timedelta(seconds=seconds), tokens=tokens, cost_usd=Decimal(cost))


def kinds(crossings: tuple[Crossing, ...]) -> list[str]:
    return [c.kind for c in crossings]


# --- examples: what each crossing carries ------------------------------------------------


def test_a_crossing_carries_the_time_and_totals_of_the_spend_that_crossed() -> None:
    outcome = budget_decide(
        ledger=Ledger(tokens_used=700),
        limits=CAPS,
        spends=[spend(3, 50), spend(1, 40), spend(2, 100), spend(4, 500)],
        at=T0 + timedelta(minutes=5),
    )
    warned, exhausted = outcome.crossings
    # in time order: 700 → 740 (s1) → 840 (s2, past 800) → 890 (s3) → 1390 (s4, past 1000)
    assert (warned.kind, warned.at, warned.tokens_used) == (
        SOFT_WARNED,
        T0 + timedelta(seconds=2),
        840,
    )
    assert (exhausted.kind, exhausted.at, exhausted.tokens_used) == (
        EXHAUSTED_KIND,
        T0 + timedelta(seconds=4),
        1390,
    )
    assert exhausted.detail is None  # the caps crossed: recorded by whoever applies it
    assert outcome.ledger == Ledger(
        tokens_used=1390,
        state=EXHAUSTED,
        warned_at=T0 + timedelta(seconds=2),
        exhausted_at=T0 + timedelta(seconds=4),
    )


def test_the_cost_cap_crosses_on_its_own() -> None:
    outcome = budget_decide(
        ledger=Ledger(cost_usd=Decimal("0.799999999999")),
        limits=CAPS,
        spends=[
            spend(1, 0, "0.000000000001"),
            spend(2, 0, "0.199999999999"),
            spend(3, 0, "0.000000000001"),
        ],
        at=T0,
    )
    # warned at exactly 80% of $1.00, exhausted at exactly $1.00, to the last pico-dollar
    assert [(c.kind, c.at, c.cost_usd) for c in outcome.crossings] == [
        (SOFT_WARNED, T0 + timedelta(seconds=1), Decimal("0.800000000000")),
        (EXHAUSTED_KIND, T0 + timedelta(seconds=3), Decimal("1.000000000000")),
    ]


def test_a_runaway_flag_holds_the_budget_at_exhausted_from_the_flag_until_acknowledged() -> None:
    flag = Flag(at=T0 + timedelta(seconds=2), rule="retry_loop", reason="retry loop: 5 failed")
    outcome = budget_decide(
        ledger=Ledger(),
        limits=CAPS,
        spends=[spend(1, 10), spend(2, 10), spend(3, 10)],
        flag=flag,
        at=T0 + timedelta(minutes=1),
    )
    assert kinds(outcome.crossings) == [RUNAWAY, EXHAUSTED_KIND]
    runaway, stop = outcome.crossings
    assert (runaway.at, runaway.tokens_used) == (flag.at, 20)  # totals at the flag's step
    assert runaway.detail == {
        "rule": "retry_loop",
        "reason": "retry loop: 5 failed",
        "evidence": {},
    }
    assert stop.at == flag.at and stop.detail is not None and stop.detail["reason"] == "runaway"
    assert outcome.ledger.state == EXHAUSTED

    acked = budget_decide(ledger=outcome.ledger, limits=CAPS, acknowledged_at=T0, at=T0)
    # acknowledged at T0, before the flag's own time (an agent's clock ahead of ours): it
    # still acknowledges everything flagged so far
    assert acked.ledger.state == OK and acked.ledger.exhausted_at is None
    assert acked.crossings == ()

    free = budget_decide(ledger=outcome.ledger, limits=CAPS, flag=flag, at=T0, stops_runaways=False)
    assert free.ledger.state == OK  # a project that flags without stopping


def test_a_second_flag_records_nothing() -> None:
    first = budget_decide(ledger=Ledger(), limits=CAPS, flag=Flag(T0, "a", "a"), at=T0)
    again = budget_decide(ledger=first.ledger, limits=CAPS, flag=Flag(T0, "b", "b"), at=T0)
    assert again.crossings == () and again.ledger == first.ledger


def test_a_cap_change_is_recorded_with_both_caps_and_states() -> None:
    ledger = budget_decide(ledger=Ledger(), limits=CAPS, spends=[spend(1, 1000)], at=T0).ledger
    raised = Caps(token_cap=5000, cost_cap_usd=Decimal("1.00"), warn_at_pct=Decimal("0.8"))
    outcome = budget_decide(ledger=ledger, limits=raised, old_limits=CAPS, at=T0)
    [change] = outcome.crossings
    assert change.kind == CAP_CHANGED
    assert change.detail == {
        "token_cap": [1000, 5000],
        "cost_cap_usd": ["1.00", "1.00"],
        "warn_at_pct": ["0.8", "0.8"],
        "state": [EXHAUSTED, OK],
    }
    assert (outcome.ledger.warned_at, outcome.ledger.exhausted_at) == (None, None)
    same = budget_decide(ledger=outcome.ledger, limits=raised, old_limits=raised, at=T0)
    assert same.crossings == ()  # equal caps are no change


@given(
    before=st.integers(0, 1500),
    # distinct times: two spends at the same instant may cross in either order
    batch=st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 400)), max_size=8, unique_by=lambda s: s[0]
    ),
)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_spends_summed_by_the_caller_decide_the_same(
    before: int, batch: list[tuple[int, int]]
) -> None:
    """Ingest passes its own integer sums (`added`): the outcome is the same as summing."""
    spends = [spend(seconds, tokens, f"0.{tokens:04d}") for seconds, tokens in batch]
    ledger = Ledger(tokens_used=before, cost_usd=Decimal(before) / 1000)
    summed = (sum(s.tokens for s in spends), sum((s.cost_usd for s in spends), Decimal(0)))
    assert budget_decide(ledger=ledger, limits=CAPS, spends=spends, at=T0) == budget_decide(
        ledger=ledger, limits=CAPS, spends=list(reversed(spends)), added=summed, at=T0
    )


# --- the one threshold rule: a session's caps and a period budget's limits ---------------


def test_a_total_reaches_a_limit_at_it_and_at_a_share_of_it() -> None:
    assert not reached(999, 1000) and reached(1000, 1000) and reached(1001, 1000)
    assert not reached(799, 1000, Decimal("0.8")) and reached(800, 1000, Decimal("0.8"))
    assert reached(Decimal("1.00"), Decimal("1.00")) and not reached(Decimal("0.99"), Decimal(1))
    assert not reached(10**12, None)  # no such limit: never reached
    assert limits_reached(0, Decimal("1.00"), 1000, Decimal("1.00"))  # either total
    assert not limits_reached(999, Decimal("0.99"), 1000, Decimal("1.00"))
    assert not limits_reached(10**9, Decimal(10**9), None, None)


@pytest.mark.parametrize(
    ("tokens", "cost", "state"),
    [
        (0, "0", OK),
        (799, "0.79", OK),
        (800, "0", WARNING),  # warn × the token cap
        (0, "0.80", WARNING),  # warn × the cost cap
        (1000, "0", EXHAUSTED),
        (0, "1.00", EXHAUSTED),
        (5000, "9", EXHAUSTED),  # exhausted wins over warned
    ],
)
def test_the_state_the_totals_put_a_budget_in(tokens: int, cost: str, state: str) -> None:
    assert threshold_state(CAPS, tokens, Decimal(cost)) == state
    limits = PeriodLimits(token_limit=1000, cost_limit_usd=Decimal("1.00"), warn_at=Decimal("0.8"))
    assert threshold_state(limits, tokens, Decimal(cost)) == state


@given(
    tokens=st.integers(0, 3000),
    cost=st.decimals(0, 3, places=2),
    token_limit=st.integers(1, 2000),
    cost_limit=st.decimals("0.01", 2, places=2),
    warn=st.decimals("0.01", 1, places=2),
)
def test_session_caps_and_period_limits_answer_as_the_one_rule(
    tokens: int, cost: Decimal, token_limit: int, cost_limit: Decimal, warn: Decimal
) -> None:
    caps = Caps(token_cap=token_limit, cost_cap_usd=cost_limit, warn_at_pct=warn)
    limits = PeriodLimits(token_limit=token_limit, cost_limit_usd=cost_limit, warn_at=warn)
    warned = tokens >= warn * token_limit or cost >= warn * cost_limit
    exhausted = tokens >= token_limit or cost >= cost_limit
    assert caps.warned(tokens, cost) == limits.warned(tokens, cost) == warned
    assert caps.exhausted(tokens, cost) == limits.exhausted(tokens, cost) == exhausted
    # a period budget may leave a limit out: the other one alone decides
    tokens_only = PeriodLimits(token_limit=token_limit, cost_limit_usd=None, warn_at=warn)
    assert tokens_only.exhausted(tokens, cost) == (tokens >= token_limit)


def test_a_ledger_is_read_from_a_row_a_mapping_or_a_ledger_row_without_runaway_fields() -> None:
    stored = Ledger(
        tokens_used=5, cost_usd=Decimal("0.5"), state=WARNING, warned_at=T0, runaway_at=T0,
        runaway_reason="burn", acknowledged_at=T0,
    )  # fmt: skip
    assert Ledger.of(stored) == stored  # a Session reads the same way: by these names
    as_mapping = {f: getattr(stored, f) for f in stored.__slots__}
    assert Ledger.of(as_mapping) == stored  # ingest's row
    period = SimpleNamespace(
        tokens_used=5, cost_usd=Decimal("0.5"), state=EXHAUSTED, warned_at=T0, exhausted_at=T0
    )  # a PeriodLedger: no runaway
    assert Ledger.of(period) == Ledger(
        tokens_used=5, cost_usd=Decimal("0.5"), state=EXHAUSTED, warned_at=T0, exhausted_at=T0
    )


# --- the state machine ---------------------------------------------------------------------


class BudgetMachine(RuleBasedStateMachine):
    """A budget driven through the engine, against a model kept by hand."""

    @initialize(stops=st.booleans())
    def start(self, stops: bool) -> None:
        self.stops = stops
        self.caps = CAPS
        self.ledger = Ledger()
        self.clock = T0
        self.recorded: list[Crossing] = []
        self.warned_crossings = 0  # times warned went false → true, by the model
        self.exhausted_crossings = 0
        self.was_warned = self.was_exhausted = False
        self.acknowledged_since_flag = False
        self.tokens, self.cost = 0, Decimal(0)

    def _held(self) -> bool:
        return (
            self.stops and self.ledger.runaway_at is not None and not self.acknowledged_since_flag
        )

    def _tick(self, seconds: int = 1) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    def _decide(self, **changes: object) -> None:
        outcome = budget_decide(
            ledger=self.ledger,
            limits=self.caps,
            at=self._tick(),
            stops_runaways=self.stops,
            **changes,  # type: ignore[arg-type]
        )
        self.recorded += outcome.crossings
        for crossing in outcome.crossings:
            # a crossing carries totals that cross the caps in effect
            if crossing.kind == SOFT_WARNED:
                assert self.caps.warned(crossing.tokens_used, crossing.cost_usd)
            if crossing.kind == EXHAUSTED_KIND and crossing.detail is None:
                assert self.caps.exhausted(crossing.tokens_used, crossing.cost_usd)
        self.ledger = outcome.ledger
        held = (
            self.stops and self.ledger.runaway_at is not None and not self.acknowledged_since_flag
        )
        warned = self.caps.warned(self.ledger.tokens_used, self.ledger.cost_usd)
        exhausted = self.caps.exhausted(self.ledger.tokens_used, self.ledger.cost_usd) or held
        self.warned_crossings += warned and not self.was_warned
        self.exhausted_crossings += exhausted and not self.was_exhausted
        self.was_warned, self.was_exhausted = warned, exhausted

    @rule(
        batch=st.lists(
            st.tuples(st.integers(0, 400), st.decimals("0", "0.4", places=12)),
            min_size=1,
            max_size=6,
        )
    )
    def spends(self, batch: list[tuple[int, Decimal]]) -> None:
        spends = [Spend(self._tick(), tokens, cost) for tokens, cost in batch]
        self.tokens += sum(tokens for tokens, _ in batch)
        self.cost += sum((cost for _, cost in batch), Decimal(0))
        self._decide(spends=spends)

    @rule(
        token_cap=st.integers(1, 5000),
        cost_cap=st.decimals("0.01", "5", places=2),
        warn=st.sampled_from([Decimal("0.5"), Decimal("0.8"), Decimal("1")]),
    )
    def change_caps(self, token_cap: int, cost_cap: Decimal, warn: Decimal) -> None:
        old, self.caps = self.caps, Caps(token_cap, cost_cap, warn)
        before = len(self.recorded)
        self._decide(old_limits=old)
        changes = [c for c in self.recorded[before:] if c.kind == CAP_CHANGED]
        assert len(changes) == (old != self.caps)

    @rule()
    def flag(self) -> None:
        first = self.ledger.runaway_at is None
        if first:
            self.acknowledged_since_flag = False
        self._decide(flag=Flag(self.clock, "retry_loop", "retry loop"))

    @rule()
    def acknowledge(self) -> None:
        self.acknowledged_since_flag = self.ledger.runaway_at is not None
        self._decide(acknowledged_at=self.clock)

    @invariant()
    def state_is_what_totals_caps_and_flags_say(self) -> None:
        tokens, cost = self.ledger.tokens_used, self.ledger.cost_usd
        held = (
            self.stops and self.ledger.runaway_at is not None and not self.acknowledged_since_flag
        )
        if self.caps.exhausted(tokens, cost) or held:
            expected = EXHAUSTED
        elif self.caps.warned(tokens, cost):
            expected = WARNING
        else:
            expected = OK
        assert self.ledger.state == expected
        assert (self.ledger.warned_at is not None) == self.caps.warned(tokens, cost)
        assert (self.ledger.exhausted_at is not None) == (expected == EXHAUSTED)

    @invariant()
    def each_crossing_is_recorded_once(self) -> None:
        recorded = kinds(tuple(self.recorded))
        assert recorded.count(SOFT_WARNED) == self.warned_crossings
        assert recorded.count(EXHAUSTED_KIND) == self.exhausted_crossings
        assert recorded.count(RUNAWAY) == (self.ledger.runaway_at is not None)

    @invariant()
    def totals_are_the_sums_of_the_spends(self) -> None:
        assert (self.ledger.tokens_used, self.ledger.cost_usd) == (self.tokens, self.cost)


BudgetMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
test_budget_machine = pytest.mark.slow(pytest.mark.filterwarnings("ignore")(BudgetMachine.TestCase))
