"""Key roles (docs/api.md, "Keys and roles"): `ingest` (the default) sends usage and reads what an
agent reads; `read` only reads; `admin` does everything. A key whose role may not do a thing gets a
403 naming the role it needs and the command that makes such a key."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from costboard.api.openapi import openapi_document
from costboard.models import ApiKey, Project, Step

pytestmark = pytest.mark.django_db


def key_with(role: str | None) -> str:
    out = io.StringIO()
    args = ["create_api_key", "acme"] + ([] if role is None else ["--role", role])
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip().splitlines()[-1]


def post_step(key: str) -> Any:
    return Client().post(
        "/api/v1/events",
        {"session_id": "s", "step_type": "x", "model": "m"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def get(key: str, path: str) -> Any:
    return Client().get(path, headers={"Authorization": f"Bearer {key}"})


def test_create_api_key_gives_the_role_asked_for() -> None:
    roles = {role: key_with(role) for role in ("ingest", "read", "admin")}
    default = key_with(None)
    stored = {k.key_hash: k.role for k in ApiKey.objects.all()}
    assert {role: stored[ApiKey.hash_of(key)] for role, key in roles.items()} == {
        "ingest": "ingest",
        "read": "read",
        "admin": "admin",
    }
    assert stored[ApiKey.hash_of(default)] == "ingest"
    assert Project.objects.count() == 1
    with pytest.raises(CommandError, match="invalid choice: 'owner'"):
        key_with("owner")


def test_a_read_key_reads_but_may_not_send_usage() -> None:
    ingest, read, admin = key_with("ingest"), key_with("read"), key_with("admin")
    assert post_step(ingest).status_code == 200
    assert post_step(admin).status_code == 200
    refused = post_step(read)
    assert refused.status_code == 403
    [error] = refused.json()["errors"]
    assert error["field"] == "Authorization"
    assert error["message"] == (
        "this key's role is read; POST here needs a key with the ingest or admin role: "
        "`python manage.py create_api_key acme --role admin`"
    )
    assert Step.objects.count() == 2  # the read key's step was not stored
    for key in (ingest, read, admin):
        assert get(key, "/api/v1/sessions/s/budget").status_code == 200
        assert get(key, "/api/v1/memory/MEMORY.md").status_code == 200
    # a revoked admin key is a 401, not a 403
    ApiKey.objects.filter(key_hash=ApiKey.hash_of(admin)).update(
        role="admin", revoked_at="2026-01-01T00:00Z"
    )
    assert post_step(admin).status_code == 401


def test_the_document_lists_the_403_of_keyed_operations() -> None:
    paths = openapi_document()["paths"]
    assert "403" in paths["/api/v1/events"]["post"]["responses"]
    assert "403" in paths["/api/v1/sessions/{session_id}/budget"]["get"]["responses"]
    assert "403" not in paths["/api/v1/openapi.json"]["get"]["responses"]


def test_a_new_keys_secret_is_shown_once_and_never_sent_in_a_cookie(admin_client: Client) -> None:
    """The new key's message waits for the next page on the server (the session), not in
    Django's messages cookie: that cookie is signed, not encrypted, so the key travelled in
    a Set-Cookie header that proxies and the browser's cookie store keep."""
    project = Project.objects.create(name="Acme", slug="acme")
    saved = admin_client.post(
        "/admin/costboard/apikey/add/", {"project": project.pk, "name": "ci", "role": "ingest"}
    )
    assert saved.status_code == 302
    shown = admin_client.get(saved["Location"]).content.decode()
    raw = re.search(r"New key for acme: (\S+) ", shown)
    assert raw is not None and ApiKey.objects.get(name="ci").prefix in raw.group(1)
    assert "messages" not in saved.cookies  # the signed (readable) cookie Django used
    assert all(raw.group(1) not in morsel.value for morsel in saved.cookies.values())
    assert raw.group(1) not in admin_client.get(saved["Location"]).content.decode()  # once


def test_the_admin_makes_a_key_with_a_role(admin_client: Client) -> None:
    project = Project.objects.create(name="Acme", slug="acme")
    response = admin_client.post(
        "/admin/costboard/apikey/add/",
        {"project": project.pk, "name": "exporter", "role": "read"},
        follow=True,
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(name="exporter")
    assert key.role == "read"
    listing = admin_client.get("/admin/costboard/apikey/?role__exact=read").content.decode()
    assert "exporter" in listing
