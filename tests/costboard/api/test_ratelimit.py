"""The per-key API rate limit (COSTBOARD_API_RATE_LIMIT, a project's api_rate_limit): 429 with
Retry-After and nothing stored past it, counted in /metrics; shared through a real Redis
(started here on a free port) by every process, or kept in process without one; and served
unlimited (fail open) while Redis is down."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client

from costboard.api import ratelimit
from costboard.models import ApiKey, Step
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "scrape-the-limit"
REDIS_EPHEMERAL = ["--save", "", "--appendonly", "no"]  # nothing written to disk


class RedisServer:
    """A redis-server of this test's own on a free port, without persistence."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("no redis-server: apt-get install redis-server")
        self.binary = binary
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", *REDIS_EPHEMERAL],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def redis_server(settings: Any) -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    settings.COSTBOARD_RATE_LIMIT_REDIS_URL = server.url
    ratelimit._STATE.paused_until = 0.0  # a previous test's outage is not this one's
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def in_process(settings: Any) -> None:
    settings.COSTBOARD_RATE_LIMIT_REDIS_URL = ""


def step(**fields: Any) -> dict[str, Any]:
    return {
        "session_id": "s1",
        "step_type": "response",
        "model": "m",
        "input_tokens": 100,
        **fields,
    }


def budget_get(agent: Agent, key: str | None = None) -> Any:
    """The cheapest keyed request: one that the limit counts like any other."""
    return agent.client.get(
        "/api/v1/sessions/none/budget", headers={"Authorization": f"Bearer {key or agent.key}"}
    )


def metric(project: str) -> float | None:
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    for line in response.content.decode().splitlines():
        if line.startswith(f'costboard_api_rate_limited_total{{project="{project}"}}'):
            return float(line.split()[-1])
    return None


def assert_refused(response: Any, limit: int) -> None:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/json"
    retry_after = int(response["Retry-After"])
    assert retry_after >= 1
    (error,) = response.json()["errors"]
    assert (error["index"], error["field"]) == (None, "Authorization")
    assert f"more than {limit} requests in one second" in error["message"]
    assert "COSTBOARD_API_RATE_LIMIT" in error["message"]


def test_past_the_limit_a_key_gets_429_with_retry_after_and_nothing_is_stored(
    agent: Agent, settings: Any, redis_server: RedisServer
) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 3
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    started = time.monotonic()
    assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 404]
    refused = agent.post({"events": [step()]})
    otlp = agent.client.post(
        "/v1/traces", b"", content_type="application/json", headers={"x-costboard-key": agent.key}
    )
    assert time.monotonic() - started < 0.9  # all of it inside the one second
    assert_refused(refused, 3)
    assert_refused(otlp, 3)  # OTLP is an endpoint like the others
    assert Step.objects.count() == 0
    assert metric("acme") == 2

    time.sleep(1.05)  # the window has moved on: the key is served again
    assert agent.events(step())["accepted"] == 1
    assert Step.objects.get().input_tokens == 100
    assert metric("acme") == 2


def test_the_limit_is_per_key(agent: Agent, settings: Any, redis_server: RedisServer) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 2
    _, second_key = ApiKey.issue(project=agent.project)
    other = make_agent("other")
    assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 429]
    assert [budget_get(agent, second_key).status_code for _ in range(2)] == [404, 404]
    assert budget_get(other).status_code == 404


def test_a_projects_own_limit_wins_and_0_turns_it_off(
    agent: Agent, settings: Any, redis_server: RedisServer
) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 1
    agent.project.api_rate_limit = 4
    agent.project.save()
    assert [budget_get(agent).status_code for _ in range(5)] == [404] * 4 + [429]
    assert_refused(budget_get(agent), 4)

    unlimited = make_agent("unlimited", api_rate_limit=0)
    assert {budget_get(unlimited).status_code for _ in range(10)} == {404}
    settings.COSTBOARD_API_RATE_LIMIT = 0
    other = make_agent("other")
    assert {budget_get(other).status_code for _ in range(10)} == {404}


def test_the_project_admin_edits_the_limit(agent: Agent, staff: Client) -> None:
    page = staff.get(f"/admin/costboard/project/{agent.project.pk}/change/")
    assert page.status_code == 200
    assert b'name="api_rate_limit"' in page.content


def test_every_process_shares_the_limit_through_redis(
    agent: Agent, settings: Any, redis_server: RedisServer
) -> None:
    """Another process (a second gunicorn worker) spends the key's second: this one is 429."""
    settings.COSTBOARD_API_RATE_LIMIT = 3
    script = textwrap.dedent(
        f"""
        import json, time, django
        django.setup()
        from costboard.api.ratelimit import rate_limit_check
        from costboard.models import Project
        project = Project(pk={agent.project.pk}, slug="acme", api_rate_limit=3)
        first_at = time.time()
        admitted = [rate_limit_check(raw_key={agent.key!r}, project=project) is None
                    for _ in range(3)]
        print(json.dumps({{"admitted": admitted, "first_at": first_at}}))
        """
    )
    env = {
        **os.environ,
        "CELERY_BROKER_URL": redis_server.url,
        "DJANGO_SETTINGS_MODULE": "costboard.settings",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["admitted"] == [True, True, True]
    refused = budget_get(agent)
    assert time.time() - outcome["first_at"] < 0.9  # within the other process's second
    assert_refused(refused, 3)


def test_without_redis_each_process_keeps_the_limit(
    agent: Agent, settings: Any, in_process: None
) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 2
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    before = metric("acme") or 0
    assert [budget_get(agent).status_code for _ in range(2)] == [404, 404]
    assert_refused(agent.post({"events": [step()]}), 2)
    assert Step.objects.count() == 0
    assert metric("acme") == before + 1
    time.sleep(1.05)
    assert budget_get(agent).status_code == 404


def test_while_redis_is_down_requests_are_served_and_a_warning_logged_once(
    agent: Agent, settings: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 2
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    ratelimit._STATE._warned_at = float("-inf")  # this test's warning is the first of the minute
    assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 429]

    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="costboard.api.ratelimit"):
        statuses = [agent.post({"events": [step(event_id=f"e{i}")]}).status_code for i in range(4)]
        time.sleep(ratelimit.REDIS_PAUSE_SECONDS + 0.05)  # Redis is asked again, and fails
        statuses.append(agent.post({"events": [step(event_id="e4")]}).status_code)
    assert statuses == [200] * 5  # fail open: the limiter's outage is not ingest's
    assert Step.objects.count() == 5
    warnings = [r for r in caplog.records if r.name == "costboard.api.ratelimit"]
    assert len(warnings) == 1
    assert "Redis" in warnings[0].getMessage() and "served unlimited" in warnings[0].getMessage()
    assert metric("acme") is None  # the scrape works; the counter it cannot read is left out

    redis_server.start()  # back on the same port: limiting resumes after the pause
    time.sleep(ratelimit.REDIS_PAUSE_SECONDS + 0.05)
    assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 429]


def test_the_default_limit_is_50_per_second() -> None:
    script = "from django.conf import settings; print(settings.COSTBOARD_API_RATE_LIMIT)"
    env = {k: v for k, v in os.environ.items() if k != "COSTBOARD_API_RATE_LIMIT"}
    env.update(DJANGO_SETTINGS_MODULE="costboard.settings", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "50"
