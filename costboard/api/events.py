"""The JSON API of CONTRACT §3: key → project, then one service call per request."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from costboard.api.metrics import ingest_tally
from costboard.api.openapi import openapi_document
from costboard.budgets.caps import session_budget
from costboard.ingest.schemas import MAX_BODY_BYTES, BatchError, parse_events
from costboard.ingest.service import events_ingest
from costboard.models import ApiKey, BudgetEvent, Project, Session

View = Callable[..., HttpResponse]


def _errors(status: int, field: str, message: str) -> JsonResponse:
    return JsonResponse(
        {"errors": [{"index": None, "field": field, "message": message}]}, status=status
    )


def project_for_key(raw_key: str) -> Project | None:
    """The project an active key belongs to (one query), noting its use once a minute."""
    key = (
        ApiKey.objects.select_related("project")
        .filter(key_hash=ApiKey.hash_of(raw_key), revoked_at__isnull=True)
        .first()
    )
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key.project


def bearer_key(request: HttpRequest) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Costboard-Key", "").strip()


def api_key_required(view: View) -> View:
    """Resolve `Authorization: Bearer <key>` to `request.project`, or answer 401."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raw_key = bearer_key(request)
        if not raw_key:
            return _errors(
                401, "Authorization", "missing API key: send Authorization: Bearer <key>"
            )
        project = project_for_key(raw_key)
        if project is None:
            return _errors(
                401,
                "Authorization",
                "unknown or revoked API key: create one with "
                "`python manage.py create_api_key <project>`",
            )
        request.project = project  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapper


@csrf_exempt
@require_POST
@api_key_required
def events(request: HttpRequest) -> HttpResponse:
    project: Project = request.project  # type: ignore[attr-defined]
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        ingest_tally(project.pk, refused=1)  # the body is not read: its events are unknown
        return _errors(413, "body", f"body is {length} bytes; at most {MAX_BODY_BYTES}: split it")
    try:
        batch = parse_events(request.body)
    except BatchError as exc:
        ingest_tally(project.pk, refused=exc.event_count or 1)
        return JsonResponse({"errors": exc.errors}, status=exc.status)
    result = events_ingest(project=project, events=batch)
    ingest_tally(project.pk, accepted=result.accepted, duplicates=result.duplicates)
    return JsonResponse(
        {"accepted": result.accepted, "duplicates": result.duplicates, "sessions": result.sessions}
    )


@require_GET
@api_key_required
def session_budget_view(request: HttpRequest, session_id: str) -> HttpResponse:
    project: Project = request.project  # type: ignore[attr-defined]
    session = Session.objects.filter(project=project, external_id=session_id).first()
    if session is None:
        return _errors(404, "session_id", f"no session {session_id!r} in project {project.slug}")
    body: dict[str, Any] = dict(session_budget(session, project))
    body["events"] = [
        event.to_dict()
        for event in BudgetEvent.objects.filter(session=session).order_by("at", "id")
    ]
    return JsonResponse(body)


@require_GET
def openapi(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_document())
