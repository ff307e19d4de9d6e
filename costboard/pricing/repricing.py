"""Repricing after a price is added, edited or deleted.

Each affected step is priced again with the current rate table; what changed is written to
the step and the difference (never a recount) is added to its turn, session, the session's
per-model usage, the daily rollups (by model, by user, by tag) and the period budgets that
counted it (costboard/budgets/repriced.py), so rollups stay equal to the sum of their steps
even where old steps were deleted by retention. A step whose model family changes with its
price row is moved, whole, from its old family's rollup rows to its new family's. Steps are
locked while repriced, so two repricings never apply one change twice. Lock order matches
ingest (sessions, then the period budgets' ledgers, then rollups; a session's turns are
under its lock) so the two cannot deadlock. The sessions and the budgets are decided again
once every chunk is written.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from costboard.budgets.repriced import (
    StepRepriced,
    period_ledgers_reprice,
    repriced_budgets_decide,
)
from costboard.budgets.services import session_recheck
from costboard.models import (
    DailyRollup,
    Session,
    SessionModelUsage,
    Step,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from costboard.pricing.families import is_tool_model, price_families, step_classify
from costboard.pricing.names import model_aliases
from costboard.pricing.rates import (
    audio_of,
    compiled_pattern,
    forget_rate_table,
    rate_table,
    step_cost,
)

ZERO = Decimal(0)
COST_COLUMNS = (
    "cost_input_usd",
    "cost_output_usd",
    "cost_cache_read_usd",
    "cost_cache_write_usd",
    "cost_usd",
)


@dataclass(frozen=True)
class PriceMatch:
    """The model names a price row covers: its name and its optional regex."""

    model: str
    regex: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"model": self.model, "regex": self.regex}

    @classmethod
    def from_dict(cls, value: dict[str, str]) -> PriceMatch:
        return cls(model=value["model"], regex=value.get("regex", ""))

    def covers(self, step_model: str) -> bool:
        name = step_model.strip().lower()
        pattern = None
        if self.regex:
            try:
                pattern = compiled_pattern(self.regex)
            except re.error:
                pattern = None
        for candidate in [name, *model_aliases(name)]:
            if candidate == self.model.lower():
                return True
            if pattern is not None and pattern.search(candidate):
                return True
        return False


def models_affected(matches: list[PriceMatch]) -> list[str]:
    """The step models (from the rollups, one row per model and day) a change may reprice;
    never the tool steps' (no price is theirs)."""
    models = DailyRollup.objects.values_list("model", flat=True).distinct()
    return sorted(
        m for m in models if not is_tool_model(m) and any(match.covers(m) for match in matches)
    )


@dataclass
class _Delta:
    costs: list[Decimal] = field(default_factory=lambda: [ZERO] * len(COST_COLUMNS))
    unpriced: int = 0

    def add(self, before: list[Decimal], after: list[Decimal]) -> None:
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            self.costs[i] += new - old

    def updates(self) -> dict[str, Any]:
        return {
            name: F(name) + amount
            for name, amount in zip(COST_COLUMNS, self.costs, strict=True)
            if amount
        }


@dataclass
class RepriceResult:
    steps_seen: int = 0
    steps_changed: int = 0
    cost_delta: Decimal = ZERO
    sessions: set[int] = field(default_factory=set)
    budgets: set[int] = field(default_factory=set)  # period budgets whose spend changed


def steps_reprice(
    *,
    models: list[str],
    project_id: int | None = None,
    since: datetime | None = None,
    chunk: int = 2000,
) -> RepriceResult:
    """Reprice every step of these models (of one project, from an instant on, when given:
    what a negotiated adjustment covers); return what changed."""
    forget_rate_table()
    table = rate_table()
    result = RepriceResult()
    scope: dict[str, Any] = {}
    if project_id is not None:
        scope["project_id"] = project_id
    if since is not None:
        scope["timestamp__gte"] = since
    for model in models:
        last_id = 0
        while True:
            with transaction.atomic():
                steps = list(
                    Step.objects.select_for_update(of=("self",))
                    .filter(model=model, id__gt=last_id, **scope)
                    .order_by("id")[:chunk]
                )
                if not steps:
                    break
                last_id = steps[-1].pk
                _reprice_chunk(steps, table, result)
    now = timezone.now()
    for session_id in sorted(result.sessions):
        session_recheck(session_id=session_id, at=now)
    repriced_budgets_decide(result.budgets, now=now)
    return result


def _costs(step: Step) -> list[Decimal]:
    return [getattr(step, name) for name in COST_COLUMNS]


ROLLUP_TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)
# What a step adds to its daily rollup, in this order: tokens, costs, calls, errors,
# unpriced calls, milliseconds.
ROLLUP_COUNTERS = (
    *ROLLUP_TOKENS,
    *COST_COLUMNS,
    "calls",
    "errors",
    "unpriced_calls",
    "duration_ms",
)
USAGE_COUNTERS = ("calls", "tokens_used", "cost_usd")


def _rollup_share(step: Step, costs: list[Decimal], unpriced: bool) -> list[Any]:
    """The step's part of its daily rollup, with these costs."""
    tokens = [getattr(step, name) for name in ROLLUP_TOKENS]
    return [*tokens, *costs, 1, int(not step.success), int(unpriced), step.duration_ms or 0]


def _add(into: list[Any], values: list[Any], sign: int = 1) -> None:
    for i, value in enumerate(values):
        into[i] += sign * value


def _reprice_chunk(steps: list[Step], table: Any, result: RepriceResult) -> None:
    """Price these steps again; write what changed and the differences to their rollups. A
    step whose family changed (its price row now another, or renamed) moves from its old
    family's rollup rows to its new family's."""
    families = price_families(table.rates, key=table)
    sessions: dict[int, _Delta] = defaultdict(_Delta)
    turns: dict[int, _Delta] = defaultdict(_Delta)
    # (session, family, model) → calls, tokens used, cost
    model_usage: dict[tuple[int, str, str, int], list[Any]] = defaultdict(lambda: [0, 0, ZERO])
    # (project, day, family, model, step type) → ROLLUP_COUNTERS
    rollups: dict[tuple[int, date, str, str, str], list[Any]] = defaultdict(
        lambda: [0] * len(ROLLUP_TOKENS) + [ZERO] * len(COST_COLUMNS) + [0] * 4
    )
    # (project, day, user) and (project, day, tag key, value) → COST_COLUMNS: the spend by
    # user and by tag change with the steps' prices too
    by_user: dict[tuple[int, date, str], list[Decimal]] = defaultdict(
        lambda: [ZERO] * len(COST_COLUMNS)
    )
    by_tag: dict[tuple[int, date, str, str], list[Decimal]] = defaultdict(
        lambda: [ZERO] * len(COST_COLUMNS)
    )
    # the user ingest rolled each step up under, which it keeps (Step.user_id); a step stored
    # before it kept one (NULL) is its session's user now
    unknown = {step.session_id for step in steps if step.user_id is None}
    users_now = (
        dict(Session.objects.filter(pk__in=unknown).values_list("pk", "user_id")) if unknown else {}
    )
    changed: list[Step] = []
    moved: set[int] = set()  # sessions with a step moved to another family
    spends: list[StepRepriced] = []  # what the period budgets that counted them get
    for step in steps:
        result.steps_seen += 1
        # ingest's rule (a tool step priced before it is set back to $0)
        picos, family, unpriced_after = step_classify(
            table,
            families,
            step.model,
            step.provider,
            step.timestamp,
            step.input_tokens,
            step.output_tokens,
            step.cache_read_input_tokens,
            step.cache_creation_input_tokens,
            step.cache_creation_1h_input_tokens,
            step.service_tier,
            step.project_id,
            audio_of(*step.audio),
        )
        cost = step_cost(picos)
        before = _costs(step)
        after = [cost.input, cost.output, cost.cache_read, cost.cache_write, cost.total]
        if cost.price_id == step.price_id and before == after and family == step.family:
            continue
        unpriced_before = step.price_id is None and not is_tool_model(step.model)
        old_family = step.family
        if family != old_family:
            moved.add(step.session_id)
        step.price_id = cost.price_id
        step.family = family
        for name, value in zip(COST_COLUMNS, after, strict=True):
            setattr(step, name, value)
        changed.append(step)
        result.cost_delta += after[-1] - before[-1]
        sessions[step.session_id].add(before, after)
        if step.turn_id is not None:
            turns[step.turn_id].add(before, after)
        day = step.timestamp.astimezone(UTC).date()
        old_key = (step.project_id, day, old_family, step.model, step.step_type)
        new_key = (step.project_id, day, family, step.model, step.step_type)
        _add(rollups[old_key], _rollup_share(step, before, unpriced_before), -1)
        _add(rollups[new_key], _rollup_share(step, after, unpriced_after))
        differences = [new - old for old, new in zip(before, after, strict=True)]
        user_id = step.user_id if step.user_id is not None else users_now.get(step.session_id)
        user_id = user_id or ""
        spends.append(
            StepRepriced(
                step.project_id, step.pk, step.timestamp, user_id, step.tags, differences[-1]
            )
        )
        _add(by_user[(step.project_id, day, user_id)], differences)
        for key, value in (step.tags or {}).items():
            _add(by_tag[(step.project_id, day, key, value)], differences)
        _add(
            model_usage[(step.session_id, old_family, step.model, step.project_id)],
            [1, step.tokens_used, before[-1]],
            -1,
        )
        _add(
            model_usage[(step.session_id, family, step.model, step.project_id)],
            [1, step.tokens_used, after[-1]],
        )
    if not changed:
        return
    Step.objects.bulk_update(changed, ["price", "family", *COST_COLUMNS], batch_size=500)
    result.steps_changed += len(changed)
    result.sessions.update(sessions)

    # Lock every touched session first, in ingest's order, before any turn or rollup.
    locked = (
        Session.objects.select_for_update(of=("self",))
        .filter(pk__in=sessions)
        .order_by("project_id", "external_id")
        .values_list("pk", flat=True)
    )
    for session_id in list(locked):
        if updates := sessions[session_id].updates():
            Session.objects.filter(pk=session_id).update(**updates)
    # the period budgets' ledgers next, as ingest locks them: after the sessions, before the
    # rollups (decided again once every chunk is written: repriced_budgets_decide)
    result.budgets |= period_ledgers_reprice(spends)
    _counters_add(
        SessionModelUsage,
        ("session_id", "family", "model", "project_id"),
        USAGE_COUNTERS,
        {key: values for key, values in model_usage.items() if any(values)},
    )
    sessions_families_rebuild(session_ids=sorted(moved))
    for turn_id in sorted(turns):
        if updates := turns[turn_id].updates():
            Turn.objects.filter(pk=turn_id).update(**updates)
    _counters_add(
        DailyRollup,
        ("project_id", "day", "family", "model", "step_type"),
        ROLLUP_COUNTERS,
        {key: values for key, values in rollups.items() if any(values)},
    )
    _counters_add(
        UserDailyRollup,
        ("project_id", "day", "user_id"),
        COST_COLUMNS,
        {key: values for key, values in by_user.items() if any(values)},
    )
    _counters_add(
        TagDailyRollup,
        ("project_id", "day", "key", "value"),
        COST_COLUMNS,
        {key: values for key, values in by_tag.items() if any(values)},
    )


def _counters_add(
    model: type[DailyRollup | SessionModelUsage | UserDailyRollup | TagDailyRollup],
    key_columns: tuple[str, ...],
    counters: tuple[str, ...],
    deltas: dict[Any, list[Any]],
) -> None:
    """Add each delta to its row, created if missing (a step moved to a family the day had
    not seen), in key order; a row left with no calls (every step moved out) is deleted."""
    table = model._meta.db_table
    columns = [*key_columns, *counters]
    sums = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in counters)
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 — names from the code
        f"VALUES ({', '.join(['%s'] * len(columns))}) "
        f"ON CONFLICT ({', '.join(key_columns)}) DO UPDATE SET {sums}"
    )
    emptied = []
    with connection.cursor() as cursor:
        for key, values in sorted(deltas.items()):
            params = [
                connection.ops.adapt_datefield_value(part) if isinstance(part, date) else part
                for part in key
            ]
            cursor.execute(sql, [*params, *values])
            if "calls" in counters and values[counters.index("calls")] < 0:
                emptied.append(dict(zip(key_columns, key, strict=True)))
    for key_values in emptied:
        model.objects.filter(**key_values, calls=0).delete()


def sessions_families_rebuild(*, session_ids: Sequence[int]) -> None:
    """Set these sessions' `families` from their model mix rows. Ingest adds the families a
    batch meets as it goes; repricing, which moves a step to another family, calls this for
    the sessions whose steps it moved (the seeder rebuilds every session's, set-based)."""
    if not session_ids:
        return
    families = "jsonb_object_agg(u.family, true)"
    if connection.vendor != "postgresql":
        families = "json_group_object(u.family, json('true'))"
    session, usage = Session._meta.db_table, SessionModelUsage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {session} AS s SET families = COALESCE(
                (SELECT {families} FROM {usage} u WHERE u.session_id = s.id), '{{}}')
            WHERE s.id IN ({", ".join(["%s"] * len(session_ids))})
            """,  # noqa: S608 — table names and an aggregate from the code; ids bound
            list(session_ids),
        )
