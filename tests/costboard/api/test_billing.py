"""POST /api/v1/billing (admin keys): billed rows as JSON or CSV, stored exactly, validated
whole (422 naming the row's index and field, nothing stored), each (date, provider) replaced
by a second send; and the admin's CSV upload through the same checks and service."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from costboard.models import ApiKey, BilledUsage, Project, ProviderProject
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db

PATH = "/api/v1/billing"
FIELDS = ("day", "provider", "source", "model", "project_id", "cost_usd", "input_tokens",
          "output_tokens")  # fmt: skip


@pytest.fixture
def admin(agent: Agent) -> Agent:
    _, key = ApiKey.issue(project=agent.project, role="admin")
    return Agent(project=agent.project, key=key, client=Client())


def post(who: Agent, body: Any, content_type: str = "application/json") -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return who.client.post(
        PATH, data, content_type=content_type, headers={"Authorization": f"Bearer {who.key}"}
    )


def rows() -> list[tuple[Any, ...]]:
    found = BilledUsage.objects.values_list(*FIELDS)
    return sorted(found, key=lambda row: (row[0], row[1], row[3] or ""))


def test_json_rows_are_stored_exactly_with_the_keys_project_by_default(admin: Agent) -> None:
    other = Project.objects.create(name="Other", slug="other")
    answer = post(
        admin,
        {
            "rows": [
                {"date": "2026-11-01", "provider": "Mistral", "model": "mistral-large",
                 "cost_usd": "12.345678901234", "input_tokens": 1000, "output_tokens": 20},
                {"date": "2026-11-01", "provider": "mistral", "model": "codestral",
                 "project": "other", "cost_usd": 0.1},
                {"date": "2026-11-02", "provider": "groq", "cost_usd": "7"},
            ]
        },
    )  # fmt: skip
    assert answer.status_code == 200, answer.content
    assert answer.json() == {
        "stored": 3,
        "replaced": 0,
        "days": [
            {"date": "2026-11-01", "provider": "mistral"},
            {"date": "2026-11-02", "provider": "groq"},
        ],
    }
    project = admin.project.pk
    day1, day2 = BilledUsage.objects.order_by("day").values_list("day", flat=True).distinct()
    assert rows() == [
        (day1, "mistral", "api", "codestral", other.pk, Decimal("0.1"), None, None),
        (day1, "mistral", "api", "mistral-large", project, Decimal("12.345678901234"), 1000, 20),
        (day2, "groq", "api", None, project, Decimal(7), None, None),
    ]


def test_a_second_send_replaces_the_days_and_providers_it_names(admin: Agent) -> None:
    first = {"rows": [
        {"date": "2026-11-01", "provider": "mistral", "model": "a", "cost_usd": "1"},
        {"date": "2026-11-01", "provider": "mistral", "model": "b", "cost_usd": "2"},
        {"date": "2026-11-02", "provider": "mistral", "model": "a", "cost_usd": "3"},
    ]}  # fmt: skip
    assert post(admin, first).json()["replaced"] == 0
    again = post(admin, first).json()
    assert (again["stored"], again["replaced"]) == (3, 3)
    assert BilledUsage.objects.count() == 3
    # a corrected invoice for one day: that day's rows replaced, the other day's kept
    fix = {"rows": [{"date": "2026-11-01", "provider": "mistral", "cost_usd": "2.50"}]}
    assert post(admin, fix).json()["replaced"] == 2
    costs = BilledUsage.objects.values_list("cost_usd", flat=True)
    assert sorted(cost for cost in costs if cost is not None) == [
        Decimal("2.5"),
        Decimal(3),
    ]


def test_rows_imported_or_uploaded_are_not_replaced_by_the_api(admin: Agent) -> None:
    for source in ("openai_costs", "csv"):
        BilledUsage.objects.create(
            provider="openai", source=source, day="2026-11-01", cost_usd=Decimal(5)
        )
    post(admin, {"rows": [{"date": "2026-11-01", "provider": "openai", "cost_usd": "1"}]})
    assert sorted(BilledUsage.objects.values_list("source", "cost_usd")) == [
        ("api", Decimal(1)),
        ("csv", Decimal(5)),
        ("openai_costs", Decimal(5)),
    ]


def test_csv_rows_are_stored_like_json(admin: Agent) -> None:
    Project.objects.create(name="Other", slug="other")
    text = (
        "\ufeffdate,provider,model,project,cost_usd,input_tokens,output_tokens\r\n"
        "2026-11-01,mistral,mistral-large,,12.345678901234,1000,20\r\n"
        "2026-11-01,mistral,codestral,other,0.1,,\r\n"
        "\r\n"
        "2026-11-02,groq,,,7,,\r\n"
    )
    answer = post(admin, text, "text/csv")
    assert answer.status_code == 200, answer.content
    assert answer.json()["stored"] == 3
    other = Project.objects.get(slug="other").pk
    day1, day2 = BilledUsage.objects.order_by("day").values_list("day", flat=True).distinct()
    assert rows() == [
        (day1, "mistral", "api", "codestral", other, Decimal("0.1"), None, None),
        (day1, "mistral", "api", "mistral-large", admin.project.pk, Decimal("12.345678901234"),
         1000, 20),
        (day2, "groq", "api", None, admin.project.pk, Decimal(7), None, None),
    ]  # fmt: skip


GOOD = {"date": "2026-11-01", "provider": "mistral", "cost_usd": "1.00"}


@pytest.mark.parametrize(
    ("bad", "field", "says"),
    [
        ({"date": "2026-02-30"}, "date", "no such date"),
        ({"date": "01/11/2026"}, "date", "YYYY-MM-DD"),
        ({"cost_usd": "12.3.4"}, "cost_usd", "not a USD amount"),
        ({"cost_usd": "1.0000000000001"}, "cost_usd", "at most 12 decimals"),
        ({"cost_usd": True}, "cost_usd", "USD amount"),
        ({"provider": "Open AI"}, "provider", "not a provider name"),
        ({"input_tokens": -1}, "input_tokens", "greater than or equal to 0"),
        ({"output_tokens": "12"}, "output_tokens", "integer"),
        ({"project": "nobody"}, "project", "no project 'nobody'"),
        ({"colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_a_bad_row_is_refused_naming_its_index_and_field(
    admin: Agent, bad: dict[str, Any], field: str, says: str
) -> None:
    answer = post(admin, {"rows": [GOOD, GOOD, {**GOOD, **bad}]})
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (2, field)
    assert says in error["message"]
    assert BilledUsage.objects.count() == 0


def test_a_missing_field_and_an_empty_body_are_refused(admin: Agent) -> None:
    answer = post(admin, {"rows": [GOOD, {"date": "2026-11-01", "provider": "x"}]})
    assert answer.status_code == 422
    assert [(e["index"], e["field"]) for e in answer.json()["errors"]] == [(1, "cost_usd")]
    empty = post(admin, {"rows": []})
    assert empty.status_code == 422
    assert empty.json()["errors"][0]["field"] == "rows"
    assert post(admin, "{not json").status_code == 400
    assert BilledUsage.objects.count() == 0


@pytest.mark.parametrize(
    ("text", "index", "field", "says"),
    [
        ("date,provider\n2026-11-01,x\n", None, "cost_usd", "no column 'cost_usd'"),
        ("date,provider,cost_usd,colour\n2026-11-01,x,1,red\n", None, "colour", "unknown column"),
        ("date,provider,cost_usd\n2026-11-01,x,1\n2026-11-01,x\n", 1, "row", "line 3 has 2 cells"),
        ("date,provider,cost_usd\n2026-11-01,x,1\n2026-11-01,x,abc\n", 1, "cost_usd", "USD"),
        ("date,provider,cost_usd,input_tokens\n2026-11-01,x,1,1.5\n", 0, "input_tokens", "integer"),
        ("date,provider,cost_usd\n", None, "rows", "no rows"),
    ],
)
def test_a_bad_csv_is_refused_naming_row_and_column(
    admin: Agent, text: str, index: int | None, field: str, says: str
) -> None:
    answer = post(admin, text, "text/csv")
    assert answer.status_code == 422, answer.content
    error = answer.json()["errors"][0]
    assert (error["index"], error["field"]) == (index, field)
    assert says in error["message"]
    assert BilledUsage.objects.count() == 0


@pytest.mark.parametrize("role", ["ingest", "read"])
def test_only_an_admin_key_may_send_bills(agent: Agent, role: str) -> None:
    _, key = ApiKey.issue(project=agent.project, role=role)
    answer = post(Agent(agent.project, key, Client()), {"rows": [GOOD]})
    assert answer.status_code == 403
    assert "admin role" in answer.json()["errors"][0]["message"]
    assert Client().post(PATH, json.dumps({"rows": [GOOD]}), "application/json").status_code == 401
    assert BilledUsage.objects.count() == 0


def test_another_content_type_is_415(admin: Agent) -> None:
    answer = post(admin, "rows", "text/plain")
    assert answer.status_code == 415
    assert "text/csv" in answer.json()["errors"][0]["message"]


# --- the admin ----------------------------------------------------------------------------------


def test_the_admin_csv_upload_stores_rows_through_the_same_checks(staff: Client) -> None:
    acme = make_agent("acme").project
    listed = staff.get("/admin/costboard/billedusage/")
    assert b"Upload a CSV bill" in listed.content
    url = "/admin/costboard/billedusage/upload-csv/"
    assert staff.get(url).status_code == 200
    bad = SimpleUploadedFile(
        "bill.csv", b"date,provider,cost_usd\n2026-11-01,x,1\n2026-11-31,x,1\n"
    )
    refused = staff.post(url, {"file": bad})
    assert refused.status_code == 200
    assert b"row 2, date: &#x27;2026-11-31&#x27; is no such date" in refused.content
    assert BilledUsage.objects.count() == 0

    bill = b"date,provider,model,cost_usd\n2026-11-01,mistral,mistral-large,12.34\n"
    done = staff.post(url, {"file": SimpleUploadedFile("bill.csv", bill), "project": acme.pk})
    assert done.status_code == 302
    again = staff.post(url, {"file": SimpleUploadedFile("bill.csv", bill), "project": acme.pk})
    assert again.status_code == 302
    assert list(BilledUsage.objects.values_list("source", "model", "project_id", "cost_usd")) == [
        ("csv", "mistral-large", acme.pk, Decimal("12.34"))
    ]


def test_a_mapping_saved_in_the_admin_moves_the_imported_rows(staff: Client) -> None:
    acme = make_agent("acme").project
    BilledUsage.objects.create(
        provider="openai", source="openai_costs", day="2026-11-01", provider_project="proj_a"
    )
    added = staff.post(
        "/admin/costboard/providerproject/add/",
        {"provider": "openai", "external_id": "proj_a", "project": acme.pk, "note": ""},
    )
    assert added.status_code == 302, added.content
    assert BilledUsage.objects.get().project == acme
    mapping = ProviderProject.objects.get()
    deleted = staff.post(f"/admin/costboard/providerproject/{mapping.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302
    assert BilledUsage.objects.get().project is None
