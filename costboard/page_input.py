"""Page input PostgreSQL cannot hold, refused before a view filters or saves with it.

A NUL (%00) in a page's filter (`/steps/?model=%00`) or the admin's search and list filters
reaches the database as a query parameter, which PostgreSQL refuses: a 500. No filter has a
use for it, so a page request whose query string holds one is a 400 naming the parameter.
Forms need no such help: Django's form fields refuse NUL themselves, with the form shown
again. The admin's action checkboxes (`_selected_action`) carry row ids, integers here;
anything else fails in the admin's own query: a 400 too. An id past the widest primary key
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

from costboard.api.failures import is_api
from costboard.dashboards.row_ids import is_row_id
from costboard.ingest.schemas import text_fault

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def page_input_fault(params: QueryDict) -> tuple[str, str] | None:
    """The first parameter (name or value) with a NUL or an unpaired surrogate, and what is
    wrong with it; None if there is none."""
    for name, values in params.lists():
        for text in (name, *values):
            fault = text_fault(text)
            if fault is not None:
                return name, fault
    return None


class PageInputMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if is_api(request):
            return self.get_response(request)
        found = page_input_fault(request.GET)
        if found is None and request.method == "POST" and request.content_type in FORMS:
            selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
            if not all(value.isascii() and value.isdigit() for value in selected):
                found = (ACTION_CHECKBOX_NAME, "must be row ids: tick the rows' checkboxes")
            elif (kept := [value for value in selected if is_row_id(value)]) != selected:
                posted = request.POST.copy()
                posted.setlist(ACTION_CHECKBOX_NAME, kept)
                # read-only again, as Django gives it
                request.POST = QueryDict(posted.urlencode(), encoding=request.encoding)
        if found is None:
            return self.get_response(request)
        name, fault = found
        shown = name[:100].replace("\x00", "%00").encode("utf-8", "backslashreplace").decode()
        return HttpResponseBadRequest(
            "<!doctype html><title>Bad request</title><h1>Bad request</h1>"
            f"<p>The parameter <code>{escape(shown)}</code> {escape(fault)}.</p>"
            "<p>Go back and try again without it.</p>"
        )
