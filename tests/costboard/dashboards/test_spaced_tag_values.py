"""A tag value sent with spaces around it is stored trimmed, as every text of an event
(docs/api.md, "Tags"), and `/sessions/?tag=key=value` trims the key and the value it is
given the same way (docs/pages.md, "Parameters"): the value as the agent sent it, `" prod "`,
and as it is stored, `"prod"`, both list that session; a space inside a value is kept and
matched as it is. `?tag=env= prod` listed nothing: only the whole parameter's ends were
trimmed, so the value kept its leading space, which no stored value has."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from django.test import Client

from costboard.models import Session
from tests.conftest import Agent, add_price

pytestmark = pytest.mark.django_db

SENT = {"lead": " prod ", "inner": "pr od", "other": "staging"}
STORED = {"lead": "prod", "inner": "pr od", "other": "staging"}


@pytest.fixture
def spaced(agent: Agent) -> Agent:
    add_price("test-sonnet")
    for session_id, value in SENT.items():
        agent.events(
            {"type": "session", "session_id": session_id, "tags": {"env": value}},
            {"session_id": session_id, "step_type": "x", "model": "test-sonnet"}
            | {"input_tokens": 1000},
        )
    return agent


def listed(staff: Client, tag: str) -> list[str]:
    return listed_at(staff, "/sessions/?" + urlencode({"tag": tag}))


def listed_at(staff: Client, url: str) -> list[str]:
    response = staff.get(f"{url}&since=")
    assert response.status_code == 200, response.content.decode()
    return re.findall(r'<tr data-session="([^"]+)">', response.content.decode())


def test_ingest_stores_a_tag_value_trimmed(spaced: Agent) -> None:
    stored = dict(Session.objects.values_list("external_id", "tags"))
    assert stored == {session_id: {"env": value} for session_id, value in STORED.items()}


@pytest.mark.parametrize(
    ("tag", "found"),
    [
        ("env= prod ", ["lead"]),  # as the agent sent it
        ("env=prod", ["lead"]),  # as it is stored
        (" env =  prod  ", ["lead"]),
        ("env=pr od", ["inner"]),
        ("env=prod d", []),
        ("env=pr  od", []),  # a space inside is matched as it is, not collapsed
    ],
)
def test_the_sessions_tag_filter_matches_what_ingest_stored(
    staff: Client, spaced: Agent, tag: str, found: list[str]
) -> None:
    assert listed(staff, tag) == found


def test_the_steps_breakdowns_links_list_the_sessions_of_each_value(
    staff: Client, spaced: Agent
) -> None:
    html = staff.get("/steps/", {"tag_key": "env"}).content.decode()
    links = re.findall(r'<a href="(/sessions/\?tag=env[^"]*)"', html)
    assert sorted(links) == [
        "/sessions/?tag=env%3Dpr+od",
        "/sessions/?tag=env%3Dprod",
        "/sessions/?tag=env%3Dstaging",
    ]
    by_link = {link: listed_at(staff, link) for link in links}
    assert by_link == {
        "/sessions/?tag=env%3Dpr+od": ["inner"],
        "/sessions/?tag=env%3Dprod": ["lead"],
        "/sessions/?tag=env%3Dstaging": ["other"],
    }
