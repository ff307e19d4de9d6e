"""Plotly figures from selector results, as plain figure dicts.

Plain dicts (not `plotly.graph_objects`) keep a page's render cheap; the tests validate each
one against Plotly's schema. Axes run from zero to just above the data, their ticks and the
hover labels written by costboard/numbers.py, the same rules as the pages' numbers; colours,
fonts and the dark theme are applied by static/costboard/charts.js from the page's CSS.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from costboard.dashboards.selectors.overview import UsageBreakdown
from costboard.dashboards.selectors.steps import Latency
from costboard.models import TOOL_MODEL
from costboard.numbers import (
    count_axis,
    count_text,
    tokens_short,
    usd_axis,
    usd_d3_format,
    usd_text,
)

Figure = dict[str, Any]

OK_COLOUR, WARN_COLOUR, OVER_COLOUR = "#1f8a4c", "#b7791f", "#c53030"
# a cap more than this many times the data would flatten the line: it is named, not drawn
CAP_OFF_CHART = 3
# up to this many points a line also marks each point: one point alone draws no line at all
FEW_POINTS = 30
# a time axis spans at least this much, so one point (or a burst of them within a second)
# is not ticked in tenths of a millisecond: the data's range is padded either side
MIN_TIME_SPAN = timedelta(minutes=2)


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


def _usd_labels(values: Sequence[Decimal]) -> list[str]:
    return [usd_text(v) for v in values]


def _empty(message: str, **layout: Any) -> Figure:
    """A chart with nothing to draw says so, rather than axes around nothing."""
    hidden = {"visible": False, "fixedrange": True}
    return {
        "data": [],
        "layout": _layout(
            xaxis=hidden,
            yaxis=hidden,
            annotations=[
                {
                    "text": message,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                    "showarrow": False,
                    "font": {"size": 14},
                }
            ],
            **layout,
        ),
    }


def _time_axis(times: Sequence[datetime]) -> dict[str, Any]:
    """A date axis over the points; a span under MIN_TIME_SPAN is padded to it, centred on
    the data, so its ticks are seconds apart at the finest."""
    axis: dict[str, Any] = {"type": "date"}
    first, last = min(times), max(times)
    if last - first < MIN_TIME_SPAN:
        pad = (MIN_TIME_SPAN - (last - first)) / 2
        axis["range"] = [(first - pad).isoformat(), (last + pad).isoformat()]
    return axis


def _line_mode(points: int) -> str:
    return "lines+markers" if points <= FEW_POINTS else "lines"


def _stack_tops(series: Sequence[Sequence[float]]) -> list[float]:
    """Each x's stacked total: what a stacked bar's axis must reach."""
    return [sum(column) for column in zip(*series, strict=True)] if series else []


def daily_cost_by_model(breakdown: UsageBreakdown) -> Figure:
    """One stacked series per model family (tool steps, $0 by nature, left out)."""
    x = [d.isoformat() for d in breakdown.days]
    data = []
    series: list[list[float]] = []
    for family, by_day in breakdown.cost_by_day_model.items():
        if family == TOOL_MODEL:
            continue
        costs = [by_day.get(d, Decimal(0)) for d in breakdown.days]
        series.append(_money(costs))
        data.append(
            {
                "type": "bar",
                "name": family,
                "x": x,
                "y": series[-1],
                "text": _usd_labels(costs),
                "textposition": "none",
                "hovertemplate": "%{x}<br>%{fullData.name}: %{text}<extra></extra>",
            }
        )
    tops = _stack_tops(series)
    if not any(tops):  # no family, or only unpriced ones at $0: bars of nothing
        return _empty("No priced steps in these 30 days")
    return {
        "data": data,
        "layout": _layout(barmode="stack", yaxis=usd_axis(tops), xaxis={"type": "date"}),
    }


def cost_by_step_type(breakdown: UsageBreakdown) -> Figure:
    items = list(breakdown.cost_by_step_type.items())[::-1]
    if not items:
        return _empty("No steps in these 30 days")
    if not any(cost for _, cost in items):
        return _empty("No cost data: every step in these 30 days cost $0")
    costs = _money([cost for _, cost in items])
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "name": "cost",
                "y": [name for name, _ in items],
                "x": costs,
                "text": _usd_labels([cost for _, cost in items]),
                "textposition": "none",
                "hovertemplate": "%{y}: %{text}<extra></extra>",
            }
        ],
        "layout": _layout(
            xaxis=usd_axis(costs), margin={"l": 90, "r": 16, "t": 8, "b": 40}, showlegend=False
        ),
    }


def tokens_by_kind(breakdown: UsageBreakdown) -> Figure:
    kinds = list(breakdown.tokens_by_kind)
    counts = [breakdown.tokens_by_kind[k] for k in kinds]
    if not any(counts):
        return _empty("No tokens in these 30 days")
    return {
        "data": [
            {
                "type": "bar",
                "name": "tokens",
                "x": kinds,
                "y": counts,
                "text": [
                    f"{count_text(breakdown.tokens_by_kind[k])} tokens<br>"
                    f"{usd_text(breakdown.cost_by_kind[k])}"
                    for k in kinds
                ],
                "textposition": "none",
                "hovertemplate": "%{x}: %{text}<extra></extra>",
            }
        ],
        "layout": _layout(showlegend=False, yaxis=count_axis([float(c) for c in counts])),
    }


def _usd_short(amount: float) -> str:
    """A gauge's end label: $8.00, $80k (a full "$100,000.00" would not fit beside the dial)."""
    return usd_text(amount) if amount < 1000 else f"${tokens_short(amount)}"


def gauge_colour(fraction: float, warn_at: float) -> str:
    """Green below the warning level, amber from it, red at and past the cap."""
    if fraction >= 1:
        return OVER_COLOUR
    return WARN_COLOUR if fraction >= warn_at else OK_COLOUR


def gauge(
    *, title: str, value: Decimal | int, cap: Decimal | int, warn_at: Decimal, usd: bool
) -> Figure:
    """A half-dial to the cap (or past it, when used beyond), ticked at 0, the warning level
    and the cap; the bar's colour is the state's; its number rounds as the page's tile."""
    used, limit, warn = float(value), float(cap), float(warn_at)
    top = max(limit, used) or 1.0
    ticks = [0.0, warn * limit, limit] if limit else [0.0]
    number: dict[str, Any] = {"valueformat": usd_d3_format(value) if usd else ",d"}
    if usd:
        number["prefix"] = "$"
    fraction = used / limit if limit else 0.0
    return {
        "data": [
            {
                "type": "indicator",
                "mode": "gauge+number",
                "value": used,
                "number": number,
                "name": title,  # the page writes the title above the dial: Plotly's sat on it
                "gauge": {
                    "axis": {
                        "range": [0, top],
                        "tickvals": ticks,
                        "ticktext": [
                            "0" if t == 0 else _usd_short(t) if usd else tokens_short(t)
                            for t in ticks
                        ],
                    },
                    "bar": {"thickness": 0.6, "color": gauge_colour(fraction, warn)},
                    "steps": [
                        {"range": [0, warn * limit], "color": "rgba(31,138,76,.15)"},
                        {"range": [warn * limit, limit], "color": "rgba(183,121,31,.2)"},
                    ],
                    "threshold": {
                        "line": {"width": 3, "color": OVER_COLOUR},
                        "value": limit,
                        "thickness": 0.9,
                    },
                },
            }
        ],
        # room either side for the end labels ("250k", "$10.00")
        "layout": _layout(height=190, margin={"l": 56, "r": 56, "t": 16, "b": 8}),
    }


def cumulative_tokens(points: list[tuple[datetime, int]], *, cap: int, warn_at: Decimal) -> Figure:
    """Tokens used over the session's life against its cap; a cap far above the data is
    named in a note rather than drawn, so the line is not flattened against it."""
    used = [tokens for _, tokens in points]
    if not any(used):  # no steps yet, or tool calls only: a flat line at 0 says nothing
        return _empty("No token data: no step of this session used tokens")
    x = [ts.isoformat() for ts, _ in points]
    peak = max(used)
    cap_drawn = cap <= CAP_OFF_CHART * max(peak, 1)
    shapes = []
    annotations = []
    if cap_drawn:
        for level, dash, colour in (
            (cap, "solid", OVER_COLOUR),
            (float(warn_at) * cap, "dot", WARN_COLOUR),
        ):
            shapes.append(
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": level,
                    "y1": level,
                    "line": {"dash": dash, "width": 1.5, "color": colour},
                }
            )
    else:
        annotations.append(
            {
                "text": f"cap {tokens_short(cap)} is off the chart ({peak / cap * 100:.2g}% used)",
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": 1,
                "xanchor": "left",
                "yanchor": "top",
                "showarrow": False,
            }
        )
    yaxis = count_axis([float(v) for v in used] + ([float(cap)] if cap_drawn else []))
    return {
        "data": [
            {
                "type": "scatter",
                "mode": _line_mode(len(points)),
                "name": "tokens used",
                "x": x,
                "y": used,
                "line": {"shape": "hv"},
                "hovertemplate": "%{x}<br>%{y:,} tokens<extra></extra>",
            }
        ],
        "layout": _layout(
            shapes=shapes,
            annotations=annotations,
            yaxis=yaxis,
            xaxis=_time_axis([ts for ts, _ in points]),
            showlegend=False,
        ),
    }


def cost_per_turn(cost_by_turn: dict[str, dict[int, Decimal]]) -> Figure:
    turns = sorted({n for by_turn in cost_by_turn.values() for n in by_turn})
    if not turns:
        return _empty("No turns: this session's steps are outside any turn")
    if not any(cost for by_turn in cost_by_turn.values() for cost in by_turn.values()):
        return _empty("No cost data: this session's steps cost $0 (no tokens, or no price)")
    data = []
    series: list[list[float]] = []
    for step_type, by_turn in sorted(cost_by_turn.items()):
        costs = [by_turn.get(n, Decimal(0)) for n in turns]
        series.append(_money(costs))
        data.append(
            {
                "type": "bar",
                "name": step_type,
                "x": turns,
                "y": series[-1],
                "text": _usd_labels(costs),
                "textposition": "none",
                "hovertemplate": "turn %{x}<br>%{fullData.name}: %{text}<extra></extra>",
            }
        )
    tops = _stack_tops(series)
    xaxis = count_axis([float(turns[-1])])
    xaxis.update(
        title={"text": "turn"},
        tickvals=turns if len(turns) <= 20 else xaxis["tickvals"],
        ticktext=[str(n) for n in turns] if len(turns) <= 20 else xaxis["ticktext"],
        range=[turns[0] - 0.5, turns[-1] + 0.5],
    )
    return {
        "data": data,
        "layout": _layout(barmode="stack", yaxis=usd_axis(tops), xaxis=xaxis),
    }


def _ms_axis(values: list[float]) -> dict[str, Any]:
    axis = count_axis(values)
    in_seconds = axis["tickvals"][-1] >= 2000
    axis["ticktext"] = [
        "0" if v == 0 else (f"{v / 1000:g} s" if in_seconds else f"{v:g} ms")
        for v in axis["tickvals"]
    ]
    return axis


def latency(rows: list[Latency]) -> Figure:
    if not rows:
        return _empty("No timed steps in this period")
    names = [r.step_type for r in rows]
    p50 = [r.p50_ms for r in rows]
    p95 = [r.p95_ms for r in rows]
    return {
        "data": [
            {
                "type": "bar",
                "name": "p50",
                "x": names,
                "y": p50,
                "hovertemplate": "%{x} p50: %{y:,.0f} ms<extra></extra>",
            },
            {
                "type": "bar",
                "name": "p95",
                "x": names,
                "y": p95,
                "hovertemplate": "%{x} p95: %{y:,.0f} ms<extra></extra>",
            },
        ],
        "layout": _layout(barmode="group", yaxis=_ms_axis([float(v or 0) for v in [*p50, *p95]])),
    }


def turn_cost_histogram(buckets: list[tuple[str, int]]) -> Figure:
    """Turns by cost, as horizontal bars (the ranges read as written), from the cheapest
    bucket that has a turn to the costliest."""
    filled = [i for i, (_, count) in enumerate(buckets) if count]
    if not filled:
        return _empty("No turns in this period")
    shown = buckets[filled[0] : filled[-1] + 1]
    counts = [count for _, count in shown]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "name": "turns",
                "y": [label for label, _ in shown],
                "x": counts,
                "hovertemplate": "%{y}: %{x:,} turns<extra></extra>",
            }
        ],
        "layout": _layout(
            showlegend=False,
            yaxis={"autorange": "reversed", "type": "category"},
            xaxis={"title": {"text": "turns"}, **count_axis([float(c) for c in counts])},
            margin={"l": 110, "r": 16, "t": 8, "b": 48},
        ),
    }


def estimated_vs_billed(days: Sequence[tuple[str, Decimal, Decimal]]) -> Figure:
    """Per UTC day (`(day, estimated, billed)`, in order): Costboard's estimate and the
    providers' bill side by side."""
    if not days:
        return _empty("No billed days in this period")
    x = [day for day, _, _ in days]
    estimated = [e for _, e, _ in days]
    billed = [b for _, _, b in days]
    data = [
        {
            "type": "bar",
            "name": name,
            "x": x,
            "y": _money(values),
            "text": _usd_labels(values),
            "textposition": "none",
            "hovertemplate": "%{x}<br>%{fullData.name}: %{text}<extra></extra>",
        }
        for name, values in (("Estimated (Costboard)", estimated), ("Billed", billed))
    ]
    return {
        "data": data,
        "layout": _layout(
            barmode="group",
            yaxis=usd_axis(_money([*estimated, *billed])),
            xaxis={"type": "date"},
        ),
    }
