"""The cost API (docs/api.md, "Events"): events in, budgets out; and the OpenAPI document, raw
and as a page. The boundary (key, methods, errors) is costboard/api/boundary.py."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, cast

from csp.constants import SELF
from csp.decorators import csp_update
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from costboard.api.boundary import (
    ApiError,
    ApiRequest,
    Operation,
    Reply,
    path_text,
    read_body,
    typed_response,
)
from costboard.api.boundary import endpoint as api_endpoint
from costboard.api.encoding import HEADER as ENCODING_HEADER
from costboard.api.idempotency import (
    KEY_HEADER,
    REPLAYED_HEADER,
    idempotency_key,
    idempotent_answer,
)
from costboard.api.openapi import openapi_document
from costboard.api.schemas import SESSION_BUDGET_DETAIL, SESSION_ID, EventsResponse
from costboard.budgets.caps import session_budget
from costboard.budgets.period_ledgers import stopping_budget
from costboard.ingest.schemas import (
    MAX_BODY_BYTES,
    MAX_EVENTS,
    BatchError,
    Event,
    EventsBody,
    parse_events,
)
from costboard.ingest.service import events_ingest, step_months_ready
from costboard.models import BudgetEvent, Project, Session
from costboard.projects import ingest_tally

PREFER_HEADER = "Prefer"
APPLIED_HEADER = "Preference-Applied"

EVENTS = Operation(
    method="POST",
    summary="Report usage: one event or a batch of up to 1000, stored all or nothing",
    description="Each step is priced, rolled up and counted against its session's budget; "
    "the answer carries the budget of every session the batch touched: stop when its state "
    "is exhausted. An event_id makes an event idempotent within the project. Token semantics "
    "are Anthropic's: input_tokens excludes cache reads and writes. At most "
    f"{MAX_BODY_BYTES} bytes (5 MB) and {MAX_EVENTS} events. An Idempotency-Key header "
    "makes the whole batch idempotent: sent again with the same key and body, it is not "
    "ingested again and gets the first answer (kept at least 24 hours). The body may be "
    "sent compressed with Content-Encoding: gzip: at most 5 MB compressed and 5 MB "
    "decompressed.",
    body=EventsBody,
    headers={
        ENCODING_HEADER: {
            "description": "gzip: the body is gzip-compressed (at most 5 MB, and at most 5 MB "
            "once decompressed: 413 past either; 400 if it is not gzip). Limits and the "
            "Idempotency-Key see the decompressed body. Another coding (br, deflate) is 415.",
            "schema": {"type": "string", "examples": ["gzip"]},
        },
        KEY_HEADER: {
            "description": "one key per batch, the same on each retry of it (a UUID is a good "
            "key): the same key and body get the stored answer with Idempotent-Replayed: true; "
            "the same key with another body is 422. Only a 200 is stored: after a refusal, "
            "the corrected batch may be sent under the same key. Kept at least 24 hours.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
        },
        PREFER_HEADER: {
            "description": "`return=minimal` (RFC 7240): `sessions` holds only the touched "
            "sessions that are not ok (warning, exhausted, runaway or stopped by a budget) and "
            "`sessions_ok` counts the others: a gateway batching across hundreds of users "
            "reads only the ones to act on. Answered with Preference-Applied.",
            "schema": {"type": "string"},
        },
    },
    responses={
        200: Reply(
            "stored (or replayed): the touched sessions' budgets",
            EventsResponse,
            headers={
                APPLIED_HEADER: {
                    "description": "return=minimal when the Prefer header asked for it",
                    "schema": {"type": "string", "enum": ["return=minimal"]},
                },
                REPLAYED_HEADER: {
                    "description": "true when this is the stored answer to an earlier request "
                    "with the same Idempotency-Key (nothing was ingested again)",
                    "schema": {"type": "string", "enum": ["true"]},
                },
            },
        ),
        422: Reply(
            "invalid events, each error with its index; or an Idempotency-Key that is "
            "malformed or was used with another body; nothing stored"
        ),
    },
)


@api_endpoint(EVENTS)
def events(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    key = _idempotency_key(request, project)
    minimal = prefers_minimal(request.headers.get(PREFER_HEADER, ""))
    try:
        # gzip or not, what is validated, limited and keyed is the decompressed body
        body = read_body(request, limit=MAX_BODY_BYTES, what="split the batch")
    except ApiError:
        ingest_tally(project.pk, refused=1)  # the body is not read: its events are unknown
        raise
    try:
        batch = parse_events(body)
    except BatchError as exc:
        ingest_tally(project.pk, refused=exc.event_count or 1)
        raise
    prefix = cast(ApiRequest, request).api_key.prefix
    now = timezone.now()
    step_months_ready(batch, now)  # before any transaction, an Idempotency-Key's (see there)
    try:
        response = idempotent_answer(
            project=project,
            key=key,
            body=body,
            answer=lambda: _ingested(project, batch, prefix, minimal, now),
        )
    except (ApiError, BatchError):  # the key was used with another body; sums out of range
        ingest_tally(project.pk, refused=len(batch))
        raise
    if _answered_minimal(response, asked=minimal):
        response[APPLIED_HEADER] = "return=minimal"
    return response


def _answered_minimal(response: HttpResponse, *, asked: bool) -> bool:
    """Whether the answer sent is the minimal one: what this request asked, unless it is a
    replay, whose stored answer is minimal or not as its first request asked."""
    if response.get(REPLAYED_HEADER) != "true":
        return asked
    return "sessions_ok" in json.loads(response.content)


def prefers_minimal(prefer: str) -> bool:
    """Whether a Prefer header (RFC 7240: preferences split by commas, each `name[=value]`
    with `;`-parameters) holds return=minimal; names case-insensitive, values maybe quoted."""
    for preference in prefer.split(","):
        name, _, value = preference.split(";", 1)[0].partition("=")
        if name.strip().lower() == "return" and value.strip().strip('"') == "minimal":
            return True
    return False


def _ingested(
    project: Project, batch: list[Event], key_prefix: str, minimal: bool, now: datetime
) -> dict[str, Any]:
    # it counts them for /metrics; the key's own budgets count its steps
    result = events_ingest(
        project=project, events=batch, now=now, key_prefix=key_prefix, flagged_only=minimal
    )
    # Built as a dict on the hot path: EventsResponse documents it, the contract test checks it.
    answer = {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "sessions": result.sessions,
        "budgets": result.budgets,
    }
    if minimal:
        answer["sessions_ok"] = result.sessions_ok
    return answer


def _idempotency_key(request: HttpRequest, project: Project) -> str | None:
    try:
        return idempotency_key(request)
    except ApiError:
        ingest_tally(project.pk, refused=1)  # refused before the body is read
        raise


SESSION_BUDGET = Operation(
    method="GET",
    summary="A session's budget and its budget events, oldest first",
    path_parameters={"session_id": SESSION_ID},
    responses={
        200: Reply("the budget", SESSION_BUDGET_DETAIL),
        404: Reply("no such session in this project"),
        422: Reply("session_id holds NUL or an unpaired surrogate"),
    },
)


@api_endpoint(SESSION_BUDGET)
def session_budget_view(request: HttpRequest, session_id: str) -> HttpResponse:
    project = cast(ApiRequest, request).project
    external_id = path_text("session_id", session_id)
    detail = session_budget_read(
        project, external_id, key_prefix=cast(ApiRequest, request).api_key.prefix
    )
    if detail is None:
        raise ApiError(404, "session_id", f"no session {session_id!r} in project {project.slug}")
    return typed_response(SESSION_BUDGET_DETAIL, detail)


def session_budget_read(
    project: Project, external_id: str, *, key_prefix: str
) -> dict[str, Any] | None:
    """A session's budget and its budget events (None: no such session): what an agent reads
    before each call."""
    session = Session.objects.filter(project=project, external_id=external_id).first()
    if session is None:
        return None
    events = BudgetEvent.objects.filter(session=session).order_by("at", "id")
    stopping = stopping_budget(
        project,
        user_id=session.user_id,
        tags=session.tags,
        key_prefix=key_prefix,
        now=timezone.now(),
    )
    return {
        **session_budget(session, project, stopped_by_budget=stopping),
        "events": [e.to_dict() for e in events],
    }


OPENAPI = Operation(
    method="GET",
    summary="This document (OpenAPI 3.1), generated from the models that validate",
    auth=False,
    tag="documentation",
    responses={200: Reply("the OpenAPI document", schema={"type": "object"})},
)


@api_endpoint(OPENAPI)
def openapi(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_document())


DOCS = Operation(
    method="GET",
    summary="This document as a page (Swagger UI, served from our own static files)",
    description="Public, like the document: it describes the API, it shows no data.",
    auth=False,
    tag="documentation",
    responses={200: Reply("the page", media_type="text/html", schema={"type": "string"})},
)


# Swagger UI draws its icons as data: SVG images (no script runs in an image): this page's
# CSP allows those beside our own files (costboard/csp.py). csp_update's view is typed as
# answering any HttpResponseBase; this one answers a page.
@api_endpoint(DOCS)  # type: ignore[arg-type]
@csp_update({"img-src": [SELF, "data:"]})
def docs(request: HttpRequest) -> HttpResponse:
    return render(request, "api/docs.html", {"title": openapi_document()["info"]["title"]})
