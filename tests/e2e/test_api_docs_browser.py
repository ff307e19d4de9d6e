"""/api/v1/docs in a real Chromium, offline: Swagger UI comes from our static files and draws
the generated document's operations; no request leaves the live server, none is attempted."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from costboard.api.openapi import openapi_document

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_api_docs_render_offline_in_chromium(live_server: Any, page: Any) -> None:
    base = live_server.url
    ours = urlsplit(base).netloc
    asked: list[str] = []
    elsewhere: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        asked.append(url)
        if urlsplit(url).netloc != ours:
            elsewhere.append(url)
            request_route.abort()
        else:
            request_route.continue_()

    page.route("**/*", route)
    page.goto(f"{base}/api/v1/docs")

    events = page.locator(".opblock-summary-path[data-path='/api/v1/events']")
    events.wait_for()
    summary = page.locator(
        ".opblock-post:has([data-path='/api/v1/events']) .opblock-summary-description"
    )
    assert "Report usage" in summary.inner_text()
    # every operation of the document, and no other
    operations = sum(len(methods) for methods in openapi_document()["paths"].values())
    assert operations >= 16
    assert page.locator(".opblock").count() == operations
    # an operation opens on its request body, drawn from the generated schema's example
    events.click()
    body = page.locator(".opblock.is-open .body-param__example")
    body.wait_for()
    assert "claude-sonnet-4-5" in body.inner_text()

    assert f"{base}/api/v1/openapi.json" in asked
    assert any("swagger-ui-bundle" in url for url in asked)
    assert elsewhere == []
    assert page.errors == []
