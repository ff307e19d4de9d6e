"""Period budgets decided with the spend: what ingest's budgets question (batch.py) asks,
inside the batch's transaction, after the steps are stored.

For each of the project's budgets, the batch's steps it covers (periods.budget_member's rule,
asked once per batch, per session or per step as the scope needs) are grouped by the member
they count toward (a per-member budget's user, key or tag value; '' for the others) and the
period their timestamps fall in; the sums are added to each (budget, period, member) ledger
row in one upsert, made if missing, in one order (budget, period start, member), which locks
the rows, so two batches never deadlock and never decide on stale totals; the budget engine
decides each from its totals before the batch (the same `budget_decide` as a session's) and
its crossings become BudgetEvents — soft_warned, exhausted and one `threshold` per warn
fraction, once per ledger, so per budget, period and member (a unique constraint holds it
under any race) — which the caller announces through the outbox.

A rolling budget (docs/budgets.md, "Rolling windows") has one ledger per member (its period
start the epoch, as a total budget's), locked the same way; under that lock the batch's
steps in the window are added to its hourly buckets (BudgetHour) — in the same statement as
the ledgers on PostgreSQL, once they are locked — and the ledger keeps the window's totals,
summed again from the buckets when the window has moved to another hour, so the engine
decides from the window's totals at the batch's time, never from a sum of steps. When those
fell back under the first warn fraction since a crossing, the ledger begins a new episode:
its state back to ok, its crossings recordable again.

Steps a batch moves out of the `system` session into their OTLP trace's session (docs/api.md,
"OTLP traces"; `SpendBatch.moved`) were counted when they arrived, under the user and tags
they had in `system`. Each user or tag budget that counted one (`budget_counted`) and whose
member for it is not the same there and now (another member, none before, or none now) gets
it taken out of the old member's ledger (and day, or hour) and added to the new one's, in
the same upsert as the batch's steps (so under the same locks, in the same order); project
and key budgets are unchanged (the step's project and key are). Every ledger touched is then
decided like any other: the additions' crossings recorded once; a ledger the subtraction
takes back under a limit or a warn fraction is decided from its new totals (its state ok or
warning again, as a repricing does), its crossings already recorded kept, and not recorded
again in that period.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any, Protocol

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Collate

from costboard.budgets.alerts import announce
from costboard.budgets.engine import (
    EXHAUSTED,
    SOFT_WARNED,
    THRESHOLD,
    Crossing,
    Ledger,
    Outcome,
    budget_decide,
)
from costboard.budgets.periods import (
    EPOCH,
    PeriodLimits,
    StepScope,
    budget_member,
    forecast,
    member_days,
    period_bounds,
    rolling,
    window_bounds,
    window_totals,
)
from costboard.budgets.upserts import DAYS, HOURS, day_rows, hour_rows, upsert_rows
from costboard.budgets.windows import (
    LedgerKey,
    Spans,
    in_window,
    span,
    window_ledger,
    window_moved,
    windows_set,
)
from costboard.model_rows import ModelColumns
from costboard.models import (
    BudgetEvent,
    PeriodBudget,
    PeriodLedger,
    Project,
    usd,
)
from costboard.money import pico_usd
from costboard.sql_arrays import USD_PICO, Column, Dialect

FORECAST = BudgetEvent.Kind.FORECAST


class SpendStep(Protocol):
    """A stored step as period budgets read it (ingest's steps): and a spend to the engine."""

    @property
    def session_key(self) -> str: ...
    @property
    def at(self) -> datetime: ...
    @property
    def tokens(self) -> int: ...
    @property
    def cost_pico(self) -> int: ...  # USD × 10^12: sums are exact integer additions
    @property
    def cost_usd(self) -> Decimal: ...


@dataclass(frozen=True, slots=True)
class MovedSpend:
    """A stored step the batch moved into another session (module docstring): its id, and
    what budgets matched it by (user and tags) where it was and where it now is."""

    step: SpendStep  # in its new session
    step_id: int
    before: StepScope
    after: StepScope


@dataclass(frozen=True, slots=True)
class TakenBack:
    """A moved step as the budgets it leaves get it: its tokens and cost taken out."""

    moved: SpendStep

    @property
    def session_key(self) -> str:
        return self.moved.session_key

    @property
    def at(self) -> datetime:
        return self.moved.at

    @property
    def tokens(self) -> int:
        return -self.moved.tokens

    @property
    def cost_pico(self) -> int:
        return -self.moved.cost_pico

    @property
    def cost_usd(self) -> Decimal:
        return -self.moved.cost_usd


def budget_counted(budget: PeriodBudget, step_id: int, at: datetime) -> bool:
    """Did `budget` count the stored step of this id and time when it arrived: from the first
    step id the budget could count (`counts_from_step`); for a budget made before that was
    kept, by the step's time from its creation on."""
    if budget.counts_from_step is not None:
        return step_id >= budget.counts_from_step
    return at >= budget.created_at


@dataclass(frozen=True)
class SpendBatch:
    """A batch's stored steps, with what budgets match them by: the key that sent them, each
    session's end user (as it stands after the batch) and each step's tags; and the stored
    steps it moved between sessions (`moved`, module docstring)."""

    steps: Sequence[SpendStep]
    key_prefix: str = ""
    user_of: Mapping[str, str] = field(default_factory=dict)
    tags_of: Callable[[Any], dict[str, str] | None] = lambda step: None
    moved: Sequence[MovedSpend] = ()

    def members(self, budget: PeriodBudget) -> dict[str, Sequence[SpendStep]]:
        """The steps that count toward `budget` (its period aside), by the member they count
        toward ('' alone for a budget that is not per member): for the project's budgets and
        the sending key's, the whole batch, without looking at each step."""
        if budget.scope in (PeriodBudget.Scope.PROJECT, PeriodBudget.Scope.API_KEY):
            # the same for every step of the batch: asked once
            whole = StepScope(user_id="", key_prefix=self.key_prefix, tags=None)
            member = budget_member(budget, whole)
            return {} if member is None else {member: self.steps}
        groups: dict[str, list[SpendStep]] = {}
        if budget.scope == PeriodBudget.Scope.USER:
            member_of: dict[str, str] = {}
            for key, user_id in self.user_of.items():
                found = budget_member(budget, StepScope(user_id=user_id, key_prefix="", tags=None))
                if found is not None:
                    member_of[key] = found
            for step in self.steps if member_of else ():
                found = member_of.get(step.session_key)
                if found is not None:
                    groups.setdefault(found, []).append(step)
        else:
            for step in self.steps:
                scope = StepScope(user_id="", key_prefix="", tags=self.tags_of(step))
                found = budget_member(budget, scope)
                if found is not None:
                    groups.setdefault(found, []).append(step)
        for moved in self.moved:
            spend = moved.step
            if not (spend.tokens or spend.cost_pico):
                continue
            if not budget_counted(budget, moved.step_id, spend.at):
                continue  # made after it arrived: it counts toward none of its members
            was, now = budget_member(budget, moved.before), budget_member(budget, moved.after)
            if was == now:
                continue
            if was is not None:
                groups.setdefault(was, []).append(TakenBack(spend))
            if now is not None:
                groups.setdefault(now, []).append(spend)
        return dict(groups)


@dataclass
class PeriodOutcome:
    """The ledgers a batch touched (after it), its crossings, and for each session the
    exhausted stop-budget that stops it, if any."""

    ledgers: list[tuple[PeriodBudget, PeriodLedger]] = field(default_factory=list)
    events: list[BudgetEvent] = field(default_factory=list)
    stopped: dict[str, int] = field(default_factory=dict)  # session key → budget id


def project_budgets(project: Project) -> list[PeriodBudget]:
    """The project's period budgets, by id: read by every batch and every budget read, so
    written once as SQL (costboard/model_rows.py) rather than compiled by the ORM each time."""
    with connection.cursor() as cursor:
        cursor.execute(_budgets_sql(connection.vendor), [project.pk])
        return [_BUDGET.instance(row) for row in cursor.fetchall()]


_BUDGET = ModelColumns(PeriodBudget, "b")


@lru_cache(maxsize=4)
def _budgets_sql(vendor: str) -> str:
    return f"SELECT {_BUDGET.select()} FROM {_BUDGET.table} WHERE b.project_id = %s ORDER BY b.id"


def _by_period(
    budget: PeriodBudget, steps: Sequence[SpendStep], spans: Spans
) -> dict[datetime, tuple[datetime | None, Sequence[SpendStep]]]:
    """The steps grouped by the period of `budget` they fall in: start → (end, steps). A
    batch mostly falls in one, found from its first and last step alone."""
    first, last = span(steps, spans)
    start, end = period_bounds(budget.period, budget.timezone, first)
    if end is None or last < end:
        return {start: (end, steps)}
    groups: dict[datetime, tuple[datetime | None, list[SpendStep]]] = {}
    for step in steps:
        start, end = period_bounds(budget.period, budget.timezone, step.at)
        groups.setdefault(start, (end, []))[1].append(step)
    return dict(groups)


def period_budgets_apply(
    *,
    project: Project,
    budgets: Sequence[PeriodBudget],
    batch: SpendBatch,
    now: datetime,
) -> PeriodOutcome:
    """Count the batch's steps toward the budgets that cover them and decide each (module
    docstring)."""
    outcome = PeriodOutcome()
    if not budgets or not (batch.steps or batch.moved):
        return outcome
    groups: dict[LedgerKey, Sequence[SpendStep]] = {}
    ends: dict[LedgerKey, datetime | None] = {}
    by_id = {budget.pk: budget for budget in budgets}
    spans: Spans = {}
    # a rolling budget's ledgers: every step of its member (whose sessions it stops)
    windows: dict[LedgerKey, Sequence[SpendStep]] = {}
    for budget in budgets:
        if rolling(budget):  # one ledger per member, its window's start the budget's
            start = window_bounds(budget.window_hours or 1, now)[0]
            for member, covered in batch.members(budget).items():
                key = (budget.pk, EPOCH, member)
                groups[key], ends[key] = in_window(start, covered, spans), None
                windows[key] = covered
            continue
        for member, covered in batch.members(budget).items():
            for start, (end, steps) in _by_period(budget, covered, spans).items():
                groups[(budget.pk, start, member)] = steps
                ends[(budget.pk, start, member)] = end
    if not groups:
        return outcome
    # sums once per list of steps: the budgets that cover the whole batch share one
    sums: dict[int, tuple[int, int]] = {}  # tokens and pico-dollars
    for spends in groups.values():
        if id(spends) not in sums:
            sums[id(spends)] = (sum(s.tokens for s in spends), sum(s.cost_pico for s in spends))
    added = {key: sums[id(spends)] for key, spends in groups.items()}
    calendar = {key: steps for key, steps in groups.items() if key not in windows}
    rows = _ledgers_add(
        project.pk,
        added,
        ends,
        now,
        days=day_rows(by_id, calendar, sums, spans),
        hours=hour_rows({key: groups[key] for key in windows}, sums, spans),
    )
    # a rolling ledger whose window moved to another hour since its last batch (or new):
    # its totals summed again from its hours, under its lock (`window_moved`)
    moved = window_moved(
        [(by_id[pk], rows[(pk, start, member)]) for pk, start, member in windows], now
    )
    written: list[PeriodLedger] = []  # the rolling ledgers to write, in one statement

    events: list[BudgetEvent] = []
    limits_of = {pk: PeriodLimits.of(budget) for pk, budget in by_id.items()}
    for key in sorted(groups):
        row = rows[key]
        budget, spends = by_id[row.budget_id], groups[key]
        tokens, pico = added[key]
        cost = pico_usd(pico)
        limits = limits_of[row.budget_id]
        episode = row.episode
        # the row holds the totals with this batch: the engine decides from those before it
        totals = (row.tokens_used - tokens, row.cost_usd - cost)
        if key in windows:
            before = window_ledger(row, limits, totals)
        else:
            before = replace(Ledger.of(row), tokens_used=totals[0], cost_usd=totals[1])
        decided = budget_decide(
            ledger=before,
            limits=limits,
            at=now,
            spends=spends,  # read only to time a crossing
            added=(tokens, cost),
            thresholds=limits.thresholds,
        )
        changed = _ledger_set(row, decided, totals=False)
        if key in windows and (changed or key in moved or row.episode != episode):
            written.append(row)
        elif changed:
            row.save(update_fields=_STATE_FIELDS)
        if decided.crossings:
            events += _crossings_recorded(project, budget, row, decided.crossings)
        outcome.ledgers.append((budget, row))
        # a stop in the period the answer is for, `now`'s (as every read decides it): a
        # late step's exhausted past period stops nothing now
        current = (
            key in windows or row.period_end is None or row.period_start <= now < row.period_end
        )
        if budget.action == PeriodBudget.Action.STOP and row.state == EXHAUSTED and current:
            counted = windows.get(key, spends)
            for session_key in {s.session_key for s in counted if not isinstance(s, TakenBack)}:
                outcome.stopped.setdefault(session_key, budget.pk)
    windows_set(written)
    outcome.events = events
    return outcome


_STATE_FIELDS = ["state", "warned_at", "exhausted_at", "threshold_crossed", "episode"]


def _ledger_totals_set(row: PeriodLedger, decided: Outcome) -> None:
    row.tokens_used, row.cost_usd = decided.ledger.tokens_used, decided.ledger.cost_usd


def _ledger_set(row: PeriodLedger, decided: Outcome, *, totals: bool) -> bool:
    """The engine's ledger onto the row (with its totals: a rolling ledger's window); True if
    its state changed."""
    after = decided.ledger
    if totals:
        _ledger_totals_set(row, decided)
    state = (after.state, after.warned_at, after.exhausted_at, after.threshold_crossed)
    if state == (row.state, row.warned_at, row.exhausted_at, row.threshold_crossed):
        return False
    row.state, row.warned_at, row.exhausted_at, row.threshold_crossed = state
    return True


# The order ledgers are locked in, everywhere: ingest's upsert takes them in Python's order of
# (budget, period start, member), so a lock taken in SQL orders the member as Python does — by
# code point, the "C" collation (a database's own, en_US say, puts "U-b" before "u-a" where
# Python does not): two orders over one pair of rows would deadlock.
LEDGER_ORDER = (
    "budget_id",
    "period_start",
    Collate("member", "C") if connection.vendor == "postgresql" else "member",
)


def _ledgers_add(
    project_id: int,
    added: dict[LedgerKey, tuple[int, int]],
    ends: dict[LedgerKey, datetime | None],
    now: datetime,
    *,
    days: list[list[Any]],
    hours: list[list[Any]],
) -> dict[LedgerKey, PeriodLedger]:
    """Add each (budget, period, member)'s tokens and pico-dollars to its ledger row, made if
    missing, in (budget, period start, member) order so two batches never deadlock, which
    locks the rows until the commit and returns them with the sums added (so the engine reads
    the totals before the batch as these less what it added, no other batch between); then,
    under those locks, the batch's `days` (calendar budgets') and `hours` (rolling budgets')
    to theirs. On PostgreSQL one statement, each table's rows one array per column: the days
    and hours are written only once every ledger is locked (they wait for the ledgers' count);
    on SQLite (the database locked whole) one statement each. The ledgers are read back as
    the ORM would (`ModelColumns`), without its compiler."""
    sql = Dialect()
    ledgers, params = upsert_rows(
        sql,
        "v",
        _LEDGER_ADD_COLUMNS,
        [
            [budget_id, start, member, ends[(budget_id, start, member)], tokens, pico]
            for (budget_id, start, member), (tokens, pico) in sorted(added.items())
        ],
    )
    params += [project_id, _moment(now)]
    table = PeriodLedger._meta.db_table
    returned = ", ".join(str(f.column) for f in _LEDGER.fields)
    ledgers_add = (
        f"INSERT INTO {table} (project_id, budget_id, period_start, member, period_end, "
        f"tokens_used, cost_usd, state, updated_at) SELECT %s, budget_id, period_start, member, "
        f"period_end, tokens_used, cost_usd, 'ok', %s FROM v WHERE true "
        f"ON CONFLICT (budget_id, period_start, member, project_id) DO UPDATE "
        f"SET tokens_used = {table}.tokens_used + excluded.tokens_used, "
        f"cost_usd = {table}.cost_usd + excluded.cost_usd, updated_at = excluded.updated_at "
        f"RETURNING {returned}"
    )
    postgres = sql.postgres
    after = "(SELECT count(*) FROM led) > 0" if postgres else "true"
    more: list[tuple[str, str, list[Any]]] = []  # each table's rows, upsert, parameters
    for name, (target, columns, conflict), adds in (("d", DAYS, days), ("h", HOURS, hours)):
        if adds:
            with_rows, row_params = upsert_rows(sql, name, columns, adds)
            upsert = adding(target, name, columns, conflict, after)
            more.append((with_rows, upsert, [*row_params, project_id]))
    with sql.cursor() as cursor:
        if postgres:
            parts = [ledgers, f"led AS ({ledgers_add})"]
            for n, (with_rows, upsert, more_params) in enumerate(more):
                parts += [with_rows, f"w{n} AS ({upsert})"]
                params += more_params
            cursor.execute(f"WITH {', '.join(parts)} SELECT * FROM led", params)
            found = cursor.fetchall()
        else:
            cursor.execute(f"WITH {ledgers} {ledgers_add}", params)
            found = cursor.fetchall()
            for with_rows, upsert, more_params in more:
                cursor.execute(f"WITH {with_rows} {upsert}", more_params)
    ledger_rows = [_LEDGER.instance(values) for values in found]
    return {(row.budget_id, row.period_start, row.member): row for row in ledger_rows}


def adding(table: str, source: str, columns: Sequence[Column], conflict: str, where: str) -> str:
    """The upsert adding `source`'s rows (`columns`: the key columns, then the tokens and cost
    they add) to `table`'s, for the project given as its one parameter."""
    names = ", ".join(column for column, _ in columns)
    return (
        f"INSERT INTO {table} (project_id, {names}) SELECT %s, {names} FROM {source} "
        f"WHERE {where} ON CONFLICT ({conflict}, project_id) DO UPDATE SET "
        f"tokens_used = {table}.tokens_used + excluded.tokens_used, "
        f"cost_usd = {table}.cost_usd + excluded.cost_usd"
    )


def _moment(at: datetime) -> Any:
    return at if connection.vendor == "postgresql" else connection.ops.adapt_datetimefield_value(at)


_LEDGER = ModelColumns(PeriodLedger, "l")

_LEDGER_ADD_COLUMNS: list[Column] = [
    ("budget_id", "bigint"),
    ("period_start", "timestamptz"),
    ("member", "text"),
    ("period_end", "timestamptz"),
    ("tokens_used", "bigint"),
    ("cost_usd", USD_PICO),
]


def _crossings_recorded(
    project: Project,
    budget: PeriodBudget,
    ledger: PeriodLedger,
    crossings: Sequence[Crossing],
    extra: dict[str, object] | None = None,
) -> list[BudgetEvent]:
    """The crossings as BudgetEvents of the ledger (a per-member budget's: of its member, named
    in the detail), each kind (each warn fraction's `threshold`) once per period, and per
    episode for a rolling budget: one already recorded (crossed before a limit was raised,
    then crossed again) is not recorded twice. Returns those recorded now (to announce), but
    the first warn fraction's `threshold`: its crossing is announced as its `soft_warned`
    (docs/budgets.md, "Thresholds"), and a fraction of 1, whose crossing is the exhaustion's,
    announced as that.

    A `soft_warned` is the first fraction's, once per fraction (its `threshold` the fraction):
    a budget whose first fraction was moved up (0.5 to 0.8) warns again when the new one is
    crossed. It is recorded only for a fraction not crossed yet in the period (or episode):
    one whose `threshold` event exists was alerted when crossed, first fraction then or not,
    and is not alerted again when an edit makes it the first. The caller holds the ledger's
    row lock, so the check and the record are one decision; the unique constraint holds the
    record besides."""
    first = budget.thresholds[0]
    warned_before = any(c.kind == SOFT_WARNED for c in crossings) and (
        BudgetEvent.objects.filter(
            ledger=ledger, kind=THRESHOLD, threshold=first, episode=ledger.episode
        ).exists()
    )
    recorded = []
    for crossing in crossings:
        threshold = Decimal(0)
        if crossing.kind == THRESHOLD and crossing.detail is not None:
            threshold = Decimal(str(crossing.detail["threshold"]))
        elif crossing.kind == SOFT_WARNED:
            if warned_before:
                continue
            threshold = first
        event, created = BudgetEvent.objects.get_or_create(
            ledger=ledger,
            kind=crossing.kind,
            threshold=threshold,
            episode=ledger.episode,
            defaults={
                "project": project,
                "at": crossing.at,
                "tokens_used": crossing.tokens_used,
                "cost_usd": crossing.cost_usd,
                "detail": {
                    "budget_id": budget.pk,
                    "budget": budget.name,
                    **({"member": ledger.member} if ledger.member else {}),
                    **PeriodLimits.of(budget).describe(),
                    "warn_at_pct": str(budget.warn_at_pct),
                    "warn_at": list(budget.warn_at),
                    **(
                        {"window_hours": budget.window_hours, "episode": ledger.episode}
                        if rolling(budget)
                        else {}
                    ),
                    **(crossing.detail or {}),
                    **(extra or {}),
                },
            },
        )
        # the first fraction's crossing is announced once, as its soft_warned; a fraction of
        # 1 (or more) is crossed where the limit is, and announced as the exhaustion
        if created and not (crossing.kind == THRESHOLD and (threshold == first or threshold >= 1)):
            recorded.append(event)
    return recorded


def period_budget_recheck(budget: PeriodBudget, *, now: datetime) -> list[BudgetEvent]:
    """After a budget's limits changed: its current period decided again under the new ones
    (a raised limit clears a state, a lowered one may cross), each member's of a per-member
    budget, in the caller's transaction, under the ledgers' locks (taken in member order).
    Returns the crossings recorded (to announce)."""
    start, _ = period_bounds(budget.period, budget.timezone, now)
    rows = list(
        PeriodLedger.objects.select_for_update()
        .filter(budget=budget, period_start=start)
        .order_by(*LEDGER_ORDER)
    )
    limits = PeriodLimits.of(budget)
    windows = window_totals([(budget, row.member) for row in rows], now) if rolling(budget) else {}
    recorded: list[BudgetEvent] = []
    for row in rows:
        ledger = Ledger.of(row)
        if rolling(budget):  # its window now, under its lock
            ledger = window_ledger(row, limits, windows[(budget.pk, row.member)])
            row.window_start = window_bounds(budget.window_hours or 1, now)[0]
        decided = budget_decide(ledger=ledger, limits=limits, at=now, thresholds=limits.thresholds)
        _ledger_set(row, decided, totals=False)
        row.updated_at = now
        _ledger_totals_set(row, decided)
        row.save(
            update_fields=["tokens_used", "cost_usd", "window_start", "updated_at", *_STATE_FIELDS]
        )
        recorded += _crossings_recorded(budget.project, budget, row, decided.crossings)
    return recorded


def stopping_budgets(
    budgets: Sequence[PeriodBudget], scopes: Mapping[str, StepScope], now: datetime
) -> dict[str, int]:
    """Each of `scopes` (a session's, by its key) that an exhausted stop-budget covers, in
    the budget's current period (a rolling budget: its window at `now`) → the first such
    budget's id. A per-member budget stops only the scopes of its exhausted members. One
    query (two with rolling budgets); none when no budget stops or covers them."""
    stops = [b for b in budgets if b.action == PeriodBudget.Action.STOP]
    if not stops or not scopes:
        return {}
    wanted: dict[str, list[tuple[int, str]]] = {}
    members: dict[int, set[str]] = {}
    for key, scope in scopes.items():
        for budget in stops:
            member = budget_member(budget, scope)
            if member is not None:
                wanted.setdefault(key, []).append((budget.pk, member))
                members.setdefault(budget.pk, set()).add(member)
    if not members:
        return {}
    current = Q(pk__in=[])
    windows: list[tuple[PeriodBudget, str]] = []
    for budget in stops:
        if budget.pk not in members:
            continue
        if rolling(budget):  # decided against its window now, whatever was stored
            windows += [(budget, member) for member in members[budget.pk]]
            continue
        start = period_bounds(budget.period, budget.timezone, now)[0]
        current |= Q(budget=budget, period_start=start, member__in=members[budget.pk])
    exhausted: set[tuple[int, str]] = set()
    if len(windows) < sum(len(found) for found in members.values()):
        exhausted |= set(
            PeriodLedger.objects.filter(current, state=EXHAUSTED).values_list("budget_id", "member")
        )
    if windows:
        by_id = {budget.pk: budget for budget in stops}
        for (pk, member), (tokens, cost) in window_totals(windows, now).items():
            if PeriodLimits.of(by_id[pk]).exhausted(tokens, cost):
                exhausted.add((pk, member))
    found: dict[str, int] = {}
    for key, pairs in wanted.items():
        first = next((budget_id for budget_id, m in pairs if (budget_id, m) in exhausted), None)
        if first is not None:
            found[key] = first
    return found


def stopping_budget(
    project: Project, *, user_id: str, tags: dict[str, str] | None, key_prefix: str, now: datetime
) -> int | None:
    """The id of an exhausted stop-budget (in its current period) that covers a session of
    this user and these tags asked about with this key; None if nothing stops it."""
    scope = StepScope(user_id=user_id, key_prefix=key_prefix, tags=tags or None)
    return stopping_budgets(project_budgets(project), {"": scope}, now).get("")


def period_forecast_sweep(*, now: datetime) -> int:
    """Alert, once per period (and member, for a per-member budget), each budget whose
    current period is projected at its recent daily rate to pass its USD limit before the
    period ends (a `forecast` event, through the outbox). Run by beat and guard_sweep; safe
    to run twice (the event is once per ledger). Returns how many were recorded."""
    budgets = {
        b.pk: b
        for b in PeriodBudget.objects.filter(cost_limit_usd__isnull=False).select_related("project")
    }
    bounds = {pk: period_bounds(b.period, b.timezone, now) for pk, b in budgets.items()}
    current = Q(pk__in=[])
    for pk, (start, _) in bounds.items():
        current |= Q(budget_id=pk, period_start=start)
    ledgers = list(
        PeriodLedger.objects.filter(current)
        .exclude(state=EXHAUSTED)
        .order_by("budget_id", "member")
        .values_list("pk", "budget_id", "member")
    )
    days = member_days([(budget_id, member) for _, budget_id, member in ledgers], now)
    recorded: list[BudgetEvent] = []
    for ledger_id, budget_id, member in ledgers:
        budget = budgets[budget_id]
        start, end = bounds[budget_id]
        with transaction.atomic():
            row = PeriodLedger.objects.select_for_update().filter(pk=ledger_id).first()
            if row is None or row.state == EXHAUSTED:
                continue
            ahead = forecast(
                budget, row.cost_usd, start=start, end=end, days=days[(budget_id, member)], now=now
            )
            if ahead is None or ahead.crossing_day is None:
                continue
            crossing = Crossing(FORECAST, now, row.tokens_used, row.cost_usd)
            made = _crossings_recorded(
                budget.project,
                budget,
                row,
                [crossing],
                extra={
                    "crossing_date": ahead.crossing_day.isoformat(),
                    "forecast_cost_usd": usd(ahead.cost_usd),
                    "forecast_daily_usd": usd(ahead.daily_usd),
                },
            )
            announce(made)
            recorded += made
    return len(recorded)
