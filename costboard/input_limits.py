"""What any input may hold, wherever it comes in (the API, OTLP, the admin, the pages): text
PostgreSQL can store (no NUL, no unpaired surrogate: `text_fault`), a count written in digits
(`digit_count`), an amount written in digits (`amount_fault`) and the years a date may be in.
Below every app's layer, so the services that check their own input (pricing's adjustments,
billing's bills) share the checks ingest and the API make (docs/api.md, "Limits")."""

from __future__ import annotations

import re
from datetime import date

# Years outside these are typing mistakes, and near Python's year 1 and 9999 the conversion
# to UTC (or a period's end) would overflow.
FIRST_YEAR, LAST_YEAR = 1970, 2999
FIRST_DAY, LAST_DAY = date(FIRST_YEAR, 1, 1), date(LAST_YEAR, 12, 31)

# after json.loads, valid surrogate pairs are one code point: any surrogate left is unpaired
BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def text_fault(text: str) -> str | None:
    """What is wrong with `text` for PostgreSQL (NUL, an unpaired surrogate), or None."""
    found = BAD_CHAR.search(text)
    return None if found is None else bad_char_message(found.group())


def bad_char_message(char: str) -> str:
    if char == "\x00":
        return "must not contain NUL (\\u0000): remove it"
    return (
        f"has an unpaired surrogate (\\u{ord(char):04x}): send valid UTF-8, or \\ud83d\\ude00 "
        "pairs in JSON escapes"
    )


def digit_count(text: str, most: int) -> int | None:
    """`text` as a whole number if it is digits 0-9 alone (leading zeros allowed) and at most
    `most`; None otherwise. str.isdigit() alone takes '²' and Arabic-Indic digits, which int()
    refuses or reads, and int() refuses thousands of digits: the digits and their count are
    checked first."""
    digits = text.lstrip("0") or "0"
    if not (text.isascii() and text.isdigit()) or len(digits) > len(str(most)):
        return None
    number = int(digits)
    return number if number <= most else None


def amount_fault(text: str, *, example: str = "12.50") -> str | None:
    """What is wrong with `text` as a decimal amount (USD, a percentage, a rate) for its digits,
    or None. Decimal() reads any Unicode decimal digit as its value ("１２" fullwidth and
    "١٢" Arabic-Indic are 12) and takes "1_000" as 1000, and pydantic's and Django's decimal
    fields call it: an amount of ours is written in the digits 0-9, with no separator.
    Whatever else `text` holds is the parser's to judge."""
    found = next((char for char in text if char.isdecimal() and not char.isascii()), None)
    if found is None:
        if "_" in text:  # Decimal() reads "1_000" as 1000, as Python source would
            return f"has a '_': write the amount in digits alone, e.g. {example}"
        return None
    return (
        f"has a digit that is not 0-9 ({found!r}, U+{ord(found):04X}): write the amount in "
        f"ASCII digits, e.g. {example}"
    )
