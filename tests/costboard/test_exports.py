"""A CSV cell a spreadsheet will not run as a formula (costboard/exports.py), and a negative
amount still a number."""

from __future__ import annotations

import pytest

from costboard.exports import csv_cell


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
        (-3, -3),
    ],
)
def test_a_cell_that_starts_a_formula_is_quoted_and_a_number_is_not(
    value: object, written: object
) -> None:
    assert csv_cell(value) == written
