"""Row ids from a page's checkboxes (the admin's action selection, the memory review's bulk
decisions): strings of ASCII digits no larger than the widest primary key's largest value.

A larger one names no row, yet reaches the query as a parameter: SQLite cannot bind an
integer past 64 bits (OverflowError) and Python will not read one of more than 4,300
digits, a 500 on either database. Such an id is no selection, so it is left out.
"""

from __future__ import annotations

from django.db import connection


def is_row_id(value: str) -> bool:
    """Whether `value` is an id a row can have (compared by length first: int() refuses a
    string of more than 4,300 digits)."""
    if not (value.isascii() and value.isdigit()):
        return False
    _, largest = connection.ops.integer_field_range("BigAutoField")
    digits, width = value.lstrip("0") or "0", len(str(largest))
    return len(digits) < width or (len(digits) == width and int(digits) <= largest)
