"""The Python client (docs/integrations.md, "The Python client") against a live test server, a
closed port and a flaky proxy; and the `costboard-client` distribution installed alone into a clean
venv."""

from __future__ import annotations

import ast
import contextlib
import email.utils
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import costboard_client
import pytest
import time_machine
from costboard_client import BudgetExceeded, Costboard, _client

from costboard.models import ApiKey, IngestTally, PeriodBudget, Session, Step
from tests.clients.conftest import Clock
from tests.conftest import TEST_RATES, Agent, add_price, make_agent, usd
from tests.servers import HOLD_AT_MOST, Receiver, Relay
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme(transactional_db: None) -> Agent:
    return make_agent("acme")


@pytest.fixture
def cb(live_server: Any, acme: Agent) -> Iterator[Costboard]:
    client = Costboard(live_server.url, acme.key, flush_interval=60, flush_at=1000)
    yield client
    client.close(timeout=5)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_a_wrapped_call_is_recorded_with_its_duration_and_tokens(
    cb: Costboard, acme: Agent, clock: Clock
) -> None:
    with cb.step("s-1", "search", "test-sonnet", turn=1) as s:
        clock.now += 0.25  # the call takes a quarter of a second
        s.record({"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 500})

    assert cb.flush(timeout=10)
    step = Step.objects.get(event_id=s.event_id)
    assert step.success is True
    assert step.duration_ms == 250
    assert (step.input_tokens, step.output_tokens, step.cache_read_input_tokens) == (120, 30, 500)
    assert step.session.external_id == "s-1"
    assert step.turn is not None and step.turn.number == 1
    assert cb.stats.sent == 1 and cb.stats.failed == 0
    assert cb.known_budget("s-1")["tokens_used"] == 150  # type: ignore[index]


def test_the_budgets_kept_are_the_last_sessions_heard_of(
    live_server: Any, acme: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that reports sessions for weeks keeps the budgets of the last KNOWN_SESSIONS
    only; a session forgotten is one not heard of: its next call goes ahead, and its answer
    is kept again."""
    monkeypatch.setattr(_client, "KNOWN_SESSIONS", 3)
    cb = Costboard(live_server.url, acme.key, flush_interval=60, flush_at=1000)
    try:
        cb.session("s-0", token_cap=10)
        for n in range(5):  # s-0 is exhausted by its step, then four more sessions answer
            with cb.step(f"s-{n}", "search", "test-sonnet") as s:
                s.record({"input_tokens": 20})
            assert cb.flush(timeout=10)
        known = [n for n in range(5) if cb.known_budget(f"s-{n}") is not None]
        assert known == [2, 3, 4]
        ran = False
        with cb.step("s-0", "search", "test-sonnet") as s:  # forgotten: it goes ahead
            ran = True
            s.record({"input_tokens": 1})
        assert ran and cb.flush(timeout=10)
        assert cb.known_budget("s-0")["state"] == "exhausted"  # type: ignore[index]
        with pytest.raises(BudgetExceeded):  # noqa: SIM117
            with cb.step("s-0", "search", "test-sonnet"):
                pass
    finally:
        cb.close(timeout=5)


def test_tags_go_with_the_session_and_the_step(cb: Costboard) -> None:
    cb.session("s-tags", tags={"customer": "acme", "env": "prod"})
    with cb.step("s-tags", "search", "test-sonnet", tags={"feature": "search"}) as s:
        s.record({"input_tokens": 1})
    assert cb.flush(timeout=10)
    assert Step.objects.get(event_id=s.event_id).tags == {
        "customer": "acme",
        "env": "prod",
        "feature": "search",
    }


def test_an_exception_is_recorded_as_a_failed_step_and_reraised(cb: Costboard) -> None:
    with pytest.raises(TimeoutError, match="upstream took too long"):  # noqa: SIM117
        with cb.step("s-err", "response", "test-sonnet") as s:
            raise TimeoutError("upstream took too long")

    assert cb.flush(timeout=10)
    step = Step.objects.get(event_id=s.event_id)
    assert step.success is False
    assert step.error == "TimeoutError: upstream took too long"
    assert step.duration_ms is not None


def test_a_step_of_an_exhausted_session_is_refused_before_the_call(cb: Costboard) -> None:
    cb.session("s-cap", token_cap=100, user_id="u-1")
    with cb.step("s-cap", "search", "test-sonnet") as s:
        s.record({"input_tokens": 80, "output_tokens": 40})
    assert cb.flush(timeout=10)
    assert cb.known_budget("s-cap")["state"] == "exhausted"  # type: ignore[index]

    ran = False
    with pytest.raises(BudgetExceeded) as refused:  # noqa: SIM117
        with cb.step("s-cap", "response", "test-sonnet"):
            ran = True
    assert ran is False
    assert refused.value.session_id == "s-cap"
    assert refused.value.budget["tokens_used"] == 120
    assert Step.objects.filter(session__external_id="s-cap").count() == 1

    # After the cap is raised, the next ingest response (or cb.budget) lifts the refusal.
    cb.session("s-cap", token_cap=10_000)
    assert cb.flush(timeout=10)
    assert cb.budget("s-cap")["state"] == "ok"  # type: ignore[index]
    with cb.step("s-cap", "response", "test-sonnet"):
        ran = True
    assert ran is True


def test_a_stop_budget_above_the_session_refuses_and_is_named(cb: Costboard, acme: Agent) -> None:
    budget = PeriodBudget.objects.create(
        project=acme.project, name="daily tokens", period="day", token_limit=100, action="stop"
    )
    cb.session("s-team", user_id="u-2")
    with cb.step("s-team", "search", "test-sonnet") as s:
        s.record({"input_tokens": 70, "output_tokens": 40})  # 110 of the budget's 100
    assert cb.flush(timeout=10)
    known = cb.known_budget("s-team")
    assert known is not None
    assert (known["state"], known["stopped_by"]) == ("exhausted", f"budget:{budget.pk}")
    assert known["tokens_used"] == 110  # the session's own: its own cap is far away

    with pytest.raises(BudgetExceeded) as refused:  # noqa: SIM117
        with cb.step("s-team", "response", "test-sonnet"):
            pass
    assert refused.value.stopped_by == f"budget:{budget.pk}"
    assert refused.value.period is not None and refused.value.period["name"] == "daily tokens"
    assert "stopped by budget 'daily tokens'" in str(refused.value)
    assert "tokens 110/100" in str(refused.value)


def test_an_exhausted_project_stop_budget_refuses_the_agents_other_sessions_too(
    cb: Costboard, acme: Agent
) -> None:
    """The answer that exhausted a project's stop-budget names it: a session last heard `ok`
    before that (or never heard of) was let through to its call all the same."""
    budget = PeriodBudget.objects.create(
        project=acme.project, name="daily tokens", period="day", token_limit=100, action="stop"
    )
    with cb.step("s-other", "search", "test-sonnet") as s:
        s.record({"input_tokens": 1, "output_tokens": 1})
    assert cb.flush(timeout=10)
    assert cb.known_budget("s-other")["state"] == "ok"  # type: ignore[index]
    with cb.step("s-heavy", "search", "test-sonnet") as s:
        s.record({"input_tokens": 70, "output_tokens": 40})
    assert cb.flush(timeout=10)

    for session in ("s-other", "s-never-seen", None):
        ran = False
        with pytest.raises(BudgetExceeded) as refused:  # noqa: SIM117
            with cb.step(session, "response", "test-sonnet"):
                ran = True
        assert ran is False
        assert refused.value.stopped_by == f"budget:{budget.pk}"
        assert "stopped by budget 'daily tokens'" in str(refused.value)
    assert Step.objects.count() == 2

    # the limit raised, one session's budget from the server lifts the refusal of them all
    admin = ApiKey.issue(project=acme.project, role=ApiKey.Role.ADMIN)[1]
    raised = acme.client.patch(
        f"/api/v1/budgets/{budget.pk}",
        {"token_limit": 1000},
        content_type="application/json",
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert raised.status_code == 200, raised.content
    assert cb.budget("s-other")["state"] == "ok"  # type: ignore[index]
    for session in ("s-other", "s-heavy", "s-never-seen"):
        with cb.step(session, "response", "test-sonnet") as s:
            s.record({"input_tokens": 1})
    assert cb.flush(timeout=10)
    assert Step.objects.count() == 5


def test_a_session_stopped_by_a_day_budget_goes_ahead_the_next_day(
    cb: Costboard, acme: Agent
) -> None:
    """The refusal says "wait for its next period": waiting did nothing, the client refused
    the session until cb.budget() was called."""
    with time_machine.travel(datetime(2026, 11, 20, 23, 0, tzinfo=UTC), tick=False) as traveller:
        budget = PeriodBudget.objects.create(
            project=acme.project, name="daily tokens", period="day", token_limit=100, action="stop"
        )
        with cb.step("s-day", "search", "test-sonnet") as s:
            s.record({"input_tokens": 70, "output_tokens": 40})
        assert cb.flush(timeout=10)
        with pytest.raises(BudgetExceeded, match="wait for its next period") as refused:  # noqa: SIM117
            with cb.step("s-day", "response", "test-sonnet"):
                pass
        assert refused.value.stopped_by == f"budget:{budget.pk}"
        traveller.move_to(datetime(2026, 11, 20, 23, 59, 59, tzinfo=UTC))
        with pytest.raises(BudgetExceeded):  # noqa: SIM117
            with cb.step("s-day", "response", "test-sonnet"):
                pass

        traveller.move_to(datetime(2026, 11, 21, 0, 0, 1, tzinfo=UTC))  # the next day
        with cb.step("s-day", "response", "test-sonnet") as s:
            s.record({"input_tokens": 5, "output_tokens": 5})
        assert cb.flush(timeout=10)
        known = cb.known_budget("s-day")
        assert known is not None and known["stopped_by"] is None
        assert Step.objects.filter(session__external_id="s-day").count() == 2


def test_a_per_member_day_budget_refusal_names_its_member_and_ends_with_the_day(
    cb: Costboard, acme: Agent
) -> None:
    """A batch touching two members of a per-member budget answers it as "<id>:<member>"
    each, while the stopped session's `stopped_by` is "budget:<id>": the refusal found no
    period, so it named no figures and never ended with the day."""
    with time_machine.travel(datetime(2026, 11, 20, 23, 0, tzinfo=UTC), tick=False) as traveller:
        budget = PeriodBudget.objects.create(
            project=acme.project,
            name="each user a day",
            scope="user",
            scope_value="*",
            period="day",
            token_limit=100,
            action="stop",
        )
        cb.session("s-ann", user_id="ann")
        cb.session("s-bob", user_id="bob")
        with cb.step("s-ann", "search", "test-sonnet") as s:
            s.record({"input_tokens": 70, "output_tokens": 40})
        with cb.step("s-bob", "search", "test-sonnet") as s:
            s.record({"input_tokens": 5, "output_tokens": 5})
        assert cb.flush(timeout=10)  # one batch: both members answered
        with pytest.raises(BudgetExceeded) as refused:  # noqa: SIM117
            with cb.step("s-ann", "response", "test-sonnet"):
                pass
        assert refused.value.stopped_by == f"budget:{budget.pk}"
        assert refused.value.period is not None
        assert (refused.value.period["member"], refused.value.period["tokens_used"]) == ("ann", 110)
        assert "(tokens 110/100" in str(refused.value)
        with cb.step("s-bob", "response", "test-sonnet"):  # bob is under his limit
            pass

        traveller.move_to(datetime(2026, 11, 21, 0, 0, 1, tzinfo=UTC))  # the next day
        with cb.step("s-ann", "response", "test-sonnet") as s:
            s.record({"input_tokens": 5, "output_tokens": 5})
        assert cb.flush(timeout=10)
        known = cb.known_budget("s-ann")
        assert known is not None and known["stopped_by"] is None


def test_budget_asks_the_server_and_refreshes_the_cache(cb: Costboard, acme: Agent) -> None:
    acme.events({"type": "session", "session_id": "s-b", "token_cap": 10})
    acme.events({"step_type": "search", "model": "m", "session_id": "s-b", "input_tokens": 11})
    assert cb.known_budget("s-b") is None

    budget = cb.budget("s-b")

    assert budget is not None and budget["state"] == "exhausted"
    assert budget["tokens_used"] == 11
    with pytest.raises(BudgetExceeded):
        cb.step("s-b", "search", "m").__enter__()
    assert cb.budget("no-such-session") is None
    # a session id with a slash, as the client sends it (%2F) to a real server
    acme.events({"step_type": "search", "model": "m", "session_id": "t/s-b", "input_tokens": 7})
    slashed = cb.budget("t/s-b")
    assert slashed is not None and slashed["tokens_used"] == 7


def test_a_base_url_other_than_http_is_refused_at_construction(tmp_path: Path) -> None:
    """urlopen follows file: too: such a base_url read a local file as the server's answer."""
    answer = tmp_path / "api" / "v1" / "sessions" / "s-1" / "budget"
    answer.parent.mkdir(parents=True)
    answer.write_text('{"state": "ok"}')
    for url in (f"file://{tmp_path}", "ftp://costboard.example", "127.0.0.1:8000"):
        with pytest.raises(ValueError, match=r"base_url must start with http:// or https://"):
            Costboard(url, "cb_key")
    Costboard("HTTPS://costboard.example", "cb_key").close()  # the scheme in any case


def test_a_down_server_never_breaks_the_agent(clock: Clock) -> None:
    cb = Costboard(
        f"http://127.0.0.1:{closed_port()}",
        "cb_nothing",
        timeout=0.5,
        max_retries=1,
        backoff=0.05,
        flush_interval=60,
        flush_at=1000,
        max_buffer=3,
    )
    for i in range(5):
        with cb.step("s-down", "search", "test-sonnet") as s:
            s.record({"input_tokens": i, "output_tokens": 1})
    assert cb.stats.dropped == 2  # the bounded buffer kept the newest 3
    assert clock.slept == []  # recording waits for nothing

    assert cb.flush(timeout=3) is False
    [backoff] = clock.slept  # flush waited only before its one retry
    assert 0.025 <= backoff <= 0.05

    stats = cb.stats
    assert stats.sent == 0
    assert (stats.failed, stats.buffered) == (0, 3)  # kept, to send once the server answers
    assert stats.retries >= 1
    assert stats.last_error is not None
    assert cb.budget("s-down") is None  # no exception either
    cb.close(timeout=1)
    [_, again] = clock.slept  # close tried them once more, with one retry, then gave up
    assert 0.025 <= again <= 0.05
    assert (cb.stats.failed, cb.stats.buffered) == (0, 3)


def test_a_reply_that_is_not_costboards_is_retried_and_never_counted_sent(
    live_server: Any, acme: Agent, clock: Clock
) -> None:
    """A 200 with an HTML page (a captive portal, a proxy's error page) stored nothing: the
    batch is retried under its key and, once Costboard answers, stored once."""
    relay = Relay(live_server.url).start()
    relay.garbage()
    cb = Costboard(relay.url, acme.key, max_retries=5, flush_interval=60, flush_at=1000)
    try:
        one_step(cb)
        assert cb.flush(timeout=2) is False
        stats = cb.stats
        assert (stats.sent, stats.failed, stats.buffered) == (0, 0, 1)  # kept, to send again
        assert relay.requests == stats.retries + 1 >= 2
        assert "not a JSON object" in (stats.last_error or "")

        relay.garbage(False)
        assert cb.flush(timeout=2) is True
    finally:
        cb.close(timeout=1)
        relay.stop()
    assert (cb.stats.sent, cb.stats.failed) == (1, 0)
    assert Step.objects.filter(session__external_id="s-flaky").count() == 1


def test_steps_recorded_while_costboard_restarts_are_kept_and_stored_once_it_is_back(
    live_server: Any, acme: Agent
) -> None:
    """A restart of Costboard outlasts a batch's retries: the background sender keeps what
    it could not deliver (within max_buffer) and sends it once Costboard answers again; it
    used to give the batch up, and the steps of the restart were lost."""
    relay = Relay(live_server.url).start()
    relay.stop()  # Costboard restarting: connections refused
    cb = Costboard(
        relay.url,
        acme.key,
        flush_at=1,
        flush_interval=0.05,
        max_retries=2,
        backoff=0.01,
        max_backoff=0.02,
    )
    try:
        for _ in range(3):
            one_step(cb)
        wait_until(
            lambda: cb.stats.retries >= 3 * 2 or cb.stats.failed,  # two rounds, or given up
            what="the sender's retries running out",
        )
        stats = cb.stats
        assert (stats.sent, stats.failed, stats.buffered) == (0, 0, 3)
        assert "Connection refused" in (stats.last_error or "")

        relay.start()
        wait_until(lambda: cb.stats.sent == 3, what="the kept steps sent in the background")
    finally:
        cb.close(timeout=5)
        relay.stop()
    assert (cb.stats.failed, cb.stats.buffered, cb.stats.dropped) == (0, 0, 0)
    assert Step.objects.filter(session__external_id="s-flaky").count() == 3


@pytest.mark.slow
def test_recording_never_waits_on_a_server_that_does_not_answer() -> None:
    """The first batch's POST hangs (the server holds its reply until the test releases it)
    while the agent records more: no step could end if recording waited on the network."""
    server = Receiver().start()
    server.hold()
    cb = Costboard(server.base_url, "cb_key", timeout=2 * HOLD_AT_MOST, flush_at=1)
    try:
        one_step(cb)  # flush_at 1: the background sender posts it at once
        wait_until(lambda: server.held() == 1, what="the sender waiting on the server")
        for _ in range(5):
            one_step(cb)
        assert (server.held(), server.received()) == (1, [])  # the reply never came meanwhile
        assert cb.stats.buffered == 6 and cb.stats.sent == 0
        server.release()
        assert cb.flush(timeout=30)
    finally:
        server.stop()
        cb.close(timeout=1)
    assert (cb.stats.sent, cb.stats.failed, cb.stats.retries) == (6, 0, 0)


def test_a_refused_batch_is_counted_failed_and_not_retried(live_server: Any) -> None:
    cb = Costboard(live_server.url, "cb_wrong_key", flush_interval=60, flush_at=1000)
    with cb.step("s-401", "search", "test-sonnet"):
        pass
    assert cb.flush(timeout=10) is False
    assert (cb.stats.failed, cb.stats.retries, cb.stats.sent) == (1, 0, 0)
    assert "HTTP 401 Authorization: unknown or revoked API key" in (cb.stats.last_error or "")
    assert "(event" not in (cb.stats.last_error or "")  # an error of no event names none
    cb.close(timeout=1)


def test_an_invalid_event_is_dropped_and_the_rest_of_its_batch_sent(cb: Costboard) -> None:
    with cb.step("s-422", "search", "test-sonnet") as bad:
        bad.record({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}})
    with cb.step("s-422", "search", "test-sonnet") as good:
        good.record({"input_tokens": 3, "output_tokens": 4})

    assert cb.flush(timeout=10) is False  # one event was refused
    assert (cb.stats.failed, cb.stats.sent) == (1, 1)
    assert "cached_tokens" in (cb.stats.last_error or "")
    assert Step.objects.filter(event_id=good.event_id).exists()
    assert not Step.objects.filter(event_id=bad.event_id).exists()


def test_a_batch_too_large_for_the_server_is_sent_in_halves(cb: Costboard) -> None:
    message = "x" * 900_000
    for turn in range(1, 8):  # about 6.3 MB in one POST: over the server's 5 MB
        cb.turn("s-big", turn, user_message=message)

    assert cb.flush(timeout=30)
    assert (cb.stats.sent, cb.stats.failed) == (7, 0)
    assert cb.known_budget("s-big")["turns"] == 7  # type: ignore[index]


class _Forwards(BaseHTTPRequestHandler):
    """Forwards to the live server and keeps each request body and Idempotency-Key (what the
    client put on the wire) and whether the server's answer was a replay."""

    upstream = ""
    posts: list[bytes] = []
    keys: list[str | None] = []
    replayed: list[str | None] = []

    def status_for(self, request_number: int) -> int:
        return 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append(body)
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        headers = {"Authorization": self.headers["Authorization"]}
        headers["Content-Type"] = "application/json"
        if self.headers.get("Idempotency-Key"):
            headers["Idempotency-Key"] = self.headers["Idempotency-Key"]
        request = urllib.request.Request(self.upstream + self.path, data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = response.read()
            type(self).replayed.append(response.headers.get("Idempotent-Replayed"))
        status = self.status_for(len(type(self).posts))
        if status == 0:  # the server stored it, the answer is lost: close without one
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _LosesTheFirstResponse(_Forwards):
    """The first answer is replaced by a 503 (a lost response): the client must retry."""

    def status_for(self, request_number: int) -> int:
        return 503 if request_number == 1 else 200


class _DropsTheFirstResponse(_Forwards):
    """The first answer never comes: the connection closes once the server has stored it."""

    def status_for(self, request_number: int) -> int:
        return 0 if request_number == 1 else 200


@contextlib.contextmanager
def proxy_to(live_server: Any, base: type[_Forwards]) -> Iterator[tuple[str, type[_Forwards]]]:
    """A proxy in front of the live server: its URL and its handler class (with `posts`)."""
    handler = type(
        "Handler",
        (base,),
        {"upstream": live_server.url, "posts": [], "keys": [], "replayed": []},
    )
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_port}", handler
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("loses", [_LosesTheFirstResponse, _DropsTheFirstResponse])
def test_a_retry_after_a_lost_response_is_stored_once(
    live_server: Any, acme: Agent, loses: type[_Forwards]
) -> None:
    with proxy_to(live_server, loses) as (url, handler):
        cb = Costboard(url, acme.key, backoff=0.05, flush_interval=60, flush_at=1000)
        cb.session("s-retry", user_id="u-1")
        with cb.step("s-retry", "search", "test-sonnet") as s:
            s.record({"input_tokens": 7, "output_tokens": 3})
        assert cb.flush(timeout=10)
        cb.close(timeout=1)

    assert len(handler.posts) == 2
    assert handler.posts[0] == handler.posts[1]  # the same event_ids both times
    assert handler.keys[0] == handler.keys[1] and len(handler.keys[0] or "") == 32
    assert handler.replayed == [None, "true"]  # the server answered the retry from its store
    assert Step.objects.filter(event_id=s.event_id).count() == 1
    session = Session.objects.get(project=acme.project, external_id="s-retry")
    assert (session.input_tokens, session.output_tokens) == (7, 3)  # once, not 14 and 6
    assert IngestTally.objects.get(project=acme.project).accepted == 2
    stats = cb.stats
    assert (stats.retries, stats.sent, stats.duplicates, stats.failed) == (1, 2, 0, 0)
    assert cb.known_budget("s-retry")["tokens_used"] == 10  # type: ignore[index]


OK_ANSWER = {"accepted": 1, "duplicates": 0, "sessions": {}}


class _Scripted(BaseHTTPRequestHandler):
    """A stand-in server: answers the n-th POST with the n-th (status, headers) of `script`
    (the last one from then on), noting each one's headers and body; the replies to the POSTs
    numbered in `held` wait for `gate`."""

    script: list[tuple[int, dict[str, str]]] = []
    held: frozenset[int] = frozenset()
    gate = threading.Event()
    seen: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        seen = type(self).seen
        seen.append((dict(self.headers), body))
        number = len(seen)
        status, headers = self.script[min(number, len(self.script)) - 1]
        if number in self.held:
            self.gate.wait(timeout=HOLD_AT_MOST)
        message = {"index": None, "field": None, "message": f"scripted {status}"}
        answer = json.dumps(OK_ANSWER if status == 200 else {"errors": [message]}).encode()
        try:
            self.send_response(status)
            for name, value in {**headers, "Content-Type": "application/json"}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except OSError:  # a held reply's client has long gone
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def scripted(
    *script: tuple[int, dict[str, str]], held: frozenset[int] = frozenset()
) -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """A local HTTP server playing `script`: its URL and what it saw. Held replies go out
    when the block ends."""
    seen: list[tuple[dict[str, str], bytes]] = []
    gate = threading.Event()
    handler = type(
        "Handler", (_Scripted,), {"script": list(script), "held": held, "gate": gate, "seen": seen}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        gate.set()
        server.shutdown()
        server.server_close()


def one_step(cb: Costboard) -> None:
    with cb.step("s-flaky", "search", "test-sonnet") as s:
        s.record({"input_tokens": 5, "output_tokens": 1})


NOON = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)


@pytest.mark.slow
def test_503_and_429_are_retried_after_their_retry_after_under_one_key(clock: Clock) -> None:
    with (
        time_machine.travel(NOON, tick=False),  # the HTTP date is read against this clock
        scripted(
            (503, {"Retry-After": "1"}),
            (429, {"Retry-After": email.utils.format_datetime(NOON + timedelta(seconds=4), True)}),
            (200, {}),
        ) as (url, seen),
    ):
        cb = Costboard(url, "cb_key", backoff=0.01, flush_interval=60, flush_at=1000)
        one_step(cb)
        assert cb.flush(timeout=15)
        cb.close(timeout=1)

    assert clock.slept == [1, 4]  # Retry-After: 1, then until the date; not the 0.01 s back-off
    assert len(seen) == 3
    (h0, b0), (h1, b1), (h2, b2) = seen
    keys = {h0["Idempotency-Key"], h1["Idempotency-Key"], h2["Idempotency-Key"]}
    assert len(keys) == 1 and len(keys.pop()) == 32
    assert b0 == b1 == b2
    (event,) = json.loads(b0)["events"]
    assert len(event["event_id"]) == 32
    stats = cb.stats
    assert (stats.retries, stats.sent, stats.failed) == (2, 1, 0)


@pytest.mark.slow
def test_a_long_retry_after_is_capped(clock: Clock) -> None:
    with scripted((503, {"Retry-After": "3600"}), (200, {})) as (url, seen):
        cb = Costboard(url, "cb_key", max_retry_after=0.2, flush_interval=60, flush_at=1000)
        one_step(cb)
        assert cb.flush(timeout=10)
        cb.close(timeout=1)
    assert len(seen) == 2
    assert clock.slept == [0.2]  # not the hour asked for


@pytest.mark.slow
def test_a_timeout_is_retried_under_the_same_key() -> None:
    """The first reply is held until the block ends: the client's 2 s timeout passes, on any
    machine, and the retry is answered at once."""
    with scripted((200, {}), held=frozenset({1})) as (url, seen):
        cb = Costboard(url, "cb_key", timeout=2, backoff=0.01, flush_interval=60, flush_at=1000)
        one_step(cb)
        assert cb.flush(timeout=30)
        cb.close(timeout=1)
    assert len(seen) == 2
    assert seen[0][0]["Idempotency-Key"] == seen[1][0]["Idempotency-Key"]
    assert seen[0][1] == seen[1][1]
    assert (cb.stats.retries, cb.stats.sent) == (1, 1)
    assert "timed out" in (cb.stats.last_error or "")


@pytest.mark.parametrize(("status", "kept"), [(500, False), (502, True)])
def test_retries_are_bounded_and_backed_off_with_jitter(
    clock: Clock, status: int, kept: bool
) -> None:
    """A 500 answers this batch: given up on after its retries. A proxy's 502 says Costboard
    was not reached (restarting): the batch is kept to be sent again, not lost."""
    with scripted((status, {})) as (url, seen):
        cb = Costboard(
            url, "cb_key", max_retries=3, backoff=0.1, max_backoff=0.4, flush_interval=60
        )
        one_step(cb)
        assert cb.flush(timeout=10) is False
        assert len(seen) == 4  # the first try and 3 retries, then given up (or kept)
        stats = cb.stats
        cb.close(timeout=0)
    assert len({headers["Idempotency-Key"] for headers, _ in seen}) == 1
    # each wait is in [ceiling/2, ceiling]: ceilings 0.1, 0.2, 0.4 (capped by max_backoff)
    assert len(clock.slept) == 3
    for waited, ceiling in zip(clock.slept, (0.1, 0.2, 0.4), strict=True):
        assert ceiling / 2 <= waited <= ceiling, clock.slept
    assert (stats.retries, stats.sent) == (3, 0)
    assert (stats.failed, stats.buffered) == ((0, 1) if kept else (1, 0))


@pytest.mark.slow
@pytest.mark.parametrize("status", [400, 403, 404, 409, 410])
def test_other_4xx_are_never_retried(status: int) -> None:
    with scripted((status, {"Retry-After": "1"}), (200, {})) as (url, seen):
        cb = Costboard(url, "cb_key", backoff=0.01, flush_interval=60, flush_at=1000)
        one_step(cb)
        assert cb.flush(timeout=10) is False
        cb.close(timeout=1)
    assert len(seen) == 1
    assert (cb.stats.retries, cb.stats.failed, cb.stats.sent) == (0, 1, 0)
    assert str(status) in (cb.stats.last_error or "")


@pytest.mark.slow
def test_each_batch_has_its_own_key() -> None:
    with scripted((200, {})) as (url, seen):
        cb = Costboard(url, "cb_key", batch_size=2, flush_interval=60, flush_at=1000)
        for _ in range(5):
            one_step(cb)
        assert cb.flush(timeout=10)
        cb.close(timeout=1)
    batches = [json.loads(body)["events"] for _, body in seen]
    assert sorted(len(events) for events in batches) == [1, 2, 2]  # the worker may send one
    assert len({event["event_id"] for events in batches for event in events}) == 5
    assert len({headers["Idempotency-Key"] for headers, _ in seen}) == 3


def test_every_event_on_the_wire_carries_an_event_id(live_server: Any, acme: Agent) -> None:
    with proxy_to(live_server, _Forwards) as (url, handler):
        cb = Costboard(url, acme.key, flush_interval=60, flush_at=1000)
        cb.session("s-wire", token_cap=10_000, cost_cap_usd="1.50", user_id="u-1")
        cb.turn("s-wire", 1, user_message="find flights", assistant_response="three found")
        with cb.step("s-wire", "search", "test-sonnet", turn=1) as s:
            s.record({"input_tokens": 12, "output_tokens": 5})
        with cb.step(None, "compress", "test-sonnet"):  # the project's system budget
            pass
        cb.session("s-wire", ended=True)
        assert cb.flush(timeout=10)
        cb.close(timeout=1)

    events = [event for body in handler.posts for event in json.loads(body)["events"]]
    assert [e["type"] for e in events] == ["session", "turn", "step", "step", "session"]
    ids = [e.get("event_id") for e in events]
    assert all(isinstance(i, str) and 0 < len(i) <= 128 for i in ids), ids
    assert len(set(ids)) == 5
    assert ids[2] == s.event_id

    # The server takes them as idempotency keys: the same batch again changes nothing.
    replay = acme.post({"events": events})
    assert replay.status_code == 200, replay.content
    assert replay.json()["duplicates"] == 5
    assert Step.objects.filter(project=acme.project).count() == 2
    assert acme.budget("s-wire").json()["turns"] == 1


def test_events_are_sent_in_the_background(live_server: Any, acme: Agent) -> None:
    cb = Costboard(live_server.url, acme.key, flush_interval=60, flush_at=3, batch_size=2)
    for turn in (1, 2, 3):
        cb.turn("s-bg", turn, user_message=f"question {turn}")
    wait_until(lambda: cb.stats.sent >= 3, what="3 events sent in the background")
    assert cb.stats.sent == 3  # two POSTs of at most 2, no flush() called
    assert cb.known_budget("s-bg")["turns"] == 3  # type: ignore[index]
    cb.close(timeout=1)


def _anthropic_message(**usage: Any) -> Any:
    from anthropic.types import Message, Usage

    return Message(
        id="msg_1",
        type="message",
        role="assistant",
        content=[],
        model="claude-sonnet-4-5-20250929",
        stop_reason="end_turn",
        stop_sequence=None,
        usage=Usage(**usage),
    )


def _openai_chat(**usage: Any) -> Any:
    from openai.types.chat import ChatCompletion
    from openai.types.completion_usage import CompletionUsage

    return ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=0,
        model="gpt-4o-2024-08-06",
        choices=[],
        usage=CompletionUsage(**usage),
    )


def _openai_response(**usage: Any) -> Any:
    from openai.types.responses import Response, ResponseUsage

    return Response(
        id="resp_1",
        object="response",
        created_at=0,
        model="gpt-4.1-2025-04-14",
        output=[],
        parallel_tool_calls=False,
        tool_choice="auto",
        tools=[],
        usage=ResponseUsage(**usage),
    )


@pytest.mark.slow
def test_sdk_responses_are_recorded_with_the_normalized_tokens(cb: Costboard) -> None:
    message = _anthropic_message(
        input_tokens=100,
        output_tokens=20,
        cache_read_input_tokens=300,
        cache_creation_input_tokens=40,
    )
    chat = _openai_chat(
        prompt_tokens=1000,
        completion_tokens=50,
        total_tokens=1050,
        prompt_tokens_details={"cached_tokens": 600},
    )
    response = _openai_response(
        input_tokens=500,
        input_tokens_details={"cached_tokens": 200, "cache_write_tokens": 50},
        output_tokens=70,
        output_tokens_details={"reasoning_tokens": 30},
        total_tokens=570,
    )
    recorded = []
    for sdk_object in (message, chat, response, message.model_dump(), chat.model_dump()):
        with cb.step("s-sdk", "response", None) as s:
            assert s.record(sdk_object) is sdk_object
        recorded.append(s.event_id)
    assert cb.flush(timeout=10)

    def stored(event_id: str) -> tuple[Any, ...]:
        step = Step.objects.get(event_id=event_id)
        return (
            step.model,
            step.provider,
            step.input_tokens,
            step.output_tokens,
            step.cache_read_input_tokens,
            step.cache_creation_input_tokens,
            step.reasoning_tokens,
        )

    anthropic_row = ("claude-sonnet-4-5-20250929", "anthropic", 100, 20, 300, 40, 0)
    chat_row = ("gpt-4o-2024-08-06", "openai", 400, 50, 600, 0, 0)
    assert stored(recorded[0]) == anthropic_row
    assert stored(recorded[1]) == chat_row
    # reads and writes both come out of the 500 input tokens
    assert stored(recorded[2]) == ("gpt-4.1-2025-04-14", "openai", 250, 70, 200, 50, 30)
    assert stored(recorded[3]) == anthropic_row
    assert stored(recorded[4]) == chat_row


def test_a_given_model_wins_and_two_records_are_summed(cb: Costboard) -> None:
    with cb.step("s-sum", "agent-loop", "claude-sonnet-4-5") as s:
        s.record(_anthropic_message(input_tokens=10, output_tokens=1))
        s.record(_anthropic_message(input_tokens=5, output_tokens=2, cache_read_input_tokens=9))
        s.record(None)  # a streamed response without usage: ignored
    assert cb.flush(timeout=10)
    step = Step.objects.get(event_id=s.event_id)
    assert step.model == "claude-sonnet-4-5"
    assert (step.input_tokens, step.output_tokens, step.cache_read_input_tokens) == (15, 3, 9)


def test_decimal_token_counts_and_caps_are_sent_as_numbers(cb: Costboard) -> None:
    """Token counts summed as Decimals (or any integral number type) are whole numbers on the
    wire: sent as strings, the server refused the step and it was lost."""
    add_price("test-sonnet")
    cb.session("s-decimal", token_cap=1000, cost_cap_usd=Decimal("0.25"))
    with cb.step("s-decimal", "search", "test-sonnet") as s:
        s.record({"input_tokens": Decimal(120), "output_tokens": Decimal("30.0")})
        s.record({"input_tokens": 3, "cache_read_input_tokens": Decimal(500)})
    assert cb.flush(timeout=10)
    assert (cb.stats.sent, cb.stats.failed) == (2, 0)
    step = Step.objects.get(event_id=s.event_id)
    assert (step.input_tokens, step.output_tokens, step.cache_read_input_tokens) == (123, 30, 500)
    assert step.cost_usd == (
        usd(123, TEST_RATES["input_mtok"])
        + usd(30, TEST_RATES["output_mtok"])
        + usd(500, TEST_RATES["cache_read_mtok"])
    )
    session = Session.objects.get(external_id="s-decimal")
    assert (session.token_cap, session.cost_cap_usd) == (1000, Decimal("0.25"))
    assert cb.known_budget("s-decimal")["tokens_used"] == 153  # type: ignore[index]


def test_the_service_tier_comes_from_the_response_or_the_call(cb: Costboard) -> None:
    """OpenAI's on the response, Anthropic's in its usage (read by the server), or given."""
    add_price("gpt-4o-2024-08-06", provider="openai")
    add_price("gpt-4o-2024-08-06", provider="openai", service_tier="flex", input_mtok=Decimal(1))
    chat = _openai_chat(prompt_tokens=1000, completion_tokens=0, total_tokens=1000)
    calls = {
        "openai": chat.model_copy(update={"service_tier": "flex"}),
        "anthropic": _anthropic_message(input_tokens=10, output_tokens=1, service_tier="batch"),
        "plain": chat,
    }
    recorded = {}
    for name, response in calls.items():
        with cb.step("s-tier", "response", None) as s:
            s.record(response)
        recorded[name] = s.event_id
    with cb.step("s-tier", "response", None, service_tier="priority") as given:
        given.record(calls["openai"])  # the caller's word wins
    assert cb.flush(timeout=10)
    tiers = {name: Step.objects.get(event_id=e).service_tier for name, e in recorded.items()}
    assert tiers == {"openai": "flex", "anthropic": "batch", "plain": "standard"}
    assert Step.objects.get(event_id=given.event_id).service_tier == "priority"
    flex = Step.objects.get(event_id=recorded["openai"])
    assert flex.cost_usd == usd(1000, Decimal(1))  # the flex row's rate
    assert Step.objects.get(event_id=recorded["plain"]).cost_usd == usd(
        1000, TEST_RATES["input_mtok"]
    )


# The interpreter the clean venv is made from: this one, unless told (say, the oldest Python
# the distribution's requires-python admits).
CLEAN_VENV_PYTHON = os.environ.get("COSTBOARD_CLIENT_TEST_PYTHON") or sys.executable
# What `python -m venv` may bring of its own (setuptools until Python 3.12; wheel in some).
VENV_OWN = {"pip", "setuptools", "wheel"}


def _outside_env(**extra: str) -> dict[str, str]:
    """A process outside the server: no Django settings, nothing of the checkout on its path."""
    left_out = {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in left_out}
    env.update(extra)
    return env


def _run(
    args: list[str], *, env: dict[str, str], cwd: Path | str = "/", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_buffer_is_flushed_at_exit(live_server: Any, acme: Agent) -> None:
    script = textwrap.dedent(
        f"""
        from costboard_client import Costboard
        cb = Costboard({live_server.url!r}, {acme.key!r}, flush_interval=60, flush_at=1000)
        with cb.step("s-exit", "search", "test-sonnet") as s:
            s.record({{"input_tokens": 11, "output_tokens": 4}})
        print(s.event_id)
        """
    )
    done = _run([sys.executable, "-c", script], env=_outside_env())
    assert done.returncode == 0, done.stderr
    step = Step.objects.get(event_id=done.stdout.strip())
    assert (step.input_tokens, step.output_tokens) == (11, 4)


def test_the_client_imports_without_django() -> None:
    script = (
        "import json, sys; from costboard_client import Costboard, BudgetExceeded; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'django')))"
    )
    done = _run([sys.executable, "-c", script], env=_outside_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_costboard_client_in_the_server_is_the_same_client() -> None:
    script = textwrap.dedent(
        """
        import json, sys
        from costboard.client import BudgetExceeded, Costboard
        import costboard.client as shim, costboard_client
        print(json.dumps({
            "all": [sorted(shim.__all__), sorted(costboard_client.__all__)],
            "same": [n for n in costboard_client.__all__
                     if getattr(shim, n) is getattr(costboard_client, n)],
            "django": sorted(m for m in sys.modules if m.split(".")[0] == "django"),
        }))
        """
    )
    done = _run([sys.executable, "-c", script], env=_outside_env(PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["all"][0] == found["all"][1]
    assert sorted(found["same"]) == found["all"][1]
    assert {"BudgetExceeded", "ClientStats", "Costboard", "Step", "__version__"} <= set(
        found["same"]
    )
    assert found["django"] == []  # no Django settings needed (docs/integrations.md)


def test_the_server_module_says_how_to_get_the_client_when_it_is_missing() -> None:
    script = "import sys; sys.modules['costboard_client'] = None; import costboard.client"
    done = _run([sys.executable, "-c", script], env=_outside_env(PYTHONPATH=str(ROOT)))
    assert done.returncode == 1
    assert "costboard.client needs the costboard-client distribution" in done.stderr
    assert "pip install ./clients/python" in done.stderr


@pytest.mark.slow
def test_the_server_reaches_the_client_only_through_costboard_client() -> None:
    """One door: the server's own code never imports the client except to re-export it."""
    shim = ROOT / "costboard" / "client.py"
    found = []
    for package in ("costboard", "memory_ui", "devtools"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == shim:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                if any(
                    name.split(".")[0] == "costboard_client" or name == "costboard.client"
                    for name in names
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
    assert "costboard_client" in shim.read_text()  # the scan does see an import when one is there


@pytest.mark.slow
def test_the_distribution_installs_alone_and_reports_to_a_live_server(
    live_server: Any, acme: Agent, tmp_path: Path
) -> None:
    add_price("test-sonnet")
    # A copy of the distribution as checked in: an in-tree build would leave build/ behind.
    source = tmp_path / "costboard-client"
    shutil.copytree(
        ROOT / "clients" / "python",
        source,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"),
    )
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    made = _run([CLEAN_VENV_PYTHON, "-m", "venv", str(venv)], env=_outside_env())
    assert made.returncode == 0, made.stderr
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    installed = _run([*pip, "install", "--quiet", str(source)], env=_outside_env(), timeout=180)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    no_django = _run([python, "-c", "import django"], env=_outside_env(), cwd=tmp_path)
    assert no_django.returncode == 1
    assert "No module named 'django'" in no_django.stderr
    listed = _run([*pip, "list", "--format=json"], env=_outside_env())
    assert listed.returncode == 0, listed.stderr
    packages = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert packages.get("costboard-client") == costboard_client.__version__ == "0.8.0"
    assert set(packages) - VENV_OWN == {"costboard-client"}

    script = textwrap.dedent(
        f"""
        import json, os, sys
        import costboard_client
        from costboard_client import BudgetExceeded, Costboard

        cb = Costboard({live_server.url!r}, {acme.key!r}, flush_interval=60, flush_at=1000)
        with cb.step("s-alone", "search", "test-sonnet", turn=1, provider="testco") as s:
            s.record({{"input_tokens": 1234, "output_tokens": 567}})
        package = os.path.dirname(costboard_client.__file__)
        print(json.dumps({{
            "flushed": cb.flush(timeout=10),
            "event_id": s.event_id,
            "module": costboard_client.__file__,
            "typed": os.path.exists(os.path.join(package, "py.typed")),
            "version": costboard_client.__version__,
            "budget": cb.known_budget("s-alone"),
            "django": sorted(m for m in sys.modules if m.split(".")[0] == "django"),
        }}))
        """
    )
    reported = _run([python, "-c", script], env=_outside_env(), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    outcome = json.loads(reported.stdout)
    assert outcome["flushed"] is True
    assert outcome["module"].startswith(str(venv))  # the installed copy, not the checkout
    assert outcome["version"] == costboard_client.__version__
    assert outcome["typed"] is True  # py.typed ships: type checkers read its hints
    assert outcome["django"] == []

    step = Step.objects.get(project=acme.project, session__external_id="s-alone")
    assert step.event_id is not None
    assert step.event_id == outcome["event_id"] and len(step.event_id) == 32
    assert (step.input_tokens, step.output_tokens, step.provider) == (1234, 567, "testco")
    cost = usd(1234, TEST_RATES["input_mtok"]) + usd(567, TEST_RATES["output_mtok"])
    assert cost == Decimal("0.012207")
    assert step.cost_usd == cost
    assert outcome["budget"]["tokens_used"] == 1234 + 567
    assert Decimal(outcome["budget"]["cost_usd"]) == cost
