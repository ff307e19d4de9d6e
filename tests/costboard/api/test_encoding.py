"""Compressed bodies (costboard/api/encoding.py): `Content-Encoding: gzip` on the API's JSON
bodies, limited, validated and keyed as the decompressed body; a gzip bomb refused 413 with
no more than the limit ever decompressed; corrupt gzip 400; other codings 415."""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from typing import Any

import pytest
from django.test import Client

from costboard.api import encoding
from costboard.api.openapi import openapi_document
from costboard.ingest.schemas import MAX_BODY_BYTES
from costboard.models import IdempotentRequest, Step
from memory_ui.models import Memory
from tests.conftest import Agent, make_agent
from tests.costboard.api.test_bodies import gunicorn

__all__ = ["gunicorn"]  # the fixture: `make run`'s server on the test database


def step(n: int, **fields: Any) -> dict[str, Any]:
    return {
        "session_id": "s1",
        "turn": 1,
        "step_type": "response",
        "model": "m",
        "input_tokens": 3,
        "event_id": f"e{n}",
        **fields,
    }


def batch(count: int = 3) -> bytes:
    return json.dumps({"events": [step(n) for n in range(count)]}).encode()


def post(agent: Agent, body: bytes, path: str = "/api/v1/events", **headers: str) -> Any:
    return Client().post(
        path,
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}", **headers},
    )


def error_of(response: Any) -> dict[str, Any]:
    (error,) = response.json()["errors"]
    return error


@pytest.mark.django_db
@pytest.mark.parametrize("coding", ["gzip", "GZIP", "x-gzip", "gzip, identity", "identity, gzip"])
def test_a_gzip_batch_is_stored_as_the_same_batch_sent_plain(agent: Agent, coding: str) -> None:
    response = post(agent, gzip.compress(batch(3)), **{"Content-Encoding": coding})
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == 3
    assert sorted(str(e) for e in Step.objects.values_list("event_id", flat=True)) == [
        "e0",
        "e1",
        "e2",
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("coding", ["", "identity"])
def test_no_coding_or_identity_is_a_plain_body(agent: Agent, coding: str) -> None:
    response = post(agent, batch(1), **{"Content-Encoding": coding})
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_several_gzip_members_one_after_another_are_one_body(agent: Agent) -> None:
    whole = batch(2)
    members = gzip.compress(whole[:10]) + gzip.compress(whole[10:])
    response = post(agent, members, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.content
    assert Step.objects.count() == 2


@pytest.mark.django_db
def test_the_idempotency_key_sees_the_decompressed_body(agent: Agent) -> None:
    body = batch(2)
    first = post(agent, body, **{"Idempotency-Key": "k-1"})
    assert first.status_code == 200, first.content
    # the same batch, gzip, at two levels (two different compressed bodies): a replay each
    for level in (1, 9):
        again = post(
            agent,
            gzip.compress(body, compresslevel=level),
            **{"Idempotency-Key": "k-1", "Content-Encoding": "gzip"},
        )
        assert again.status_code == 200, again.content
        assert again["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
    assert Step.objects.count() == 2
    assert IdempotentRequest.objects.count() == 1
    # another batch under the key, gzip: the key was used with another body
    other = post(
        agent,
        gzip.compress(batch(3)),
        **{"Idempotency-Key": "k-1", "Content-Encoding": "gzip"},
    )
    assert other.status_code == 422
    assert error_of(other)["field"] == "Idempotency-Key"


@pytest.mark.django_db
def test_a_body_over_the_limit_once_decompressed_is_413_naming_the_limit(agent: Agent) -> None:
    # valid JSON of MAX_BODY_BYTES + 1 bytes that compresses to a few kilobytes
    padding = " " * (MAX_BODY_BYTES + 1 - len(batch(1)))
    body = batch(1)[:-1] + padding.encode() + b"}"
    assert len(body) == MAX_BODY_BYTES + 1
    compressed = gzip.compress(body)
    assert len(compressed) < 20_000

    response = post(agent, compressed, **{"Content-Encoding": "gzip"})

    assert response.status_code == 413
    error = error_of(response)
    assert error["field"] == "body"
    assert f"at most {MAX_BODY_BYTES} decompressed" in error["message"]
    assert Step.objects.count() == 0
    # exactly at the limit it is read (and stored)
    exact = body[:-2] + b"}"
    assert post(agent, gzip.compress(exact), **{"Content-Encoding": "gzip"}).status_code == 200


class CountingZlib:
    """zlib as encoding.py uses it, counting every byte its inflaters hand out."""

    MAX_WBITS = zlib.MAX_WBITS
    error = zlib.error

    def __init__(self) -> None:
        self.out = 0

    def decompressobj(self, wbits: int) -> Any:
        real = zlib.decompressobj(wbits)
        counter = self

        class Counted:
            def decompress(self, data: bytes, max_length: int = 0) -> bytes:
                chunk = real.decompress(data, max_length)
                counter.out += len(chunk)
                return chunk

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        return Counted()


def gzip_of_zeros(size: int) -> bytes:
    """`size` zero bytes, gzip, made a mebibyte at a time (never `size` bytes in memory)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(size >> 20)]
    return b"".join(parts) + packer.flush()


@pytest.mark.django_db
def test_a_gzip_bomb_is_413_and_only_the_limit_is_ever_decompressed(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = gzip_of_zeros(1 << 30)  # 1 GiB of zeros
    assert len(bomb) < MAX_BODY_BYTES  # under the limit as sent: only decompressing tells
    counting = CountingZlib()
    monkeypatch.setattr(encoding, "zlib", counting)

    response = post(agent, bomb, **{"Content-Encoding": "gzip"})

    assert response.status_code == 413
    assert f"at most {MAX_BODY_BYTES} decompressed" in error_of(response)["message"]
    assert counting.out == MAX_BODY_BYTES + 1  # the limit and the one byte that passed it
    assert Step.objects.count() == 0


@pytest.mark.django_db
def test_a_compressed_body_over_the_limit_is_413_before_it_is_read(agent: Agent) -> None:
    response = Client().generic(
        "POST",
        "/api/v1/events",
        b"",
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}", "Content-Encoding": "gzip"},
        CONTENT_LENGTH=str(MAX_BODY_BYTES + 1),
    )
    assert response.status_code == 413
    assert error_of(response)["message"].startswith(f"compressed body is {MAX_BODY_BYTES + 1}")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "length",
    ["²", "١٢", pytest.param("9" * 5000, id="5000-digits"), "1.5", "-1", "0x10"],
)
@pytest.mark.parametrize("path", ["/api/v1/events", "/v1/traces"])
def test_a_content_length_that_is_not_digits_0_9_is_400_naming_it(
    agent: Agent, path: str, length: str
) -> None:
    """int() refuses '²' and 5000 digits, which str.isdigit() takes (a 500 before, as Django's
    own reading of the body was): gunicorn refuses them, other WSGI servers pass them on."""
    response = Client().generic(
        "POST",
        path,
        batch(1),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
        CONTENT_LENGTH=length,
    )
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["field"] == "Content-Length"
    assert "not a size in bytes" in error["message"]
    assert "send the body's length in bytes as digits 0-9" in error["message"]
    assert len(error["message"]) < 200  # the 5000 digits are not echoed back
    assert Step.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "told"),
    [
        (batch(1), "the body is not gzip"),  # plain JSON under a gzip header
        # a whole gzip header, then a deflate block of the reserved type
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 20, "the body is not gzip"),
        (gzip.compress(batch(1))[:-12], "ends before its gzip stream does"),  # truncated
        (b"", "ends before its gzip stream does"),
        (gzip.compress(batch(1)) + b"\x00\x00", "the body is not gzip"),  # trailing bytes
    ],
    ids=["plain", "garbage", "truncated", "empty", "trailing"],
)
def test_a_body_that_is_not_the_gzip_it_claims_is_400_naming_content_encoding(
    agent: Agent, body: bytes, told: str
) -> None:
    response = post(agent, body, **{"Content-Encoding": "gzip"})
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["field"] == "Content-Encoding"
    assert told in error["message"]
    assert Step.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("coding", ["br", "deflate", "zstd", "gzip, br", "compress"])
def test_another_coding_is_415_naming_gzip_as_the_one_accepted(agent: Agent, coding: str) -> None:
    response = post(agent, batch(1), **{"Content-Encoding": coding})
    assert response.status_code == 415
    assert response["Accept-Encoding"] == "gzip"
    error = error_of(response)
    assert error["field"] == "Content-Encoding"
    assert "Content-Encoding: gzip" in error["message"]
    assert Step.objects.count() == 0


@pytest.mark.django_db
def test_the_other_json_bodies_may_come_gzip_too(agent: Agent) -> None:
    candidate = json.dumps({"content": "Use ruff for linting", "type": "user"}).encode()
    response = post(
        agent, gzip.compress(candidate), "/api/v1/memory/candidates", **{"Content-Encoding": "gzip"}
    )
    assert response.status_code == 201, response.content
    assert Memory.objects.count() == 1
    refused = post(agent, candidate, "/api/v1/memory/candidates", **{"Content-Encoding": "br"})
    assert refused.status_code == 415


def test_the_openapi_document_names_content_encoding_on_every_body() -> None:
    document = openapi_document()
    for path, method in (("/api/v1/events", "post"), ("/api/v1/memory/candidates", "post")):
        operation = document["paths"][path][method]
        (header,) = [p for p in operation["parameters"] if p["name"] == "Content-Encoding"]
        assert header["in"] == "header"
        assert header["schema"]["examples"] == ["gzip"]
        assert "gzip" in header["description"]
    assert "Content-Encoding: gzip" in document["info"]["description"]


def raw_post(port: int, body: bytes, key: str, *headers: str) -> tuple[int, dict[str, Any]]:
    """POST `body` to /api/v1/events over a socket, chunked, as a streaming gateway sends it."""
    encoded = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = "".join(
        f"{line}\r\n"
        for line in (
            "POST /api/v1/events HTTP/1.1",
            "Host: 127.0.0.1",
            f"Authorization: Bearer {key}",
            "Content-Type: application/json",
            "Transfer-Encoding: chunked",
            "Connection: close",
            *headers,
        )
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + b"\r\n" + encoded)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


@pytest.mark.slow
def test_gunicorn_reads_a_chunked_gzip_batch_and_refuses_a_chunked_bomb(gunicorn: int) -> None:
    agent = make_agent("zipped")
    status, answer = raw_post(
        gunicorn, gzip.compress(batch(3)), agent.key, "Content-Encoding: gzip"
    )
    assert status == 200, answer
    assert answer["accepted"] == 3

    status, answer = raw_post(
        gunicorn, gzip_of_zeros(256 << 20), agent.key, "Content-Encoding: gzip"
    )
    assert status == 413, answer
    assert f"at most {MAX_BODY_BYTES} decompressed" in answer["errors"][0]["message"]
    assert Step.objects.count() == 3
