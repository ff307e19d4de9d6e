"""What the client tests share: the client's clock, turned by hand, and what a step of
Anthropic's 1-hour cache writes is stored as."""

from __future__ import annotations

import pytest
from costboard_client import _client

from costboard.models import Step
from tests.conftest import usd


class Clock:
    """The client's time, standing still but for its own sleeps and what a test adds: how
    long the client waited is read off this clock, never measured."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(_client, "_monotonic", clock)
    monkeypatch.setattr(_client, "_perf_counter", clock)
    monkeypatch.setattr(_client, "_sleep", clock.sleep)
    return clock


def assert_one_hour_writes_priced_apart(step: Step) -> None:
    """A step of 7 input, 11 output, 1,301 cache-read and 503 cache-write tokens, 401 of the
    writes to Anthropic's 1-hour cache: stored with the split and priced at each rate (the
    1-hour writes above the 5-minute ones)."""
    assert (step.input_tokens, step.cache_read_input_tokens, step.output_tokens) == (7, 1301, 11)
    assert (step.cache_creation_input_tokens, step.cache_creation_1h_input_tokens) == (503, 401)
    price = step.price
    assert price is not None and price.model == "claude-sonnet-4-5"
    read, write, write_1h = price.cache_read_mtok, price.cache_write_mtok, price.cache_write_1h_mtok
    assert read is not None and write is not None and write_1h is not None
    assert write_1h > write
    assert step.cost_usd == (
        usd(7, price.input_mtok)
        + usd(11, price.output_mtok)
        + usd(1301, read)
        + usd(102, write)
        + usd(401, write_1h)
    )
