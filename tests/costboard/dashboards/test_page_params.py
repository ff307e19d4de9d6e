"""Every query parameter a page reads is checked (docs/pages.md, "Parameters"): a value it
cannot use answers 422 with the page's filter errors naming the parameter and what it
accepts, the parameter left out; htmx gets the fragment with the errors; every good value is
a 200. And /steps/'s charts and tag breakdown show the steps its table shows."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from costboard.models import Step
from tests.conftest import Agent, add_price
from tests.costboard.dashboards.test_dashboards import figures, traffic

pytestmark = pytest.mark.django_db

SESSION_SORTS = ["last_active", "started", "cost", "tokens", "turns", "steps", "session"]
STATES = ["ok", "warning", "exhausted", "runaway", "flagged", "stopped"]
USER_SORTS = ["user", "cost", "tokens", "sessions", "steps"]
KINDS = ["runaway", "exhausted", "warning"]
MEMORY_TYPES = ["user", "feedback", "project", "reference"]
FAMILIES = ["test-haiku", "test-sonnet"]
STEP_TYPES = ["intent", "response", "search"]
TAG = ["key=value", "feature=search"]
MEMORY_SCOPE = ["project", "user:&lt;id&gt;"]


def errors(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-error="(\w+)"><strong>\w+:</strong> ([^<]+)</p>', html))


@pytest.fixture
def data(agent: Agent, priced: None) -> Agent:
    """Three sessions of two turns (intent on test-haiku, response on test-sonnet) and one of
    two turns of a `search` step on test-haiku, tagged team=a."""
    add_price("test-haiku", input_mtok=Decimal(1), output_mtok=Decimal(5))
    traffic(agent)
    agent.events(
        {"type": "session", "session_id": "searcher", "tags": {"team": "a"}},
        *(
            {
                "session_id": "searcher",
                "turn": t,
                "step_type": "search",
                "model": "test-haiku",
                "input_tokens": 40_000 * t,
                "duration_ms": 50,
            }
            for t in (1, 2)
        ),
    )
    return agent


# (path, query, the parameter named, what its message lists)
BAD: list[tuple[str, dict[str, str], str, list[str]]] = [
    ("/", {"tag_key": "zzz"}, "tag_key", ["team"]),
    ("/sessions/", {"state": "bogus"}, "state", STATES),
    ("/sessions/", {"sort": "bogus"}, "sort", SESSION_SORTS),
    ("/sessions/", {"sort": "--cost"}, "sort", SESSION_SORTS),
    ("/sessions/", {"page": "abc"}, "page", ["page 1 only"]),
    ("/sessions/", {"page": "0"}, "page", ["page 1 only"]),
    ("/sessions/", {"page": "-1"}, "page", ["page 1 only"]),
    ("/sessions/", {"page": "2"}, "page", ["page 1 only"]),
    ("/sessions/", {"page": "9" * 30}, "page", ["page 1 only"]),
    ("/sessions/", {"tag": "novalue"}, "tag", TAG),
    ("/sessions/", {"tag": "Upper=x"}, "tag", TAG),
    ("/sessions/", {"live": "yes"}, "live", ["1 to refresh"]),
    ("/sessions/", {"model": "zzz"}, "model", FAMILIES),
    ("/sessions/", {"exact": "zzz"}, "exact", FAMILIES),
    ("/sessions/", {"since": "soon"}, "since", ["YYYY-MM-DD"]),
    ("/sessions/export.csv", {"state": "bogus"}, "state", STATES),
    ("/sessions/export.csv", {"sort": "bogus"}, "sort", SESSION_SORTS),
    ("/sessions/export.csv", {"tag": "novalue"}, "tag", TAG),
    ("/sessions/export.csv", {"model": "zzz"}, "model", FAMILIES),
    ("/sessions/export.csv", {"until": "2026-02-30"}, "until", ["YYYY-MM-DD"]),
    ("/steps/", {"step_type": "zzz"}, "step_type", STEP_TYPES),
    ("/steps/", {"model": "zzz"}, "model", FAMILIES),
    ("/steps/", {"exact": "zzz"}, "exact", FAMILIES),
    ("/steps/", {"tag_key": "zzz"}, "tag_key", ["team"]),
    ("/steps/", {"tier": "flex tier"}, "tier", ["standard, flex, priority, batch"]),
    ("/steps/", {"tier": "x" * 33}, "tier", ["at most 32 characters"]),
    ("/steps/", {"by_tier": "yes"}, "by_tier", ["1 to split the rows by service tier"]),
    ("/users/", {"sort": "bogus"}, "sort", USER_SORTS),
    ("/users/export.csv", {"sort": "bogus"}, "sort", USER_SORTS),
    ("/users/export.csv", {"since": "x"}, "since", ["YYYY-MM-DD"]),
    ("/reconciliation/", {"day": "soon"}, "day", ["YYYY-MM-DD"]),
    ("/reconciliation/", {"provider": "zzz"}, "provider", ["every provider"]),
    ("/flagged/", {"kind": "zzz"}, "kind", KINDS),
    ("/flagged/", {"acknowledged": "yes"}, "acknowledged", ["1 to show acknowledged"]),
    ("/flagged/", {"page": "abc"}, "page", ["page 1 only"]),
    ("/flagged/", {"page": "3"}, "page", ["page 1 only"]),
    ("/memory/review/", {"type": "zzz"}, "type", MEMORY_TYPES),
    ("/memory/review/", {"scope": "team:x"}, "scope", MEMORY_SCOPE),
    ("/memory/review/", {"page": "abc"}, "page", ["page 1 only"]),
    ("/memory/review/", {"page": "5"}, "page", ["page 1 only"]),
    ("/memory/", {"type": "zzz"}, "type", MEMORY_TYPES),
    ("/memory/", {"scope": "everyone"}, "scope", MEMORY_SCOPE),
    ("/memory/", {"page": "abc"}, "page", ["page 1 only"]),
    ("/memory/", {"page": "7"}, "page", ["page 1 only"]),
]


@pytest.mark.parametrize(
    ("path", "query", "name", "accepted"),
    BAD,
    ids=[f"{path} {'&'.join(f'{k}={v[:12]}' for k, v in q.items())}" for path, q, _, _ in BAD],
)
def test_a_bad_parameter_is_named_with_what_it_accepts(
    staff: Client, data: Agent, path: str, query: dict[str, str], name: str, accepted: list[str]
) -> None:
    response = staff.get(path, query)
    assert response.status_code == 422
    html = response.content.decode()
    found = errors(html)
    assert list(found) == [name]
    for value in accepted:
        assert value in found[name]
    if path.endswith(".csv"):  # no file: the list's link with the filters, to fix them there
        assert response["Content-Type"].startswith("text/html")
        assert "Fix it to download the file." in html
        assert re.search(r'href="/(sessions|users)/\?[^"]*" data-without', html)
    else:
        assert "This filter is left out until it is fixed." in html
    if name in ("state", "tag", "step_type", "tier", "since", "until") and not path.endswith(
        ".csv"
    ):
        # the form's own field is marked, pointing at its error
        assert f'aria-invalid="true" aria-describedby="error-{name}"' in html


# (path, query, the fragment htmx asks for)
HTMX_BAD = [
    ("/sessions/", {"state": "bogus"}, '<div id="table"'),
    ("/sessions/", {"page": "abc"}, '<div id="table"'),
    ("/steps/", {"step_type": "zzz"}, '<div id="results"'),
    ("/flagged/", {"kind": "zzz"}, '<div id="flagged-list"'),
    ("/memory/review/", {"type": "zzz"}, '<div id="queue"'),
    ("/memory/", {"scope": "everyone"}, '<div id="browser"'),
]


@pytest.mark.parametrize(("path", "query", "fragment"), HTMX_BAD)
def test_htmx_gets_the_fragment_with_the_errors(
    staff: Client, data: Agent, path: str, query: dict[str, str], fragment: str
) -> None:
    response = staff.get(path, query, headers={"HX-Request": "true"})
    assert response.status_code == 422
    html = response.content.decode()
    assert html.lstrip().startswith(fragment) and "<html" not in html
    [name] = query
    assert list(errors(html)) == [name]


GOOD: list[tuple[str, dict[str, str]]] = [
    ("/", {}),
    ("/", {"tag_key": "team"}),
    *(("/sessions/", {"state": state}) for state in STATES),
    *(("/sessions/", {"sort": sort}) for sort in SESSION_SORTS),
    *(("/sessions/", {"sort": f"-{sort}"}) for sort in SESSION_SORTS),
    ("/sessions/", {"page": "1", "tag": "team=a", "live": "1"}),
    ("/sessions/", {"live": "0", "user": "anything", "q": "any text", "state": ""}),
    ("/sessions/", {"model": "test-haiku", "exact": "test-haiku"}),
    ("/sessions/", {"since": "", "until": ""}),
    ("/sessions/export.csv", {"state": "flagged", "sort": "-cost", "tag": "team=a"}),
    *(("/steps/", {"step_type": step_type}) for step_type in STEP_TYPES),
    ("/steps/", {"model": "test-sonnet", "tag_key": "team"}),
    *(("/users/", {"sort": sort}) for sort in USER_SORTS),
    ("/users/export.csv", {"sort": "-sessions"}),
    *(("/flagged/", {"kind": kind}) for kind in KINDS),
    ("/flagged/", {"acknowledged": "1", "page": "1"}),
    ("/flagged/", {"acknowledged": "0"}),
    *(("/memory/review/", {"type": type}) for type in MEMORY_TYPES),
    ("/memory/review/", {"scope": "user:ann", "page": "1"}),
    ("/memory/", {"type": "user", "scope": "project", "page": "1"}),
    ("/memory/", {"q": "words", "page": "1"}),
    ("/memory/metrics/", {}),
    ("/budgets/", {}),
]


@pytest.mark.parametrize(
    ("path", "query"),
    GOOD,
    ids=[f"{path} {'&'.join(f'{k}={v}' for k, v in q.items())}" for path, q in GOOD],
)
def test_every_good_value_is_a_200(
    staff: Client, data: Agent, path: str, query: dict[str, str]
) -> None:
    response = staff.get(path, query)
    assert response.status_code == 200
    if not path.endswith(".csv"):
        assert errors(response.content.decode()) == {}


def sessions_shown(response: Any) -> list[str]:
    return re.findall(r'<tr data-session="([^"]+)"', response.content.decode())


def test_a_bad_parameter_is_left_out(staff: Client, data: Agent) -> None:
    everything = sessions_shown(staff.get("/sessions/"))
    assert len(everything) == 4
    for query in ({"state": "bogus"}, {"page": "2"}, {"tag": "team"}, {"sort": "cost!"}):
        assert sessions_shown(staff.get("/sessions/", query)) == everything, query
    # and a good one next to it still filters
    assert sessions_shown(staff.get("/sessions/", {"state": "bogus", "tag": "team=a"})) == [
        "searcher"
    ]


def test_a_page_past_the_last_names_the_pages_there_are(
    staff: Client, data: Agent, monkeypatch: Any
) -> None:
    from costboard.dashboards.views import sessions as views

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    assert sessions_shown(staff.get("/sessions/", {"page": "2"}))  # 4 sessions: two pages
    response = staff.get("/sessions/", {"page": "3"})
    assert response.status_code == 422
    assert errors(response.content.decode()) == {
        "page": "“3” is not a page of this list: it has pages 1–2. "
        "This filter is left out until it is fixed."
    }
    assert sessions_shown(response) == sessions_shown(staff.get("/sessions/"))


# A start after today without an end: the end the page takes is today, so the period would
# run backwards and show nothing under a 200 ("Dec 5 – Nov 29 · $0.00 in all"), an empty
# file for the CSV; GET /api/v1/spend refuses since after until the same way.
@pytest.mark.parametrize("path", ["/users/", "/users/export.csv", "/steps/", "/reconciliation/"])
def test_a_start_after_today_without_an_end_is_named(staff: Client, data: Agent, path: str) -> None:
    response = staff.get(path, {"since": "2999-12-31"})
    assert response.status_code == 422
    found = errors(response.content.decode())
    assert list(found) == ["since"]
    assert found["since"].startswith("2999-12-31 is after today, ")
    # with an end on or after it, the same start is a period (of no spend yet)
    assert staff.get(path, {"since": "2999-12-31", "until": "2999-12-31"}).status_code == 200


# --- /steps/: one filter for the table, the charts and the tags ---------------------------


def table(html: str) -> dict[tuple[str, str], tuple[int, str]]:
    """/steps/'s table: (step type, family) → (calls, cost)."""
    body = html.split('id="step-table"')[1].split("</table>")[0]
    rows = re.findall(
        r'<tr data-family="([^"]+)"><td>([^<]+)</td>.*?<td class="num">([\d,]+)</td>'
        r'.*?<td class="num">(\$[^<]+)</td><td class="num">',
        body,
        re.S,
    )
    return {
        (step_type, family): (int(calls.replace(",", "")), cost)
        for family, step_type, calls, cost in rows
    }


def histogram(response: Any) -> dict[str, int]:
    bars = figures(response)["turn_costs"]["data"][0]
    return {label: count for label, count in zip(bars["y"], bars["x"], strict=True) if count}


def latency_types(response: Any) -> list[str]:
    return sorted(figures(response)["latency"]["data"][0]["x"])


def test_the_charts_show_the_steps_the_table_shows(staff: Client, data: Agent) -> None:
    whole = staff.get("/steps/")
    assert sum(histogram(whole).values()) == 8  # every turn
    assert latency_types(whole) == STEP_TYPES

    # one step type: its two turns, each by what its search step cost
    response = staff.get("/steps/", {"step_type": "search"})
    assert response.status_code == 200
    rows = table(response.content.decode())
    assert list(rows) == [("search", "test-haiku")]
    assert sum(histogram(response).values()) == rows["search", "test-haiku"][0] == 2
    costs = sorted(s.cost_usd for s in Step.objects.filter(step_type="search"))
    assert costs == [Decimal("0.04"), Decimal("0.08")]  # 40,000 and 80,000 tokens at $1/M
    assert histogram(response) == {"$0.03–$0.10": 2}
    assert latency_types(response) == ["search"]

    # one model: the turns that called it, each by its calls of it; latency of its steps only
    response = staff.get("/steps/", {"model": "test-haiku"})
    rows = table(response.content.decode())
    assert {family for _, family in rows} == {"test-haiku"}
    assert sum(histogram(response).values()) == sum(calls for calls, _ in rows.values()) == 8
    haiku_turns = Step.objects.filter(model="test-haiku").values("turn_id").distinct().count()
    assert haiku_turns == 8
    assert latency_types(response) == ["intent", "search"]  # no response: test-sonnet's

    # one model and one type, as htmx swaps the results
    response = staff.get(
        "/steps/", {"model": "test-sonnet", "step_type": "response"}, headers={"HX-Request": "true"}
    )
    rows = table(response.content.decode())
    assert list(rows) == [("response", "test-sonnet")]
    assert sum(histogram(response).values()) == rows["response", "test-sonnet"][0] == 6
    assert latency_types(response) == ["response"]


def tag_rows(html: str) -> dict[str, str]:
    body = html.split('id="tag-table"')[1].split("</table>")[0]
    found = re.findall(
        r'<tr data-tag-(?:value="([^"]+)"|untagged)>.*?data-tag-cost>([^<]+)<', body, re.S
    )
    return {value or "untagged": cost for value, cost in found}


def test_the_tag_breakdown_is_of_the_steps_the_filter_keeps(staff: Client, data: Agent) -> None:
    whole = tag_rows(staff.get("/steps/", {"tag_key": "team"}).content.decode())
    assert set(whole) == {"a", "untagged"}
    assert whole["a"] == "$0.12"  # the two search steps
    sonnet = staff.get("/steps/", {"tag_key": "team", "model": "test-sonnet"}).content.decode()
    assert set(tag_rows(sonnet)) == {"untagged"}  # the searcher called no test-sonnet
    search = staff.get("/steps/", {"tag_key": "team", "step_type": "search"}).content.decode()
    assert tag_rows(search) == {"a": "$0.12"}


def tier_table(html: str) -> dict[tuple[str, str, str], tuple[int, str]]:
    """/steps/'s table split by tier: (step type, family, tier) → (calls, cost)."""
    body = html.split('id="step-table"')[1].split("</table>")[0]
    rows = re.findall(
        r'<tr data-family="([^"]+)"><td>([^<]+)</td>.*?<td data-tier="([^"]*)">.*?'
        r'<td class="num">([\d,]+)</td>.*?<td class="num">(\$[^<]+)</td><td class="num">',
        body,
        re.S,
    )
    return {
        (step_type, family, tier): (int(calls.replace(",", "")), cost)
        for family, step_type, tier, calls, cost in rows
    }


def test_steps_filter_and_group_by_service_tier(staff: Client, data: Agent) -> None:
    add_price("test-haiku", service_tier="batch", input_mtok=Decimal("0.5"))
    data.events(
        *(
            {
                "session_id": "batcher",
                "turn": t,
                "step_type": "search",
                "model": "test-haiku",
                "service_tier": "Batch",
                "input_tokens": 40_000,
            }
            for t in (1, 2, 3)
        )
    )
    assert Step.objects.filter(service_tier="batch").count() == 3
    whole = table(staff.get("/steps/").content.decode())
    assert whole["search", "test-haiku"][0] == 5  # two standard, three batch

    response = staff.get("/steps/", {"tier": "batch"})
    assert response.status_code == 200
    assert table(response.content.decode()) == {("search", "test-haiku"): (3, "$0.06")}
    assert histogram(response) == {"$0.01–$0.03": 3}  # three turns of one $0.02 batch step

    response = staff.get("/steps/", {"by_tier": "1", "step_type": "search"})
    assert response.status_code == 200
    rows = tier_table(response.content.decode())
    assert rows == {
        ("search", "test-haiku", "standard"): (2, "$0.12"),  # 40,000 and 80,000 at $1/M
        ("search", "test-haiku", "batch"): (3, "$0.06"),  # 3 × 40,000 at $0.50/M
    }
    # the tier words the rate table prices are offered; a step's own word is accepted too
    html = staff.get("/steps/", {"tier": "scale"}).content.decode()
    assert '<option value="batch"' in html and '<option value="scale" selected>' in html
