"""Every JSON body of the API, read one way: `json_loads` (UTF-8 only, no NaN, a whole JSON
number such as 100.0 read as the integer JSON Schema says it is) and the limits PostgreSQL or
Python would otherwise fail on (docs/api.md, "Limits"): no NUL or unpaired surrogate in text
(`bad_text`, `text_fault`), objects nested at most 32 deep (`too_deep`). The events'
schemas (costboard/ingest/schemas.py), the API's other bodies and the admin's forms all check
with these.
"""

from __future__ import annotations

import json
import re
import sys
from decimal import Decimal
from typing import Any

from costboard.input_limits import BAD_CHAR, bad_char_message

MAX_DEPTH = 32  # docs/api.md, "Limits": metadata, context and usage nest at most this deep
# the largest number a JSON parser's double holds (1.797…e308): past it, a fraction kept in
# metadata would be written back as Infinity, which is not JSON
_FLOAT_MAX = Decimal(sys.float_info.max)


def json_number(text: str) -> int | Decimal:
    """A JSON number with a fraction or an exponent: exact, as Decimal, never a float; a whole
    one (100.0, 1e3) as int, since JSON Schema's "integer" includes it."""
    if text[-1] != "0" and "e" not in text and "E" not in text and len(text) < 300:
        return Decimal(text)  # the common 2310.5: a last digit that is not 0 is a fraction
    number = Decimal(text)
    if number.adjusted() > 308 or abs(number) > _FLOAT_MAX:
        raise ValueError(f"the number {text[:24]} is beyond ±1e308, the range JSON parsers share")
    if number == number.to_integral_value():
        return int(number)
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON: send a number or null")


def json_loads(body: bytes) -> Any:
    """A JSON body as Python: UTF-8 only (RFC 8259; json.loads would also take CESU-8
    surrogates and UTF-16), numbers as json_number. ValueError if malformed; RecursionError
    if nested past what Python parses."""
    return json.loads(body.decode("utf-8"), parse_float=json_number, parse_constant=_no_constant)


# NUL (PostgreSQL text and jsonb refuse it) or a surrogate, escaped: cheap to look for in the
# body, so the walk that finds which field has one runs only when the body has one.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89abAB][0-9a-fA-F]{2}|[dD][c-fC-F][0-9a-fA-F]{2})")


def may_hold_bad_text(body: str | bytes) -> bool:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return _SUSPECT_ESCAPE.search(text) is not None


def bad_text(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first string (key or value) in `value` with a NUL or an unpaired surrogate: its
    dotted path and what to fix; None if there is none."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            found = BAD_CHAR.search(item)
            if found is not None:
                return where or "body", bad_char_message(found.group())
        elif isinstance(item, dict):
            for key, child in item.items():
                in_key = BAD_CHAR.search(key)
                if in_key is not None:
                    return where or "body", "a key " + bad_char_message(in_key.group())
                stack.append((child, f"{where}.{key}" if where else key))
        elif isinstance(item, list):
            stack.extend(
                (child, f"{where}.{n}" if where else str(n)) for n, child in enumerate(item)
            )
    return None


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether objects and arrays nest more than `limit` levels in `value` (itself level 1)."""
    for child in value.values() if type(value) is dict else value:
        if type(child) is dict or type(child) is list:
            break
    else:
        return False  # the usual flat object, without building a level
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item)
            if type(child) is dict or type(child) is list
        ]
        if not level:
            return False
    return True
