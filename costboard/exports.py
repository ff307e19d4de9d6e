"""What every CSV download shares: a cell a spreadsheet will not run as a formula."""

from __future__ import annotations

import re
from typing import Any

from costboard.tag_values import UNTAGGED_LABEL

# a leading =, +, -, @ (or a tab or carriage return before one) starts a formula in Excel,
# LibreOffice and Google Sheets; a leading apostrophe gets one more, so that a cell starting
# with one always had it added (a value sent as '=1 is not read as =1 quoted)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


# a number as our CSVs write one (a negative amount: a credit, a repricing's correction) is a
# number to a spreadsheet, not a formula
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def csv_cell(value: Any) -> Any:
    """`value` for a CSV cell: text that starts like a formula (a session id, a user_id or a
    tag an agent sent) or with an apostrophe gets a leading apostrophe, unless it is a plain
    number (`-0.004`); numbers and everything else as they are."""
    if (
        isinstance(value, str)
        and value.startswith(_FORMULA_STARTS)
        and not _PLAIN_NUMBER.fullmatch(value)
    ):
        return f"'{value}"
    return value


def tag_csv_cell(value: str | None) -> str:
    """A tag's value for a CSV cell: the value as sent (an empty cell for ""), quoted as
    csv_cell quotes text, and the untagged spend (None) as UNTAGGED_LABEL, which no value is
    written as: a value that reads like it gets the apostrophe too."""
    if value is None:
        return UNTAGGED_LABEL
    if value == UNTAGGED_LABEL:
        return f"'{value}"
    return str(csv_cell(value))
