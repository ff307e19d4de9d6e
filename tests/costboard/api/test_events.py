from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import genai_prices
import pytest

from costboard.api.events import prefers_minimal
from costboard.models import BudgetEvent, DailyRollup, EventReceipt, Session, Step, Turn
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent, make_agent, usd
from tests.costboard.ingest.test_normalize import GEMINI_WITH_TOOL_PROMPTS

pytestmark = pytest.mark.django_db


def step(**fields: object) -> dict[str, object]:
    return {"step_type": "response", "model": "test-sonnet", "session_id": "s1", **fields}


def stored_counts() -> tuple[int, int, int, int, int]:
    return (
        Session.objects.count(),
        Turn.objects.count(),
        Step.objects.count(),
        DailyRollup.objects.count(),
        EventReceipt.objects.count(),
    )


def test_a_single_event_is_accepted_and_the_budget_returned(agent: Agent, priced: object) -> None:
    response = agent.post(step(input_tokens=1000, output_tokens=200, turn=1))
    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == 1
    assert body["duplicates"] == 0
    budget = body["sessions"]["s1"]
    assert budget == {
        "session_id": "s1",
        "state": "ok",
        "runaway": False,
        "tokens_used": 1200,
        "token_cap": 100_000,
        "cost_usd": "0.006",
        "cost_cap_usd": "5.00",
        "turns": 1,
        "steps": 1,
        "warned_at": None,
        "exhausted_at": None,
        "stopped_by": None,
    }
    assert Decimal(budget["cost_usd"]) == usd(1000, Decimal(3)) + usd(200, Decimal(15))


def test_sessions_and_turns_are_created_on_first_mention(agent: Agent, priced: object) -> None:
    agent.events(
        {
            "type": "turn",
            "session_id": "s1",
            "turn": 1,
            "user_message": "Find laptops under $1000",
            "assistant_response": "Here are 5 options",
            "context": {"focus": "laptops", "selections": [1, 3]},
        },
        step(turn=1, step_type="intent", input_tokens=100, output_tokens=10),
        step(turn=1, step_type="search", input_tokens=200, output_tokens=20),
        step(turn=2, step_type="response", input_tokens=300, output_tokens=30),
    )
    session = Session.objects.get(external_id="s1")
    assert (session.turn_count, session.step_count) == (2, 3)
    turn1 = Turn.objects.get(session=session, number=1)
    assert turn1.user_message == "Find laptops under $1000"
    assert turn1.context == {"focus": "laptops", "selections": [1, 3]}
    assert (turn1.step_count, turn1.input_tokens, turn1.output_tokens) == (2, 300, 30)
    # a later turn event without text keeps the text already stored
    agent.events({"type": "turn", "session_id": "s1", "turn": 1, "context": {"focus": "Dell"}})
    turn1.refresh_from_db()
    assert turn1.user_message == "Find laptops under $1000"
    assert turn1.context == {"focus": "Dell"}


def test_a_replayed_batch_is_all_duplicates_and_changes_nothing(
    agent: Agent, priced: object
) -> None:
    batch: list[dict[str, Any]] = [
        {"type": "session", "session_id": "s1", "user_id": "u1", "event_id": "sess"},
        {"type": "turn", "session_id": "s1", "turn": 1, "user_message": "hi", "event_id": "t1"},
        step(turn=1, input_tokens=10, output_tokens=5, event_id="a"),
        step(turn=1, input_tokens=20, output_tokens=5, event_id="b"),
        step(input_tokens=30, output_tokens=5, event_id="c", session_id=None),
    ]
    first = agent.events(*batch)
    assert (first["accepted"], first["duplicates"]) == (5, 0)
    snapshot = [
        (s.external_id, s.tokens_used, s.cost_usd, s.step_count, s.turn_count)
        for s in Session.objects.order_by("external_id")
    ]
    rollups = list(DailyRollup.objects.values_list("calls", "cost_usd", "input_tokens"))
    counts = stored_counts()

    again = agent.events(*batch)
    assert (again["accepted"], again["duplicates"]) == (0, 5)
    assert again["sessions"] == first["sessions"]
    assert stored_counts() == counts
    assert [
        (s.external_id, s.tokens_used, s.cost_usd, s.step_count, s.turn_count)
        for s in Session.objects.order_by("external_id")
    ] == snapshot
    assert list(DailyRollup.objects.values_list("calls", "cost_usd", "input_tokens")) == rollups


def test_an_event_id_repeated_within_a_batch_counts_once(agent: Agent, priced: object) -> None:
    body = agent.events(step(input_tokens=10, event_id="x"), step(input_tokens=10, event_id="x"))
    assert (body["accepted"], body["duplicates"]) == (1, 1)
    assert Step.objects.count() == 1


def test_an_event_id_is_one_event_whatever_its_kind_within_and_across_batches(
    agent: Agent, priced: object
) -> None:
    session = {"type": "session", "session_id": "s1", "user_id": "u1", "event_id": "x"}
    turn = {"type": "turn", "session_id": "s1", "turn": 1, "user_message": "hi", "event_id": "y"}
    within = agent.events(session, step(input_tokens=10, event_id="x"))
    assert (within["accepted"], within["duplicates"]) == (1, 1)
    # across batches alike: a step after a session or turn event of its id, and the reverse
    assert agent.events(turn)["accepted"] == 1
    later = agent.events(step(input_tokens=10, event_id="x"), step(input_tokens=7, event_id="y"))
    assert (later["accepted"], later["duplicates"]) == (0, 2)
    agent.events(step(input_tokens=5, event_id="z"))
    reverse = agent.events({**session, "user_id": "u2", "event_id": "z"})
    assert (reverse["accepted"], reverse["duplicates"]) == (0, 1)
    assert Step.objects.get().input_tokens == 5
    assert Session.objects.get().user_id == "u1"
    assert EventReceipt.objects.count() == 2


def test_event_ids_are_scoped_to_the_project(agent: Agent, priced: object) -> None:
    other = make_agent("other")
    agent.events(step(input_tokens=10, event_id="same"))
    body = other.events(step(input_tokens=10, event_id="same"))
    assert (body["accepted"], body["duplicates"]) == (1, 0)
    assert Step.objects.count() == 2


def test_one_bad_event_refuses_the_whole_batch(agent: Agent, priced: object) -> None:
    response = agent.post(
        {
            "events": [
                {"type": "session", "session_id": "s1", "event_id": "s"},
                step(input_tokens=10),
                step(input_tokens=-5),
                step(input_tokens=10),
            ]
        }
    )
    assert response.status_code == 422
    assert response.json() == {
        "errors": [
            {
                "index": 2,
                "field": "input_tokens",
                "message": "must be at least 0, got -5",
            }
        ]
    }
    assert stored_counts() == (0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    ("event", "field", "says"),
    [
        ({"model": "m"}, "step_type", "required"),
        ({"step_type": "x"}, "model", "required"),
        ({"step_type": "x", "model": "m", "input_token": 5}, "input_token", "'input_tokens'"),
        ({"step_type": "x", "model": "m", "input_tokens": 1.5}, "input_tokens", "whole number"),
        ({"step_type": "x", "model": "m", "input_tokens": "12"}, "input_tokens", "whole number"),
        ({"step_type": "x", "model": "m", "turn": 0}, "turn", "must be at least 1"),
        ({"step_type": "x", "model": "m", "timestamp": "yesterday"}, "timestamp", "ISO 8601"),
        ({"step_type": "x", "model": "m", "success": "yes"}, "success", "true or false"),
        ({"step_type": "x", "model": "m", "event_id": "e" * 129}, "event_id", "128"),
        ({"type": "turn", "session_id": "s"}, "turn", "required"),
        ({"type": "session"}, "session_id", "required"),
        ({"type": "session", "session_id": "s", "cost_cap_usd": "lots"}, "cost_cap_usd", "decimal"),
        ({"type": "nope"}, "type", "use session, turn or step"),
        (
            {
                "step_type": "x",
                "model": "m",
                "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}},
            },
            "usage.prompt_tokens_details.cached_tokens",
            "cannot be larger",
        ),
    ],
)
def test_invalid_input_names_the_field_and_the_fix(
    agent: Agent, event: dict[str, object], field: str, says: str
) -> None:
    response = agent.post({"events": [step(input_tokens=1), event]})
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert errors[0]["index"] == 1
    assert errors[0]["field"] == field
    assert says in errors[0]["message"]
    assert Step.objects.count() == 0


def test_batch_bounds(agent: Agent) -> None:
    empty = agent.post({"events": []})
    assert empty.status_code == 422
    assert empty.json()["errors"][0]["field"] == "events"
    too_many = agent.post({"events": [step(input_tokens=1)] * 1001})
    assert too_many.status_code == 422
    assert "1 to 1000" in too_many.json()["errors"][0]["message"]
    assert Step.objects.count() == 0


def test_malformed_json_is_400(agent: Agent) -> None:
    response = agent.post(None, raw=b'{"events": [')
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "body"


def test_a_body_over_5_mb_is_413(agent: Agent) -> None:
    padding = "x" * (5 * 1024 * 1024)
    response = agent.post(None, raw=json.dumps({"events": [step(error=padding)]}).encode())
    assert response.status_code == 413
    assert Step.objects.count() == 0


def test_steps_without_a_session_count_against_the_system_session(
    agent: Agent, priced: object
) -> None:
    body = agent.events(
        {"step_type": "compress", "model": "test-sonnet", "input_tokens": 70, "output_tokens": 7}
    )
    assert body["sessions"]["system"]["tokens_used"] == 77
    system = Session.objects.get(project=agent.project, external_id="system")
    assert system.step_count == 1


def test_a_fork_keeps_its_parent_and_gets_a_fresh_budget(agent: Agent, priced: object) -> None:
    agent.events(step(session_id="parent", input_tokens=9_000, output_tokens=0))
    body = agent.events(
        {"type": "session", "session_id": "child", "parent_session_id": "parent"},
        step(session_id="child", input_tokens=10, output_tokens=0),
    )
    child = Session.objects.get(external_id="child")
    assert child.parent is not None
    assert child.parent.external_id == "parent"
    assert body["sessions"]["child"]["tokens_used"] == 10
    assert body["sessions"]["parent"]["tokens_used"] == 9_000


def test_session_attributes_metadata_merges_and_ended(agent: Agent) -> None:
    agent.events(
        {
            "type": "session",
            "session_id": "s1",
            "user_id": "u-7",
            "metadata": {"agent": "support", "v": 1},
        }
    )
    agent.events(
        {
            "type": "session",
            "session_id": "s1",
            "metadata": {"v": 2},
            "ended": True,
            "timestamp": "2026-11-20T10:00:00+01:00",
        }
    )
    session = Session.objects.get(external_id="s1")
    assert session.user_id == "u-7"
    assert session.metadata == {"agent": "support", "v": 2}

    assert session.ended_at is not None
    assert session.ended_at.isoformat() == "2026-11-20T09:00:00+00:00"


def test_fractions_in_metadata_and_context_stay_numbers(agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "m", "metadata": {"temperature": 0.7}},
        {"type": "turn", "session_id": "m", "turn": 1, "context": {"score": 0.25, "k": 5}},
        {"session_id": "m", "turn": 1, "step_type": "x", "model": "m", "metadata": {"p": 1.5}},
    )
    session = Session.objects.get(external_id="m")
    assert session.metadata == {"temperature": 0.7}
    assert session.turns.get().context == {"score": 0.25, "k": 5}
    assert Step.objects.get(session=session).metadata == {"p": 1.5}


def test_budget_states_and_crossings_recorded_once(agent: Agent, priced: object) -> None:
    agent.events({"type": "session", "session_id": "s1", "token_cap": 1000})
    first = agent.events(step(input_tokens=700, output_tokens=0, timestamp="2026-11-22T10:00:00Z"))
    assert first["sessions"]["s1"]["state"] == "ok"
    second = agent.events(
        step(input_tokens=50, output_tokens=0, timestamp="2026-11-22T10:01:00Z"),
        step(input_tokens=100, output_tokens=0, timestamp="2026-11-22T10:02:00Z"),
    )
    budget = second["sessions"]["s1"]
    assert budget["state"] == "warning"
    # the warning is timed at the step that crossed 80%, not the first of the batch
    assert budget["warned_at"] == "2026-11-22T10:02:00+00:00"
    third = agent.events(step(input_tokens=150, output_tokens=1, timestamp="2026-11-22T10:03:00Z"))
    assert third["sessions"]["s1"]["state"] == "exhausted"
    assert third["sessions"]["s1"]["exhausted_at"] == "2026-11-22T10:03:00+00:00"
    # steps after exhaustion are still stored
    fourth = agent.events(step(input_tokens=5, output_tokens=0))
    assert fourth["sessions"]["s1"]["tokens_used"] == 1006
    assert fourth["sessions"]["s1"]["warned_at"] == "2026-11-22T10:02:00+00:00"
    kinds = list(BudgetEvent.objects.order_by("at").values_list("kind", flat=True))
    assert kinds == ["soft_warned", "exhausted"]


def test_the_cost_cap_also_exhausts(agent: Agent, priced: object) -> None:
    agent.events({"type": "session", "session_id": "s1", "cost_cap_usd": "0.01"})
    body = agent.events(step(output_tokens=667))  # 667 × $15/M = $0.010005
    assert body["sessions"]["s1"]["state"] == "exhausted"
    assert body["sessions"]["s1"]["cost_cap_usd"] == "0.01"


def test_caps_come_from_the_project_then_the_environment(priced: object, settings: object) -> None:
    capped = make_agent(
        "capped", token_cap=500, cost_cap_usd=Decimal("1.5"), warn_at_pct=Decimal("0.5")
    )
    body = capped.events(step(input_tokens=260))
    budget = body["sessions"]["s1"]
    assert (budget["token_cap"], budget["cost_cap_usd"], budget["state"]) == (
        500,
        "1.50",
        "warning",
    )
    plain = make_agent("plain")
    settings.COSTBOARD_SESSION_TOKEN_CAP = 300  # type: ignore[attr-defined]
    budget = plain.events(step(input_tokens=260))["sessions"]["s1"]
    assert (budget["token_cap"], budget["state"]) == (300, "warning")


def test_raising_a_cap_recomputes_the_state_and_records_it(agent: Agent, priced: object) -> None:
    agent.events({"type": "session", "session_id": "s1", "token_cap": 100})
    assert agent.events(step(input_tokens=120))["sessions"]["s1"]["state"] == "exhausted"
    body = agent.events({"type": "session", "session_id": "s1", "token_cap": 1000})
    budget = body["sessions"]["s1"]
    assert (budget["state"], budget["warned_at"], budget["exhausted_at"]) == ("ok", None, None)
    events = agent.budget("s1").json()["events"]
    assert [e["kind"] for e in events] == ["soft_warned", "exhausted", "cap_changed"]
    assert events[-1]["detail"]["token_cap"] == [100, 1000]
    assert events[-1]["detail"]["state"] == ["exhausted", "ok"]


def test_budget_endpoint(agent: Agent, priced: object) -> None:
    agent.events(step(input_tokens=10))
    response = agent.budget("s1")
    assert response.status_code == 200
    assert response.json()["tokens_used"] == 10
    assert response.json()["events"] == []
    missing = agent.budget("nope")
    assert missing.status_code == 404
    assert missing.json()["errors"][0]["field"] == "session_id"


@pytest.mark.parametrize(
    ("session_id", "path"),
    [
        ("team/alice", "team%2Falice"),
        ("team/alice", "team/alice"),
        ("a/b/budget", "a%2Fb%2Fbudget"),  # ends as the route does
        ("50% off ü", "50%25%20off%20%C3%BC"),
    ],
)
def test_any_session_id_events_take_is_read_back_percent_encoded(
    agent: Agent, priced: object, session_id: str, path: str
) -> None:
    agent.events(step(session_id=session_id, input_tokens=10), step(session_id="team"))
    headers = {"Authorization": f"Bearer {agent.key}"}
    budget = agent.client.get(f"/api/v1/sessions/{path}/budget", headers=headers)
    assert budget.status_code == 200, budget.content
    assert budget.json()["tokens_used"] == 10
    context = agent.client.get(f"/api/v1/sessions/{path}/context?budget=100", headers=headers)
    assert context.status_code == 200, context.content
    missing = agent.client.get(f"/api/v1/sessions/{path}x/budget", headers=headers)
    assert missing.status_code == 404
    assert missing.json()["errors"][0]["field"] == "session_id"


def test_openapi_document_describes_the_api(client: object) -> None:
    response = client.get("/api/v1/openapi.json")  # type: ignore[attr-defined]
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.1")
    assert {"/api/v1/events", "/api/v1/sessions/{session_id}/budget"} <= set(doc["paths"])
    step_schema = doc["components"]["schemas"]["StepEvent"]
    assert {"step_type", "model"} <= set(step_schema["required"])
    assert "cache_read_input_tokens" in step_schema["properties"]


def test_prefer_return_minimal_answers_only_the_sessions_to_act_on(
    agent: Agent, priced: object
) -> None:
    caps = [
        {"type": "session", "session_id": s, "token_cap": 100} for s in ("fine", "near", "over")
    ]
    batch = {
        "events": [
            *caps,
            {**step(input_tokens=10), "session_id": "fine"},
            {**step(input_tokens=85), "session_id": "near"},  # past 80 %: warning
            {**step(input_tokens=150), "session_id": "over"},  # past the cap: exhausted
        ]
    }
    response = agent.post(batch, Prefer="respond-async, return=minimal")
    assert response.status_code == 200, response.content
    assert response["Preference-Applied"] == "return=minimal"
    body = response.json()
    assert body["accepted"] == 6
    assert sorted(body["sessions"]) == ["near", "over"]
    assert body["sessions"]["near"]["state"] == "warning"
    assert body["sessions"]["over"]["state"] == "exhausted"
    assert body["sessions"]["over"]["stopped_by"] == "session"
    assert body["sessions_ok"] == 1
    # the ok session is stored all the same, only left out of the answer
    assert agent.budget("fine").json()["tokens_used"] == 10

    full = agent.post({"events": [{**step(input_tokens=1), "session_id": "fine"}]})
    assert "Preference-Applied" not in full
    assert full.json()["sessions"]["fine"]["tokens_used"] == 11
    assert "sessions_ok" not in full.json()


@pytest.mark.parametrize(
    ("prefer", "minimal"),
    [
        ("return=minimal", True),
        ('RETURN="minimal"; foo=bar', True),
        ("wait=5, return=minimal", True),
        ("return=representation", False),
        ("return-minimal", False),
        ("", False),
    ],
)
def test_the_prefer_header_is_read_as_rfc_7240_says(prefer: str, minimal: bool) -> None:
    assert prefers_minimal(prefer) is minimal


def test_a_gemini_step_with_tool_use_prompt_tokens_costs_what_genai_prices_says(
    agent: Agent,
) -> None:
    # Gemini reports the tool prompts (a search's results) beside promptTokenCount: billed as
    # input, they also take this call past gemini-2.5-pro's 200k long-context tier
    prices_sync()
    metadata = GEMINI_WITH_TOOL_PROMPTS
    agent.events(
        step(
            model="gemini-2.5-pro",
            provider="google",
            usage=metadata,
            timestamp="2026-11-20T12:00:00Z",
        )
    )
    extracted = genai_prices.extract_usage(
        {"modelVersion": "gemini-2.5-pro", "usageMetadata": metadata}, provider_id="google"
    )
    theirs = genai_prices.calc_price(
        extracted.usage,
        "gemini-2.5-pro",
        provider_id="google",
        genai_request_timestamp=datetime(2026, 11, 20, 12, tzinfo=UTC),
    ).total_price
    stored = Step.objects.get()
    assert (stored.input_tokens, stored.cache_read_input_tokens, stored.output_tokens) == (
        190_000,
        20_000,
        800,
    )
    # 190,000 x $2.50 + 20,000 x $0.25 + 800 x $15 per million, all at the >200k tier
    assert stored.cost_usd == theirs == Decimal("0.492")
    assert Session.objects.get().cost_usd == Decimal("0.492")
