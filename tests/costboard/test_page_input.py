"""Bad input to the pages and the admin (costboard/page_input.py, the admin's forms): a 4xx or
the form shown again with its error, never a 500, and nothing saved."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from costboard.models import ApiKey, ModelPrice, Project, WebhookEndpoint
from memory_ui.models import Memory
from tests.conftest import Agent, streamed

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(staff: Client) -> Client:
    staff.raise_request_exception = False
    return staff


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/steps/?model=%00", "model"),
        ("/steps/?step_type=a%00b", "step_type"),
        ("/sessions/?q=%00", "q"),
        ("/sessions/?user=%00&model=m", "user"),
        ("/sessions/export.csv?model=%00", "model"),
        ("/?project=%00", "project"),
        ("/memory/?q=%00", "q"),
        ("/memory/review/?scope=user:%00", "scope"),
        ("/admin/costboard/step/?model=%00", "model"),
        ("/admin/costboard/modelprice/?provider=%00", "provider"),
        ("/admin/costboard/session/?q=%00", "q"),
        ("/sessions/?%00=1", "%00"),
        ("/users/?x=%00", "x"),  # any page, any parameter
    ],
)
def test_a_nul_in_a_pages_query_is_422_naming_the_parameter(
    admin_client: Client, path: str, parameter: str
) -> None:
    response = admin_client.get(path)
    assert response.status_code == 422
    assert error_of(response.content.decode(), parameter) == (
        "must not contain NUL (%00): remove it"
    )


def error_of(html: str, parameter: str) -> str:
    """The message the pages' filter errors show for `parameter`."""
    found = re.search(
        rf'data-error="{re.escape(parameter)}"><strong>[^<]*:</strong> ([^<]*?)\. ', html
    )
    assert found is not None, html
    return found.group(1)


@pytest.mark.parametrize(
    ("query", "parameter", "says"),
    [
        ("tag=customer%3Dacme%1B", "tag", "must not contain the control character U+001B"),
        ("q=a%7Fb", "q", "the control character U+007F"),
        ("q=%C2%85", "q", "the control character U+0085"),
        ("model=%FF", "model", "is not valid UTF-8"),
        ("model=%ED%A0%80", "model", "is not valid UTF-8"),  # a surrogate, UTF-8 encoded
        ("%FF=1", "\ufffd", "is not valid UTF-8"),
        ("a%01b=1", "a%01b", "the control character U+0001"),
    ],
)
def test_a_control_character_or_bad_utf8_in_a_pages_query_is_422(
    admin_client: Client, query: str, parameter: str, says: str
) -> None:
    response = admin_client.get(f"/sessions/?model=m&{query}&user=ann")
    assert response.status_code == 422
    html = response.content.decode()
    assert says in error_of(html, parameter)
    assert '<a href="/sessions/?model=m&amp;user=ann" data-without>' in html  # the rest kept


@pytest.mark.parametrize("query", ["q=a%09b", "q=line%0Aline%0D", "q=%C3%BC%E2%82%AC", "q=+"])
def test_tabs_newlines_and_any_script_are_fine(admin_client: Client, query: str) -> None:
    assert admin_client.get(f"/sessions/?{query}").status_code == 200


def test_an_htmx_request_gets_the_errors_alone(admin_client: Client) -> None:
    response = admin_client.get("/sessions/?q=%00", headers={"HX-Request": "true"})
    assert response.status_code == 422
    html = response.content.decode()
    assert html.startswith('<div class="filter-errors"') and "<html" not in html
    assert error_of(html, "q") == "must not contain NUL (%00): remove it"


@pytest.mark.slow
@pytest.mark.parametrize(
    "query",
    [
        "since=0001-01-01",
        "until=9999-12-31",
        "since=0001-01-01&until=9999-12-31",
        "since=9999-12-31&until=0001-01-01",
        "since=2026-02-30",
        "page=99999999999999999999999",
    ],
)
@pytest.mark.parametrize("page", ["/steps/", "/sessions/", "/sessions/export.csv"])
def test_a_date_no_data_can_have_is_no_filter(
    admin_client: Client, agent: Agent, page: str, query: str
) -> None:
    agent.events({"session_id": "s1", "step_type": "x", "model": "m", "input_tokens": 1})
    response = admin_client.get(f"{page}?{query}")
    # a page names the wrong date or page in its form (422, tests/…/test_filter_input.py); a
    # download is refused the same way (no file of rows the filter did not keep); the steps
    # page and the download have no pages
    wrong = "since" in query or "until" in query or page == "/sessions/"
    assert response.status_code == (422 if wrong else 200)
    if response.status_code == 200 and page.endswith(".csv"):
        assert b"s1" in streamed(response)


@pytest.mark.parametrize("selected", ["abc", "\x00", "1\x00", "²"])
def test_an_admin_action_on_rows_that_are_not_ids_is_400(
    admin_client: Client, selected: str
) -> None:
    response = admin_client.post(
        "/admin/costboard/apikey/", {"action": "revoke", "_selected_action": [selected]}
    )
    assert response.status_code == 400
    assert b"_selected_action" in response.content


def test_an_admin_action_on_a_row_id_past_bigint_selects_nothing(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/costboard/apikey/", {"action": "revoke", "_selected_action": ["9" * 30]}
    )
    assert response.status_code in (200, 302)


BIGINT_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("path", "action"),
    [
        ("/admin/costboard/apikey/", "revoke"),
        ("/admin/costboard/session/", "delete_selected"),
        ("/admin/costboard/outboxitem/", "retry_items"),
        ("/admin/memory_ui/memory/", "approve_selected"),
        ("/admin/auth/user/", "delete_selected"),
    ],
)
@pytest.mark.parametrize(
    "row_id",
    [
        pytest.param(str(BIGINT_MAX), id="bigint's largest"),
        pytest.param(str(BIGINT_MAX + 1), id="one past it"),
        pytest.param("0" * 30 + str(BIGINT_MAX + 1), id="one past it after zeros"),
        pytest.param("9" * 30, id="30 digits"),
        pytest.param("9" * 5000, id="5000 digits"),
    ],
)
def test_every_admins_action_on_an_id_no_row_has_selects_nothing(
    admin_client: Client, agent: Agent, path: str, action: str, row_id: str
) -> None:
    """Past bigint (SQLite cannot bind it; int() refuses 5,000 digits) or not, the action runs
    on no row: a redirect or the confirmation of nothing, not a 500."""
    response = admin_client.post(
        path, {"action": action, "index": "0", "_selected_action": [row_id]}
    )
    assert response.status_code in (200, 302)
    assert ApiKey.objects.get(project=agent.project).revoked_at is None


def test_an_admin_action_still_acts_on_the_valid_ids_beside_one_past_bigint(
    admin_client: Client, agent: Agent
) -> None:
    chosen = ApiKey.objects.get(project=agent.project)
    other, _ = ApiKey.issue(project=agent.project, name="other")
    response = admin_client.post(
        "/admin/costboard/apikey/",
        {"action": "revoke", "index": "0", "_selected_action": ["9" * 30, str(chosen.pk)]},
    )
    assert response.status_code == 302
    chosen.refresh_from_db()
    other.refresh_from_db()
    assert chosen.revoked_at is not None
    assert other.revoked_at is None


PRICE = {
    "provider": "p",
    "model": "m",
    "input_mtok": "1",
    "output_mtok": "1",
    "cache_read_mtok": "1",
    "cache_write_mtok": "1",
    "cache_write_1h_mtok": "1",
    "tiers": "[]",
    "effective_from_0": "2026-01-01",
    "effective_from_1": "00:00:00",
    "source": "manual",
}


@pytest.mark.parametrize(
    ("tiers", "says"),
    [
        ('[{"start": 1, "input_mtok": "\\u0000"}]', "NUL"),
        ('[{"start": 1, "input_mtok": "\\ud800"}]', "unpaired surrogate"),
        ('[{"start": 1, "x\\u0000": "1"}]', "NUL"),
        ('[{"start": 1, "input_mtok": NaN}]', "NaN is not JSON"),
        ('[{"start": 1, "input_mtok": Infinity}]', "Infinity is not JSON"),
        ('[{"start": 1e400}]', "integer"),
        ('[{"start": ' + "9" * 30 + "}]", "start"),
        ('[{"start": true}]', "integer"),
        ('[{"start": 1, "input_mtok": "abc"}]', "input_mtok"),
        ('[{"start": 1, "input_mtok": "-1"}]', "input_mtok"),
        ('[{"start": 1, "input_mtok": [1]}]', "input_mtok"),
        ("[" * 5000 + "]" * 5000, "nests too deep"),
        ('{"start": 1}', "a list like"),
    ],
)
def test_a_price_tier_postgresql_or_pricing_would_fail_on_is_a_form_error(
    admin_client: Client, tiers: str, says: str
) -> None:
    response = admin_client.post("/admin/costboard/modelprice/add/", {**PRICE, "tiers": tiers})
    assert response.status_code == 200
    assert says in response.content.decode()
    assert not ModelPrice.objects.exists()


def test_a_good_price_tier_is_saved(admin_client: Client) -> None:
    tiers = '[{"start": 200000, "input_mtok": "6", "output_mtok": 22.5}]'
    response = admin_client.post("/admin/costboard/modelprice/add/", {**PRICE, "tiers": tiers})
    assert response.status_code == 302, response.content
    assert ModelPrice.objects.get().tiers == [
        {"start": 200000, "input_mtok": "6", "output_mtok": 22.5}
    ]


@pytest.mark.parametrize(
    ("path", "data", "model"),
    [
        ("/admin/costboard/project/add/", {"name": "x\x00", "slug": "x"}, Project),
        ("/admin/costboard/modelprice/add/", {**PRICE, "model": "m\x00"}, ModelPrice),
        (
            "/admin/costboard/webhookendpoint/add/",
            {
                "name": "n\x00",
                "url": "https://example.com/hook",
                "secret": "s" * 20,
                "kinds": ["exhausted"],
            },
            WebhookEndpoint,
        ),
    ],
)
def test_the_admins_forms_refuse_nul_with_the_form_shown_again(
    admin_client: Client, agent: Agent, path: str, data: dict[str, Any], model: Any
) -> None:
    before = model.objects.count()
    response = admin_client.post(path, {"project": str(agent.project.pk), **data})
    assert response.status_code == 200
    assert "Null characters are not allowed." in response.content.decode()
    assert model.objects.count() == before


def test_the_memory_edit_form_refuses_nul(admin_client: Client, agent: Agent) -> None:
    memory = Memory.objects.create(
        project=agent.project, type="user", content="Use ruff", fingerprint="use ruff"
    )
    response = admin_client.post(
        f"/memory/{memory.pk}/edit/", {"content": "Use\x00 ruff", "type": "user"}
    )
    assert response.status_code == 422
    memory.refresh_from_db()
    assert memory.content == "Use ruff"
