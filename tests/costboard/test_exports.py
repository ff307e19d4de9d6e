"""A CSV cell a spreadsheet will not run as a formula (costboard/exports.py), and a negative
amount still a number."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from costboard.exports import csv_cell
from tests.conftest import make_agent, streamed


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("-0.004", "-0.004"),  # a credit, a repricing's correction: a number
        ("-12", "-12"),
        ("0.5", "0.5"),
        ("-1+2", "'-1+2"),  # a formula
        ("-0.004)", "'-0.004)"),
        ("-", "'-"),
        ("=HYPERLINK(1)", "'=HYPERLINK(1)"),
        ("+1", "'+1"),
        ("@sum", "'@sum"),
        ("\t=1", "'\t=1"),
        ("search", "search"),
        ("'=1", "''=1"),  # sent with its apostrophe: not the quoted =1
        ("'", "''"),
        ("it's", "it's"),
        (-3, -3),
    ],
)
def test_a_cell_that_starts_a_formula_is_quoted_and_a_number_is_not(
    value: object, written: object
) -> None:
    assert csv_cell(value) == written


@pytest.mark.django_db
def test_a_project_slug_that_starts_a_formula_is_quoted_in_the_sessions_export(
    staff: Client, priced: None
) -> None:
    """A slug may start with "-" (a SlugField's letters), and `-a1` is a formula to a
    spreadsheet: the sessions export's project column is quoted like every text cell."""
    agent = make_agent("-a1")
    agent.events({"session_id": "s", "step_type": "x", "model": "test-haiku", "input_tokens": 5})
    rows = list(csv.reader(io.StringIO(streamed(staff.get("/sessions/export.csv")).decode())))
    assert [row[:2] for row in rows[1:]] == [["'-a1", "s"]]
