"""GET /metrics: Prometheus text read from the database, behind a staff login or a token."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from costboard.ingest.schemas import Event, validate_event
from costboard.models import IngestTally
from costboard.projects import ingest_tally
from tests.conftest import Agent, make_agent, run_in_threads, usd

TOKEN = "scrape-me-7f3a"
BOUNDS = ["1000.0", "5000.0", "10000.0", "25000.0", "50000.0", "100000.0", "250000.0"]
BOUNDS += ["500000.0", "1000000.0", "5000000.0", "+Inf"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: Client | None = None, /, **headers: str) -> Samples:
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def buckets(samples: Samples, project: str) -> list[float]:
    return [
        value(samples, "costboard_session_tokens_used_bucket", project=project, le=le)
        for le in BOUNDS
    ]


def step(session_id: str, input_tokens: int, output_tokens: int, **more: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        **more,
    }


def valid(index: int, raw: dict[str, Any]) -> Event:
    """The event the ingest service takes, validated as the API validates it."""
    event, errors = validate_event(index, raw)
    assert event is not None, errors
    return event


@pytest.fixture
def token(settings: Any) -> str:
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    return TOKEN


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_it_reports_sessions_events_budget_events_and_cost_per_project(
    agent: Agent, priced: None, token: str
) -> None:
    beta = make_agent("beta")
    make_agent("idle")
    accepted = duplicates = 0

    def send(target: Agent, *events: dict[str, Any]) -> None:
        nonlocal accepted, duplicates
        body = target.events(*events)
        accepted += body["accepted"] if target is agent else 0
        duplicates += body["duplicates"] if target is agent else 0

    # acme: exactly 1,000 tokens (the 1k bucket includes its bound), near its cap, at its
    # cap, ended past the default cap, and a runaway retry loop.
    send(agent, step("small", 900, 100, event_id="s1"))
    send(agent, step("small", 900, 100, event_id="s1"))  # a replay: nothing changes
    send(
        agent,
        {"type": "session", "session_id": "warned", "token_cap": 10_000, "event_id": "w0"},
        step("warned", 6_000, 2_500),
        {"type": "session", "session_id": "spent", "token_cap": 20_000},
        step("spent", 15_000, 5_000),
        step("ended", 200_000, 100_000),
        {"type": "session", "session_id": "ended", "ended": True},
    )
    send(agent, {"type": "session", "session_id": "warned", "event_id": "w0"})  # a replay
    send(
        agent,
        *(
            step("loop", 100 + i, 0, turn=1, success=False, error="429 rate limited")
            for i in range(5)
        ),
    )
    send(agent, {"type": "session", "session_id": "small", "token_cap": 50_000})  # cap change
    # refused: a batch of three with one bad event (3), and malformed JSON (1)
    bad = agent.post({"events": [step("x", 1, 1), step("x", -5, 1), step("x", 1, 1)]})
    assert bad.status_code == 422
    assert agent.post(None, raw=b"{not json").status_code == 400
    # beta: one session of two million tokens under generous caps
    beta.events(
        {"type": "session", "session_id": "big", "token_cap": 10_000_000, "cost_cap_usd": "100"},
        step("big", 1_500_000, 500_000),
    )
    assert (accepted, duplicates) == (13, 2)

    samples = scrape(**bearer(token))

    # tokens_used of acme's sessions: 1,000 · 510 · 8,500 · 20,000 · 300,000 (ended)
    assert buckets(samples, "acme") == [2, 2, 3, 4, 4, 4, 4, 5, 5, 5, 5]
    assert value(samples, "costboard_session_tokens_used_sum", project="acme") == 330_010
    assert value(samples, "costboard_session_tokens_used_count", project="acme") == 5
    assert buckets(samples, "beta") == [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert value(samples, "costboard_session_tokens_used_sum", project="beta") == 2_000_000
    assert buckets(samples, "idle") == [0] * 11
    assert value(samples, "costboard_session_tokens_used_count", project="idle") == 0

    assert value(samples, "costboard_events_accepted_total", project="acme") == 13
    assert value(samples, "costboard_events_duplicated_total", project="acme") == 2
    assert value(samples, "costboard_events_refused_total", project="acme") == 4
    assert value(samples, "costboard_events_accepted_total", project="beta") == 2
    assert value(samples, "costboard_events_refused_total", project="beta") == 0
    assert value(samples, "costboard_events_accepted_total", project="idle") == 0

    def sessions(project: str, state: str) -> float:
        return value(samples, "costboard_sessions", project=project, state=state)

    # not ended: small ok, warned near its cap, spent at it and the loop (a runaway is told
    # to stop: exhausted); `ended` is left out
    assert [sessions("acme", s) for s in ("ok", "warning", "exhausted")] == [1, 1, 2]
    assert [sessions("beta", s) for s in ("ok", "warning", "exhausted")] == [1, 0, 0]
    assert value(samples, "costboard_sessions_runaway", project="acme") == 1
    assert value(samples, "costboard_sessions_runaway", project="beta") == 0

    def budget_events(project: str, kind: str) -> float:
        return value(samples, "costboard_budget_events_total", project=project, kind=kind)

    # soft_warned: warned, spent, ended; exhausted: spent, ended, the stopped loop
    assert budget_events("acme", "soft_warned") == 3
    assert budget_events("acme", "exhausted") == 3
    assert budget_events("acme", "runaway") == 1
    assert budget_events("acme", "cap_changed") == 1
    assert [budget_events("beta", k) for k in ("soft_warned", "exhausted", "runaway")] == [0] * 3

    input_tokens = 900 + 6_000 + 15_000 + 200_000 + sum(100 + i for i in range(5))
    output_tokens = 100 + 2_500 + 5_000 + 100_000
    acme_cost = usd(input_tokens, Decimal(3)) + usd(output_tokens, Decimal(15))
    assert acme_cost == Decimal("2.28123")
    assert value(samples, "costboard_cost_usd_total", project="acme") == float(acme_cost)
    assert value(samples, "costboard_cost_usd_total", project="beta") == 12.0
    assert value(samples, "costboard_cost_usd_total", project="idle") == 0.0


def test_counters_add_up_every_day_of_the_tally(agent: Agent, token: str) -> None:
    ingest_tally(agent.project.pk, accepted=5, duplicates=1, day=date(2025, 1, 1))
    ingest_tally(agent.project.pk, accepted=7, refused=2, day=date(2025, 1, 1))
    ingest_tally(agent.project.pk, accepted=3, day=date(2025, 1, 2))

    assert IngestTally.objects.count() == 2
    samples = scrape(**bearer(token))
    assert value(samples, "costboard_events_accepted_total", project="acme") == 15
    assert value(samples, "costboard_events_duplicated_total", project="acme") == 1
    assert value(samples, "costboard_events_refused_total", project="acme") == 2


def test_a_refused_batch_counts_its_events_or_one(agent: Agent) -> None:
    agent.post({"events": [step("x", 1, 1)] * 1001})  # too many: 1,001 refused
    agent.post({"events": []})  # an empty batch is refused as one
    agent.post({"events": "nope"})  # its events cannot be counted: one
    agent.post({"type": "step"})  # one event without step_type and model

    assert IngestTally.objects.get(project=agent.project).refused == 1_001 + 1 + 1 + 1


def test_a_wrong_key_is_no_projects_refusal(agent: Agent) -> None:
    response = agent.client.post(
        "/api/v1/events", "{}", content_type="application/json", headers=bearer("cb_wrong")
    )
    assert response.status_code == 401
    assert not IngestTally.objects.exists()


def test_anonymous_gets_401_saying_how_to_authenticate(db: None, token: str) -> None:
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert "Authorization: Bearer <COSTBOARD_METRICS_TOKEN>" in response.content.decode()
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_token_gets_401(db: None, token: str) -> None:
    assert Client().get("/metrics", headers=bearer("scrape-me-7f3b")).status_code == 401
    assert Client().get("/metrics", headers={"Authorization": TOKEN}).status_code == 401


def test_the_right_token_gets_the_metrics(agent: Agent, token: str) -> None:
    samples = scrape(**bearer(token))
    assert value(samples, "costboard_sessions", project="acme", state="ok") == 0


def test_without_a_token_setting_no_bearer_gets_in(db: None, settings: Any) -> None:
    settings.COSTBOARD_METRICS_TOKEN = ""
    for header in ("Bearer ", "Bearer", "Bearer  "):
        response = Client().get("/metrics", headers={"Authorization": header})
        assert response.status_code == 401
        assert "log in as staff" in response.content.decode()


def test_staff_login_gets_the_metrics(agent: Agent, settings: Any) -> None:
    settings.COSTBOARD_METRICS_TOKEN = ""
    client = Client()
    client.force_login(get_user_model().objects.create_user("ops", "", "pw", is_staff=True))
    samples = scrape(client)
    assert value(samples, "costboard_events_accepted_total", project="acme") == 0


def test_a_logged_in_user_who_is_not_staff_gets_401(agent: Agent, token: str) -> None:
    client = Client()
    client.force_login(get_user_model().objects.create_user("member", "", "pw"))
    assert client.get("/metrics").status_code == 401


def test_it_runs_the_same_few_queries_whatever_the_number_of_projects(
    agent: Agent, priced: None, token: str, django_assert_max_num_queries: Any
) -> None:
    agent.events(step("a", 10, 10))
    with django_assert_max_num_queries(7):
        few = per_project(scrape(**bearer(token)))
    for slug in ("b", "c", "d", "e", "f", "g", "h"):
        other = make_agent(slug)
        other.events(step("a", 10, 10), {"type": "session", "session_id": "z", "token_cap": 5})
    with django_assert_max_num_queries(7):
        many = per_project(scrape(**bearer(token)))
    assert len(many) == len(few) * 8


def per_project(samples: Samples) -> Samples:
    """The samples labelled by project (the outbox's are by kind, not per project)."""
    return {key: v for key, v in samples.items() if any(k == "project" for k, _ in key[1])}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_threads_posting_to_one_project_lose_no_count(settings: Any) -> None:
    settings.COSTBOARD_METRICS_TOKEN = TOKEN
    agent = make_agent("busy")

    def work(thread: int) -> None:
        mine = Agent(agent.project, agent.key, Client())
        batches = [
            [step(f"t{thread}", 10 + i, 5, event_id=f"t{thread}-b{b}-s{i}") for i in range(4)]
            for b in range(5)
        ]
        for batch in batches:
            mine.events(*batch)
        assert mine.events(*batches[0])["duplicates"] == 4
        assert mine.post({"events": [step("x", -1, 0), step("x", 1, 0)]}).status_code == 422

    assert run_in_threads(8, work) == []

    tally = IngestTally.objects.get(project=agent.project)
    assert (tally.accepted, tally.duplicates, tally.refused) == (8 * 5 * 4, 8 * 4, 8 * 2)
    samples = scrape(**bearer())
    assert value(samples, "costboard_events_accepted_total", project="busy") == 160
    assert value(samples, "costboard_events_duplicated_total", project="busy") == 32
    assert value(samples, "costboard_events_refused_total", project="busy") == 16


def test_events_ingested_without_the_api_are_counted_too(agent: Agent, token: str) -> None:
    """The demo seeder (and any other caller) gives batches to the ingest service directly:
    what it stores is in /metrics, as the API's is, each event once."""
    from costboard.ingest.service import events_ingest

    raw = [
        {"type": "session", "session_id": "direct", "event_id": "open"},
        step("direct", 100, 10, event_id="a"),
        step("direct", 200, 20, event_id="b"),
        {"session_id": "direct", "step_type": "tool", "model": "none", "duration_ms": 5},
    ]
    events = [valid(i, e) for i, e in enumerate(raw)]
    first = events_ingest(project=agent.project, events=events)
    again = events_ingest(project=agent.project, events=events[:3])  # replays
    assert (first.accepted, again.accepted, again.duplicates) == (4, 0, 3)
    agent.events(step("direct", 1, 1), step("direct", 1, 1, event_id="a"))  # one new, one replay

    samples = scrape(**bearer(token))
    assert value(samples, "costboard_events_accepted_total", project="acme") == 4 + 1
    assert value(samples, "costboard_events_duplicated_total", project="acme") == 3 + 1
    tally = IngestTally.objects.get(project=agent.project)
    assert (tally.accepted, tally.duplicates, tally.refused) == (5, 4, 0)


def test_a_batch_rolled_back_is_not_counted(agent: Agent) -> None:
    from django.db import transaction

    from costboard.ingest.service import events_ingest

    event = valid(0, step("gone", 1, 1))
    with pytest.raises(RuntimeError), transaction.atomic():
        events_ingest(project=agent.project, events=[event])
        raise RuntimeError("the caller's transaction fails after the ingest")
    assert not IngestTally.objects.exists()


def test_the_request_and_batch_tallies_add_up_in_one_row(agent: Agent, token: str) -> None:
    """Both writers of the tally are one statement (costboard.projects.ingest_tally_statement):
    a request's own count (a refusal, a session deleted) and ingest's batch count, run in its
    transaction, add to the same row of the day, column by column, whichever runs first."""
    from django.db import connection, transaction

    from costboard.ingest.schemas import validate_event
    from costboard.ingest.service import events_ingest
    from costboard.models import Session
    from costboard.projects import ingest_tally_statement, sessions_delete, sessions_tally_check

    now = datetime(2020, 3, 1, 12, tzinfo=UTC)  # not today: the delete below counts today
    day = now.date()
    ingest_tally(agent.project.pk, refused=3, day=day)  # a request refused before the batch
    raw = [
        {"type": "session", "session_id": "a", "event_id": "open-a"},
        step("a", 100, 10, event_id="s1"),
        step("b", 200, 20, event_id="s2"),
    ]
    events = [event for i, e in enumerate(raw) if (event := validate_event(i, e)[0])]
    assert len(events) == len(raw)
    first = events_ingest(project=agent.project, events=events, now=now)
    again = events_ingest(project=agent.project, events=[*events[1:], events[1]], now=now)
    assert (first.accepted, first.duplicates, again.accepted, again.duplicates) == (3, 0, 0, 3)
    ingest_tally(agent.project.pk, refused=2, duplicates=1, day=day)
    (gone,) = Session.objects.filter(project=agent.project, external_id="b").values_list("pk")
    assert sessions_delete(session_ids=list(gone)) == 1
    with transaction.atomic(), connection.cursor() as cursor:  # as the bulk seeder counts
        cursor.execute(*ingest_tally_statement(agent.project.pk, day, accepted=4, sessions_made=1))

    tally = IngestTally.objects.get(project=agent.project, day=day)
    assert (
        tally.accepted,
        tally.duplicates,
        tally.refused,
        tally.sessions_made,
        tally.sessions_deleted,
    ) == (3 + 4, 3 + 1, 3 + 2, 2 + 1, 0)
    # the delete ran today (its own day): the sessions made less deleted over the days
    today = IngestTally.objects.exclude(day=day).get(project=agent.project)
    assert (today.accepted, today.refused, today.sessions_deleted) == (0, 0, 1)
    assert IngestTally.objects.count() == 2
    samples = scrape(**bearer(token))
    assert value(samples, "costboard_events_accepted_total", project="acme") == 7
    assert value(samples, "costboard_events_duplicated_total", project="acme") == 4
    assert value(samples, "costboard_events_refused_total", project="acme") == 5
    # made 3 (2 by ingest, 1 by the statement alone: a session no row has), deleted 1
    assert sessions_tally_check() == {agent.project.pk: -1}
