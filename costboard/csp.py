"""The Content-Security-Policy of every page (docs/operations.md, "Content-Security-Policy").

Scripts and styles come from our own static files only: no inline <script>, no on*= handler,
no <style> element, no eval. The pages keep to it: their scripts are static/costboard/*.js,
htmx is told not to inject its indicator styles (templates/base.html's htmx-config; the
indicator CSS is in app.css), and plotly.js finds the element it would otherwise write its
styles into already there, a stylesheet link marked `no-inline-styles`, and so writes none
(templates/costboard/_charts.html, static/costboard/plotly.css).

The header is django-csp's (settings.CONTENT_SECURITY_POLICY), on every answer a browser
could render as a document; the API's JSON, protobuf, CSV and the metrics' text carry none
(nothing in them runs), which keeps the ingest path's answers as small as they were.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware
from django.http import HttpRequest
from django.http.response import HttpResponseBase

# answers no browser runs anything in: data, not documents
DATA_TYPES = ("application/json", "application/x-protobuf", "text/csv", "text/plain")


class PagePolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, for documents only."""

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        content_type = response.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type in DATA_TYPES:
            return response
        return super().process_response(request, response)
