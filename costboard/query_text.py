"""Query parameters no page or endpoint can use, found before any view reads them.

A NUL reaches PostgreSQL as a query parameter it refuses (a 500 from `group_by=tag:%00`, or a
page's filter); other control characters and bytes that are not UTF-8 (which Django would
quietly turn into U+FFFD) are typing or encoding mistakes no filter has a use for. Tab, line
feed and carriage return stay: a pasted search can carry them. The API answers a fault as its
422 (costboard/api/boundary.py), the pages as theirs (costboard/page_input.py); docs/api.md,
"Limits".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes, urlencode

# C0 controls but tab, LF and CR; DEL; the C1 controls
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
SHOWN_NAME = 100  # characters of a parameter's name an error repeats


@dataclass(frozen=True)
class QueryFaults:
    """The parameters at fault (their names as shown, with what to fix) and the query string
    without them."""

    faults: dict[str, str]
    rest: str


def query_faults(query_string: str) -> QueryFaults | None:
    """What is wrong with each parameter of `query_string` (as WSGI gives it: bytes as
    Latin-1), or None when nothing is."""
    raw = _bytes(query_string)
    faults: dict[str, str] = {}
    kept: list[tuple[str, str]] = []
    for pair in raw.split(b"&"):
        if not pair:
            continue
        name_part, _, value_part = pair.partition(b"=")
        name_bytes = unquote_to_bytes(name_part.replace(b"+", b" "))
        name = shown(name_bytes.decode("utf-8", "replace"))
        texts = []
        for part in (name_bytes, unquote_to_bytes(value_part.replace(b"+", b" "))):
            try:
                texts.append(part.decode("utf-8"))
            except UnicodeDecodeError:
                faults.setdefault(
                    name, "is not valid UTF-8: percent-encode the UTF-8 bytes of its text"
                )
                break
            found = _CONTROL.search(texts[-1])
            if found is not None:
                faults.setdefault(name, _control_message(found.group()))
                break
        else:
            kept.append((texts[0], texts[1]))
    if not faults:
        return None
    return QueryFaults(faults=faults, rest=urlencode(kept))


def shown(name: str) -> str:
    """A parameter's name fit to repeat in an error: control characters percent-encoded."""
    return _CONTROL.sub(lambda m: f"%{ord(m.group()):02X}", name[:SHOWN_NAME])


def _bytes(query_string: str) -> bytes:
    try:
        return query_string.encode("latin-1")
    except UnicodeEncodeError:  # a server that decoded it already (ASGI: UTF-8)
        return query_string.encode("utf-8", "surrogateescape")


def _control_message(char: str) -> str:
    if char == "\x00":
        return "must not contain NUL (%00): remove it"
    return f"must not contain the control character U+{ord(char):04X}: remove it"
