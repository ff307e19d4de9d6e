"""Requests in flight per API key (COSTBOARD_API_MAX_IN_FLIGHT, a project's api_max_in_flight):
one more than the key's most at once is answered 429 with Retry-After before the view runs,
nothing stored, counted in /metrics; in OTLP's own format on /v1/traces. Shared through a real
Redis (started here on a free port) by every thread and process, with leases a killed worker
cannot keep for ever; kept in process without Redis; held at each process's share while Redis
is down. Slots are taken by real threads at once, and given back however the view ends."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from contextlib import ExitStack
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, RequestFactory
from google.rpc.status_pb2 import Status

from costboard.api import inflight, ratelimit
from costboard.api.boundary import ApiError, Operation, Reply, endpoint
from costboard.api.inflight import Busy, in_flight
from costboard.models import ApiKey, Step
from tests.conftest import Agent, make_agent
from tests.servers import RedisServer
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "scrape-the-gate"
PROTOBUF = "application/x-protobuf"


class Clock:
    """Redis scripts' time and the pause after a Redis failure, in seconds, turned by hand."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Fresh gates and outage: a previous test's slots, refusals and Redis failure are not
    this one's."""
    clock = Clock()
    monkeypatch.setattr(ratelimit._STATE, "clock", clock)
    monkeypatch.setattr(ratelimit._STATE, "window_clock", clock)
    monkeypatch.setattr(ratelimit._STATE, "paused_until", 0.0)
    monkeypatch.setattr(ratelimit._STATE, "down", False)
    monkeypatch.setattr(ratelimit._STATE, "workers", 0)
    monkeypatch.setattr(inflight, "_LOCAL", inflight._LocalGate())
    monkeypatch.setattr(inflight, "_FALLBACK", inflight._LocalGate())
    return clock


def step(event_id: str) -> dict[str, Any]:
    return {"session_id": "s1", "step_type": "response", "model": "m", "event_id": event_id}


def holding(stack: ExitStack, agent: Agent, count: int, key: str | None = None) -> None:
    """Take `count` of the key's slots, as requests being answered would, until `stack`
    closes."""
    for _ in range(count):
        busy = stack.enter_context(in_flight(raw_key=key or agent.key, project=agent.project))
        assert busy is None


def metric(project: str) -> float | None:
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    for line in response.content.decode().splitlines():
        if line.startswith(f'costboard_api_in_flight_limited_total{{project="{project}"}}'):
            return float(line.split()[-1])
    return None


def assert_busy(response: Any, limit: int) -> None:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "1"
    (error,) = response.json()["errors"]
    assert (error["index"], error["field"]) == (None, "Authorization")
    assert f"already has {limit} requests being answered" in error["message"]
    assert "COSTBOARD_API_MAX_IN_FLIGHT" in error["message"]


def test_past_its_requests_in_flight_a_key_gets_429_and_nothing_is_stored(
    agent: Agent, settings: Any, either_store: None
) -> None:
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 2
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    _, second_key = ApiKey.issue(project=agent.project)
    other = make_agent("other")
    with ExitStack() as two:
        holding(two, agent, 2)
        refused = agent.post({"events": [step("e1")]})
        assert_busy(refused, 2)
        assert_busy(agent.budget("s1"), 2)
        assert Step.objects.count() == 0
        assert metric("acme") == 2
        assert metric("other") == 0
        # per key: the project's second key and another project's are not held by it
        assert agent.budget("s1").status_code == 429
        assert Agent(agent.project, second_key, Client()).events(step("e2"))["accepted"] == 1
        assert other.events(step("e3"))["accepted"] == 1
        with in_flight(raw_key=agent.key, project=agent.project) as third:
            assert third == Busy(limit=2)
    # both answered: the key's two slots are free again, and stay free after each request
    assert [agent.post({"events": [step(f"f{i}")]}).status_code for i in range(3)] == [200] * 3
    assert metric("acme") == 4  # the two above, the third budget read, the third slot


def test_a_projects_own_value_wins_and_0_turns_the_limit_off(
    agent: Agent, settings: Any, either_store: None
) -> None:
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 1
    agent.project.api_max_in_flight = 3
    agent.project.save()
    with ExitStack() as stack:
        holding(stack, agent, 3)
        assert_busy(agent.budget("s1"), 3)

    unlimited = make_agent("unlimited", api_max_in_flight=0)
    with ExitStack() as stack:
        holding(stack, unlimited, 20)
        assert unlimited.budget("s1").status_code == 404
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 0
    with ExitStack() as stack:
        holding(stack, agent, 3)  # the project's own 3 still holds
        assert agent.budget("s1").status_code == 429


@pytest.mark.parametrize("content_type", [PROTOBUF, "application/json"])
def test_otlp_is_told_in_its_own_format(
    agent: Agent, settings: Any, redis_server: RedisServer, content_type: str
) -> None:
    """An exporter reads a google.rpc.Status with RESOURCE_EXHAUSTED, in the request's format,
    and retries after Retry-After (OTLP/HTTP's 429)."""
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 1
    with ExitStack() as stack:
        holding(stack, agent, 1)
        response = agent.client.post(
            "/v1/traces", b"{}", content_type=content_type, headers={"x-costboard-key": agent.key}
        )
    assert response.status_code == 429
    assert response["Content-Type"] == content_type
    assert response["Retry-After"] == "1"
    if content_type == PROTOBUF:
        status = Status.FromString(response.content)
        code, message = status.code, status.message
    else:
        body = response.json()
        code, message = body["code"], body["message"]
        assert body["errors"] == [{"index": None, "field": "Authorization", "message": message}]
    assert code == 8  # google.rpc.Code RESOURCE_EXHAUSTED
    assert "already has 1 request being answered, its most at once" in message
    assert "COSTBOARD_API_MAX_IN_FLIGHT" in message


# --- real threads through the boundary ------------------------------------------------------


class Held:
    """A view that holds its request until the test lets go, then ends as the test says."""

    def __init__(self, ending: str) -> None:
        self.ending = ending
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.go = threading.Event()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            assert self.go.wait(timeout=60), "the test never let the view go"
        finally:
            with self.lock:
                self.inside -= 1
        if self.ending == "raises ApiError":
            raise ApiError(409, "body", "refused by the view")
        if self.ending == "raises RuntimeError":
            raise RuntimeError("the view failed")
        return JsonResponse({"ok": True})


class Crowd:
    """`count` threads calling `view` at once with `key`: each one's status (or its
    exception's name), in the order they finished."""

    def __init__(self, view: Any, key: str, count: int) -> None:
        self.results: list[int | str] = []
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(count)
        self._view, self._key = view, key
        self._threads = [threading.Thread(target=self._call) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _call(self) -> None:
        request = RequestFactory().get("/held", headers={"Authorization": f"Bearer {self._key}"})
        try:
            self._barrier.wait()
            outcome: int | str = self._view(request).status_code
        except Exception as exc:  # the view's own failure, as Django's handler would see it
            outcome = type(exc).__name__
        finally:
            connections.close_all()
        with self._lock:
            self.results.append(outcome)

    def finished(self) -> list[int | str]:
        with self._lock:
            return list(self.results)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=60)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ending", ["returns", "raises ApiError", "raises RuntimeError"])
def test_of_eight_at_once_exactly_n_are_admitted_and_their_slots_come_back(
    settings: Any, either_store: None, ending: str
) -> None:
    """Eight threads call a keyed endpoint at once (a view of this test's, through the real
    boundary): exactly three get in, five are 429; the three end (returning, refusing or
    failing) and the next eight find the same three slots free."""
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 3
    agent = make_agent("busy")
    assert agent.budget("s1").status_code == 404  # the key's first use noted before threads
    expected = {"returns": 200, "raises ApiError": 409, "raises RuntimeError": "RuntimeError"}
    for round_ in range(2):  # the second finds every slot of the first given back
        held = Held(ending)
        operation = Operation(method="GET", summary="a held view", responses={200: Reply("ok")})
        crowd = Crowd(endpoint(operation)(held), agent.key, 8)
        wait_until(
            lambda: len(crowd.finished()) == 5 and held.inside == 3,  # noqa: B023
            what="five refused and three inside the view",
        )
        assert crowd.finished() == [429] * 5, round_
        assert agent.budget("s1").status_code == 429  # still full while they run
        held.go.set()
        crowd.join()
        assert crowd.finished() == [429] * 5 + [expected[ending]] * 3
        assert held.most_inside == 3
        assert agent.budget("s1").status_code == 404
    url = settings.COSTBOARD_RATE_LIMIT_REDIS_URL
    if url:  # every lease released: none left to expire
        leases = inflight.LEASE_PREFIX + ratelimit.key_id_of(agent.key)
        assert redis.Redis.from_url(url).zcard(leases) == 0
    else:
        assert inflight._LOCAL.in_flight(ratelimit.key_id_of(agent.key)) == 0


# --- Redis: leases, processes, outages -------------------------------------------------------


def test_a_lease_expires_on_redis_time_and_its_release_removes_it(
    agent: Agent, settings: Any, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As deployed: a lease's expiry is Redis' TIME plus LEASE_SECONDS, the set itself goes
    when its last lease would, and the release takes the lease out at once."""
    monkeypatch.setattr(ratelimit._STATE, "window_clock", None)
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 2
    server = redis.Redis.from_url(redis_server.url)
    leases = inflight.LEASE_PREFIX + ratelimit.key_id_of(agent.key)

    def redis_now_us() -> int:
        seconds, micros = server.time()
        return int(seconds) * 1_000_000 + int(micros)

    with ExitStack() as stack:
        before = redis_now_us()
        holding(stack, agent, 1)
        after = redis_now_us()
        [lease] = server.zrange(leases, 0, -1, withscores=True)
        assert isinstance(lease, tuple)  # withscores: (member, score)
        _, expiry = lease
        lease_us = inflight.LEASE_SECONDS * 1_000_000
        assert before + lease_us <= expiry <= after + lease_us
        assert 0 < server.pttl(leases) <= inflight.LEASE_SECONDS * 1000
    assert server.zcard(leases) == 0
    server.close()


@pytest.mark.slow
def test_another_process_holds_the_keys_slots_until_its_leases_expire(
    agent: Agent, settings: Any, redis_server: RedisServer, clock: Clock
) -> None:
    """A second gunicorn worker takes the key's two slots and dies without giving them back
    (os._exit: no `finally` runs, as when gunicorn kills a worker): this process is refused
    until the leases expire, then served."""
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 2
    script = textwrap.dedent(
        f"""
        import json, os, django
        django.setup()
        from costboard.api import ratelimit
        from costboard.api.inflight import in_flight
        from costboard.models import Project
        ratelimit._STATE.window_clock = lambda: {clock.now!r}  # this test's moment
        project = Project(pk={agent.project.pk}, slug="acme", api_max_in_flight=2)
        gates = [in_flight(raw_key={agent.key!r}, project=project) for _ in range(3)]
        print(json.dumps({{"busy": [gate.__enter__() is not None for gate in gates]}}))
        os._exit(0)
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
    assert json.loads(done.stdout) == {"busy": [False, False, True]}
    clock.advance(inflight.LEASE_SECONDS - 1)
    assert_busy(agent.budget("s1"), 2)
    clock.advance(1)  # the dead worker's leases have expired
    assert [agent.budget("s1").status_code for _ in range(3)] == [404] * 3


def test_while_redis_is_down_each_process_holds_its_share_of_the_slots(
    agent: Agent,
    settings: Any,
    redis_server: RedisServer,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis stopped: 4 in flight over 2 workers is 2 in this process; one warning for the
    outage (the rate limit's too); a slot taken then is given back there, after Redis is back."""
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 4
    settings.COSTBOARD_WEB_WORKERS = 2
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="costboard.api.ratelimit"), ExitStack() as outage:
        holding(outage, agent, 2)
        refused = agent.budget("s1")
        assert_busy(refused, 4)
        assert "each of its processes admits 2 until" in refused.json()["errors"][0]["message"]
        clock.advance(ratelimit.REDIS_PAUSE_SECONDS)  # Redis asked again: still down
        assert_busy(agent.budget("s1"), 4)
        redis_server.start()
        clock.advance(ratelimit.REDIS_PAUSE_SECONDS)
        with ExitStack() as shared:  # Redis back: the whole limit, shared, from nothing
            holding(shared, agent, 4)
            assert_busy(agent.budget("s1"), 4)
        assert inflight._FALLBACK.in_flight(ratelimit.key_id_of(agent.key)) == 2
    assert inflight._FALLBACK.in_flight(ratelimit.key_id_of(agent.key)) == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "costboard.api.ratelimit"]
    assert len(messages) == 2
    assert "cannot be reached" in messages[0] and "answers again" in messages[1]


@pytest.mark.parametrize(("limit", "workers", "share"), [(2, 2, 1), (1, 4, 1), (5, 2, 2)])
def test_a_process_share_is_the_limit_divided_among_the_workers_at_least_one(
    agent: Agent,
    settings: Any,
    redis_server: RedisServer,
    limit: int,
    workers: int,
    share: int,
) -> None:
    settings.COSTBOARD_API_MAX_IN_FLIGHT = limit
    settings.COSTBOARD_WEB_WORKERS = workers
    redis_server.stop()
    with ExitStack() as stack:
        holding(stack, agent, share)
        with in_flight(raw_key=agent.key, project=agent.project) as busy:
            assert busy == Busy(limit=limit, share=share)


class FormFields(HTMLParser):
    """The values a browser would submit from a page's form (inputs, checked boxes, selected
    options, textareas)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            if kind not in ("submit", "button", "file"):
                self.fields.append((name, a.get("value", "on" if kind == "checkbox" else "")))
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.fields.append((self._select, a.get("value", "")))
        elif tag == "textarea" and name:
            self._textarea = name
            self.fields.append((name, ""))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            name, value = self.fields[-1]
            self.fields[-1] = (name, value + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None


def test_the_project_admin_edits_the_limit(agent: Agent, staff: Client) -> None:
    url = f"/admin/costboard/project/{agent.project.pk}/change/"
    page = staff.get(url)
    assert page.status_code == 200
    assert b'name="api_max_in_flight"' in page.content
    parser = FormFields()
    parser.feed(page.content.decode())
    data: dict[str, Any] = {}
    for name, value in parser.fields:
        data.setdefault(name, []).append(value)
    data["api_max_in_flight"] = ["5"]
    saved = staff.post(url, data)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    agent.project.refresh_from_db()
    assert agent.project.api_max_in_flight == 5
    data["api_max_in_flight"] = [""]  # blank: the setting's value again
    assert staff.post(url, data).status_code == 302
    agent.project.refresh_from_db()
    assert agent.project.api_max_in_flight is None


@pytest.mark.slow
def test_the_default_is_2_in_flight() -> None:
    script = "from django.conf import settings; print(settings.COSTBOARD_API_MAX_IN_FLIGHT)"
    env = {k: v for k, v in os.environ.items() if k != "COSTBOARD_API_MAX_IN_FLIGHT"}
    env.update(DJANGO_SETTINGS_MODULE="costboard.settings", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
