"""What the pages' reads share: the zero and the day bounds they count in, and a model
family's calls and cost with the exact names behind them (the overview's charts, the sessions
list's model mix and /steps/'s table all show models by family)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal

from costboard.models import TOOL_MODEL

ZERO = Decimal(0)
MILLION = Decimal(1_000_000)


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


@dataclass
class ExactModel:
    """One exact model name as steps sent it, within its family."""

    model: str
    calls: int = 0
    cost_usd: Decimal = ZERO


@dataclass
class FamilyUsage:
    """A model family's calls and cost, with the exact names behind them, costliest first."""

    family: str
    calls: int = 0
    cost_usd: Decimal = ZERO
    names: list[ExactModel] = field(default_factory=list)

    @property
    def is_tool(self) -> bool:
        return self.family == TOOL_MODEL

    @property
    def aliased(self) -> bool:
        """Sent under some other name than the family's own (one click shows which)."""
        return any(name.model != self.family for name in self.names)


class FamilyTally:
    """Calls and cost per family and exact name, summed from rollup rows."""

    def __init__(self) -> None:
        self.families: dict[str, FamilyUsage] = {}
        self._names: dict[tuple[str, str], ExactModel] = {}

    def add(self, family: str, model: str, calls: int, cost: Decimal) -> None:
        usage = self.families.get(family)
        if usage is None:
            usage = self.families[family] = FamilyUsage(family)
        usage.calls += calls
        usage.cost_usd += cost
        name = self._names.get((family, model))
        if name is None:
            name = self._names[(family, model)] = ExactModel(model)
            usage.names.append(name)
        name.calls += calls
        name.cost_usd += cost

    def ordered(self) -> list[FamilyUsage]:
        """Costliest first, then most called; tool steps last ($0 by nature)."""
        for usage in self.families.values():
            usage.names.sort(key=lambda n: (-n.cost_usd, -n.calls, n.model))
        return sorted(
            self.families.values(),
            key=lambda u: (u.is_tool, -u.cost_usd, -u.calls, u.family),
        )
