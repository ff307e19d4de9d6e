"""The OpenAPI document against the server: real requests to every endpoint (successes and the
usual refusals), each answer checked against the document's schema for its operation and
status (jsonschema, Draft 2020-12, refs resolved in the document), its content type and its
documented headers. And the document lists every API route, and agrees with the server on
the cases it once got wrong."""

from __future__ import annotations

import gzip
import json
import re
from datetime import datetime
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import OpenAPIV31SpecValidator
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from costboard.api.boundary import MAX_QUERY_STRING
from costboard.api.openapi import openapi_document
from costboard.ingest.schemas import MAX_BODY_BYTES
from costboard.models import ApiKey
from memory_ui.models import Memory, RetrievalLog
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db

DOC = openapi_document()
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
FORMATS = FormatChecker()


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    if not isinstance(value, str) or not RFC3339.match(value):
        return False
    datetime.fromisoformat(value)
    return True


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator of `schema` whose #/components/... refs resolve in the document."""
    return Draft202012Validator({**schema, "components": DOC["components"]}, format_checker=FORMATS)


def operation(path: str, method: str) -> dict[str, Any]:
    return DOC["paths"][path][method.lower()]


def conforms(response: Any, path: str, method: str) -> Any:
    """Assert `response` is documented for its operation: its status, its content type, its
    headers, and (JSON) its body under the schema; return the parsed body."""
    documented = operation(path, method)["responses"]
    status = str(response.status_code)
    assert status in documented, f"{method} {path} answered an undocumented {status}"
    reply = documented[status]
    if "content" not in reply:  # documented without a body (a 204): none, nor a Content-Type
        assert not response.content, f"{method} {path} {status} has a body"
        assert "Content-Type" not in response, f"{method} {path} {status} names a Content-Type"
        return None
    media_type = response["Content-Type"].split(";")[0].strip()
    assert media_type in reply["content"], f"{media_type} not documented for {status}"
    for header, spec in reply.get("headers", {}).items():
        if spec.get("required") or header == "Allow":
            assert header in response, f"{header} missing from {status}"
            validator(spec["schema"]).validate(
                int(response[header]) if spec["schema"]["type"] == "integer" else response[header]
            )
    if media_type != "application/json":
        return response.content
    body = json.loads(response.content)
    errors = sorted(validator(reply["content"][media_type]["schema"]).iter_errors(body), key=str)
    assert not errors, f"{method} {path} {status}: {errors[0].message} in {body}"
    return body


def request_is_documented(path: str, method: str, body: Any) -> bool:
    schema = operation(path, method)["requestBody"]["content"]["application/json"]["schema"]
    return validator(schema).is_valid(body)


def parameter_is_documented(path: str, method: str, name: str, value: Any) -> bool:
    (parameter,) = [p for p in operation(path, method)["parameters"] if p["name"] == name]
    return validator(parameter["schema"]).is_valid(value)


def auth(agent: Agent) -> dict[str, str]:
    return {"Authorization": f"Bearer {agent.key}"}


def post(agent: Agent | None, path: str, body: Any, **kwargs: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body)
    headers = {**(auth(agent) if agent else {}), **kwargs.pop("headers", {})}
    content_type = kwargs.pop("content_type", "application/json")
    return Client().post(path, raw, content_type=content_type, headers=headers, **kwargs)


def get(agent: Agent | None, path: str, **params: Any) -> Any:
    return Client().get(path, params, headers=auth(agent) if agent else {})


def step(**fields: Any) -> dict[str, Any]:
    return {"session_id": "s1", "step_type": "response", "model": "test-sonnet", **fields}


@pytest.fixture
def used(agent: Agent, priced: object) -> Agent:
    """A session past its soft warning, with two turns of text."""
    agent.events(
        {"type": "session", "session_id": "s1", "token_cap": 1000},
        {"type": "turn", "session_id": "s1", "turn": 1, "user_message": "Find a laptop"},
        step(turn=1, input_tokens=850, output_tokens=10, timestamp="2026-11-22T10:00:00Z"),
        {"type": "turn", "session_id": "s1", "turn": 2, "user_message": "Cheaper?"},
    )
    return agent


# --- the document and the routes ---------------------------------------------------------------


def api_routes(patterns: list[Any], prefix: str = "") -> list[str]:
    routes: list[str] = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes += api_routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern) and route.startswith(("api/v1/", "v1/traces")):
            routes.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))
    return routes


def test_the_document_lists_every_api_route_and_nothing_else() -> None:
    routes = api_routes(get_resolver().url_patterns)
    assert {"/api/v1/events", "/v1/traces", "/api/v1/docs"} <= set(routes)
    assert sorted(DOC["paths"]) == sorted(routes)


def test_the_served_document_is_the_generated_one_and_valid_openapi_3_1(client: Client) -> None:
    response = client.get("/api/v1/openapi.json")
    assert conforms(response, "/api/v1/openapi.json", "GET") == DOC
    assert DOC["openapi"] == "3.1.0"
    assert DOC["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key",
    }
    for path, methods in DOC["paths"].items():
        for method, spec in methods.items():
            statuses = set(spec["responses"])
            assert {"405", "414"} <= statuses, (method, path)
            if spec.get("security") != []:
                assert "401" in statuses, (method, path)
            if "requestBody" in spec:
                assert {"400", "413", "422"} <= statuses, (method, path)


def test_the_served_document_passes_an_openapi_validator(client: Client) -> None:
    served = client.get("/api/v1/openapi.json").json()
    errors = [str(error) for error in OpenAPIV31SpecValidator(served).iter_errors()]
    assert errors == []


def test_every_operation_has_its_own_operation_id() -> None:
    ids = [spec["operationId"] for methods in DOC["paths"].values() for spec in methods.values()]
    assert len(ids) == len(set(ids)) == 18
    budget = DOC["paths"]["/api/v1/budgets/{budget_id}"]
    assert (
        budget["get"]["operationId"],
        DOC["paths"]["/api/v1/budgets"]["get"]["operationId"],
    ) == (
        "getBudgetsByBudgetId",
        "getBudgets",
    )


def test_a_response_without_a_body_documents_no_content() -> None:
    deleted = DOC["paths"]["/api/v1/budgets/{budget_id}"]["delete"]["responses"]["204"]
    assert deleted == {"description": "deleted: no body"}
    for path, methods in DOC["paths"].items():
        for method, spec in methods.items():
            for status, reply in spec["responses"].items():
                assert ("content" in reply) == (status != "204"), (method, path, status)


def test_every_schema_ref_resolves() -> None:
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(DOC)))
    assert refs <= set(DOC["components"]["schemas"])
    assert {"StepEvent", "TurnEvent", "SessionEvent", "SessionBudget", "Errors"} <= refs


# --- POST /api/v1/events -----------------------------------------------------------------------


def test_events_answers_conform(used: Agent) -> None:
    path = "/api/v1/events"
    body = conforms(post(used, path, step(input_tokens=5)), path, "POST")
    assert body["sessions"]["s1"]["state"] == "warning"
    assert body["sessions"]["s1"]["warned_at"] == "2026-11-22T10:00:00+00:00"
    assert conforms(post(used, path, [step(input_tokens=1)]), path, "POST")["accepted"] == 1
    minimal = post(used, path, [step(input_tokens=1)], headers={"Prefer": "return=minimal"})
    assert conforms(minimal, path, "POST")["sessions_ok"] == 0  # s1 is past its warning
    batch = {"events": [step(event_id="a", input_tokens=1), step(event_id="a", input_tokens=1)]}
    assert conforms(post(used, path, batch), path, "POST")["duplicates"] == 1

    refusals = {
        400: post(used, path, b'{"events": ['),
        401: post(None, path, step()),
        405: Client().get(path, headers=auth(used)),
        413: post(used, path, b" " * (MAX_BODY_BYTES + 1)),
        414: post(used, path + "?" + "x" * (MAX_QUERY_STRING + 1), step()),
        422: post(used, path, {"events": [step(input_tokens=-1)]}),
    }
    for status, response in refusals.items():
        assert response.status_code == status, (status, response.content)
        assert conforms(response, path, "POST")["errors"]
    assert refusals[405]["Allow"] == "POST"


# --- budgets and context -----------------------------------------------------------------------


def test_budget_answers_conform(used: Agent) -> None:
    path = "/api/v1/sessions/{session_id}/budget"
    body = conforms(get(used, "/api/v1/sessions/s1/budget"), path, "GET")
    assert [event["kind"] for event in body["events"]] == ["soft_warned"]
    assert body["tokens_used"] == 860
    for status, response in {
        401: get(None, "/api/v1/sessions/s1/budget"),
        404: get(used, "/api/v1/sessions/nope/budget"),
        414: get(used, "/api/v1/sessions/s1/budget", q="x" * MAX_QUERY_STRING),
        422: get(used, "/api/v1/sessions/a%00b/budget"),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "GET")


def test_context_answers_conform(used: Agent) -> None:
    path = "/api/v1/sessions/{session_id}/context"
    body = conforms(get(used, "/api/v1/sessions/s1/context", budget=100), path, "GET")
    assert [turn["number"] for turn in body["turns"]] == [1, 2]
    for status, response in {
        401: get(None, "/api/v1/sessions/s1/context", budget=100),
        404: get(used, "/api/v1/sessions/nope/context", budget=100),
        422: get(used, "/api/v1/sessions/s1/context", budget="many"),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "GET")


# --- POST /v1/traces ---------------------------------------------------------------------------


def otlp_json(**attributes: Any) -> dict[str, Any]:
    values = [{"key": k, "value": {"stringValue": str(v)}} for k, v in attributes.items()]
    return {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "chat",
                                "startTimeUnixNano": "1763805600000000000",
                                "endTimeUnixNano": "1763805601000000000",
                                "attributes": values,
                            },
                            {"traceId": "", "spanId": "", "name": "no ids"},
                        ]
                    }
                ]
            }
        ]
    }


def test_otlp_answers_conform(agent: Agent, priced: object) -> None:
    path = "/v1/traces"
    good = otlp_json(**{"gen_ai.conversation.id": "s1", "gen_ai.request.model": "test-sonnet"})
    assert request_is_documented(path, "POST", good)
    body = conforms(post(agent, path, good), path, "POST")
    assert body["partialSuccess"]["rejectedSpans"] == "1"  # the span without ids

    empty = ExportTraceServiceRequest(resource_spans=[ResourceSpans()]).SerializeToString()
    protobuf = post(agent, path, empty, content_type="application/x-protobuf")
    assert protobuf.status_code == 200
    assert conforms(protobuf, path, "POST") == ExportTraceServiceResponse().SerializeToString()

    big = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}] * 10_001}]}]}
    for status, response in {
        400: post(agent, path, b"{not json"),
        401: post(None, path, good),
        413: post(agent, path, big),
        415: post(agent, path, b"{}", content_type="text/plain"),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "POST")
    gzipped = post(agent, path, gzip.compress(b"{}"), headers={"Content-Encoding": "gzip"})
    assert conforms(gzipped, path, "POST") == {}


# --- the memory API ----------------------------------------------------------------------------


def test_candidate_answers_conform(agent: Agent) -> None:
    path = "/api/v1/memory/candidates"
    candidate = {"content": "Always use ruff", "type": "feedback", "tags": ["lint"]}
    created = post(agent, path, candidate)
    assert created.status_code == 201
    assert conforms(created, path, "POST")["status"] == "pending"
    merged = post(agent, path, candidate)
    assert merged.status_code == 200
    assert conforms(merged, path, "POST")["merged"] is True
    Memory.objects.filter(project=agent.project).update(status="rejected")
    for status, response in {
        400: post(agent, path, b"{nope"),
        401: post(None, path, candidate),
        409: post(agent, path, candidate),
        413: post(agent, path, {"content": "x" * 70_000, "type": "user"}),
        422: post(agent, path, {"content": "x", "type": "preference"}),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "POST")


def test_memory_md_search_and_feedback_answers_conform(agent: Agent) -> None:
    memory = Memory.objects.create(
        project=agent.project,
        type="project",
        content="Deploys go through staging first",
        status="approved",
        fingerprint="deploys go through staging first",
    )
    md = get(agent, "/api/v1/memory/MEMORY.md")
    assert conforms(md, "/api/v1/memory/MEMORY.md", "GET") == (
        b"[project] Deploys go through staging first\n"
    )
    assert md["X-Memory-Lines"] == "1"
    assert get(agent, "/api/v1/memory/MEMORY.md", scope="team:x").status_code == 422
    conforms(
        get(agent, "/api/v1/memory/MEMORY.md", scope="team:x"), "/api/v1/memory/MEMORY.md", "GET"
    )

    path = "/api/v1/memory/search"
    found = conforms(get(agent, path, q="staging"), path, "GET")
    assert [result["id"] for result in found["results"]] == [memory.pk]
    assert conforms(get(agent, path, q="   "), path, "GET")["errors"][0]["field"] == "q"

    path = "/api/v1/memory/feedback"
    given = {"memory_id": memory.pk, "useful": True, "retrieval_id": found["retrieval_id"]}
    stored = post(agent, path, given)
    assert stored.status_code == 201
    assert conforms(stored, path, "POST")["retrieval_id"] == found["retrieval_id"]
    other = make_agent("other")
    for status, response in {
        404: post(other, path, given),
        422: post(agent, path, {**given, "useful": "yes"}),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "POST")


def test_period_budget_answers_conform(agent: Agent) -> None:
    admin = {"Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='admin')[1]}"}

    def call(method: str, path: str, body: Any = None) -> Any:
        if body is None:
            return Client().generic(method, path, headers=admin)
        return Client().generic(
            method, path, json.dumps(body), content_type="application/json", headers=admin
        )

    listed, one = "/api/v1/budgets", "/api/v1/budgets/{budget_id}"
    kept = call("POST", listed, {"name": "kept", "token_limit": 100}).json()
    made = conforms(call("POST", listed, {"name": "m", "cost_limit_usd": "5.00"}), listed, "POST")
    at = f"/api/v1/budgets/{made['id']}"
    assert {b["id"] for b in conforms(call("GET", listed), listed, "GET")["budgets"]} == {
        kept["id"],
        made["id"],
    }
    assert conforms(call("GET", at), one, "GET")["name"] == "m"
    assert conforms(call("PATCH", at, {"name": "n"}), one, "PATCH")["name"] == "n"
    deleted = call("DELETE", at)
    assert deleted.status_code == 204
    assert conforms(deleted, one, "DELETE") is None
    for method, status, response in [
        ("GET", 404, call("GET", at)),
        ("PATCH", 404, call("PATCH", at, {"name": "n"})),
        ("DELETE", 404, call("DELETE", at)),
        ("GET", 401, Client().get(at)),
        ("GET", 403, get(agent, at)),
        ("PATCH", 422, call("PATCH", f"/api/v1/budgets/{kept['id']}", {"name": 5})),
    ]:
        assert response.status_code == status, (method, status, response.content)
        conforms(response, one, method)
    refused = call("POST", listed, {"name": "m", "cost_limit_usd": "-1"})
    assert refused.status_code == 422
    conforms(refused, listed, "POST")


def test_spend_answers_conform(used: Agent) -> None:
    reader = {"Authorization": f"Bearer {ApiKey.issue(project=used.project, role='read')[1]}"}
    path = "/api/v1/spend"
    for group_by in ("day", "model,step_type", "user", "day,tag:feature"):
        answer = Client().get(path, {"group_by": group_by}, headers=reader)
        assert conforms(answer, path, "GET")["group_by"] == group_by.split(",")
        csv_answer = Client().get(
            path, {"group_by": group_by}, headers={**reader, "Accept": "text/csv"}
        )
        assert conforms(csv_answer, path, "GET").startswith(group_by.encode() + b",cost_usd")
    for status, response in {
        401: Client().get(path),
        403: get(used, path),
        422: Client().get(path, {"group_by": "hour"}, headers=reader),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "GET")


def test_reconciliation_answers_conform(agent: Agent) -> None:
    reader = {"Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='read')[1]}"}
    path = "/api/v1/reconciliation"
    stored = Client().post(
        "/api/v1/billing",
        json.dumps({"rows": [{"date": "2026-11-01", "provider": "mistral", "cost_usd": "1.25"}]}),
        "application/json",
        headers={"Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='admin')[1]}"},
    )
    assert stored.status_code == 200
    query = {"since": "2026-11-01", "until": "2026-11-02"}
    for group_by in ("day,provider,model", "provider"):
        answer = conforms(
            Client().get(path, {**query, "group_by": group_by}, headers=reader), path, "GET"
        )
        assert answer["group_by"] == group_by.split(",")
        assert answer["total"]["billed_cost_usd"] == "1.25"
        csv_answer = Client().get(
            path, {**query, "group_by": group_by}, headers={**reader, "Accept": "text/csv"}
        )
        assert conforms(csv_answer, path, "GET").startswith(
            group_by.encode() + b",estimated_cost_usd"
        )
    for status, response in {
        401: Client().get(path),
        403: get(agent, path),
        422: Client().get(path, {"group_by": "hour"}, headers=reader),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "GET")


def test_billing_answers_conform(agent: Agent) -> None:
    admin = {"Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='admin')[1]}"}
    path = "/api/v1/billing"
    row = {"date": "2026-11-01", "provider": "mistral", "cost_usd": "1.25"}
    stored = Client().post(path, json.dumps({"rows": [row]}), "application/json", headers=admin)
    assert conforms(stored, path, "POST")["stored"] == 1
    as_csv = Client().post(
        path, "date,provider,cost_usd\n2026-11-01,mistral,1.25\n", "text/csv", headers=admin
    )
    assert conforms(as_csv, path, "POST")["replaced"] == 1
    for status, response in {
        401: Client().post(path, "{}", "application/json"),
        403: post(agent, path, {"rows": [row]}),
        415: Client().post(path, "x", "text/plain", headers=admin),
        422: Client().post(path, '{"rows": []}', "application/json", headers=admin),
    }.items():
        assert response.status_code == status, (status, response.content)
        conforms(response, path, "POST")


def test_the_docs_page_is_documented_html(client: Client) -> None:
    response = client.get("/api/v1/docs")
    assert conforms(response, "/api/v1/docs", "GET")
    assert b"swagger-ui-bundle.js" in response.content
    assert b"http://" not in response.content and b"https://" not in response.content


# --- what the hand-typed document once got wrong: now document and server agree ---------------


def test_a_number_for_a_timestamp_is_refused_by_both(agent: Agent) -> None:
    event = step(input_tokens=1, timestamp=1763805600)
    assert not request_is_documented("/api/v1/events", "POST", event)
    response = post(agent, "/api/v1/events", event)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "timestamp"
    assert "ISO 8601" in response.json()["errors"][0]["message"]


def test_odd_timestamps_are_refused_naming_the_field(agent: Agent) -> None:
    for timestamp in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1969-12-31"):
        response = post(agent, "/api/v1/events", step(input_tokens=1, timestamp=timestamp))
        assert response.status_code == 422, timestamp
        assert response.json()["errors"][0]["field"] == "timestamp"


def test_null_tags_are_no_tags_for_both(agent: Agent) -> None:
    candidate = {"content": "Prefer small PRs", "type": "feedback", "tags": None}
    assert request_is_documented("/api/v1/memory/candidates", "POST", candidate)
    response = post(agent, "/api/v1/memory/candidates", candidate)
    assert response.status_code == 201
    assert response.json()["tags"] == []


def test_retrieval_id_0_is_refused_by_both(agent: Agent) -> None:
    feedback = {"memory_id": 1, "useful": True, "retrieval_id": 0}
    assert not request_is_documented("/api/v1/memory/feedback", "POST", feedback)
    response = post(agent, "/api/v1/memory/feedback", feedback)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "retrieval_id"


@pytest.mark.parametrize("q", ["", "   "])
def test_an_empty_query_is_refused_by_both(agent: Agent, q: str) -> None:
    assert not parameter_is_documented("/api/v1/memory/search", "GET", "q", q)
    response = get(agent, "/api/v1/memory/search", q=q)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "q"
    assert not RetrievalLog.objects.exists()


def test_a_whole_decimal_token_cap_is_accepted_by_both(agent: Agent) -> None:
    body = b'{"type": "session", "session_id": "s1", "token_cap": 200000.0}'
    assert request_is_documented("/api/v1/events", "POST", json.loads(body))
    response = post(agent, "/api/v1/events", body)
    assert response.status_code == 200, response.content
    assert response.json()["sessions"]["s1"]["token_cap"] == 200_000
    fraction = post(
        agent, "/api/v1/events", b'{"type": "session", "session_id": "s", "token_cap": 1.5}'
    )
    assert not request_is_documented(
        "/api/v1/events", "POST", {"type": "session", "session_id": "s", "token_cap": 1.5}
    )
    assert fraction.status_code == 422


def test_the_documented_example_is_accepted(agent: Agent, priced: object) -> None:
    schema = DOC["components"]["schemas"]["EventsBody"]
    (example,) = schema["examples"]
    assert request_is_documented("/api/v1/events", "POST", example)
    body = conforms(post(agent, "/api/v1/events", example), "/api/v1/events", "POST")
    assert body["accepted"] == 3
    assert body["sessions"]["chat-42"]["token_cap"] == 200_000
