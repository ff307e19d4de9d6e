"""The admin's lists cost the same number of queries whatever rows they show: the rate list
read the rate table's version once per row (for its "negotiated (now)" column) and the
price adjustments read each row's project, so a page of 50 rows made 50 more queries. A
project's page read each member's user and project, and each key's project."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from costboard.models import ApiKey, Membership, PriceAdjustment, Project, WebhookEndpoint
from tests.conftest import add_price, make_agent

pytestmark = pytest.mark.django_db


def more_rows(first: int, last: int) -> None:
    """Prices of models m<first>..m<last - 1>, each with its project's own adjustment."""
    today = timezone.now().date()
    for n in range(first, last):
        project = make_agent(f"p{n}").project
        add_price(f"m{n}")
        PriceAdjustment.objects.create(
            provider="testco", family=f"m{n}", project=project, percent=-n, effective_from=today
        )


def queries(staff: Client, url: str) -> tuple[int, str]:
    staff.get(url)  # what the first request reads once (content types) read before counting
    with CaptureQueriesContext(connection) as done:
        listed = staff.get(url)
    assert listed.status_code == 200, url
    return len(done.captured_queries), listed.content.decode()


def test_the_rate_list_costs_the_same_queries_for_2_rows_as_for_12(staff: Client) -> None:
    PriceAdjustment.objects.create(
        provider="testco", percent=Decimal("-12.5"), effective_from=timezone.now().date()
    )
    more_rows(0, 2)
    few, _ = queries(staff, "/admin/costboard/modelprice/")
    more_rows(2, 12)
    many, page = queries(staff, "/admin/costboard/modelprice/")
    assert many == few
    # each row's adjustment in force for every project, and the projects with their own
    assert page.count('<td class="field-negotiated">-12.5 % (1 project their own)</td>') == 12


def test_the_adjustment_list_costs_the_same_queries_for_2_rows_as_for_12(staff: Client) -> None:
    more_rows(0, 2)
    few, _ = queries(staff, "/admin/costboard/priceadjustment/")
    more_rows(2, 12)
    many, page = queries(staff, "/admin/costboard/priceadjustment/")
    assert many == few
    assert page.count('class="action-select"') == 12
    assert '<td class="field-project nowrap">P11</td>' in page


def members_keys_and_webhooks(project: Project, first: int, last: int) -> None:
    for n in range(first, last):
        ApiKey.issue(project=project, name=f"key {n}")
        user = get_user_model().objects.create_user(f"member{n}")
        Membership.objects.create(user=user, project=project)
        WebhookEndpoint.objects.create(
            project=project, url=f"https://hooks{n}.example.com/costboard", secret="s" * 32
        )


def test_a_projects_page_costs_one_query_more_per_member_and_none_per_key_or_webhook(
    staff: Client,
) -> None:
    # each member's row read its user and project (the row's title), each key's its project
    project = make_agent("acme").project
    url = f"/admin/costboard/project/{project.pk}/change/"
    members_keys_and_webhooks(project, 0, 2)
    few, _ = queries(staff, url)
    members_keys_and_webhooks(project, 2, 12)
    many, page = queries(staff, url)
    # the one left: Django's autocomplete widget reads its chosen user's name, row by row
    assert many - few == 10
    assert page.count("member11 in Acme") == 1 and page.count(" (acme)") == 13
