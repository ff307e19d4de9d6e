"""Page input no page can use, refused before a view filters or saves with it.

A NUL (%00) in a page's filter (`/steps/?model=%00`) or the admin's search and list filters
reaches the database as a query parameter, which PostgreSQL refuses: a 500. No filter has a
use for it, nor for another control character or bytes that are not UTF-8
(costboard/query_text.py), so a page request whose query string holds one is a 422 showing
the pages' own filter errors, naming each parameter, with a link to the page without them.
Forms need no such help: Django's form fields refuse NUL themselves, with the form shown
again. The admin's action checkboxes (`_selected_action`) carry row ids, integers here;
anything else fails in the admin's own query: a 400. An id past the widest primary key
names no row, yet was a 500 (costboard/dashboards/row_ids.py): it is left out of the
selection, so the action acts on the ids that can be rows, in every admin (Django's own
too). The API answers its own 4xx
(costboard/api/boundary.py), so its paths are left alone, and their bodies unread.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.shortcuts import render

from costboard.api.failures import is_api
from costboard.dashboards.row_ids import is_row_id
from costboard.query_text import QueryFaults, query_faults

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


class PageInputMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if is_api(request):
            return self.get_response(request)
        faulty = query_faults(request.META.get("QUERY_STRING", ""))
        if faulty is not None:
            return _refused_query(request, faulty)
        if request.method == "POST" and request.content_type in FORMS:
            selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
            if not all(value.isascii() and value.isdigit() for value in selected):
                return HttpResponseBadRequest(
                    "<!doctype html><title>Bad request</title><h1>Bad request</h1>"
                    f"<p>The parameter <code>{escape(ACTION_CHECKBOX_NAME)}</code> must be row "
                    "ids: tick the rows' checkboxes.</p><p>Go back and try again.</p>"
                )
            if (kept := [value for value in selected if is_row_id(value)]) != selected:
                posted = request.POST.copy()
                posted.setlist(ACTION_CHECKBOX_NAME, kept)
                # read-only again, as Django gives it
                request.POST = QueryDict(posted.urlencode(), encoding=request.encoding)
        return self.get_response(request)


def _refused_query(request: HttpRequest, faulty: QueryFaults) -> HttpResponse:
    """422 with the pages' own filter errors naming each parameter, and a link to the page
    without them (htmx: the errors alone, swapped where the fragment goes)."""
    context = {
        "filter_errors": faulty.faults,
        "without": request.path + (f"?{faulty.rest}" if faulty.rest else ""),
    }
    template = (
        "costboard/_filter_errors.html"
        if request.headers.get("HX-Request")
        else ("costboard/bad_query.html")
    )
    return render(request, template, context, status=422)
