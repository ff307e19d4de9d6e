"""The pages' date filters are bounded like the spend API's (docs/api.md, "Spend"): a number
is not a Unix time (`until=0` is not 1970-01-01), and a year outside 1970–2999 is named, at
either end."""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("page", ["/sessions/", "/steps/", "/users/"])
@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("until", "0", "is not a date"),
        ("since", "0", "is not a date"),
        ("until", "1700000000", "is not a date"),
        ("until", "1969-12-31", "outside the years 1970–2999"),
        ("since", "3000-01-01", "outside the years 1970–2999"),
    ],
)
def test_a_date_out_of_bounds_is_a_422_naming_the_filter(
    staff: Client, page: str, name: str, value: str, says: str
) -> None:
    response = staff.get(page, {name: value})
    assert response.status_code == 422
    errors = dict(
        re.findall(
            r'data-error="(\w+)"><strong>\w+:</strong> ([^<]+)</p>', response.content.decode()
        )
    )
    assert says in errors[name]
