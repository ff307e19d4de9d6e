"""The memory API of CONTRACT §3: candidates in, MEMORY.md and ranked search out, feedback on
what a search returned. The key decides the project; nothing here approves a memory."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from costboard.api.events import _errors, api_key_required
from costboard.models import Project, Session
from memory_ui import ranking, services
from memory_ui.models import Memory
from memory_ui.services import MemoryInputError

PROPOSED_BY = "api"
MAX_BODY_BYTES = 64 * 1024  # one candidate: a sentence and a few fields


class _BadBody(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json_object(request: HttpRequest, example: str) -> dict[str, Any]:
    try:
        body = json.loads(request.body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadBody(400, f"malformed JSON ({exc}): send a JSON object, e.g. {example}") from None
    if not isinstance(body, dict):
        raise _BadBody(422, f"must be a JSON object, e.g. {example}")
    return body


def memory_to_dict(memory: Memory, *, merged: bool = False) -> dict[str, Any]:
    return {
        "id": memory.pk,
        "type": memory.type,
        "content": memory.content,
        "scope": memory.scope,
        "status": memory.status,
        "importance": float(memory.importance),
        "source": memory.source,
        "tags": list(memory.tags),
        "ttl_days": memory.ttl_days,
        "times_proposed": memory.times_proposed,
        "created_at": memory.created_at.isoformat(),
        "merged": merged,
    }


def _session(project: Project, value: Any) -> Session | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MemoryInputError("session_id", "must be a string: the session_id your events use")
    session = Session.objects.filter(project=project, external_id=value).first()
    if session is None:
        raise MemoryInputError(
            "session_id",
            f"no session {value!r} in project {project.slug}: send its events first, or leave "
            "session_id out",
        )
    return session


@csrf_exempt
@require_POST
@api_key_required
def candidates(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/memory/candidates: a pending candidate (201), or the memory it repeats
    (200, "merged": true)."""
    project: Project = request.project  # type: ignore[attr-defined]
    if len(request.body) > MAX_BODY_BYTES:
        return _errors(413, "body", f"body is over {MAX_BODY_BYTES} bytes: send one candidate")
    try:
        body = _json_object(request, '{"content": "Always use ruff", "type": "feedback"}')
    except _BadBody as exc:
        return _errors(exc.status, "body", str(exc))
    try:
        memory = services.candidate_propose(
            project=project,
            type=body.get("type", ""),  # each field validated by the service
            content=body.get("content", ""),
            scope=body.get("scope", "project"),
            importance=body.get("importance"),
            tags=body.get("tags"),
            ttl_days=body.get("ttl_days"),
            session=_session(project, body.get("session_id")),
            source=Memory.Source.AGENT_INFERRED,
            proposed_by=PROPOSED_BY,
        )
    except MemoryInputError as exc:
        return _errors(422, exc.field, exc.message)
    if memory is None:
        return _errors(
            409,
            "content",
            "this sentence was rejected before by a reviewer in this scope: it is not proposed "
            "again",
        )
    merged = memory.times_proposed > 1
    return JsonResponse(memory_to_dict(memory, merged=merged), status=200 if merged else 201)


@require_GET
@api_key_required
def memory_md(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/memory/MEMORY.md?scope=project: the scope's approved, live entries."""
    project: Project = request.project  # type: ignore[attr-defined]
    try:
        scope = services.clean_scope(request.GET.get("scope"))
    except MemoryInputError as exc:
        return _errors(422, exc.field, exc.message)
    md = services.memory_md(project, scope)
    response = HttpResponse(md.text, content_type="text/markdown; charset=utf-8")
    response["X-Memory-Lines"] = str(md.lines)
    response["X-Memory-Bytes"] = str(md.bytes)
    response["X-Memory-Total"] = str(md.total)
    response["X-Memory-Cut"] = str(md.cut_count)
    return response


@require_GET
@api_key_required
def search(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/memory/search?q=…&scope=…&k=5: ranked live memories, each with the parts
    of its score; logged, and the log's id returned for feedback."""
    project: Project = request.project  # type: ignore[attr-defined]
    try:
        query = ranking.clean_query(request.GET.get("q"))
        scope = services.clean_scope(request.GET.get("scope"))
        k = ranking.clean_k(request.GET.get("k"))
        ranked = ranking.memories_search(project=project, query=query, scope=scope, k=k)
    except MemoryInputError as exc:
        return _errors(422, exc.field, exc.message)
    log = services.retrieval_log_record(
        project=project, query=query, scope=scope, k=k, ranked=ranked
    )
    return JsonResponse(
        {
            "retrieval_id": log.pk,
            "query": query,
            "scope": scope,
            "k": k,
            "results": [r.to_dict() for r in ranked],
        }
    )


@csrf_exempt
@require_POST
@api_key_required
def feedback(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/memory/feedback {"memory_id", "useful", "retrieval_id"?}: 201."""
    project: Project = request.project  # type: ignore[attr-defined]
    if len(request.body) > MAX_BODY_BYTES:
        return _errors(413, "body", f"body is over {MAX_BODY_BYTES} bytes")
    try:
        body = _json_object(request, '{"memory_id": 12, "useful": true, "retrieval_id": 34}')
    except _BadBody as exc:
        return _errors(exc.status, "body", str(exc))
    try:
        stored = services.memory_feedback_add(
            project=project,
            memory_id=body.get("memory_id"),
            useful=body.get("useful"),
            retrieval_id=body.get("retrieval_id"),
        )
    except MemoryInputError as exc:
        return _errors(422, exc.field, exc.message)
    except ranking.NotFound as exc:
        return _errors(404, exc.field, exc.message)
    return JsonResponse(
        {
            "id": stored.pk,
            "memory_id": stored.memory_id,
            "retrieval_id": stored.retrieval_id,
            "useful": stored.useful,
            "created_at": stored.created_at.isoformat(),
        },
        status=201,
    )
