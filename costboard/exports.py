"""What every CSV download shares: a cell a spreadsheet will not run as a formula."""

from __future__ import annotations

import re
from typing import Any

# a leading =, +, -, @ (or a tab or carriage return before one) starts a formula in Excel,
# LibreOffice and Google Sheets
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


# a number as our CSVs write one (a negative amount: a credit, a repricing's correction) is a
# number to a spreadsheet, not a formula
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def csv_cell(value: Any) -> Any:
    """`value` for a CSV cell: text that starts like a formula (a session id, a user_id or a
    tag an agent sent) gets a leading apostrophe, unless it is a plain number (`-0.004`);
    numbers and everything else as they are."""
    if (
        isinstance(value, str)
        and value.startswith(_FORMULA_STARTS)
        and not _PLAIN_NUMBER.fullmatch(value)
    ):
        return f"'{value}"
    return value
