"""Charts on small data: one point draws a marker, a time axis over a single point or a burst
is padded rather than ticked in fractions of a millisecond, and a chart with nothing but
zeros says so instead of drawing empty axes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import plotly.graph_objects as go
import pytest
from django.test import Client

from costboard.dashboards import charts
from costboard.dashboards.selectors.overview import UsageBreakdown
from costboard.models import Session
from tests.conftest import Agent
from tests.costboard.dashboards.test_dashboards import figures

AT = datetime(2026, 11, 27, 10, 0, 0, tzinfo=UTC)
WARN = Decimal("0.8")


def message(figure: dict[str, Any]) -> str:
    assert figure["data"] == []
    [annotation] = figure["layout"]["annotations"]
    return str(annotation["text"])


def test_one_point_draws_a_marker_on_an_axis_padded_a_minute_either_side() -> None:
    figure = charts.cumulative_tokens([(AT, 1200)], cap=100_000, warn_at=WARN)
    go.Figure(figure)
    [line] = figure["data"]
    assert line["mode"] == "lines+markers"
    assert (line["x"], line["y"]) == ([AT.isoformat()], [1200])
    assert figure["layout"]["xaxis"] == {
        "type": "date",
        "range": ["2026-11-27T09:59:00+00:00", "2026-11-27T10:01:00+00:00"],
    }


def test_a_burst_within_a_second_is_padded_to_two_minutes_around_it() -> None:
    points = [(AT + timedelta(milliseconds=ms), 100 * (n + 1)) for n, ms in enumerate([0, 80, 400])]
    figure = charts.cumulative_tokens(points, cap=100_000, warn_at=WARN)
    assert figure["data"][0]["mode"] == "lines+markers"
    assert figure["layout"]["xaxis"]["range"] == [
        "2026-11-27T09:59:00.200000+00:00",
        "2026-11-27T10:01:00.200000+00:00",
    ]
    start, end = (datetime.fromisoformat(t) for t in figure["layout"]["xaxis"]["range"])
    assert end - start == charts.MIN_TIME_SPAN


def test_a_long_session_keeps_plotlys_own_range_and_a_plain_line() -> None:
    points = [(AT + timedelta(minutes=n), 10 * (n + 1)) for n in range(charts.FEW_POINTS + 1)]
    figure = charts.cumulative_tokens(points, cap=100_000, warn_at=WARN)
    assert figure["data"][0]["mode"] == "lines"
    assert figure["layout"]["xaxis"] == {"type": "date"}
    few = charts.cumulative_tokens(points[: charts.FEW_POINTS], cap=100_000, warn_at=WARN)
    assert few["data"][0]["mode"] == "lines+markers"
    assert few["layout"]["xaxis"] == {"type": "date"}  # 29 minutes: no padding needed


def test_a_session_without_tokens_says_so_on_both_charts() -> None:
    tool_calls = [(AT, 0), (AT + timedelta(seconds=2), 0)]
    assert message(charts.cumulative_tokens(tool_calls, cap=100_000, warn_at=WARN)) == (
        "No token data: no step of this session used tokens"
    )
    assert message(charts.cumulative_tokens([], cap=100_000, warn_at=WARN)).startswith(
        "No token data"
    )
    free = {"tool": {1: Decimal(0), 2: Decimal(0)}}
    assert message(charts.cost_per_turn(free)).startswith("No cost data")
    go.Figure(charts.cost_per_turn(free))


def test_an_overview_of_free_steps_says_so_rather_than_drawing_zero_bars() -> None:
    day = date(2026, 11, 27)
    breakdown = UsageBreakdown(
        days=[day],
        cost_by_day_model={"none": {day: Decimal(0)}, "unpriced-model": {day: Decimal(0)}},
        cost_by_step_type={"tool": Decimal(0)},
        tokens_by_kind={"input": 0, "output": 0, "cache read": 0, "cache write": 0},
        cost_by_kind={k: Decimal(0) for k in ("input", "output", "cache read", "cache write")},
        cache_savings_usd=Decimal(0),
    )
    assert message(charts.daily_cost_by_model(breakdown)) == "No priced steps in these 30 days"
    assert message(charts.cost_by_step_type(breakdown)).startswith("No cost data")
    assert message(charts.tokens_by_kind(breakdown)) == "No tokens in these 30 days"


def test_a_single_turn_costing_something_still_draws_its_bar() -> None:
    figure = charts.cost_per_turn({"response": {1: Decimal("0.0042")}})
    go.Figure(figure)
    assert figure["data"][0]["y"] == [0.0042]
    assert figure["layout"]["xaxis"]["range"] == [0.5, 1.5]
    assert figure["layout"]["xaxis"]["tickvals"] == [1]


@pytest.mark.django_db
def test_the_session_pages_of_one_step_and_of_tool_calls_only(
    staff: Client, agent: Agent, priced: None
) -> None:
    agent.events(
        {
            "session_id": "one-step",
            "turn": 1,
            "timestamp": "2026-11-27T10:00:00Z",
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 800,
            "output_tokens": 40,
        },
        *[
            {
                "session_id": "tools-only",
                "turn": 1,
                "timestamp": f"2026-11-27T10:00:0{n}Z",
                "step_type": "tool",
                "model": "none",
                "duration_ms": 120,
            }
            for n in range(3)
        ],
    )
    one = Session.objects.get(external_id="one-step")
    figs = figures(staff.get(f"/sessions/{one.pk}/"))
    assert figs["cumulative"]["data"][0]["mode"] == "lines+markers"
    assert figs["cumulative"]["data"][0]["y"] == [840]
    assert figs["cumulative"]["layout"]["xaxis"]["range"] == [
        "2026-11-27T09:59:00+00:00",
        "2026-11-27T10:01:00+00:00",
    ]
    tools = Session.objects.get(external_id="tools-only")
    figs = figures(staff.get(f"/sessions/{tools.pk}/"))
    for name in ("cumulative", "per_turn"):
        go.Figure(figs[name])
    assert message(figs["cumulative"]).startswith("No token data")
    assert message(figs["per_turn"]).startswith("No cost data")
