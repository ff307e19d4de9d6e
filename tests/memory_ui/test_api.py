"""The memory API: candidates in (never approved), MEMORY.md with its headers, ranked search
logged, feedback stored; the key decides the project, every error names its field."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from costboard.models import Session
from memory_ui import memory_file
from memory_ui.models import Memory, MemoryEvent, MemoryFeedback, RetrievalLog
from memory_ui.text import fingerprint
from memory_ui.writes import decisions
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db


def post(agent: Agent, path: str, payload: Any, *, raw: bytes | None = None) -> Any:
    return agent.client.post(
        f"/api/v1/memory/{path}",
        raw if raw is not None else json.dumps(payload),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )


def get(agent: Agent, path: str, **params: Any) -> Any:
    return agent.client.get(
        f"/api/v1/memory/{path}", params, headers={"Authorization": f"Bearer {agent.key}"}
    )


def error(response: Any) -> tuple[int, str, str]:
    (first,) = response.json()["errors"]
    return response.status_code, first["field"], first["message"]


def approved(agent: Agent, content: str, **fields: Any) -> Memory:
    return Memory.objects.create(
        project=agent.project,
        type=fields.pop("type", "project"),
        content=content,
        status="approved",
        decided_at=fields.pop("decided_at", timezone.now()),
        fingerprint=fingerprint(content),
        **fields,
    )


# --- POST /api/v1/memory/candidates -----------------------------------------------------------


def test_a_candidate_is_created_pending_and_never_approved(agent: Agent) -> None:
    response = post(
        agent,
        "candidates",
        {
            "content": "  Always use ruff,  never black ",
            "type": "feedback",
            "importance": 0.7,
            "tags": ["lint"],
            "ttl_days": 90,
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    memory = Memory.objects.get()
    assert body == {
        "id": memory.pk,
        "type": "feedback",
        "content": "Always use ruff, never black",
        "scope": "project",
        "status": "pending",
        "importance": 0.7,
        "source": "agent_inferred",
        "tags": ["lint"],
        "ttl_days": 90,
        "times_proposed": 1,
        "created_at": memory.created_at.isoformat(),
        "merged": False,
        "conflicts_with": [],
    }
    assert (memory.project, memory.status, memory.proposed_by, memory.source) == (
        agent.project,
        "pending",
        "api",
        "agent_inferred",
    )
    assert memory.decided_at is None and memory.expires_at is None


def test_a_candidate_may_name_a_user_scope_and_a_session_of_the_project(agent: Agent) -> None:
    session = Session.objects.create(project=agent.project, external_id="chat-1")
    response = post(
        agent,
        "candidates",
        {
            "content": "Prefers metric units",
            "type": "user",
            "scope": "user:u-7",
            "session_id": "chat-1",
        },
    )
    assert response.status_code == 201, response.content
    memory = Memory.objects.get()
    assert (memory.scope, memory.session) == ("user:u-7", session)


def test_a_user_scope_takes_any_user_id_and_md_and_search_read_it(agent: Agent) -> None:
    scope = "user:auth0|5f1a9c tenant:42/ü"
    response = post(agent, "candidates", {"content": "Prefers metric units", "type": "user",
                                           "scope": scope})  # fmt: skip
    assert response.status_code == 201, response.content
    assert Memory.objects.get().scope == scope
    approved(agent, "Answers in French", scope=scope, type="user")
    assert get(agent, "MEMORY.md", scope=scope).content.decode() == "[user] Answers in French\n"
    assert get(agent, "MEMORY.md").content.decode() == ""
    found = get(agent, "search", q="French", scope=scope).json()
    assert [hit["content"] for hit in found["results"]] == ["Answers in French"]
    for bad in ("user:a\tb", "user:", "user:" + "x" * 129, "user:\ud800"):
        refused = post(agent, "candidates", {"content": "x", "type": "user", "scope": bad})
        assert error(refused)[:2] == (422, "scope"), bad
    assert Memory.objects.count() == 2


def test_an_unknown_session_is_422_on_session_id(agent: Agent) -> None:
    other = make_agent("other")
    Session.objects.create(project=other.project, external_id="theirs")
    response = post(agent, "candidates", {"content": "x", "type": "user", "session_id": "theirs"})
    status, field, message = error(response)
    assert (status, field) == (422, "session_id")
    assert "'theirs'" in message
    assert not Memory.objects.exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"type": "user"}, "content"),
        ({"content": "x" * 151, "type": "user"}, "content"),
        ({"content": "Fine", "type": "preference"}, "type"),
        ({"content": "Fine"}, "type"),
        ({"content": "Fine", "type": "user", "scope": "team:a"}, "scope"),
        ({"content": "Fine", "type": "user", "importance": 2}, "importance"),
        ({"content": "Fine", "type": "user", "tags": "billing"}, "tags"),
        ({"content": "Fine", "type": "user", "ttl_days": 0}, "ttl_days"),
        ({"content": "Fine", "type": "user", "session_id": 12}, "session_id"),
    ],
)
def test_invalid_candidates_are_422_naming_the_field(
    agent: Agent, payload: dict[str, Any], field: str
) -> None:
    status, named, message = error(post(agent, "candidates", payload))
    assert (status, named) == (422, field) and message
    assert not Memory.objects.exists()


def test_malformed_json_is_400_and_a_non_object_422(agent: Agent) -> None:
    assert error(post(agent, "candidates", None, raw=b"{nope"))[:2] == (400, "body")
    assert error(post(agent, "candidates", ["content"]))[:2] == (422, "body")


def test_the_same_sentence_again_answers_200_with_the_memory_merged(agent: Agent) -> None:
    first = post(agent, "candidates", {"content": "Deploys happen on Tuesdays", "type": "project"})
    again = post(agent, "candidates", {"content": "deploys happen on tuesdays!", "type": "project"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert (again.json()["merged"], again.json()["times_proposed"]) == (True, 2)
    assert Memory.objects.count() == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("दिन", "दान"),  # Devanagari: the vowel signs are combining marks, the words differ
        ("नीति बदलो", "नाता बदला"),
        ("🚀🚀🚀", "!!!"),  # no letter or digit in either
        ("✅", "❌"),
    ],
)
def test_sentences_differing_only_in_marks_or_symbols_are_two_candidates(
    agent: Agent, first: str, second: str
) -> None:
    one = post(agent, "candidates", {"content": first, "type": "project"})
    two = post(agent, "candidates", {"content": second, "type": "project"})
    assert (one.status_code, two.status_code) == (201, 201), two.content
    assert two.json()["content"] == second
    assert sorted(Memory.objects.values_list("content", flat=True)) == sorted([first, second])
    again = post(agent, "candidates", {"content": second, "type": "project"})
    assert (again.status_code, again.json()["id"]) == (200, two.json()["id"])


def test_merging_into_an_approved_memory_keeps_it_approved_and_approves_nothing_new(
    agent: Agent,
) -> None:
    memory = approved(agent, "The staging database is on port 5433")
    response = post(
        agent, "candidates", {"content": "The staging database is on port 5433", "type": "project"}
    )
    assert response.status_code == 200
    assert (response.json()["id"], response.json()["status"]) == (memory.pk, "approved")
    assert Memory.objects.count() == 1


def test_a_rejected_sentence_is_409_on_content(agent: Agent) -> None:
    created = post(agent, "candidates", {"content": "Use tabs for indentation", "type": "feedback"})
    reviewer = get_user_model().objects.create_user("rita")
    decisions.memory_reject(Memory.objects.get(pk=created.json()["id"]), by=reviewer)
    status, field, message = error(
        post(agent, "candidates", {"content": "use tabs for indentation", "type": "feedback"})
    )
    assert (status, field) == (409, "content")
    assert "was rejected before" in message
    assert Memory.objects.count() == 1


def test_a_candidates_secrets_are_redacted_before_it_is_stored(agent: Agent) -> None:
    # docs/memory.md, "Redaction": an agent's proposal kept the key as sent, and the review
    # queue, the memory's history and (once approved) MEMORY.md showed it to everyone
    key = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH"
    response = post(
        agent,
        "candidates",
        {
            "content": f"Deploys use the key {key}, ask ann@example.com",
            "type": "project",
            "tags": ["deploy", "ann@example.com"],
        },
    )
    assert response.status_code == 201, response.content
    said = "Deploys use the key [redacted:api_key], ask [redacted:email]"
    assert (response.json()["content"], response.json()["tags"]) == (
        said,
        ["deploy", "[redacted:email]"],
    )
    memory = Memory.objects.get()
    assert (memory.content, memory.tags, memory.redactions) == (
        said,
        ["deploy", "[redacted:email]"],
        ["api_key", "email"],
    )
    stored = json.dumps(list(MemoryEvent.objects.values("before", "after", "note")))
    assert key not in stored and "ann@example.com" not in stored
    assert MemoryEvent.objects.get().note == "redacted: api_key, email"


def test_a_candidate_too_long_once_redacted_is_422_on_content(agent: Agent) -> None:
    # "password: x" grows by 18 characters ("x" becomes "[redacted:password]"): past 150
    content = "a" * 135 + " password: x"
    status, field, message = error(post(agent, "candidates", {"content": content, "type": "user"}))
    assert (status, field) == (422, "content")
    assert message == (
        "is 165 characters once its secrets are redacted (password); at most 150: say it shorter"
    )
    assert not Memory.objects.exists()


def test_the_key_decides_the_project(agent: Agent) -> None:
    other = make_agent("other")
    post(other, "candidates", {"content": "Theirs", "type": "project"})
    post(agent, "candidates", {"content": "Ours", "type": "project"})
    assert dict(Memory.objects.values_list("content", "project__slug")) == {
        "Theirs": "other",
        "Ours": "acme",
    }


def test_a_missing_or_wrong_key_is_401(agent: Agent) -> None:
    response = agent.client.post("/api/v1/memory/candidates", "{}", content_type="application/json")
    assert response.status_code == 401
    response = agent.client.get(
        "/api/v1/memory/MEMORY.md", headers={"Authorization": "Bearer nope"}
    )
    assert response.status_code == 401


# --- GET /api/v1/memory/MEMORY.md -------------------------------------------------------------


def test_memory_md_is_markdown_with_its_counts_in_headers(agent: Agent) -> None:
    approved(agent, "Release freeze starts March 3", importance=Decimal("0.9"))
    approved(agent, "Prefers short answers", type="user")
    approved(agent, "Only in a user scope", scope="user:u-1")
    Memory.objects.create(project=agent.project, type="user", content="Still pending")
    response = get(agent, "MEMORY.md")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    text = response.content.decode()
    assert text == "[project] Release freeze starts March 3\n[user] Prefers short answers\n"
    assert (
        response["X-Memory-Lines"],
        response["X-Memory-Bytes"],
        response["X-Memory-Total"],
        response["X-Memory-Cut"],
    ) == ("2", str(len(text.encode())), "2", "0")
    user = get(agent, "MEMORY.md", scope="user:u-1")
    assert user.content.decode() == "[project] Only in a user scope\n"


def test_memory_md_reports_what_the_cap_cut(agent: Agent, monkeypatch: Any) -> None:
    monkeypatch.setattr(memory_file, "MEMORY_MD_LINES", 2)
    for n in range(5):
        approved(agent, f"fact {n}", importance=Decimal(n) / 10)
    response = get(agent, "MEMORY.md")
    assert response.content.decode() == "[project] fact 4\n[project] fact 3\n"
    assert (response["X-Memory-Lines"], response["X-Memory-Total"], response["X-Memory-Cut"]) == (
        "2",
        "5",
        "3",
    )


def test_memory_md_of_a_bad_scope_is_422(agent: Agent) -> None:
    assert error(get(agent, "MEMORY.md", scope="everyone"))[:2] == (422, "scope")


def test_memory_md_shows_only_the_keys_project(agent: Agent) -> None:
    other = make_agent("other")
    approved(other, "Their secret")
    response = get(agent, "MEMORY.md")
    assert (response.content, response["X-Memory-Total"]) == (b"", "0")


# --- GET /api/v1/memory/search ----------------------------------------------------------------


def test_search_returns_scored_results_with_components_and_logs_them(agent: Agent) -> None:
    ruff = approved(agent, "Always use ruff for linting", source="user_stated")
    approved(agent, "Deploys happen on Tuesdays")
    approved(agent, "ruff in another scope", scope="user:u-1")
    response = get(agent, "search", q="ruff", k=3)
    assert response.status_code == 200, response.content
    body = response.json()
    assert [r["id"] for r in body["results"]] == [ruff.pk]
    (result,) = body["results"]
    assert set(result) == {"id", "type", "content", "score", "components"}
    assert (result["type"], result["content"]) == ("project", "Always use ruff for linting")
    components = result["components"]
    assert set(components) == {"relevance", "importance", "freshness", "credibility"}
    assert components["credibility"] == 1.0 and components["importance"] == 0.5
    assert all(0 <= v <= 1 for v in components.values())
    for value in [result["score"], *components.values()]:
        assert round(value, 4) == value
    log = RetrievalLog.objects.get()
    assert body["retrieval_id"] == log.pk
    assert (log.project, log.query, log.scope, log.k, log.results, log.memory_ids) == (
        agent.project,
        "ruff",
        "project",
        3,
        1,
        [ruff.pk],
    )


def test_search_in_a_user_scope_and_with_no_result(agent: Agent) -> None:
    mine = approved(agent, "Prefers metric units", scope="user:u-1", type="user")
    body = get(agent, "search", q="metric units", scope="user:u-1").json()
    assert [r["id"] for r in body["results"]] == [mine.pk]
    empty = get(agent, "search", q="kubernetes").json()
    assert (
        empty["results"] == [] and RetrievalLog.objects.get(pk=empty["retrieval_id"]).results == 0
    )


def test_search_sees_only_the_keys_project(agent: Agent) -> None:
    other = make_agent("other")
    approved(other, "Always use ruff")
    assert get(agent, "search", q="ruff").json()["results"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "q"),
        ({"q": "   "}, "q"),
        ({"q": "x" * 501}, "q"),
        ({"q": "ruff", "k": "0"}, "k"),
        ({"q": "ruff", "k": "51"}, "k"),
        ({"q": "ruff", "k": "five"}, "k"),
        ({"q": "ruff", "scope": "team:a"}, "scope"),
    ],
)
def test_bad_search_parameters_are_422_naming_them(
    agent: Agent, params: dict[str, str], field: str
) -> None:
    assert error(get(agent, "search", **params))[:2] == (422, field)
    assert not RetrievalLog.objects.exists()


def test_k_caps_the_results(agent: Agent) -> None:
    for n in range(4):
        approved(agent, f"ruff rule {n}")
    assert len(get(agent, "search", q="ruff", k=2).json()["results"]) == 2
    assert len(get(agent, "search", q="ruff", k=50).json()["results"]) == 4


# --- POST /api/v1/memory/feedback -------------------------------------------------------------


def test_feedback_is_stored(agent: Agent) -> None:
    memory = approved(agent, "Always use ruff")
    retrieval_id = get(agent, "search", q="ruff").json()["retrieval_id"]
    response = post(
        agent, "feedback", {"memory_id": memory.pk, "useful": True, "retrieval_id": retrieval_id}
    )
    assert response.status_code == 201, response.content
    stored = MemoryFeedback.objects.get()
    assert (stored.project, stored.memory, stored.retrieval_id, stored.useful) == (
        agent.project,
        memory,
        retrieval_id,
        True,
    )
    assert response.json()["id"] == stored.pk
    no_search = post(agent, "feedback", {"memory_id": memory.pk, "useful": False})
    assert no_search.status_code == 201
    assert MemoryFeedback.objects.filter(useful=False, retrieval=None).count() == 1


def test_feedback_on_another_projects_memory_or_search_is_404(agent: Agent) -> None:
    other = make_agent("other")
    theirs = approved(other, "Their memory")
    their_search = get(other, "search", q="memory").json()["retrieval_id"]
    assert error(post(agent, "feedback", {"memory_id": theirs.pk, "useful": True}))[:2] == (
        404,
        "memory_id",
    )
    mine = approved(agent, "My memory")
    response = post(
        agent, "feedback", {"memory_id": mine.pk, "useful": True, "retrieval_id": their_search}
    )
    assert error(response)[:2] == (404, "retrieval_id")
    assert not MemoryFeedback.objects.exists()


def test_feedback_on_a_memory_the_search_did_not_return_is_404(agent: Agent) -> None:
    ruff = approved(agent, "Always use ruff")
    other = approved(agent, "Deploys happen on Tuesdays")
    search = get(agent, "search", q="ruff").json()
    assert [r["id"] for r in search["results"]] == [ruff.pk]
    response = post(
        agent,
        "feedback",
        {"memory_id": other.pk, "useful": True, "retrieval_id": search["retrieval_id"]},
    )
    status, field, message = error(response)
    assert (status, field) == (404, "memory_id")
    assert f"search {search['retrieval_id']} did not return memory {other.pk}" in message
    assert not MemoryFeedback.objects.exists()
    returned = post(
        agent,
        "feedback",
        {"memory_id": ruff.pk, "useful": True, "retrieval_id": search["retrieval_id"]},
    )
    assert returned.status_code == 201
    assert MemoryFeedback.objects.get().memory == ruff


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"useful": True}, "memory_id"),
        ({"memory_id": "12", "useful": True}, "memory_id"),
        ({"memory_id": True, "useful": True}, "memory_id"),
        ({"memory_id": 1}, "useful"),
        ({"memory_id": 1, "useful": "yes"}, "useful"),
        ({"memory_id": 1, "useful": True, "retrieval_id": "x"}, "retrieval_id"),
    ],
)
def test_invalid_feedback_is_422_naming_the_field(
    agent: Agent, payload: dict[str, Any], field: str
) -> None:
    assert error(post(agent, "feedback", payload))[:2] == (422, field)


def test_malformed_feedback_json_is_400(agent: Agent) -> None:
    assert error(post(agent, "feedback", None, raw=b"{"))[:2] == (400, "body")


def test_the_openapi_document_describes_the_memory_endpoints(client: Any) -> None:
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert set(paths["/api/v1/memory/candidates"]["post"]["responses"]) >= {
        "201",
        "200",
        "409",
        "422",
    }
    headers = paths["/api/v1/memory/MEMORY.md"]["get"]["responses"]["200"]["headers"]
    assert set(headers) == {"X-Memory-Lines", "X-Memory-Bytes", "X-Memory-Total", "X-Memory-Cut"}
    assert "/api/v1/memory/search" in paths and "/api/v1/memory/feedback" in paths


def test_an_expired_memory_is_not_served(agent: Agent) -> None:
    approved(agent, "Old news about ruff", expires_at=timezone.now() - timedelta(seconds=1))
    assert get(agent, "MEMORY.md").content == b""
    assert get(agent, "search", q="ruff").json()["results"] == []


def test_markdown_in_a_memory_cannot_reach_past_its_own_line(agent: Agent) -> None:
    """docs/memory.md, "MEMORY.md": a code span or HTML left open in one entry would swallow
    the entries after it where MEMORY.md is rendered; what closes on its own line stays."""
    contents = [
        "Wrap code in ``` fences",
        "Close them with ``` too",
        "# Not a heading: a memory",
        "Run `make test` first",
        "Notes start with <!-- and run on",
        "Use <b>bold</b> sparingly",
    ]
    for rank, content in enumerate(contents):
        approved(agent, content, importance=Decimal("0.9") - Decimal(rank) / 10)
    text = get(agent, "MEMORY.md").content.decode()
    assert text.splitlines() == [
        r"[project] Wrap code in \`\`\` fences",
        r"[project] Close them with \`\`\` too",
        "[project] # Not a heading: a memory",
        "[project] Run `make test` first",
        r"[project] Notes start with \<!-- and run on",
        "[project] Use <b>bold</b> sparingly",
    ]
