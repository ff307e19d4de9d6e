"""POST /api/v1/billing (admin keys): billed rows as JSON or CSV, stored exactly, validated
whole (422 naming the row's index and field, nothing stored), each (date, provider) of the
key's project replaced by a second send, another project's rows neither written nor replaced;
and the admin's CSV upload (a bill across projects) through the same checks and service."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from costboard.models import ApiKey, BilledUsage, ProviderProject
from tests.conftest import Agent, make_agent
from tests.costboard.test_admin import staff_with

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


UPLOAD = "/admin/costboard/billedusage/upload-csv/"


def upload(staff: Client, bill: str | bytes, **fields: Any) -> Any:
    """The admin's "Upload a CSV bill" with this file (and the form's other fields)."""
    data = bill.encode() if isinstance(bill, str) else bill
    return staff.post(UPLOAD, {"file": SimpleUploadedFile("bill.csv", data), **fields})


def rows() -> list[tuple[Any, ...]]:
    found = BilledUsage.objects.values_list(*FIELDS)
    return sorted(found, key=lambda row: (row[0], row[1], row[3] or ""))


def test_json_rows_are_stored_exactly_with_the_keys_project_by_default(admin: Agent) -> None:
    answer = post(
        admin,
        {
            "rows": [
                {"date": "2026-11-01", "provider": "Mistral", "model": "mistral-large",
                 "cost_usd": "12.345678901234", "input_tokens": 1000, "output_tokens": 20},
                {"date": "2026-11-01", "provider": "mistral", "model": "codestral",
                 "project": admin.project.slug, "cost_usd": 0.1},
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
        (day1, "mistral", "api", "codestral", project, Decimal("0.1"), None, None),
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


def another_admin(slug: str) -> Agent:
    other = make_agent(slug)
    _, key = ApiKey.issue(project=other.project, role="admin")
    return Agent(project=other.project, key=key, client=Client())


@pytest.mark.parametrize("content_type", ["application/json", "text/csv"])
def test_a_key_names_no_other_project_and_learns_nothing_of_them(
    admin: Agent, content_type: str
) -> None:
    beta = another_admin("beta")
    assert post(beta, {"rows": [{"date": "2026-11-01", "provider": "openai", "cost_usd": "9"}]})
    kept = rows()

    def refusal(slug: str) -> dict[str, Any]:
        if content_type == "text/csv":
            body: Any = f"date,provider,project,cost_usd\n2026-11-01,openai,{slug},1\n"
        else:
            row = {"date": "2026-11-01", "provider": "openai", "project": slug, "cost_usd": "1"}
            body = {"rows": [row]}
        answer = post(admin, body, content_type)
        assert answer.status_code == 422, answer.content
        [error] = answer.json()["errors"]
        return error

    existing, missing = refusal("beta"), refusal("gamma")
    assert (existing["index"], existing["field"]) == (0, "project")
    own = admin.project.slug
    assert existing["message"].startswith(f"'beta' is not this key's project ({own})")
    assert "upload a bill across projects in the admin" in existing["message"]
    # another project's existence is not told: the same words for one that is not there
    assert missing["message"] == existing["message"].replace("'beta'", "'gamma'")
    assert rows() == kept  # beta's row neither replaced nor joined by one


def test_each_projects_key_replaces_only_its_own_rows_of_a_day(admin: Agent) -> None:
    beta = another_admin("beta")
    day = {"date": "2026-11-01", "provider": "openai"}
    assert post(admin, {"rows": [{**day, "model": "gpt-4o", "cost_usd": "1"}]}).status_code == 200
    second = post(beta, {"rows": [{**day, "model": "gpt-4o", "cost_usd": "2"}]})
    assert (second.json()["stored"], second.json()["replaced"]) == (1, 0)
    corrected = post(admin, {"rows": [{**day, "model": "gpt-4o", "cost_usd": "1.5"}]}).json()
    assert (corrected["stored"], corrected["replaced"]) == (1, 1)
    assert sorted(BilledUsage.objects.values_list("project__slug", "cost_usd")) == [
        (admin.project.slug, Decimal("1.5")),
        ("beta", Decimal(2)),
    ]


def test_csv_rows_are_stored_like_json(admin: Agent) -> None:
    text = (
        "\ufeffdate,provider,model,project,cost_usd,input_tokens,output_tokens\r\n"
        "2026-11-01,mistral,mistral-large,,12.345678901234,1000,20\r\n"
        f"2026-11-01,mistral,codestral,{admin.project.slug},0.1,,\r\n"
        "\r\n"
        "2026-11-02,groq,,,7,,\r\n"
    )
    answer = post(admin, text, "text/csv")
    assert answer.status_code == 200, answer.content
    assert answer.json()["stored"] == 3
    day1, day2 = BilledUsage.objects.order_by("day").values_list("day", flat=True).distinct()
    assert rows() == [
        (day1, "mistral", "api", "codestral", admin.project.pk, Decimal("0.1"), None, None),
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
        # 13 digits before the point: "at most 12 decimals" alone named what was not wrong
        ({"cost_usd": "1000000000000"}, "cost_usd", "at most 12 digits before the point"),
        ({"cost_usd": 10**13}, "cost_usd", "at most 12 digits before the point"),
        ({"cost_usd": True}, "cost_usd", "USD amount"),
        ({"provider": "Open AI"}, "provider", "not a provider name"),
        ({"input_tokens": -1}, "input_tokens", "greater than or equal to 0"),
        ({"output_tokens": "12"}, "output_tokens", "integer"),
        ({"project": "nobody"}, "project", "'nobody' is not this key's project"),
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


def test_a_days_rows_past_what_a_days_bill_is_kept_in_are_refused(admin: Agent) -> None:
    near = {"date": "2026-11-01", "provider": "mistral", "cost_usd": "999999999999.99"}
    assert post(admin, {"rows": [near]}).status_code == 200  # one row: the most a cell holds
    answer = post(admin, {"rows": [{**near, "model": "a"}, {**near, "model": "b"}]})
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (None, "cost_usd")
    assert "2026-11-01 and mistral add up to 1999999999999.98 USD" in error["message"]
    assert list(BilledUsage.objects.values_list("model", flat=True)) == [None]  # the first kept
    # a credit beside it brings the day back within: stored
    credit = {**near, "model": "credit", "cost_usd": "-999999999999.99"}
    assert (
        post(admin, {"rows": [{**near, "model": "a"}, {**near, "model": "b"}, credit]}).status_code
        == 200
    )


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


@pytest.mark.parametrize(
    ("cell", "shown"),
    [
        ("²", "'²'"),  # str.isdigit() says True, int() refuses it
        ("١٢", "'١٢'"),  # Arabic-Indic digits: int() would read them as 12
        ("9" * 5000, "(5000 characters)"),  # past int()'s 4300 digits
        ("-1", "'-1'"),
    ],
)
def test_a_csv_token_cell_not_of_ascii_digits_is_refused_in_words(
    admin: Agent, cell: str, shown: str
) -> None:
    text = f"date,provider,cost_usd,input_tokens\n2026-11-01,x,1,5\n2026-11-01,x,1,{cell}\n"
    answer = post(admin, text, "text/csv")
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (1, "input_tokens")
    assert shown in error["message"]
    assert "is not a token count" in error["message"]
    assert "in ASCII digits 0-9" in error["message"]
    assert BilledUsage.objects.count() == 0


@pytest.mark.parametrize("column", ["model", "project"])
def test_a_csv_cell_holding_nul_is_refused_naming_row_and_column(admin: Agent, column: str) -> None:
    text = (
        f"date,provider,cost_usd,{column}\n"
        f"2026-11-01,x,1,{admin.project.slug}\n"
        f"2026-11-01,x,1,{admin.project.slug}\x00x\n"
    )
    answer = post(admin, text, "text/csv")
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (1, column)
    assert error["message"] == "must not contain NUL (\\u0000): remove it"
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
    assert staff.get(UPLOAD).status_code == 200
    refused = upload(staff, "date,provider,cost_usd\n2026-11-01,x,1\n2026-11-31,x,1\n")
    assert refused.status_code == 200
    assert b"row 2, date: &#x27;2026-11-31&#x27; is no such date" in refused.content
    assert BilledUsage.objects.count() == 0

    bill = "date,provider,model,cost_usd\n2026-11-01,mistral,mistral-large,12.34\n"
    assert upload(staff, bill, project=acme.pk).status_code == 302
    assert upload(staff, bill, project=acme.pk).status_code == 302  # again: replaced
    assert list(BilledUsage.objects.values_list("source", "model", "project_id", "cost_usd")) == [
        ("csv", "mistral-large", acme.pk, Decimal("12.34"))
    ]


def test_the_admin_csv_upload_refuses_nul_and_a_token_cell_not_of_ascii_digits(
    staff: Client,
) -> None:
    bill = (
        "date,provider,model,cost_usd,input_tokens\n"
        "2026-11-01,mistral,mistral-large,1,5\n2026-11-01,mistral,gpt\x00x,1,5\n"
    )
    refused = upload(staff, bill)
    assert refused.status_code == 200
    assert b"row 2, model: must not contain NUL" in refused.content
    refused = upload(staff, "date,provider,cost_usd,output_tokens\n2026-11-01,mistral,1,²\n")
    assert refused.status_code == 200
    assert (
        "row 1, output_tokens: &#x27;²&#x27; is not a token count: write a whole number"
        in refused.content.decode()
    )
    assert BilledUsage.objects.count() == 0


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"])
def test_a_csv_whatever_its_line_ends_is_read_row_by_row(staff: Client, newline: str) -> None:
    # a spreadsheet's "CSV (Macintosh)" ends its lines with a lone CR: the whole file was one
    # line, refused as "no header row"
    bill = newline.join(
        ["date,provider,model,cost_usd", "2026-11-01,mistral,mistral-large,1.5",
         '2026-11-02,mistral,"codestral",0.25', ""]
    )  # fmt: skip
    assert upload(staff, bill).status_code == 302
    assert rows() == [
        (date(2026, 11, 1), "mistral", "csv", "mistral-large", None, Decimal("1.5"), None, None),
        (date(2026, 11, 2), "mistral", "csv", "codestral", None, Decimal("0.25"), None, None),
    ]


def test_the_admin_uploads_a_bill_across_projects_and_a_new_one_replaces_it_whole(
    staff: Client,
) -> None:
    acme, beta = make_agent("acme").project, make_agent("beta").project
    bill = (
        "date,provider,project,cost_usd\n"
        "2026-11-01,mistral,acme,1\n2026-11-01,mistral,beta,2\n2026-11-02,mistral,beta,3\n"
    )
    assert upload(staff, bill).status_code == 302
    # the corrected bill of the 1st names acme alone: beta's row of that day goes with it
    fix = "date,provider,project,cost_usd\n2026-11-01,mistral,acme,1.25\n"
    assert upload(staff, fix).status_code == 302
    assert sorted(BilledUsage.objects.values_list("day", "project_id", "cost_usd")) == [
        (date(2026, 11, 1), acme.pk, Decimal("1.25")),
        (date(2026, 11, 2), beta.pk, Decimal(3)),
    ]
    refused = upload(staff, "date,provider,project,cost_usd\n2026-11-01,mistral,nobody,1\n")
    assert b"&#x27;nobody&#x27; is no project" in refused.content


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


def test_the_upload_link_is_offered_only_to_who_may_upload(staff: Client) -> None:
    # a user who may only view the billed rows followed the link to a 403
    viewer = staff_with("viewer", "view_billedusage")
    listed = viewer.get("/admin/costboard/billedusage/")
    assert listed.status_code == 200 and b"Upload a CSV bill" not in listed.content
    assert viewer.get(UPLOAD).status_code == 403
    uploader = staff_with("uploader", "view_billedusage", "add_billedusage")
    assert b"Upload a CSV bill" in uploader.get("/admin/costboard/billedusage/").content
    assert uploader.get(UPLOAD).status_code == 200
