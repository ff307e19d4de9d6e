"""What every CSV download shares: a cell a spreadsheet will not run as a formula."""

from __future__ import annotations

from typing import Any

# a leading =, +, -, @ (or a tab or carriage return before one) starts a formula in Excel,
# LibreOffice and Google Sheets
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """`value` for a CSV cell: text that starts like a formula (a session id, a user_id or a
    tag an agent sent) gets a leading apostrophe; numbers and everything else as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return f"'{value}"
    return value
