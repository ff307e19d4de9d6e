"""GET /api/v1/sessions/<id>/context?budget=N: the newest turns that fit, oldest first, counted
with cl100k_base, or as ceil(characters / 4) when the tokenizer cannot be loaded."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tiktoken

from costboard.api.context import MAX_CONTEXT_BUDGET
from costboard.tokenizer import ENCODING, cl100k
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def without_tokenizer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """tiktoken cannot be imported, as when the package is missing: the offline fallback."""
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    cl100k.cache_clear()
    yield
    cl100k.cache_clear()  # loaded again by the next test that counts


@pytest.fixture(params=["cl100k_base", "characters"])
def sized(request: pytest.FixtureRequest) -> Callable[[int], str]:
    """A text of n tokens as the endpoint counts it, with the tokenizer (" hello" is one
    cl100k_base token) and without it (ceil(characters / 4)): loading works the same."""
    if request.param == "characters":
        request.getfixturevalue("without_tokenizer")
        return lambda n: "x" * (4 * n)
    return lambda n: " ".join(["hello"] * n)


def turn(number: int, user: str = "", response: str = "", session: str = "s1") -> dict[str, Any]:
    return {
        "type": "turn",
        "session_id": session,
        "turn": number,
        "user_message": user,
        "assistant_response": response,
    }


def response_step(number: int, **fields: Any) -> dict[str, Any]:
    return {
        "step_type": "response",
        "model": "test-sonnet",
        "session_id": "s1",
        "turn": number,
        "input_tokens": 100,
        **fields,
    }


def context(agent: Agent, budget: object = None, session_id: str = "s1") -> Any:
    query: dict[str, Any] = {} if budget is None else {"budget": budget}
    return agent.client.get(
        f"/api/v1/sessions/{session_id}/context",
        query,
        headers={"Authorization": f"Bearer {agent.key}"},
    )


def loaded(agent: Agent, budget: int, session_id: str = "s1") -> dict[str, Any]:
    response = context(agent, budget, session_id)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


# Five turns of 10, 20, 30, 40 and 60 tokens: 160 in all.
SIZES = [10, 20, 30, 40, 60]


@pytest.fixture
def five_turns(agent: Agent, sized: Callable[[int], str]) -> Agent:
    agent.events(*[turn(n, user=sized(size)) for n, size in enumerate(SIZES, start=1)])
    return agent


def test_a_budget_equal_to_the_newest_turns_loads_exactly_them(five_turns: Agent) -> None:
    body = loaded(five_turns, 100)  # 60 + 40
    assert [t["number"] for t in body["turns"]] == [4, 5]
    assert [t["tokens"] for t in body["turns"]] == [40, 60]
    assert body["token_count"] == 100
    assert body["loaded_turns"] == 2
    assert body["total_turns"] == 5
    assert body["budget"] == 100
    assert body["session_id"] == "s1"


def test_one_token_less_leaves_the_oldest_of_them_out(five_turns: Agent) -> None:
    body = loaded(five_turns, 99)
    assert [t["number"] for t in body["turns"]] == [5]
    assert body["token_count"] == 60
    assert body["loaded_turns"] == 1
    assert body["total_turns"] == 5


def test_a_budget_smaller_than_the_newest_turn_loads_nothing_and_says_summarize(
    five_turns: Agent,
) -> None:
    body = loaded(five_turns, 59)
    assert body["turns"] == []
    assert body["token_count"] == 0
    assert body["loaded_turns"] == 0
    assert body["total_turns"] == 5
    assert body["should_summarize"] is True


def test_loading_stops_at_the_first_turn_that_does_not_fit(
    agent: Agent, sized: Callable[[int], str]
) -> None:
    # The oldest turn would fit in what is left, but the history stays contiguous.
    agent.events(turn(1, user=sized(1)), turn(2, user=sized(10)), turn(3, user=sized(10)))
    body = loaded(agent, 15)
    assert [t["number"] for t in body["turns"]] == [3]
    assert body["token_count"] == 10


def test_turns_come_oldest_first_with_their_text(agent: Agent, without_tokenizer: None) -> None:
    agent.events(
        turn(2, user="second?", response="second."),
        turn(1, user="first?", response="first."),
        turn(7, user="seventh?", response="seventh."),
    )
    body = loaded(agent, 1000)
    assert [t["number"] for t in body["turns"]] == [1, 2, 7]
    first = body["turns"][0]
    assert first["user_message"] == "first?"
    assert first["assistant_response"] == "first."
    assert first["tokens"] == 2 + 2  # each text counted on its own: ceil(6/4) + ceil(6/4)
    assert first["started_at"]


def test_should_summarize_is_past_80_percent_of_the_budget(five_turns: Agent) -> None:
    at_80 = loaded(five_turns, 200)  # all 160 tokens loaded: exactly 80%
    assert at_80["loaded_turns"] == 5
    assert at_80["token_count"] == 160
    assert at_80["should_summarize"] is False
    past_80 = loaded(five_turns, 199)  # 160 > 159.2
    assert past_80["loaded_turns"] == 5
    assert past_80["should_summarize"] is True


def test_should_summarize_when_turns_are_left_out_even_under_80_percent(
    five_turns: Agent,
) -> None:
    body = loaded(five_turns, 129)  # 60 + 40 fit; + 30 would not
    assert body["token_count"] == 100  # under 0.8 × 129 = 103.2
    assert body["loaded_turns"] == 2
    assert body["should_summarize"] is True


def test_a_session_without_turns_loads_nothing_and_needs_no_summary(agent: Agent) -> None:
    agent.events({"type": "session", "session_id": "s1"})
    body = loaded(agent, 10)
    assert body == {
        "session_id": "s1",
        "budget": 10,
        "token_count": 0,
        "total_turns": 0,
        "loaded_turns": 0,
        "should_summarize": False,
        "estimated": False,
        "turns": [],
    }


def test_without_the_tokenizer_characters_are_counted_not_bytes(
    agent: Agent, without_tokenizer: None
) -> None:
    text = "é" * 8 + "😀" * 4 + "你好世界"  # 16 characters, 44 bytes in UTF-8
    agent.events(turn(1, user=text))
    body = loaded(agent, 4)
    assert body["turns"][0]["user_message"] == text
    assert body["turns"][0]["tokens"] == 4
    assert body["turns"][0]["estimated"] is True
    assert body["estimated"] is True
    assert loaded(agent, 3)["loaded_turns"] == 0


def test_without_the_tokenizer_one_successful_response_step_gives_its_stored_usage(
    agent: Agent, without_tokenizer: None
) -> None:
    response = "r" * 40  # estimated: 10
    agent.events(
        turn(1, user="abcd", response=response),
        response_step(1, output_tokens=7, reasoning_tokens=2),
        turn(2, response=response),
        response_step(2, output_tokens=7),
        {**response_step(2, output_tokens=500, step_type="intent")},  # not the response
        {**response_step(2, output_tokens=90, success=False, error="timeout")},  # failed
    )
    first, second = loaded(agent, 1000)["turns"]
    # 1 estimated for the message + 5 stored (output without reasoning) for the response
    assert (first["tokens"], first["estimated"]) == (1 + 5, True)
    assert (second["tokens"], second["estimated"]) == (7, False)


def test_without_the_tokenizer_or_one_usable_response_step_the_response_is_estimated(
    agent: Agent, without_tokenizer: None
) -> None:
    response = "r" * 40  # estimated: 10
    agent.events(
        turn(1, response=response),  # no steps at all
        turn(2, response=response),  # two responses: which one wrote the text is unknown
        response_step(2, output_tokens=7),
        response_step(2, output_tokens=8),
        turn(3, response=response),  # only a failed one
        response_step(3, output_tokens=7, success=False, error="overloaded"),
        turn(4, response=response),  # no usage reported
        response_step(4, output_tokens=0),
    )
    body = loaded(agent, 1000)
    assert [(t["tokens"], t["estimated"]) for t in body["turns"]] == [(10, True)] * 4


def test_empty_text_counts_nothing_whatever_the_steps_say(
    agent: Agent, sized: Callable[[int], str]
) -> None:
    agent.events(turn(1), response_step(1, output_tokens=9))
    body = loaded(agent, 1)
    assert [(t["tokens"], t["estimated"]) for t in body["turns"]] == [(0, False)]
    assert body["should_summarize"] is False
    assert body["estimated"] is False


def test_an_unknown_session_is_404(agent: Agent) -> None:
    response = context(agent, 100, session_id="nope")
    assert response.status_code == 404
    assert response.json()["errors"][0]["field"] == "session_id"


def test_the_key_decides_the_project(agent: Agent) -> None:
    agent.events(turn(1, user="acme's"))
    other = make_agent("other")
    assert context(other, 100).status_code == 404
    other.events(turn(1, user="other's"), turn(2, user="more"))
    assert [t["user_message"] for t in loaded(other, 100)["turns"]] == ["other's", "more"]
    assert [t["user_message"] for t in loaded(agent, 100)["turns"]] == ["acme's"]


def test_a_missing_or_wrong_key_is_401(agent: Agent) -> None:
    agent.events(turn(1, user="hi"))
    assert agent.client.get("/api/v1/sessions/s1/context?budget=5").status_code == 401
    wrong = agent.client.get(
        "/api/v1/sessions/s1/context?budget=5", headers={"Authorization": "Bearer cb_nope"}
    )
    assert wrong.status_code == 401


def test_only_get_is_allowed(agent: Agent) -> None:
    response = agent.client.post(
        "/api/v1/sessions/s1/context?budget=5", headers={"Authorization": f"Bearer {agent.key}"}
    )
    assert response.status_code == 405


@pytest.mark.parametrize(
    ("budget", "fix"),
    [
        (None, "budget is required"),
        ("", "budget is required"),
        ("abc", "whole number"),
        ("1.5", "whole number"),
        ("1e3", "whole number"),
        ("0", "at least 1"),
        ("-3", "at least 1"),
        (str(MAX_CONTEXT_BUDGET + 1), f"at most {MAX_CONTEXT_BUDGET}"),
        ("9" * 5000, f"at most {MAX_CONTEXT_BUDGET}"),
    ],
)
def test_a_bad_budget_is_422_naming_the_field_and_the_fix(
    agent: Agent, budget: str | None, fix: str
) -> None:
    agent.events(turn(1, user="hi"))
    response = context(agent, budget)
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["index"] is None
    assert error["field"] == "budget"
    assert fix in error["message"]


@pytest.mark.parametrize("budget", ["1", str(MAX_CONTEXT_BUDGET), " 42 ", "007"])
def test_budgets_at_the_bounds_are_accepted(agent: Agent, budget: str) -> None:
    agent.events(turn(1, user="hi"))
    response = context(agent, budget)
    assert response.status_code == 200
    assert response.json()["budget"] == int(budget)


def test_queries_stay_few_however_long_the_session(
    agent: Agent, sized: Callable[[int], str], django_assert_max_num_queries: Any
) -> None:
    # 600 turns of 1 token; every tenth also has a response of 3 tokens (and a step saying so)
    events: list[dict[str, Any]] = [
        turn(n, user=sized(1), response="" if n % 10 else sized(3)) for n in range(1, 601)
    ]
    events += [response_step(n, output_tokens=3) for n in range(10, 601, 10)]
    agent.events(*events)
    with django_assert_max_num_queries(5):
        everything = loaded(agent, MAX_CONTEXT_BUDGET)
    assert everything["loaded_turns"] == everything["total_turns"] == 600
    assert everything["token_count"] == 600 + 60 * 3
    with django_assert_max_num_queries(5):
        newest = loaded(agent, 100)
    # read across the first chunk's edge: the newest turns, contiguous, oldest first
    assert [t["number"] for t in newest["turns"]] == list(
        range(525, 601)
    )  # 7 × (9 + 4), then 4 + 5 × 1
    assert newest["token_count"] == 100


def test_the_openapi_document_describes_the_endpoint(client: Any) -> None:
    doc = client.get("/api/v1/openapi.json").json()
    operation = doc["paths"]["/api/v1/sessions/{session_id}/context"]["get"]
    budget = next(p for p in operation["parameters"] if p["name"] == "budget")
    assert budget["schema"]["maximum"] == MAX_CONTEXT_BUDGET
    assert {"200", "404", "422", "401"} <= set(operation["responses"])
    assert "should_summarize" in doc["components"]["schemas"]["SessionContext"]["required"]


# --- counted with cl100k_base -------------------------------------------------------------------

PLAIN_TEXTS = [
    "hello world",
    "Can you summarize the Q3 churn analysis in three bullet points?",
    "Sure — here's the fix:\n\n```python\ndef total(xs: list[int]) -> int:\n"
    "    return sum(xs)\n```",
    "Ça coûte 12,50 € — naïve café, déjà vu.",
    "你好，世界！今天的会议改到下午三点。",
    "Привет! Как дела? 😀👍🏽 مرحبا بالعالم",
    "indented:\n    two  spaces,\ttabs\n\n\nand blank lines",
    "x" * 40,
]


def tiktoken_count(text: str) -> int:
    """tiktoken's own count, straight from its API."""
    return len(tiktoken.get_encoding(ENCODING).encode(text))


def test_the_offline_encoding_is_cl100k_base() -> None:
    encoding = tiktoken.get_encoding(ENCODING)
    # cl100k_base's published ids (tiktoken's own tests) and its vocabulary size
    assert encoding.encode("hello world") == [15339, 1917]
    assert encoding.n_vocab == 100277


def test_turns_are_counted_as_tiktoken_counts_them(agent: Agent) -> None:
    agent.events(
        *[
            turn(n, user=text, response=PLAIN_TEXTS[-n])
            for n, text in enumerate(PLAIN_TEXTS, start=1)
        ]
    )
    body = loaded(agent, MAX_CONTEXT_BUDGET)
    expected = [
        tiktoken_count(text) + tiktoken_count(PLAIN_TEXTS[-n])
        for n, text in enumerate(PLAIN_TEXTS, start=1)
    ]
    assert [t["user_message"] for t in body["turns"]] == PLAIN_TEXTS
    assert [t["tokens"] for t in body["turns"]] == expected
    assert body["token_count"] == sum(expected)
    assert [t["estimated"] for t in body["turns"]] == [False] * len(PLAIN_TEXTS)
    assert body["estimated"] is False


def test_the_budget_is_spent_in_tiktoken_tokens(agent: Agent) -> None:
    newest = "The deploy failed again; the logs say the migration timed out. 😤"
    agent.events(turn(1, user="an older message"), turn(2, user=newest))
    exactly = tiktoken_count(newest)
    assert [t["number"] for t in loaded(agent, exactly)["turns"]] == [2]
    assert loaded(agent, exactly - 1)["turns"] == []


def test_with_the_tokenizer_a_response_step_does_not_replace_the_count(agent: Agent) -> None:
    response = "Here are the three numbers you asked for: 4, 8 and 15."
    agent.events(turn(1, response=response), response_step(1, output_tokens=500))
    (only,) = loaded(agent, 1000)["turns"]
    assert (only["tokens"], only["estimated"]) == (tiktoken_count(response), False)


def test_a_long_turn_is_counted_exactly(agent: Agent) -> None:
    long_text = "Lorem ipsum dolor sit amet, 2024-03-15 — naïve 😀. " * 4_000 + "The end."
    agent.events(turn(1, user=long_text))
    for _ in range(2):  # the second time from the count kept for it
        (only,) = loaded(agent, MAX_CONTEXT_BUDGET)["turns"]
        assert only["tokens"] == tiktoken_count(long_text)


def test_without_the_tokenizer_counts_are_estimates_and_say_so(
    agent: Agent, without_tokenizer: None
) -> None:
    agent.events(turn(1, user="hello world", response="x" * 10))
    body = loaded(agent, 100)
    (only,) = body["turns"]
    assert (only["tokens"], only["estimated"]) == (3 + 3, True)
    assert body["estimated"] is True


def test_estimated_speaks_for_the_turn_that_ended_the_loading_too(
    agent: Agent, without_tokenizer: None
) -> None:
    agent.events(turn(1, user="x" * 400), turn(2))  # the newest is empty: nothing estimated
    body = loaded(agent, 10)
    assert [t["number"] for t in body["turns"]] == [2]
    assert body["estimated"] is True  # turn 1's size was estimated, and it decided the cut
