"""An amount sent as text is written in the digits 0-9. Decimal() reads any Unicode decimal
digit as its value ("１２" fullwidth, "١٢" Arabic-Indic: 12), and pydantic's decimal type
calls it: a session's cost_cap_usd and a bill's cost_usd in such digits were stored as 12.
Now each is a 422 naming the field and how to write it, and nothing of the request is stored
(costboard/input_limits.py, `amount_fault`)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from costboard.models import ApiKey, BilledUsage, Session, Step
from tests.conftest import Agent

pytestmark = pytest.mark.django_db

FIX = "write the amount in ASCII digits, e.g. 12.50"
# fullwidth 12, Arabic-Indic 12.50, a fullwidth digit among ASCII ones, Devanagari 5
NOT_ASCII = ["１２", "١٢.٥٠", "1２.50", "५"]


@pytest.mark.parametrize("cap", NOT_ASCII)
def test_a_session_cap_in_other_digits_is_refused_and_nothing_stored(
    agent: Agent, cap: str
) -> None:
    agent.events({"type": "session", "session_id": "kept", "cost_cap_usd": "3.00"})
    before = (Session.objects.count(), Step.objects.count())
    answer = agent.post(
        {
            "events": [
                {"session_id": "new", "step_type": "x", "model": "m", "input_tokens": 5},
                {"type": "session", "session_id": "kept", "cost_cap_usd": cap},
            ]
        }
    )
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (1, "cost_cap_usd")
    assert error["message"].endswith(FIX)
    assert (Session.objects.count(), Step.objects.count()) == before
    assert Session.objects.get(external_id="kept").cost_cap_usd == Decimal("3.00")
    # as the message says: in ASCII digits it is taken
    answer = agent.events({"type": "session", "session_id": "kept", "cost_cap_usd": " 12.50 "})
    assert answer["sessions"]["kept"]["cost_cap_usd"] == "12.50"


@pytest.mark.parametrize("cap", ["1_000", "12_50.00"])
def test_a_session_cap_with_a_separator_is_refused(agent: Agent, cap: str) -> None:
    # Decimal() reads "1_000" as 1000: the documented form is digits alone
    answer = agent.post({"events": [{"type": "session", "session_id": "s", "cost_cap_usd": cap}]})
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (0, "cost_cap_usd")
    assert error["message"].endswith("has a '_': write the amount in digits alone, e.g. 12.50")
    assert not Session.objects.exists()


@pytest.fixture
def admin(agent: Agent) -> Agent:
    _, key = ApiKey.issue(project=agent.project, role="admin")
    return Agent(project=agent.project, key=key, client=Client())


def bill(who: Agent, body: str, content_type: str) -> Any:
    return who.client.post(
        "/api/v1/billing",
        body,
        content_type=content_type,
        headers={"Authorization": f"Bearer {who.key}"},
    )


@pytest.mark.parametrize("cost", NOT_ASCII)
@pytest.mark.parametrize("content_type", ["application/json", "text/csv"])
def test_a_billed_cost_in_other_digits_is_refused_and_nothing_stored(
    admin: Agent, cost: str, content_type: str
) -> None:
    good = {"date": "2026-11-01", "provider": "mistral", "cost_usd": "1.00"}
    if content_type == "text/csv":
        body = f"date,provider,cost_usd\n2026-11-01,mistral,1.00\n2026-11-02,mistral,{cost}\n"
    else:
        body = json.dumps({"rows": [good, {**good, "date": "2026-11-02", "cost_usd": cost}]})
    answer = bill(admin, body, content_type)
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (1, "cost_usd")
    assert error["message"].endswith(FIX)
    assert BilledUsage.objects.count() == 0


def test_the_admin_csv_upload_refuses_a_cost_in_other_digits(staff: Client) -> None:
    data = "date,provider,cost_usd\n2026-11-01,mistral,１２.３４\n".encode()
    refused = staff.post(
        "/admin/costboard/billedusage/upload-csv/",
        {"file": SimpleUploadedFile("bill.csv", data)},
    )
    assert refused.status_code == 200
    assert "row 1, cost_usd: has a digit that is not 0-9" in refused.content.decode()
    assert FIX in refused.content.decode()
    assert BilledUsage.objects.count() == 0
