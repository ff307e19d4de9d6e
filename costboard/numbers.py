"""How every number reads, on pages and in charts alike: one set of rules.

- Counts have thousands separators (156,296).
- USD from a cent up has cents and separators ($1,234.56); below a cent, three significant
  digits in fixed point ($0.0000844), so a small step's cost is never "$0.00".
- Short token counts (117.6k, 10B) for tiles' sub-lines and chart axes.
- A chart's axis ticks come from the data's range: a "nice" step (1, 2 or 5 × 10^k) and
  labels with as many decimals as that step needs, so no two ticks read the same.

Charts are drawn by Plotly in the browser from figures built in Python, so the same functions
label their axes (tickvals/ticktext) and hovers (per-point text) and pick the gauges' number
format: a tile and its gauge round alike.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

CENT = Decimal("0.01")


def usd_text(amount: Decimal | float | int | None) -> str:
    """$1,234.56 from a cent up; below, three significant digits in fixed point."""
    if amount is None:
        return "—"
    amount = Decimal(str(amount)) if isinstance(amount, float) else Decimal(amount)
    if amount == 0:
        return "$0.00"
    sign = "-" if amount < 0 else ""
    amount = amount.copy_abs()
    if amount >= CENT:
        return f"{sign}${amount.quantize(CENT, rounding=ROUND_HALF_UP):,}"
    places = 2 - amount.adjusted()  # three significant digits
    text = f"{amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):f}"
    return f"{sign}${text.rstrip('0')}"


def usd_d3_format(amount: Decimal | float | int) -> str:
    """The d3 format Plotly needs to print `amount` as usd_text does (with a "$" prefix)."""
    return ",.2f" if amount == 0 or abs(float(amount)) >= 0.01 else ".3~r"


def count_text(count: int | None) -> str:
    """156296 → 156,296."""
    if count is None:
        return "—"
    return f"{count:,}"


def tokens_short(count: int | float | None) -> str:
    """117,600 → 117.6k; 250,000 → 250k; 10,000,000,000 → 10B; below 1,000 as it is."""
    if count is None:
        return "—"
    for unit, size in (("B", 1_000_000_000), ("M", 1_000_000), ("k", 1_000)):
        if abs(count) >= size:
            short = f"{count / size:.1f}".removesuffix(".0")
            return f"{short}{unit}"
    return f"{count:,.0f}" if isinstance(count, float) else f"{count:,}"


def nice_step(top: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 × 10^k) that covers 0..top in about `ticks` steps."""
    if top <= 0:
        return 1.0
    raw = top / ticks
    exponent = math.floor(math.log10(raw))
    # read from its decimal text: 5 × 1e-06 in binary is 4.9999999999999996e-06, whose
    # labels would run to 22 decimals
    for mantissa in (1, 2, 5, 10):
        step = float(f"{mantissa}e{exponent}")
        if step >= raw:
            return step
    return float(f"10e{exponent}")  # pragma: no cover - the loop always returns


def _step_decimals(step: float) -> int:
    """Decimals a tick step needs to tell its ticks apart (0.5 → 1, 0.002 → 3, 50 → 0)."""
    exact = Decimal(repr(step)).normalize()
    return max(0, -exact.as_tuple().exponent)  # type: ignore[operator]


def _ticks(top: float, ticks: int) -> tuple[list[float], float]:
    step = nice_step(top, ticks)
    count = max(1, math.ceil(top / step - 1e-9))
    values = [round(i * step, 12) for i in range(count + 1)]
    return values, step


def _trimmed(number: str) -> str:
    """$0.00010 → $0.0001, keeping cents: $0.50 stays."""
    whole, _, fraction = number.partition(".")
    if len(fraction) > 2:
        fraction = fraction.rstrip("0").ljust(2, "0")
    return f"${whole}.{fraction}" if fraction else f"${whole}"


def usd_axis(values: list[float], ticks: int = 5) -> dict[str, Any]:
    """A money axis from 0 to just above the data, its labels as distinct as its step."""
    top = max([v for v in values if v > 0], default=0.0)
    if top == 0:
        return {"range": [0, 1], "tickvals": [0], "ticktext": ["$0"], "fixedrange": True}
    tickvals, step = _ticks(top, ticks)
    decimals = max(2, _step_decimals(step)) if step < 1 else 0
    ticktext = ["$0"] + [_trimmed(f"{v:,.{decimals}f}") for v in tickvals[1:]]
    return {"range": [0, tickvals[-1]], "tickvals": tickvals, "ticktext": ticktext}


def count_axis(values: list[float], ticks: int = 5) -> dict[str, Any]:
    """A count axis (tokens, turns, ms) from 0 to just above the data, whole-number ticks."""
    top = max([v for v in values if v > 0], default=0.0)
    if top == 0:
        return {"range": [0, 1], "tickvals": [0], "ticktext": ["0"], "fixedrange": True}
    tickvals, _ = _ticks(max(top, 1.0), ticks)
    if tickvals[-1] < 5:  # small counts: one tick per whole number
        tickvals = [float(i) for i in range(int(tickvals[-1]) + 1)]
    return {
        "range": [0, tickvals[-1]],
        "tickvals": tickvals,
        "ticktext": [tokens_short(v) for v in tickvals],
    }
