"""Plotly figures from selector results, as plain figure dicts.

Plain dicts (not `plotly.graph_objects`) keep a page's render cheap; the tests validate each
one against Plotly's schema. Money axes are USD; colours, fonts and the dark theme are applied
by static/costboard/charts.js from the page's CSS.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from costboard.dashboards.selectors import Latency, UsageBreakdown
from costboard.models import TOOL_MODEL

Figure = dict[str, Any]

USD_AXIS = {"tickprefix": "$", "tickformat": ",.2~f", "rangemode": "tozero"}
USD_HOVER = "%{x}<br>%{fullData.name}: $%{y:,.4~f}<extra></extra>"


def _layout(**overrides: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "margin": {"l": 60, "r": 16, "t": 8, "b": 40},
        "height": 300,
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "closest",
    }
    layout.update(overrides)
    return layout


def _money(values: Sequence[Decimal]) -> list[float]:
    # Plotly draws numbers; the exact Decimal stays in the tables beside each chart.
    return [float(v) for v in values]


def daily_cost_by_model(breakdown: UsageBreakdown) -> Figure:
    """One stacked series per model family (tool steps, $0 by nature, left out)."""
    x = [d.isoformat() for d in breakdown.days]
    data = [
        {
            "type": "bar",
            "name": family,
            "x": x,
            "y": _money([by_day.get(d, Decimal(0)) for d in breakdown.days]),
            "hovertemplate": USD_HOVER,
        }
        for family, by_day in breakdown.cost_by_day_model.items()
        if family != TOOL_MODEL
    ]
    return {
        "data": data,
        "layout": _layout(barmode="stack", yaxis=USD_AXIS, xaxis={"type": "date"}),
    }


def cost_by_step_type(breakdown: UsageBreakdown) -> Figure:
    items = list(breakdown.cost_by_step_type.items())[::-1]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "name": "cost",
                "y": [name for name, _ in items],
                "x": _money([cost for _, cost in items]),
                "hovertemplate": "%{y}: $%{x:,.4~f}<extra></extra>",
            }
        ],
        "layout": _layout(
            xaxis=USD_AXIS, margin={"l": 90, "r": 16, "t": 8, "b": 40}, showlegend=False
        ),
    }


def tokens_by_kind(breakdown: UsageBreakdown) -> Figure:
    kinds = list(breakdown.tokens_by_kind)
    return {
        "data": [
            {
                "type": "bar",
                "name": "tokens",
                "x": kinds,
                "y": [breakdown.tokens_by_kind[k] for k in kinds],
                "customdata": _money([breakdown.cost_by_kind[k] for k in kinds]),
                "hovertemplate": "%{x}: %{y:,} tokens<br>$%{customdata:,.2f}<extra></extra>",
            }
        ],
        "layout": _layout(showlegend=False, yaxis={"tickformat": "~s", "rangemode": "tozero"}),
    }


def gauge(
    *, title: str, value: Decimal | int, cap: Decimal | int, warn_at: Decimal, usd: bool
) -> Figure:
    top = max(float(cap), float(value)) or 1.0
    number: dict[str, Any] = {"valueformat": ",.4~f" if usd else ",d"}
    if usd:
        number["prefix"] = "$"
    return {
        "data": [
            {
                "type": "indicator",
                "mode": "gauge+number",
                "value": float(value),
                "number": number,
                "title": {"text": title},
                "gauge": {
                    "axis": {"range": [0, top]},
                    "bar": {"thickness": 0.6},
                    "steps": [
                        {"range": [0, float(warn_at) * float(cap)], "color": "rgba(31,138,76,.25)"},
                        {
                            "range": [float(warn_at) * float(cap), float(cap)],
                            "color": "rgba(183,121,31,.3)",
                        },
                    ],
                    "threshold": {
                        "line": {"width": 3, "color": "#c53030"},
                        "value": float(cap),
                        "thickness": 0.9,
                    },
                },
            }
        ],
        "layout": _layout(height=220, margin={"l": 24, "r": 24, "t": 40, "b": 8}),
    }


def cumulative_tokens(points: list[tuple[datetime, int]], *, cap: int, warn_at: Decimal) -> Figure:
    x = [ts.isoformat() for ts, _ in points]
    shapes = []
    for level, dash, name in ((cap, "solid", "cap"), (float(warn_at) * cap, "dot", "warning")):
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": level,
                "y1": level,
                "line": {
                    "dash": dash,
                    "width": 1.5,
                    "color": "#c53030" if name == "cap" else "#b7791f",
                },
            }
        )
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines",
                "name": "tokens used",
                "x": x,
                "y": [tokens for _, tokens in points],
                "line": {"shape": "hv"},
                "hovertemplate": "%{x}<br>%{y:,} tokens<extra></extra>",
            }
        ],
        "layout": _layout(
            shapes=shapes,
            yaxis={"tickformat": "~s", "rangemode": "tozero"},
            xaxis={"type": "date"},
            showlegend=False,
        ),
    }


def cost_per_turn(cost_by_turn: dict[str, dict[int, Decimal]]) -> Figure:
    turns = sorted({n for by_turn in cost_by_turn.values() for n in by_turn})
    data = [
        {
            "type": "bar",
            "name": step_type,
            "x": turns,
            "y": _money([by_turn.get(n, Decimal(0)) for n in turns]),
            "hovertemplate": "turn %{x}<br>%{fullData.name}: $%{y:,.4~f}<extra></extra>",
        }
        for step_type, by_turn in sorted(cost_by_turn.items())
    ]
    return {
        "data": data,
        "layout": _layout(
            barmode="stack", yaxis=USD_AXIS, xaxis={"title": {"text": "turn"}, "dtick": 1}
        ),
    }


def latency(rows: list[Latency]) -> Figure:
    names = [r.step_type for r in rows]
    return {
        "data": [
            {
                "type": "bar",
                "name": "p50",
                "x": names,
                "y": [r.p50_ms for r in rows],
                "hovertemplate": "%{x} p50: %{y:,.0f} ms<extra></extra>",
            },
            {
                "type": "bar",
                "name": "p95",
                "x": names,
                "y": [r.p95_ms for r in rows],
                "hovertemplate": "%{x} p95: %{y:,.0f} ms<extra></extra>",
            },
        ],
        "layout": _layout(barmode="group", yaxis={"title": {"text": "ms"}, "rangemode": "tozero"}),
    }


def turn_cost_histogram(buckets: list[tuple[str, int]]) -> Figure:
    return {
        "data": [
            {
                "type": "bar",
                "name": "turns",
                "x": [label for label, _ in buckets],
                "y": [count for _, count in buckets],
                "hovertemplate": "%{x}: %{y:,} turns<extra></extra>",
            }
        ],
        "layout": _layout(
            showlegend=False,
            xaxis={"title": {"text": "cost per turn"}},
            yaxis={"title": {"text": "turns"}},
        ),
    }
