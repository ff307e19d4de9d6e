"""How a body may arrive (costboard/api/boundary.py `body_refusal`, costboard/api/chunked.py):
the Content-Types each endpoint reads (415 otherwise), and chunked bodies, read under gunicorn
(as `make run` serves) and refused with 411 by a server that does not decode them."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from costboard.api.chunked import chunked_bodies
from costboard.models import Step
from memory_ui.models import Memory
from tests.conftest import Agent, make_agent
from tests.servers import free_port, reachable
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
STEP = json.dumps({"session_id": "s1", "step_type": "response", "model": "m", "input_tokens": 3})


def keyed(agent: Agent) -> Client:
    return Client(headers={"Authorization": f"Bearer {agent.key}"})


@pytest.mark.django_db
@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "application/x-www-form-urlencoded"],
)
def test_json_and_curls_default_content_type_are_read_as_json(
    agent: Agent, content_type: str
) -> None:
    response = keyed(agent).post("/api/v1/events", STEP, content_type=content_type)
    assert response.status_code == 200, response.content
    assert Step.objects.count() == 1


@pytest.mark.django_db
def test_a_body_without_a_content_type_is_read_as_json(agent: Agent) -> None:
    response = keyed(agent).generic("POST", "/api/v1/events", STEP, content_type="")
    assert response.status_code == 200, response.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/events", STEP),
        ("/api/v1/memory/candidates", json.dumps({"content": "Use ruff", "type": "user"})),
    ],
)
@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x"])
def test_another_content_type_is_415_naming_the_header_and_nothing_is_stored(
    agent: Agent, path: str, body: str, content_type: str
) -> None:
    response = keyed(agent).post(path, body, content_type=content_type)
    assert response.status_code == 415, response.content
    (error,) = response.json()["errors"]
    assert error["field"] == "Content-Type"
    assert "send the body as Content-Type: application/json" in error["message"]
    assert (Step.objects.count(), Memory.objects.count()) == (0, 0)


@pytest.mark.django_db
def test_otlp_reads_only_protobuf_and_json(agent: Agent) -> None:
    response = keyed(agent).post(
        "/v1/traces", b"{}", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 415
    assert "application/x-protobuf" in response.json()["errors"][0]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/events", "/api/v1/memory/candidates", "/v1/traces"])
def test_a_chunked_body_the_server_did_not_decode_is_411_naming_content_length(
    agent: Agent, path: str
) -> None:
    # as Django's own server passes it on: Transfer-Encoding, no Content-Length
    response = keyed(agent).generic(
        "POST",
        path,
        STEP,
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        CONTENT_LENGTH="",
    )
    assert response.status_code == 411, response.content
    (error,) = response.json()["errors"]
    assert error["field"] == "Content-Length"
    assert "send the body with a Content-Length header" in error["message"]
    assert Step.objects.count() == 0


# --- under a real gunicorn, over a real socket --------------------------------------------------


@pytest.fixture
def gunicorn(transactional_db: None) -> Iterator[int]:
    """`make run`'s server (gunicorn, costboard.wsgi) on the test database; its port."""
    settings = connection.settings_dict
    if settings["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("gunicorn shares the test database only on PostgreSQL")
    user = settings["USER"] or ""
    password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
    host = f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{user}{password}@{host}/{settings['NAME']}",
        "CELERY_BROKER_URL": "",
    }
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("gunicorn")),
            "costboard.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def listening() -> bool:
            if server.poll() is not None:  # it died: say why
                raise RuntimeError(server.stderr.read().decode() if server.stderr else "")
            return reachable(port)

        wait_until(listening, what=f"gunicorn listening on port {port}", timeout=60)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def chunked_post(port: int, path: str, body: bytes, key: str) -> tuple[int, dict[str, Any]]:
    """POST `body` in three chunks, no Content-Length, as a streaming client sends it."""
    third = max(1, len(body) // 3)
    chunks = [body[i : i + third] for i in range(0, len(body), third)]
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + encoded)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(payload)


@pytest.mark.slow
def test_gunicorn_reads_a_chunked_body(gunicorn: int) -> None:
    agent = make_agent("chunky")
    status, answer = chunked_post(gunicorn, "/api/v1/events", STEP.encode(), agent.key)
    assert status == 200, answer
    assert answer["accepted"] == 1
    assert Step.objects.get().input_tokens == 3


@pytest.mark.slow
def test_a_chunked_body_past_the_endpoints_limit_is_413_under_gunicorn(gunicorn: int) -> None:
    agent = make_agent("chunky")
    body = b'{"step_type": "x", "model": "m", "error": "' + b"x" * (5_500_000) + b'"}'
    status, answer = chunked_post(gunicorn, "/api/v1/events", body, agent.key)
    assert status == 413, answer
    (error,) = answer["errors"]
    assert error["field"] == "body"
    assert f"body is {len(body)} bytes" in error["message"]
    assert not Step.objects.exists()


def test_a_chunked_body_is_read_no_further_than_the_limit() -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.update(length=environ.get("CONTENT_LENGTH"), body=environ["wsgi.input"].read())
        return []

    environ = {
        "HTTP_TRANSFER_ENCODING": "chunked",
        "wsgi.input_terminated": True,
        "wsgi.input": io.BytesIO(b"x" * 100),
    }
    chunked_bodies(app, limit=10)(environ, lambda *args: None)
    assert seen == {"length": "11", "body": b"x" * 11}  # past the limit: the endpoint's 413
    untouched = {"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": io.BytesIO(b"{}")}
    chunked_bodies(app, limit=10)(untouched, lambda *args: None)  # not decoded by the server
    assert "CONTENT_LENGTH" not in untouched
