"""Which checkbox values can be row ids (costboard/dashboards/row_ids.py): ASCII digits up to
the widest primary key's largest value, however many zeros lead."""

from __future__ import annotations

import pytest

from costboard.dashboards.row_ids import is_row_id

BIGINT_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("0", True),
        (str(BIGINT_MAX), True),
        ("0" * 30 + str(BIGINT_MAX), True),
        (str(BIGINT_MAX + 1), False),
        ("0" * 30 + str(BIGINT_MAX + 1), False),
        ("9" * 20, False),
        ("9" * 5000, False),
        ("", False),
        ("-1", False),
        ("²", False),
        ("١", False),  # an Arabic-Indic one: a digit to str.isdigit, not ASCII
    ],
)
def test_a_row_id_is_ascii_digits_no_larger_than_bigint(value: str, expected: bool) -> None:
    assert is_row_id(value) is expected
