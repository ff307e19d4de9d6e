"""What the API answers outside its endpoints' own refusals (costboard/api/failures.py): an
unknown path is a JSON 404, an unhandled exception a JSON 500, and a database outage a 503 with
Retry-After, found for real by pointing the connection at a port nothing listens on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tests.conftest import Agent


def json_errors(response: Any, status: int) -> list[dict[str, Any]]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    return response.json()["errors"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/events/", "/api/v2/events", "/v1/logs"])
def test_an_unknown_api_path_is_a_json_404_naming_the_path(agent: Agent, path: str) -> None:
    (error,) = json_errors(agent.client.get(path), 404)
    assert error["field"] == "path"
    assert "/api/v1/docs" in error["message"]


@pytest.mark.django_db
def test_an_unknown_page_is_still_an_html_404(client: Client) -> None:
    response = client.get("/nope/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert b"<code>/nope/</code>" in response.content


@pytest.mark.django_db
def test_an_unknown_page_has_the_sites_header_and_a_way_back(admin_client: Client) -> None:
    response = admin_client.get("/sessions/999999/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'class="topbar"' in page and 'id="project-switcher"' in page
    assert 'href="/">Go to the overview</a>' in page


@pytest.mark.django_db
def test_an_unhandled_exception_under_the_api_is_a_json_500(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent.events({"session_id": "s1", "step_type": "x", "model": "m"})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("costboard.api.events.session_budget", broken)
    client = Client(raise_request_exception=False)
    response = client.get(
        "/api/v1/sessions/s1/budget", headers={"Authorization": f"Bearer {agent.key}"}
    )
    (error,) = json_errors(response, 500)
    assert "retry later" in error["message"]
    assert "a bug" not in error["message"]  # the log has it, not the client


def closed_port() -> int:
    """A port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def database_down(django_db_blocker: Any) -> Iterator[None]:
    """The default connection pointed at a closed port, as in an outage; restored after."""
    saved = dict(connection.settings_dict)
    if saved["ENGINE"] == "django.db.backends.sqlite3":
        pytest.skip("an outage needs a database server: run with DATABASE_URL=postgres://…")
    with django_db_blocker.unblock():
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(closed_port()))
        try:
            yield
        finally:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/events", b'{"step_type": "x", "model": "m"}'),
        ("get", "/api/v1/sessions/s1/budget", b""),
        ("post", "/api/v1/memory/candidates", b'{"content": "Use ruff", "type": "user"}'),
        ("post", "/v1/traces", b"{}"),
    ],
)
def test_a_database_outage_is_a_json_503_with_retry_after(
    database_down: None, method: str, path: str, body: bytes
) -> None:
    client = Client(raise_request_exception=False)
    headers = {"Authorization": "Bearer cb_any"}
    if method == "post":
        response = client.post(path, body, content_type="application/json", headers=headers)
    else:
        response = client.get(path, headers=headers)
    (error,) = json_errors(response, 503)
    assert error["field"] == "database"
    assert "retry in 5 seconds" in error["message"]
    assert response["Retry-After"] == "5"


def test_a_database_outage_is_a_503_page_for_pages(database_down: None) -> None:
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "a" * 32  # a login's cookie: the page reads its session
    response = client.get("/sessions/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"database" in response.content
