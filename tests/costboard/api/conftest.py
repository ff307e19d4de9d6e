"""Fixtures of the API limiters' tests (test_ratelimit.py, test_inflight.py): a Redis of the
test's own, which it may stop, and the same test run against Redis and in process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.servers import RedisServer


@pytest.fixture
def redis_server(settings: Any) -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    settings.COSTBOARD_RATE_LIMIT_REDIS_URL = server.url
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["redis", "in process"])
def either_store(request: pytest.FixtureRequest, settings: Any) -> None:
    """The same test against a Redis of its own and against the limiter in process."""
    if request.param == "in process":
        settings.COSTBOARD_RATE_LIMIT_REDIS_URL = ""
    else:
        request.getfixturevalue("redis_server")
