"""What the API answers outside its endpoints' own refusals (costboard/api/failures.py): an
unknown path is a JSON 404, an unhandled exception a JSON 500, and a database outage a 503 with
Retry-After, found for real by pointing the connection at a port nothing listens on (or, on
SQLite, at a file it cannot open). A statement the database refuses is a 500, not an outage,
though the driver calls it an OperationalError too."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test import Client

from costboard.ingest.sql import database_outage
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
def database_down(django_db_blocker: Any, tmp_path: Path) -> Iterator[None]:
    """The default connection pointed at a closed port (SQLite: at a file in a folder that
    does not exist), as in an outage; restored after."""
    saved = dict(connection.settings_dict)
    if saved["ENGINE"] == "django.db.backends.sqlite3":
        outage = {"NAME": str(tmp_path / "gone" / "db.sqlite3")}
    else:
        outage = {"HOST": "127.0.0.1", "PORT": str(closed_port())}
    with django_db_blocker.unblock():
        connection.close()
        connection.settings_dict.update(outage)
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


def test_a_database_outage_is_a_503_for_the_metrics_scrape(
    database_down: None, settings: Any
) -> None:
    """A scrape fails (Prometheus' `up` is 0) and says to retry, rather than a 500 that reads
    as Costboard's bug (docs/operations.md, "Commands when the database is down"); the body
    is the scraper's text, not the pages' HTML."""
    settings.COSTBOARD_METRICS_TOKEN = "scrape-token-123"
    client = Client(raise_request_exception=False)
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape-token-123"})
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert response.content == (b"# costboard: the database is unavailable: retry in 5 seconds\n")


# A statement each database refuses with an OperationalError that is no outage
REFUSED = {
    "sqlite": "SELECT json_extract('not json', '$')",  # malformed JSON
    "postgresql": "SELECT ARRAY[[[[[[[1]]]]]]]",  # past the array dimensions' limit
}


def refused_statement(*args: Any, **kwargs: Any) -> Any:
    with transaction.atomic(), connection.cursor() as cursor:  # the test's transaction lives on
        cursor.execute(REFUSED[connection.vendor])


@pytest.mark.django_db
def test_a_statement_the_database_refuses_is_an_operational_error_but_no_outage() -> None:
    with pytest.raises(OperationalError) as refused:
        refused_statement()
    assert not database_outage(refused.value)


@pytest.mark.django_db
def test_a_statement_the_database_refuses_on_a_page_is_a_500_not_an_outage(
    staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("costboard.dashboards.views.sessions.sessions_filtered", refused_statement)
    staff.raise_request_exception = False
    response = staff.get("/sessions/")
    assert response.status_code == 500
    assert "Retry-After" not in response
    assert b"cannot reach its database" not in response.content


@pytest.mark.django_db
def test_a_statement_the_database_refuses_under_the_api_is_a_json_500(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent.events({"session_id": "s1", "step_type": "x", "model": "m"})
    monkeypatch.setattr("costboard.api.events.session_budget", refused_statement)
    client = Client(raise_request_exception=False)
    response = client.get(
        "/api/v1/sessions/s1/budget", headers={"Authorization": f"Bearer {agent.key}"}
    )
    (error,) = json_errors(response, 500)
    assert "retry later" in error["message"]
    assert "Retry-After" not in response


def sqlite_failure(path: Path, statement: str, *, hold_lock: bool = False) -> OperationalError:
    """What Django raises for SQLite's own error: its OperationalError, the driver's as cause."""
    with ExitStack() as stack:
        if hold_lock:
            holder = stack.enter_context(closing(sqlite3.connect(path, isolation_level=None)))
            holder.execute("BEGIN EXCLUSIVE")
        try:
            stack.enter_context(closing(sqlite3.connect(path, timeout=0))).execute(statement)
        except sqlite3.OperationalError as cause:
            error = OperationalError(*cause.args)
            error.__cause__ = cause
            return error
    raise AssertionError(f"{statement!r} ran")


def test_sqlite_busy_or_unopenable_is_an_outage_and_a_refused_statement_is_not(
    tmp_path: Path,
) -> None:
    db = tmp_path / "db.sqlite3"
    assert database_outage(sqlite_failure(db, "CREATE TABLE t (x)", hold_lock=True))  # locked
    assert database_outage(sqlite_failure(tmp_path / "gone" / "db.sqlite3", "SELECT 1"))
    assert not database_outage(sqlite_failure(db, "SELECT json_extract('not json', '$')"))
    assert not database_outage(sqlite_failure(db, "SELECT * FROM no_such_table"))
