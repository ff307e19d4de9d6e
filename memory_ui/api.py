"""The memory API (docs/api.md, "Memory"): candidates in, MEMORY.md and ranked search out, feedback
on what a search returned. The key decides the project; nothing here approves a memory.

Each view parses with the models of memory_ui/schemas.py (where every field is checked, once),
calls a service with the typed value parsed and answers a model; refusals are raised and the
boundary (costboard/api/boundary.py) answers them."""

from __future__ import annotations

from typing import Any, cast

from django.http import HttpRequest, HttpResponse

from costboard.api.boundary import (
    ApiError,
    ApiRequest,
    Operation,
    Reply,
    endpoint,
    json_object,
    model_response,
    parse,
    parse_query,
)
from costboard.models import Project, Session
from memory_ui import cleaners, ranking, schemas
from memory_ui.memory_file import memory_md as scope_memory_md
from memory_ui.models import Memory
from memory_ui.schemas import (
    FeedbackStored,
    MemoryCandidate,
    MemoryFeedback,
    MemoryMdQuery,
    MemorySearch,
    SearchQuery,
    SearchResult,
)
from memory_ui.writes import proposals, retrievals

PROPOSED_BY = "api"
MAX_BODY_BYTES = 64 * 1024  # one candidate: a sentence and a few fields
TAG = "memory"


def _session(project: Project, session_id: str | None) -> Session | None:
    if session_id is None:
        return None
    session = Session.objects.filter(project=project, external_id=session_id).first()
    if session is None:
        raise ApiError(
            422,
            "session_id",
            f"no session {session_id!r} in project {project.slug}: send its events first, or "
            "leave session_id out",
        )
    return session


CANDIDATES = Operation(
    method="POST",
    summary="Propose a memory: a pending candidate until a person approves it",
    tag=TAG,
    body=MemoryCandidate,
    responses={
        201: Reply(
            "a new pending candidate; conflicts_with lists the live memories it contradicts",
            schemas.Memory,
        ),
        200: Reply(
            "the scope already had it (or a near duplicate), pending or approved: that memory, "
            'proposed once more, "merged": true',
            schemas.Memory,
        ),
        409: Reply("the same sentence was rejected before in this scope (field content)"),
        422: Reply(
            "invalid content, type, scope, importance, tags, ttl_days or an unknown session_id; "
            "the field is named"
        ),
    },
)


@endpoint(CANDIDATES)
def candidates(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/memory/candidates: a pending candidate (201), or the memory it repeats
    (200, "merged": true); its secrets redacted first."""
    project = cast(ApiRequest, request).project
    body = json_object(request, limit=MAX_BODY_BYTES, example=MemoryCandidate.example())
    candidate = parse(MemoryCandidate, body)
    try:
        fields = candidate.fields()  # its secrets redacted (docs/memory.md, "Redaction")
    except cleaners.MemoryInputError as exc:
        raise ApiError(422, exc.field, exc.message) from None
    memory = proposals.candidate_propose(
        project=project,
        fields=fields,
        session=_session(project, candidate.session_id),
        source=Memory.Source.AGENT_INFERRED,
        proposed_by=PROPOSED_BY,
    )
    if memory is None:
        raise ApiError(
            409,
            "content",
            "this sentence was rejected before by a reviewer in this scope: it is not proposed "
            "again",
        )
    merged = memory.times_proposed > 1
    return model_response(schemas.Memory.of(memory, merged=merged), status=200 if merged else 201)


def _count_header(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }


MEMORY_MD = Operation(
    method="GET",
    summary="The scope's approved, live memories as MEMORY.md",
    description="One `[type] content` line each, most important first (then the newest); at "
    "most 200 lines and 25,000 bytes, cut at a line boundary.",
    tag=TAG,
    query=MemoryMdQuery,
    responses={
        200: Reply(
            "MEMORY.md",
            media_type="text/markdown",
            schema={"type": "string"},
            headers={
                "X-Memory-Lines": _count_header("lines (entries) served"),
                "X-Memory-Bytes": _count_header("bytes served, UTF-8"),
                "X-Memory-Total": _count_header("live entries in the scope"),
                "X-Memory-Cut": _count_header("entries the caps left out"),
            },
        ),
        422: Reply("bad scope"),
    },
)


@endpoint(MEMORY_MD)
def memory_md(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/memory/MEMORY.md?scope=project: the scope's approved, live entries."""
    project = cast(ApiRequest, request).project
    scope = parse_query(request, MemoryMdQuery).scope
    md = scope_memory_md(project, scope)
    response = HttpResponse(md.text, content_type="text/markdown; charset=utf-8")
    response["X-Memory-Lines"] = str(md.lines)
    response["X-Memory-Bytes"] = str(md.bytes)
    response["X-Memory-Total"] = str(md.total)
    response["X-Memory-Cut"] = str(md.cut_count)
    return response


SEARCH = Operation(
    method="GET",
    summary="The k best live memories of a scope for a query, each score with its components; "
    "logged for feedback",
    tag=TAG,
    query=SearchQuery,
    responses={
        200: Reply("the results, best first", MemorySearch),
        422: Reply("q missing, blank or too long, bad scope, k not 1 to 50"),
    },
)


@endpoint(SEARCH)
def search(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/memory/search?q=…&scope=…&k=5: ranked live memories, each with the parts
    of its score; logged, and the log's id returned for feedback."""
    project = cast(ApiRequest, request).project
    asked = parse_query(request, SearchQuery)
    ranked = ranking.memories_search(project=project, search=asked.search())
    log = retrievals.retrieval_log_record(
        project=project, query=asked.q, scope=asked.scope, k=asked.k, ranked=ranked
    )
    return model_response(
        MemorySearch(
            retrieval_id=log.pk,
            query=asked.q,
            scope=asked.scope,
            k=asked.k,
            results=[SearchResult.model_validate(r.to_dict()) for r in ranked],
        )
    )


FEEDBACK = Operation(
    method="POST",
    summary="Say whether a retrieved memory was useful",
    tag=TAG,
    body=MemoryFeedback,
    responses={
        201: Reply("stored", FeedbackStored),
        404: Reply(
            "no such memory (or search) in this project, or a memory the search did not return"
        ),
        422: Reply("memory_id, useful or retrieval_id invalid"),
    },
)


@endpoint(FEEDBACK)
def feedback(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/memory/feedback {"memory_id", "useful", "retrieval_id"?}: 201."""
    project = cast(ApiRequest, request).project
    body = json_object(request, limit=MAX_BODY_BYTES, example=MemoryFeedback.example())
    given = parse(MemoryFeedback, body)
    try:
        stored = retrievals.memory_feedback_add(project=project, feedback=given.feedback())
    except cleaners.NotFound as exc:
        raise ApiError(404, exc.field, exc.message) from None
    return model_response(
        FeedbackStored(
            id=stored.pk,
            memory_id=stored.memory_id,
            retrieval_id=stored.retrieval_id,
            useful=stored.useful,
            created_at=stored.created_at.isoformat(),
        ),
        status=201,
    )
