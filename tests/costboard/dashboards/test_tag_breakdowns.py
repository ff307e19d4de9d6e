"""Tag breakdowns on /steps/ and the overview (from the per-tag rollups, equal to the sums of
the steps that carry each value) and the tag filter on /sessions/."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone

from costboard.dashboards.selectors.overview import spend_by_period
from costboard.dashboards.selectors.tags import TAG_KEYS_SHOWN, spend_by_tag
from costboard.models import Step
from costboard.templatetags.costboard_tags import usd
from tests.conftest import Agent, add_price, streamed

pytestmark = pytest.mark.django_db


@pytest.fixture
def tagged(agent: Agent) -> Agent:
    add_price("test-sonnet")
    agent.events(
        {"type": "session", "session_id": "a", "tags": {"customer": "acme", "plan": "pro"}},
        {"type": "session", "session_id": "b", "tags": {"customer": "globex"}},
        *(
            {"session_id": "a", "step_type": "x", "model": "test-sonnet", "input_tokens": 100}
            for _ in range(3)
        ),
        *(
            {"session_id": "b", "step_type": "x", "model": "test-sonnet", "input_tokens": 900}
            for _ in range(2)
        ),
        {"session_id": "c", "step_type": "x", "model": "test-sonnet", "input_tokens": 5},
    )
    return agent


def cost_where(key: str, value: str) -> Decimal:
    return sum(
        (s.cost_usd for s in Step.objects.all() if (s.tags or {}).get(key) == value), Decimal(0)
    )


def value_cost(html: str, value: str) -> str:
    row = html[html.index(f'data-tag-value="{value}"') :]
    found = re.search(r"data-tag-cost>([^<]+)<", row)
    assert found is not None
    return found.group(1)


def test_steps_breaks_spend_down_by_a_tag_key(staff: Client, tagged: Agent) -> None:
    html = staff.get("/steps/").content.decode()
    assert re.findall(r'data-tag-key="([^"]+)"', html) == ["customer", "plan"]
    assert value_cost(html, "globex") == usd(cost_where("customer", "globex"))
    assert value_cost(html, "acme") == usd(cost_where("customer", "acme"))
    assert html.index('data-tag-value="globex"') < html.index('data-tag-value="acme"')
    plan = staff.get("/steps/?tag_key=plan").content.decode()
    assert value_cost(plan, "pro") == usd(cost_where("plan", "pro"))
    assert 'data-tag-value="acme"' not in plan
    overview = staff.get("/?tag_key=customer").content.decode()
    assert value_cost(overview, "acme") == usd(cost_where("customer", "acme"))


def test_sessions_filter_by_a_tag(staff: Client, tagged: Agent) -> None:
    html = staff.get("/sessions/?tag=customer=acme").content.decode()
    assert ">a<" in html or "<code>a</code>" in html
    assert "<code>b</code>" not in html and "<code>c</code>" not in html
    everything = staff.get("/sessions/").content.decode()
    assert "<code>b</code>" in everything  # positive control
    ignored = staff.get("/sessions/?tag=not a tag").content.decode()
    assert "<code>b</code>" in ignored  # a malformed filter filters nothing


@pytest.fixture
def awkward_tags(agent: Agent) -> Agent:
    """Tags whose keys and values a JSON comparison could misread: a dotted key, an "=" and a
    quote in a value, non-ASCII, values that read as JSON literals."""
    agent.events(
        {
            "type": "session",
            "session_id": "eu",
            "tags": {"customer.tier": "gold", "region": "eu=west", "owner": "O'Hara ü"},
        },
        {"type": "session", "session_id": "us", "tags": {"customer.tier": "silver", "n": "42"}},
        {"type": "session", "session_id": "odd", "tags": {"n": "null", "flag": "true"}},
        *(
            {"session_id": s, "step_type": "x", "model": "m", "input_tokens": 1}
            for s in ("eu", "us", "odd", "untagged")
        ),
    )
    return agent


def listed(staff: Client, tag: str) -> list[str]:
    response = staff.get(f"/sessions/?{urlencode({'tag': tag})}")
    assert response.status_code == 200
    return sorted(re.findall(r'<tr data-session="([^"]+)"', response.content.decode()))


def exported(staff: Client, tag: str) -> list[str]:
    response = staff.get(f"/sessions/export.csv?{urlencode({'tag': tag})}")
    assert response.status_code == 200
    body = streamed(response).decode()
    return sorted(row["session_id"] for row in csv.DictReader(io.StringIO(body)))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tag", "sessions"),
    [
        ("customer.tier=gold", ["eu"]),
        ("customer.tier=silver", ["us"]),
        ("region=eu=west", ["eu"]),  # the first "=" parts key from value
        ("region=eu", []),
        ("owner=O'Hara ü", ["eu"]),
        ("n=42", ["us"]),  # a number's text, not the number
        ("n=null", ["odd"]),
        ("flag=true", ["odd"]),
        ("customer.tier=platinum", []),
    ],
)
def test_the_tag_filter_lists_and_exports_the_sessions_with_that_tag(
    staff: Client, awkward_tags: Agent, tag: str, sessions: list[str]
) -> None:
    assert listed(staff, tag) == sessions
    assert exported(staff, tag) == sessions
    assert listed(staff, "") == ["eu", "odd", "untagged", "us"]  # positive control
    assert staff.get("/sessions/", {"tag": "no tag"}).status_code == 422  # not key=value


def untagged_cost(html: str) -> str:
    found = re.search(
        r"<tr data-tag-untagged><td[^>]*><em>\(untagged\)</em></td>.*?data-tag-cost>([^<]+)<",
        html,
    )
    assert found is not None, "no untagged row"
    return found.group(1)


def test_the_untagged_spend_is_a_row_and_a_keys_rows_add_up_to_the_overview(
    staff: Client, tagged: Agent
) -> None:
    tagged.events({"session_id": "t", "step_type": "tool", "model": "none"})  # a $0 step
    today = timezone.now().date()
    ids = [tagged.project.pk]
    whole = sum((s.cost_usd for s in Step.objects.all()), Decimal(0))
    [*_, thirty_days] = spend_by_period(project_ids=ids, today=today)
    assert thirty_days.cost_usd == whole
    for key in ("customer", "plan"):
        rows = spend_by_tag(project_ids=ids, since=today - timedelta(days=29), until=today, key=key)
        assert sum((row.cost_usd for row in rows), Decimal(0)) == whole
        assert sum(row.calls for row in rows) == Step.objects.count() == 7
        [untagged] = [row for row in rows if row.value is None]
        assert untagged.cost_usd == cost_without(key) > 0
        assert untagged.calls == sum(1 for s in Step.objects.all() if key not in (s.tags or {}))
    assert untagged_cost(staff.get("/steps/?tag_key=plan").content.decode()) == usd(
        cost_without("plan")
    )
    assert untagged_cost(staff.get("/?tag_key=customer").content.decode()) == usd(
        cost_without("customer")
    )


def cost_without(key: str) -> Decimal:
    return sum((s.cost_usd for s in Step.objects.all() if key not in (s.tags or {})), Decimal(0))


def test_a_tag_key_of_digits_is_a_key_not_an_array_index(staff: Client, agent: Agent) -> None:
    """A key may be all digits (`[a-z0-9_.-]`: "2024", "0"): a JSON path read it as an array
    index, so the filtered tag breakdown called its steps untagged and `?tag=2024=…` kept no
    session, while the API and the unfiltered breakdown (rollups) had them."""
    add_price("test-sonnet")
    agent.events(
        {"type": "session", "session_id": "a", "tags": {"2024": "q1", "0": "zero"}},
        {"session_id": "a", "step_type": "x", "model": "test-sonnet", "input_tokens": 100},
        {"session_id": "b", "step_type": "x", "model": "test-sonnet", "input_tokens": 50},
    )
    filtered = staff.get("/steps/?step_type=x&tag_key=2024").content.decode()
    assert value_cost(filtered, "q1") == usd(cost_where("2024", "q1"))
    assert untagged_cost(filtered) == usd(cost_without("2024"))
    for tag, sessions in (("2024=q1", ["a"]), ("0=zero", ["a"]), ("2024=q2", [])):
        assert listed(staff, tag) == sessions
        assert exported(staff, tag) == sessions
    assert listed(staff, "") == ["a", "b"]  # positive control


def test_a_tag_key_past_the_ones_listed_is_still_a_key_of_the_period(
    staff: Client, agent: Agent
) -> None:
    """The pages list the period's first TAG_KEYS_SHOWN tag keys; a key after them that steps
    carried was refused as "not a tag key of this period" (422, no breakdown), while
    GET /api/v1/spend?group_by=tag:<key> answered it. A key no step carried still is."""
    add_price("test-sonnet")
    keys = [f"k{n:02d}" for n in range(TAG_KEYS_SHOWN + 5)]
    agent.events(
        *(
            {
                "session_id": "s",
                "step_type": "x",
                "model": "test-sonnet",
                "input_tokens": 100 * (n + 1),
                "tags": {key: "v"},
            }
            for n, key in enumerate(keys)
        )
    )
    last = keys[-1]
    for path in ("/steps/", "/"):
        response = staff.get(path, {"tag_key": last})
        html = response.content.decode()
        assert response.status_code == 200, path
        assert value_cost(html, "v") == usd(cost_where(last, "v"))
        assert untagged_cost(html) == usd(cost_without(last))
        assert f'aria-current="true" data-tag-key="{last}"' in html
        assert staff.get(path, {"tag_key": "k99"}).status_code == 422  # carried by none
