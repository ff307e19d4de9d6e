"""The budget engine: the one place a budget's state and its crossings are decided.

A pure function — no database, no clock. Given a budget's ledger as stored (its totals, its
state and the times of its crossings), the spends to add in the order they happened, its
limits (and the limits it had, when they changed), a runaway flag and an acknowledgement, it
returns the new ledger and the crossings to record, each with its time and the totals at
the spend that crossed.

Whoever applies an outcome (ingest's one statement per batch, the services of budgets/
services.py) writes it under the row's lock; nothing else writes `state`, `warned_at`,
`exhausted_at` or `runaway_at`. A session is one kind of budget; a period budget over many
sessions is another kind of ledger and limits, decided by the same function.

The rules (docs/budgets.md, "States and budget events"):
- `warning` once tokens ≥ warn × token limit or cost ≥ warn × cost limit; `exhausted` once
  either reaches its limit, or while a runaway holds the budget (a flagged session whose
  project stops runaways, until a person acknowledges it).
- A crossing is recorded once: `soft_warned` when `warned_at` is unset and the budget is
  warned, `exhausted` likewise; a crossing no longer true (a limit raised, a runaway
  acknowledged, a repricing) is cleared, and may be crossed, and recorded, again.
- `runaway` is recorded once per budget: a flag on a budget already flagged changes nothing.
- `cap_changed` is recorded when the limits differ from the old ones given.
- `threshold` (period budgets' warn fractions, `thresholds`): one crossing per fraction the
  totals reach above the highest reached before (`threshold_crossed`), which is then the
  highest they reach — cleared like the others when no longer true. A ledger warned under a
  lower first fraction than the first now (`threshold_crossed` below it: moved up since) is
  decided as not warned at this one, so its crossing is a `soft_warned` of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from operator import attrgetter
from typing import Any, Protocol

OK = "ok"
WARNING = "warning"
EXHAUSTED = "exhausted"

SOFT_WARNED = "soft_warned"
EXHAUSTED_KIND = "exhausted"
RUNAWAY = "runaway"
CAP_CHANGED = "cap_changed"
THRESHOLD = "threshold"


def reached(used: int | Decimal, limit: int | Decimal | None, share: Decimal | int = 1) -> bool:
    """The one threshold rule: has `used` reached `share` of `limit` (None: no such limit,
    never reached)? A budget is warned once either total reaches warn × its limit, and
    exhausted once either reaches the limit itself (`limits_reached`)."""
    return limit is not None and used >= share * limit


def limits_reached(
    tokens_used: int,
    cost_usd: Decimal,
    token_limit: int | None,
    cost_limit_usd: Decimal | None,
    share: Decimal | int = 1,
) -> bool:
    """Either total at `share` of its limit: a session's caps and a period budget's limits
    alike (share 1: exhausted; share warn_at: warned)."""
    return reached(tokens_used, token_limit, share) or reached(cost_usd, cost_limit_usd, share)


def threshold_state(limits: Limits, tokens_used: int, cost_usd: Decimal) -> str:
    """The state these totals put a budget in by its limits alone (no runaway held)."""
    if limits.exhausted(tokens_used, cost_usd):
        return EXHAUSTED
    return WARNING if limits.warned(tokens_used, cost_usd) else OK


class Limits(Protocol):
    """What a budget is held to. Equal limits are no change (dataclasses compare by value)."""

    def warned(self, tokens_used: int, cost_usd: Decimal) -> bool: ...

    def exhausted(self, tokens_used: int, cost_usd: Decimal) -> bool: ...

    def reaches(self, tokens_used: int, cost_usd: Decimal, share: Decimal) -> bool:
        """Either total at `share` of its limit (a warn fraction's crossing)."""
        ...

    def describe(self) -> dict[str, object]: ...


@dataclass(frozen=True, slots=True)
class Ledger:
    """A budget as stored: its totals, its state and when each crossing happened."""

    tokens_used: int = 0
    cost_usd: Decimal = Decimal(0)
    state: str = OK
    warned_at: datetime | None = None
    exhausted_at: datetime | None = None
    runaway_at: datetime | None = None
    runaway_reason: str = ""
    acknowledged_at: datetime | None = None
    threshold_crossed: Decimal | None = None  # the highest warn fraction reached

    @classmethod
    def of(cls, row: Any) -> Ledger:
        """The ledger of a stored budget: a Session, a PeriodLedger (it has no runaway
        fields: theirs are the defaults) or ingest's row, a mapping of the same names."""
        if isinstance(row, Mapping):
            return cls(*(row.get(name, default) for name, default in _LEDGER_FIELDS))
        return cls(*(getattr(row, name, default) for name, default in _LEDGER_FIELDS))

    @property
    def acknowledged(self) -> bool:
        """A person has seen the runaway flag (acknowledged at or after it)."""
        return _acknowledged(self.runaway_at, self.acknowledged_at)


# each field's name and default: every one has a default
_LEDGER_FIELDS: tuple[tuple[str, Any], ...] = tuple((f.name, f.default) for f in fields(Ledger))


def _acknowledged(runaway_at: datetime | None, acknowledged_at: datetime | None) -> bool:
    return runaway_at is not None and acknowledged_at is not None and acknowledged_at >= runaway_at


class SpendLike(Protocol):
    """What one step adds, and when: a Spend, or any row with these three (ingest's steps)."""

    @property
    def at(self) -> datetime: ...
    @property
    def tokens(self) -> int: ...
    @property
    def cost_usd(self) -> Decimal: ...


@dataclass(frozen=True, slots=True)
class Spend:
    """What one step adds, and when."""

    at: datetime
    tokens: int
    cost_usd: Decimal


@dataclass(frozen=True, slots=True)
class Flag:
    """A runaway rule broken at `at`: its name, the line people read, and the evidence."""

    at: datetime
    rule: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def detail(self) -> dict[str, object]:
        return {"rule": self.rule, "reason": self.reason, "evidence": self.evidence}


@dataclass(frozen=True, slots=True)
class Crossing:
    """A budget event to record: its kind, its time, the totals then and its detail (None:
    the limits crossed)."""

    kind: str
    at: datetime
    tokens_used: int
    cost_usd: Decimal
    detail: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    ledger: Ledger
    crossings: tuple[Crossing, ...]

    @property
    def changed(self) -> bool:
        return bool(self.crossings)


_Moment = tuple[datetime, int, Decimal]  # a time, and the totals then


_BY_TIME = attrgetter("at")


def _first_moment(
    spends: Sequence[SpendLike], tokens: int, cost: Decimal, hit: Any, otherwise: _Moment
) -> _Moment:
    """When `hit(tokens, cost)` first holds: before any spend (at `otherwise`'s time, with the
    totals as they were), else at the spend that made it hold, else `otherwise`."""
    if hit(tokens, cost):
        return otherwise[0], tokens, cost
    for spend in sorted(spends, key=_BY_TIME):
        tokens += spend.tokens
        cost += spend.cost_usd
        if hit(tokens, cost):
            return spend.at, tokens, cost
    return otherwise


def _totals_at(spends: Sequence[SpendLike], tokens: int, cost: Decimal, at: datetime) -> _Moment:
    for spend in sorted(spends, key=_BY_TIME):
        if spend.at > at:
            break
        tokens += spend.tokens
        cost += spend.cost_usd
    return at, tokens, cost


def runaway_holds(ledger: Ledger, *, stops_runaways: bool) -> bool:
    """A flagged budget is held at exhausted (its agent told to stop) until acknowledged."""
    return _holds(ledger.runaway_at, ledger.acknowledged_at, stops_runaways=stops_runaways)


def _holds(
    runaway_at: datetime | None, acknowledged_at: datetime | None, *, stops_runaways: bool
) -> bool:
    """runaway_holds of a ledger with these moments (Ledger.acknowledged's rule)."""
    acknowledged = _acknowledged(runaway_at, acknowledged_at)
    return stops_runaways and runaway_at is not None and not acknowledged


def budget_decide(
    *,
    ledger: Ledger,
    limits: Limits,
    at: datetime,
    spends: Sequence[SpendLike] = (),
    added: tuple[int, Decimal] | None = None,
    old_limits: Limits | None = None,
    flag: Flag | None = None,
    acknowledged_at: datetime | None = None,
    stops_runaways: bool = True,
    thresholds: Sequence[Decimal] = (),
) -> Outcome:
    """The ledger after `spends` (in any order: taken in time order), a limit change from
    `old_limits`, a runaway `flag` and an acknowledgement at `acknowledged_at`, and the
    crossings to record. `at` is when the decision is made: the time of a crossing no spend
    caused. `added`: the spends' tokens and cost when the caller has summed them already
    (ingest, in integers); the spends are then read only to time a crossing. `thresholds`:
    a period budget's warn fractions, ascending (a `threshold` crossing each)."""
    before_tokens, before_cost = ledger.tokens_used, ledger.cost_usd
    if added is None:
        added = (sum(s.tokens for s in spends), sum((s.cost_usd for s in spends), Decimal(0)))
    tokens, cost = before_tokens + added[0], before_cost + added[1]
    now: _Moment = (at, tokens, cost)
    crossings: list[Crossing] = []

    runaway_at, runaway_reason = ledger.runaway_at, ledger.runaway_reason
    runaway_moment: _Moment | None = None
    if flag is not None and runaway_at is None:
        runaway_at, runaway_reason = flag.at, flag.reason
        runaway_moment = _totals_at(spends, before_tokens, before_cost, flag.at)
    acknowledged = ledger.acknowledged_at
    if acknowledged_at is not None:
        # everything flagged so far, even at a time ahead of ours (an agent's clock)
        seen = (acknowledged_at, acknowledged, runaway_at, ledger.warned_at, ledger.exhausted_at)
        acknowledged = max(moment for moment in seen if moment is not None)
    held = _holds(runaway_at, acknowledged, stops_runaways=stops_runaways)
    warned = limits.warned(tokens, cost)
    by_limits = limits.exhausted(tokens, cost)
    exhausted = by_limits or held
    state = EXHAUSTED if exhausted else WARNING if warned else OK

    if old_limits is not None and old_limits != limits:
        change = _cap_change_detail(old_limits, limits, ledger.state, state)
        crossings.append(Crossing(CAP_CHANGED, at, tokens, cost, change))

    warned_at = ledger.warned_at if warned else None
    crossed = ledger.threshold_crossed
    if warned_at is not None and thresholds and crossed is not None and crossed < thresholds[0]:
        # warned under a lower first fraction (it was moved up since): not warned at this
        # one, whose crossing is a warning of its own
        warned_at = None
    if warned and warned_at is None:
        moment = _first_moment(spends, before_tokens, before_cost, limits.warned, now)
        warned_at = moment[0]
        crossings.append(Crossing(SOFT_WARNED, *moment))

    threshold_crossed = None
    for share in thresholds:  # ascending: the first not reached ends it
        if not limits.reaches(tokens, cost, share):
            break
        threshold_crossed = share
        if ledger.threshold_crossed is None or share > ledger.threshold_crossed:

            def hit(t: int, c: Decimal, share: Decimal = share) -> bool:
                return limits.reaches(t, c, share)

            moment = _first_moment(spends, before_tokens, before_cost, hit, now)
            crossings.append(Crossing(THRESHOLD, *moment, detail={"threshold": float(share)}))

    if runaway_moment is not None and flag is not None:
        crossings.append(Crossing(RUNAWAY, *runaway_moment, detail=flag.detail()))

    exhausted_at = ledger.exhausted_at if exhausted else None
    if exhausted and exhausted_at is None:
        # by a limit (at the spend that reached it) or by a runaway held, whichever came first
        stops: list[tuple[_Moment, dict[str, object] | None]] = []
        if by_limits:
            stops.append(
                (_first_moment(spends, before_tokens, before_cost, limits.exhausted, now), None)
            )
        if held:
            why = {**limits.describe(), "reason": "runaway", "runaway": runaway_reason}
            stops.append((runaway_moment or now, why))
        moment, stop_detail = min(stops, key=lambda stop: stop[0][0])
        exhausted_at = moment[0]
        crossings.append(Crossing(EXHAUSTED_KIND, *moment, detail=stop_detail))

    after = Ledger(  # built once: ingest decides a ledger per session of every batch
        tokens_used=tokens,
        cost_usd=cost,
        state=state,
        warned_at=warned_at,
        exhausted_at=exhausted_at,
        runaway_at=runaway_at,
        runaway_reason=runaway_reason,
        acknowledged_at=acknowledged,
        threshold_crossed=threshold_crossed,
    )
    return Outcome(ledger=after, crossings=tuple(crossings))


def _cap_change_detail(
    old_limits: Limits, limits: Limits, old_state: str, state: str
) -> dict[str, object]:
    old, new = old_limits.describe(), limits.describe()
    detail: dict[str, object] = {name: [old.get(name), new.get(name)] for name in new}
    detail["state"] = [old_state, state]
    return detail
