"""schemathesis over the generated OpenAPI document, against the real Django app (WSGI, the
test database): every operation, a bounded and seeded number of generated requests each,
positive (fits the document) and negative (does not), authenticated with a real key. No answer
may be a 5xx or break the document's schema for its status; the status and content type must
be ones the document lists; a request the document says is invalid must be refused (4xx).

Bounded so the whole run stays well under a minute on two cores; seeded, so a failure in CI
is the same failure on a laptop.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from costboard.api.openapi import openapi_document
from costboard.wsgi import application
from memory_ui.models import Memory
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 30
SEED = 20261123

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": SEED,
        # positive and negative data: what breaks the document must be a 4xx, never a 5xx
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "mode": "all"},
        "phases": {"stateful": {"enabled": False}},
        # schemathesis's list of refusals plus the two the API answers past its size limits:
        # 413 for a body over 5 MB (a generated too-long text can be 100 MB), 414 for a query
        # string over 8 KB. Both are the refusal the document lists for them.
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [
                    *(400, 401, 403, 404, 405, 406, 409, 413, 414, 415, 422, 428, 429),
                    "5xx",
                ]
            }
        },
    }
)
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    negative_data_rejection,
]


@pytest.fixture
def fuzz_agent(db: None) -> Agent:
    agent = make_agent("fuzz")
    # something for the reads to find: a session with a turn, an approved memory
    agent.events(
        {"type": "turn", "session_id": "s1", "turn": 1, "user_message": "hi there"},
        {"session_id": "s1", "turn": 1, "step_type": "response", "model": "m", "output_tokens": 3},
    )
    Memory.objects.create(
        project=agent.project,
        type="project",
        content="Deploys go through staging first",
        status="approved",
        fingerprint="deploys go through staging first",
    )
    return agent


def in_test_transaction(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Django's WSGI app, minus closing the database connection around each request (as
    Django's test client does): the connection holds the test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        result = application(environ, start_response)
        try:
            return [b"".join(result)]
        finally:
            if hasattr(result, "close"):  # as a WSGI server does
                result.close()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@schemathesis.serializer("application/x-protobuf")
def protobuf(context: Any, value: Any) -> bytes:
    """OTLP's protobuf body as the document describes it: bytes (mostly undecodable, which
    the endpoint must refuse with a 400 Status, not fail on)."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


# a copy: schemathesis may normalize the dict it is given, and the document is cached
schema = schemathesis.openapi.from_dict(copy.deepcopy(openapi_document()), config=CONFIG)
schema.app = in_test_transaction  # requests go through Django in-process


@schema.parametrize()
# one key and one small world for every generated request of an operation, on purpose
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_the_api_keeps_to_its_document(case: Any, fuzz_agent: Agent) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {fuzz_agent.key}"}, checks=CHECKS)
