"""The per-key API rate limit (COSTBOARD_API_RATE_LIMIT, a project's api_rate_limit): 429 with
Retry-After and nothing stored past it, counted in /metrics; shared through a real Redis
(started here on a free port) by every process, or kept in process without one; and held by
each process at its share (limit ÷ workers) while Redis is down. The limiter's clocks are the
tests' own, turned by hand: what is inside the one second does not depend on how fast the
machine runs the test."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.test import Client

from costboard.api import ratelimit
from costboard.api.ratelimit import Refusal, rate_limit_check
from costboard.models import ApiKey, Step
from tests.conftest import Agent, make_agent
from tests.servers import RedisServer

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "scrape-the-limit"


class Clock:
    """The limiter's time in seconds, standing still until a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """One clock for the window (Redis' or in process) and the pause after a Redis failure; a
    previous test's outage, and gunicorn's count of workers, are not this one's."""
    clock = Clock()
    monkeypatch.setattr(ratelimit._STATE, "clock", clock)
    monkeypatch.setattr(ratelimit._STATE, "window_clock", clock)
    monkeypatch.setattr(ratelimit._STATE, "paused_until", 0.0)
    monkeypatch.setattr(ratelimit._STATE, "down", False)
    monkeypatch.setattr(ratelimit._STATE, "workers", 0)
    monkeypatch.setattr(ratelimit, "_LOCAL", ratelimit._LocalLimiter(clock=clock))
    monkeypatch.setattr(ratelimit, "_FALLBACK", ratelimit._LocalLimiter(clock=clock))
    return clock


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
    agent: Agent, settings: Any, redis_server: RedisServer, clock: Clock
) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 3
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    start = clock.now
    assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 404]
    clock.now = start + 0.5  # half of the second the three were admitted in
    refused = agent.post({"events": [step()]})
    otlp = agent.client.post(
        "/v1/traces", b"", content_type="application/json", headers={"x-costboard-key": agent.key}
    )
    assert_refused(refused, 3)
    assert refused["Retry-After"] == "1"  # the first leaves the window in 0.5 s: rounded up
    assert_refused(otlp, 3)  # OTLP is an endpoint like the others
    assert Step.objects.count() == 0
    assert metric("acme") == 2

    clock.now = start + 0.75  # still inside the three's second
    assert_refused(budget_get(agent), 3)
    assert metric("acme") == 3
    clock.now = start + 1  # the window has moved on: the key is served again
    assert agent.events(step())["accepted"] == 1
    assert Step.objects.get().input_tokens == 100
    assert metric("acme") == 3


def test_the_window_slides_each_request_leaves_it_one_second_after_it_came(
    agent: Agent, settings: Any, either_store: None, clock: Clock
) -> None:
    """A sliding window, not one reset each second: a place comes back as its request ages out,
    and a refusal says how long until the oldest does."""
    settings.COSTBOARD_API_RATE_LIMIT = 3
    start = clock.now

    def check_at(offset: float) -> Refusal | None:  # offsets a float spells exactly
        clock.now = start + offset
        return rate_limit_check(raw_key=agent.key, project=agent.project)

    assert [check_at(offset) for offset in (0, 0.25, 0.5)] == [None, None, None]
    assert check_at(0.75) == Refusal(limit=3, retry_after=1)  # the first leaves in 0.25 s
    assert check_at(1) is None  # it has: one place
    assert check_at(1) == Refusal(limit=3, retry_after=1)
    assert check_at(1.125) is not None  # the second is still in
    assert check_at(1.25) is None  # it has left: one place
    assert check_at(1.25) is not None
    assert [check_at(5) for _ in range(4)] == [None, None, None, Refusal(limit=3, retry_after=1)]


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


@pytest.mark.slow
def test_every_process_shares_the_limit_through_redis(
    agent: Agent, settings: Any, redis_server: RedisServer, clock: Clock
) -> None:
    """Another process (a second gunicorn worker) spends the key's second: this one is 429
    inside that second, and served once the other process's requests have left it."""
    settings.COSTBOARD_API_RATE_LIMIT = 3
    script = textwrap.dedent(
        f"""
        import json, django
        django.setup()
        from costboard.api import ratelimit
        from costboard.api.ratelimit import rate_limit_check
        from costboard.models import Project
        ratelimit._STATE.window_clock = lambda: {clock.now!r}  # this test's moment
        project = Project(pk={agent.project.pk}, slug="acme", api_rate_limit=3)
        admitted = [rate_limit_check(raw_key={agent.key!r}, project=project) is None
                    for _ in range(3)]
        print(json.dumps({{"admitted": admitted}}))
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
    moment = clock.now
    clock.now = moment + 0.75  # within the other process's second
    assert_refused(budget_get(agent), 3)
    clock.now = moment + 1  # its three have left the window
    assert budget_get(agent).status_code == 404


def test_without_redis_each_process_keeps_the_limit(
    agent: Agent, settings: Any, in_process: None, clock: Clock
) -> None:
    settings.COSTBOARD_API_RATE_LIMIT = 2
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    before = metric("acme") or 0
    assert [budget_get(agent).status_code for _ in range(2)] == [404, 404]
    assert_refused(agent.post({"events": [step()]}), 2)
    assert Step.objects.count() == 0
    assert metric("acme") == before + 1
    clock.advance(1)
    assert budget_get(agent).status_code == 404


def outage_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "costboard.api.ratelimit"]


def test_while_redis_is_down_each_process_holds_the_limit_and_warns_once_per_outage(
    agent: Agent,
    settings: Any,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis stopped: a 2/s limit still refuses the third request in a second, in this
    process's own log (one worker: its share is the whole limit); Redis is asked again a
    second after each failure, and the outage is logged once, its end once."""
    settings.COSTBOARD_API_RATE_LIMIT = 2
    settings.COSTBOARD_WEB_WORKERS = 1
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 429]
    failures: list[str] = []  # each time Redis was asked and could not answer
    failed = ratelimit._STATE.failed

    def counted(exc: BaseException) -> None:
        failures.append(type(exc).__name__)
        failed(exc)

    monkeypatch.setattr(ratelimit._STATE, "failed", counted)

    redis_server.stop()
    clock.advance(1)  # the second of the three above is over
    with caplog.at_level(logging.INFO, logger="costboard.api.ratelimit"):
        posts = [agent.post({"events": [step(event_id=f"e{i}")]}) for i in range(3)]
        assert [p.status_code for p in posts] == [200, 200, 429]
        assert_refused(posts[2], 2)
        assert (
            "each of its processes admits 2 until it is back"
            in posts[2].json()["errors"][0]["message"]
        )
        assert len(failures) == 1  # asked once, then left alone for the pause
        clock.advance(ratelimit.REDIS_PAUSE_SECONDS)  # Redis is asked again, and fails
        statuses = [agent.post({"events": [step(event_id=f"f{i}")]}).status_code for i in range(3)]
        assert statuses == [200, 200, 429]
        assert len(failures) == 2
        assert Step.objects.count() == 4  # nothing of the refused ones
        assert metric("acme") is None  # the scrape works; the counter it cannot read is left out
        (warning,) = outage_logs(caplog)  # two failures, one outage: one warning
        assert "cannot be reached" in warning and "÷ 1 workers" in warning

        redis_server.start()  # back on the same port (empty): shared again after the pause
        clock.advance(ratelimit.REDIS_PAUSE_SECONDS)
        assert [budget_get(agent).status_code for _ in range(3)] == [404, 404, 429]
        assert "answers again" in outage_logs(caplog)[1]

        redis_server.stop()  # another outage: another warning
        clock.advance(1)
        assert budget_get(agent).status_code == 404
    logs = outage_logs(caplog)
    assert len(logs) == 3 and "cannot be reached" in logs[2]


@pytest.mark.parametrize(
    ("limit", "workers", "share"), [(2, 2, 1), (5, 2, 2), (50, 4, 12), (1, 4, 1), (3, 1, 3)]
)
def test_while_redis_is_down_a_process_admits_the_limit_divided_among_the_workers(
    agent: Agent,
    settings: Any,
    redis_server: RedisServer,
    clock: Clock,
    limit: int,
    workers: int,
    share: int,
) -> None:
    """The workers of a machine together admit about the limit, and each at least 1/s."""
    settings.COSTBOARD_API_RATE_LIMIT = limit
    settings.COSTBOARD_WEB_WORKERS = workers
    redis_server.stop()
    admitted = [
        rate_limit_check(raw_key=agent.key, project=agent.project) is None for _ in range(share + 1)
    ]
    assert admitted == [True] * share + [False]
    clock.advance(1)
    assert rate_limit_check(raw_key=agent.key, project=agent.project) is None


def test_gunicorns_count_of_workers_wins_over_the_setting(
    agent: Agent,
    settings: Any,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """costboard/gunicorn_conf.py tells each worker how many there are (--workers 4 on the
    command line, whatever WEB_CONCURRENCY says)."""
    from costboard import gunicorn_conf, warmup

    settings.COSTBOARD_API_RATE_LIMIT = 8
    settings.COSTBOARD_WEB_WORKERS = 2
    monkeypatch.setattr(warmup, "worker_warm", lambda: 0.0)
    gunicorn_conf.post_worker_init(SimpleNamespace(pid=1, cfg=SimpleNamespace(workers=4)))
    assert ratelimit.web_workers() == 4
    redis_server.stop()
    admitted = [rate_limit_check(raw_key=agent.key, project=agent.project) for _ in range(3)]
    assert [a is None for a in admitted] == [True, True, False]  # 8 ÷ 4
    assert admitted[2] == Refusal(limit=8, retry_after=1, share=2)


def test_without_a_clock_of_its_own_the_window_runs_on_redis_time(
    agent: Agent, settings: Any, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As deployed: each admitted request is stamped with Redis' TIME, the one clock every
    process shares, and its log expires with the window. The window is an hour here, so
    nothing leaves it while the test reads it, however slowly the test runs."""
    monkeypatch.setattr(ratelimit._STATE, "window_clock", None)
    monkeypatch.setattr(ratelimit, "WINDOW_SECONDS", 3600)
    settings.COSTBOARD_API_RATE_LIMIT = 1
    server = redis.Redis.from_url(redis_server.url)
    log_key = ratelimit.LOG_PREFIX + ApiKey.hash_of(agent.key)[:32]

    def redis_now_us() -> int:
        seconds, micros = server.time()
        return int(seconds) * 1_000_000 + int(micros)

    before = redis_now_us()
    assert rate_limit_check(raw_key=agent.key, project=agent.project) is None
    after = redis_now_us()
    [entry] = server.zrange(log_key, 0, -1, withscores=True)
    assert isinstance(entry, tuple)  # withscores: (member, score)
    _, stamped = entry
    assert before <= stamped <= after  # Redis' clock, read between our two readings of it
    assert 0 < server.pttl(log_key) <= 3600 * 1000  # dropped once the window has passed

    before = redis_now_us()
    refusal = rate_limit_check(raw_key=agent.key, project=agent.project)
    after = redis_now_us()
    leaves_at = stamped + 3600 * 1_000_000
    assert refusal is not None and refusal.limit == 1
    # until the first leaves the window, as Redis' clock read it between our readings
    assert math.ceil((leaves_at - after) / 1e6) <= refusal.retry_after
    assert refusal.retry_after <= math.ceil((leaves_at - before) / 1e6)
    server.close()


@pytest.mark.slow
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
