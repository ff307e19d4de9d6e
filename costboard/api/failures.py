"""What the server answers when a request never reaches an endpoint's own refusals: an unknown
path, a request Django refuses itself, an unhandled exception, a database outage.

Under the API's paths (/api/, OTLP's /v1/) every one of them is the API's JSON error body
`{"errors": [{"index", "field", "message"}]}` (docs/api.md, "Errors"); pages keep Django's
HTML pages. A database that cannot be reached is not the server's bug: 503 with Retry-After,
for the API and the pages alike, so clients and load balancers retry rather than give up (the
Prometheus scrape, /metrics, gets it as a one-line text comment, not a page's HTML). A
statement the database refuses is a bug, a 500, though the driver may call it an
OperationalError too (SQLite's "malformed JSON", PostgreSQL's program limits): the driver's
error code tells which.
"""

from __future__ import annotations

import sys

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views import defaults

from costboard.dashboards.scope import Scope, projects_visible
from costboard.ingest.sql import database_outage

API_PREFIXES = ("/api/", "/v1/")
RETRY_AFTER_SECONDS = 5
DATABASE_DOWN = f"the database is unavailable: retry in {RETRY_AFTER_SECONDS} seconds"


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIXES)


def _errors(status: int, field: str | None, message: str) -> JsonResponse:
    return JsonResponse(
        {"errors": [{"index": None, "field": field, "message": message}]}, status=status
    )


def database_unavailable(request: HttpRequest) -> HttpResponse:
    """503 with Retry-After: JSON naming the database under the API, a comment line in the
    exposition format for the scraper of /metrics, a short page elsewhere."""
    response: HttpResponse
    if is_api(request):
        response = _errors(503, "database", DATABASE_DOWN)
    elif request.path_info == reverse("metrics"):
        response = HttpResponse(
            f"# costboard: {DATABASE_DOWN}\n",
            status=503,
            content_type="text/plain; version=0.0.4; charset=utf-8",
        )
    else:
        response = HttpResponse(
            "<!doctype html><title>Costboard is unavailable</title><h1>Service unavailable</h1>"
            "<p>Costboard cannot reach its database. Try again in a few seconds.</p>",
            status=503,
        )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return _errors(400, None, f"bad request: {exception or 'Django refused it'}")
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return _errors(403, None, f"forbidden: {exception or 'this key may not do this'}")
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return _errors(
            404,
            "path",
            f"no endpoint {request.path!r}: the API's paths are listed at /api/v1/docs "
            "(e.g. POST /api/v1/events)",
        )
    return _page_not_found(request, exception)


def _page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The site's own 404 page: its header (nav, project switcher) is the way back."""
    message = exception.args[0] if exception.args and isinstance(exception.args[0], str) else ""
    projects = list(projects_visible(getattr(request, "user", AnonymousUser())))
    slug = request.GET.get("project", "")
    current = next((p for p in projects if p.slug == slug), None)
    context = {
        "request_path": request.path,
        "exception": message,
        "scope": Scope(projects=projects, current=current),
    }
    return render(request, "404.html", context, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django calls this inside its handler of the exception (after logging it), so the
    exception is sys.exc_info()'s: a database outage is a 503, anything else a 500."""
    if database_outage(sys.exc_info()[1]):
        return database_unavailable(request)
    if is_api(request):
        return _errors(
            500,
            None,
            "the server failed on this request (its log has the details): retry later, and "
            "report it if it persists",
        )
    return defaults.server_error(request)
