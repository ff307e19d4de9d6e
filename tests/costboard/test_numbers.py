"""One set of number rules for pages and charts (costboard/numbers.py), and the charts built
with them: axes from the data's range with no two ticks alike, gauges coloured by how full."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.template import Context, Template

from costboard.dashboards import charts
from costboard.numbers import count_axis, tokens_short, usd_axis, usd_d3_format, usd_text


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (Decimal("0"), "$0.00"),
        (Decimal("0.7612"), "$0.76"),
        (Decimal("100000"), "$100,000.00"),
        (Decimal("1234.565"), "$1,234.57"),
        (Decimal("0.0000844"), "$0.0000844"),
        (Decimal("0.00632"), "$0.00632"),
        (Decimal("-0.5"), "-$0.50"),
        (None, "—"),
    ],
)
def test_usd_has_cents_and_separators_and_three_digits_below_a_cent(
    amount: Decimal | None, text: str
) -> None:
    assert usd_text(amount) == text


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0"), (999, "999"), (117_600, "117.6k"), (250_000, "250k"), (10**10, "10B")],
)
def test_short_token_counts_drop_a_trailing_zero(count: int, text: str) -> None:
    assert tokens_short(count) == text


def test_templates_use_the_same_rules() -> None:
    html = Template(
        "{% load costboard_tags %}{{ n|thousands }} {{ c|usd }} {{ t|tokens }} {{ v|plain }}"
    ).render(Context({"n": 156296, "c": Decimal("0.7612"), "t": 10**10, "v": ["a", 1]}))
    assert html == "156,296 $0.76 10B [&quot;a&quot;, 1]"


TOPS = [
    *(
        Decimal(m) * Decimal(10) ** e
        for e in range(-6, 6)
        for m in ("1", "1.3", "2.7", "4.9", "7.6")
    )
]


@pytest.mark.parametrize("top", TOPS)
def test_a_money_axis_covers_the_data_and_no_two_ticks_read_alike(top: Decimal) -> None:
    axis = usd_axis([float(top) / 3, float(top)])
    labels = axis["ticktext"]
    assert len(labels) == len(set(labels)), labels
    assert 3 <= len(labels) <= 7
    assert axis["tickvals"][0] == 0 and axis["tickvals"][-1] >= float(top)
    assert axis["range"] == [0, axis["tickvals"][-1]]
    assert axis["tickvals"][-1] < float(top) * 2.5  # the data fills the chart


@pytest.mark.parametrize("top", [1, 2, 3, 7, 12, 99, 156_296, 250_000, 1_200_000, 10**10])
def test_a_count_axis_covers_the_data_and_no_two_ticks_read_alike(top: int) -> None:
    axis = count_axis([float(top)])
    labels = axis["ticktext"]
    assert len(labels) == len(set(labels)), labels
    assert axis["tickvals"][-1] >= top


def test_the_turn_cost_axis_of_a_cheap_session_is_not_cents_three_times() -> None:
    figure = charts.cost_per_turn(
        {"response": {1: Decimal("0.004"), 2: Decimal("0.011"), 3: Decimal("0.0062")}}
    )
    assert figure["layout"]["yaxis"]["ticktext"] == ["$0", "$0.005", "$0.01", "$0.015"]
    assert figure["data"][0]["text"] == ["$0.004", "$0.01", "$0.0062"]  # as the tables read


def test_a_gauge_rounds_as_the_tile_and_is_coloured_by_how_full() -> None:
    def bar(value: int, cap: int) -> str:
        fig = charts.gauge(title="t", value=value, cap=cap, warn_at=Decimal("0.8"), usd=False)
        return str(fig["data"][0]["gauge"]["bar"]["color"])

    assert (bar(50, 100), bar(80, 100), bar(108, 100)) == (
        charts.OK_COLOUR,
        charts.WARN_COLOUR,
        charts.OVER_COLOUR,
    )
    fig = charts.gauge(
        title="USD", value=Decimal("0.7612"), cap=Decimal(10), warn_at=Decimal("0.8"), usd=True
    )
    indicator = fig["data"][0]
    assert indicator["number"] == {"valueformat": ",.2f", "prefix": "$"}  # $0.76, as the tile
    assert indicator["gauge"]["axis"]["ticktext"] == ["0", "$8.00", "$10.00"]
    assert usd_d3_format(Decimal("0.0000844")) == ".3~r"
    tokens = charts.gauge(title="tokens", value=9000, cap=10_000, warn_at=Decimal("0.8"), usd=False)
    assert tokens["data"][0]["gauge"]["axis"]["ticktext"] == ["0", "8k", "10k"]


def test_a_cap_far_above_the_data_is_named_not_drawn() -> None:
    start = datetime(2026, 11, 1, tzinfo=UTC)
    points = [(start + timedelta(hours=h), 10_000 * (h + 1)) for h in range(5)]
    far = charts.cumulative_tokens(points, cap=10**10, warn_at=Decimal("0.8"))
    assert far["layout"]["shapes"] == []
    assert far["layout"]["yaxis"]["tickvals"][-1] == 50_000
    assert "cap 10B is off the chart" in far["layout"]["annotations"][0]["text"]
    near = charts.cumulative_tokens(points, cap=60_000, warn_at=Decimal("0.8"))
    assert [shape["y0"] for shape in near["layout"]["shapes"]] == [60_000, 48_000]
    assert near["layout"]["yaxis"]["tickvals"][-1] >= 60_000


def test_charts_with_nothing_to_draw_say_so() -> None:
    figure = charts.cost_per_turn({})
    assert figure["data"] == []
    assert figure["layout"]["annotations"][0]["text"].startswith("No turns")


def test_the_turn_cost_histogram_shows_the_buckets_from_first_to_last_filled() -> None:
    buckets = [("< $0.0001", 0), ("$0.0001–$0.0003", 2), ("$0.0003–$0.001", 0), ("x", 5)]
    buckets += [("y", 0)]
    figure = charts.turn_cost_histogram(buckets)
    assert figure["data"][0]["y"] == ["$0.0001–$0.0003", "$0.0003–$0.001", "x"]
    assert figure["data"][0]["x"] == [2, 0, 5]
