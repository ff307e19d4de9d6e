"""What the client tests share: the client's clock, turned by hand."""

from __future__ import annotations

import pytest
from costboard_client import _client


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
