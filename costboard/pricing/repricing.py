"""Repricing after a price is added, edited or deleted.

Each affected step is priced again with the current rate table; what changed is written to
the step and the difference (never a recount) is added to its turn, session, the session's
per-model usage and the daily rollup,
so rollups stay equal to the sum of their steps even where old steps were deleted by
retention. Steps are locked while repriced, so two repricings never apply one change twice.
Lock order matches ingest (sessions, then turns, then rollups) so the two cannot deadlock.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from costboard.budgets.services import session_recheck
from costboard.models import DailyRollup, Session, SessionModelUsage, Step, Turn
from costboard.pricing.rates import compiled_pattern, forget_rate_table, model_aliases, rate_table

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
    """The step models (from the rollups, one row per model and day) a change may reprice."""
    models = DailyRollup.objects.values_list("model", flat=True).distinct()
    return sorted(m for m in models if any(match.covers(m) for match in matches))


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


def steps_reprice(*, models: list[str], chunk: int = 2000) -> RepriceResult:
    """Reprice every step of these models; return what changed."""
    forget_rate_table()
    table = rate_table()
    result = RepriceResult()
    for model in models:
        last_id = 0
        while True:
            with transaction.atomic():
                steps = list(
                    Step.objects.select_for_update(of=("self",))
                    .filter(model=model, id__gt=last_id)
                    .order_by("id")[:chunk]
                )
                if not steps:
                    break
                last_id = steps[-1].pk
                _reprice_chunk(steps, table, result)
    now = timezone.now()
    for session_id in sorted(result.sessions):
        session_recheck(session_id=session_id, at=now)
    return result


def _costs(step: Step) -> list[Decimal]:
    return [getattr(step, name) for name in COST_COLUMNS]


def _reprice_chunk(steps: list[Step], table: Any, result: RepriceResult) -> None:
    sessions: dict[int, _Delta] = defaultdict(_Delta)
    turns: dict[int, _Delta] = defaultdict(_Delta)
    model_usage: dict[tuple[int, str], Decimal] = defaultdict(Decimal)
    rollups: dict[tuple[int, date, str, str], _Delta] = defaultdict(_Delta)
    changed: list[Step] = []
    for step in steps:
        result.steps_seen += 1
        cost = table.price(
            model=step.model,
            provider=step.provider,
            when=step.timestamp,
            input_tokens=step.input_tokens,
            output_tokens=step.output_tokens,
            cache_read_input_tokens=step.cache_read_input_tokens,
            cache_creation_input_tokens=step.cache_creation_input_tokens,
            cache_creation_1h_input_tokens=step.cache_creation_1h_input_tokens,
        )
        before = _costs(step)
        after = [cost.input, cost.output, cost.cache_read, cost.cache_write, cost.total]
        if cost.price_id == step.price_id and before == after:
            continue
        unpriced_delta = int(cost.price_id is None) - int(step.price_id is None)
        step.price_id = cost.price_id
        for name, value in zip(COST_COLUMNS, after, strict=True):
            setattr(step, name, value)
        changed.append(step)
        result.cost_delta += after[-1] - before[-1]
        sessions[step.session_id].add(before, after)
        model_usage[(step.session_id, step.model)] += after[-1] - before[-1]
        if step.turn_id is not None:
            turns[step.turn_id].add(before, after)
        key = (step.project_id, step.timestamp.astimezone(UTC).date(), step.model, step.step_type)
        rollups[key].add(before, after)
        rollups[key].unpriced += unpriced_delta
    if not changed:
        return
    Step.objects.bulk_update(changed, ["price", *COST_COLUMNS], batch_size=500)
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
    for (session_id, model), amount in sorted(model_usage.items()):
        if amount:
            SessionModelUsage.objects.filter(session_id=session_id, model=model).update(
                cost_usd=F("cost_usd") + amount
            )
    for turn_id in sorted(turns):
        if updates := turns[turn_id].updates():
            Turn.objects.filter(pk=turn_id).update(**updates)
    for (project_id, day, model, step_type), delta in sorted(rollups.items()):
        updates = delta.updates()
        if delta.unpriced:
            updates["unpriced_calls"] = F("unpriced_calls") + delta.unpriced
        if updates:
            DailyRollup.objects.filter(
                project_id=project_id, day=day, model=model, step_type=step_type
            ).update(**updates)
