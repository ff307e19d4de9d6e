"""Compressed request bodies (docs/api.md, "Compressed bodies"): `Content-Encoding: gzip` on
the API's JSON bodies, as gateways and OpenTelemetry exporters send them.

A body is decompressed with a bound: never more than `limit` bytes (plus one, to tell that it
is over) come out of the inflater, whatever the compressed body claims, so a few kilobytes
that would inflate to gigabytes (a gzip bomb) cost `limit` bytes of memory and are refused
413. What the endpoint validates, counts against its limits and hashes for an
Idempotency-Key is the decompressed body: the same batch sent plain or gzip is the same batch.

gzip (and its old alias x-gzip) is the one coding accepted, alone or beside `identity`; any
other (br, deflate, zstd) is 415 with `Accept-Encoding: gzip` (RFC 7694). A body that is not
the gzip it claims to be is 400 naming Content-Encoding; a Content-Length that is not a
size in bytes (digits 0-9), 400 naming Content-Length. Refusals are `BodyRefused`, which
costboard/api/boundary.py's read_body answers as any API refusal (this module sits below it).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from django.http import HttpRequest

from costboard.input_limits import digit_count

HEADER = "Content-Encoding"
GZIP = "gzip"
# RFC 9110 §8.4.1.3: x-gzip is gzip; identity is no coding at all
_GZIP_NAMES = ("gzip", "x-gzip")
_NO_CODING = ("", "identity")
_GZIP_WINDOW = 16 + zlib.MAX_WBITS  # a gzip header and trailer around deflate data
# A Content-Length's digits at most: 10^18 bytes, past any body, within a 64-bit integer.
MAX_LENGTH_DIGITS = 18


class BodyRefused(Exception):
    """The body cannot be read as sent: an HTTP status, the field at fault, a message naming
    the fix, and the headers to answer with."""

    def __init__(
        self, status: int, field: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
        self.headers = dict(headers or {})


def content_coding(request: HttpRequest) -> str | None:
    """The body's coding: "gzip", or None for a plain body; 415 for any other coding."""
    named = [
        part.strip().lower()
        for part in request.headers.get(HEADER, "").split(",")
        if part.strip().lower() not in _NO_CODING
    ]
    if not named:
        return None
    if len(named) == 1 and named[0] in _GZIP_NAMES:
        return GZIP
    raise BodyRefused(
        415,
        HEADER,
        f"unsupported {', '.join(named)[:60]!r}: send the body as it is, or compressed with "
        "Content-Encoding: gzip",
        headers={"Accept-Encoding": GZIP},
    )


def gunzip(body: bytes, *, limit: int, what: str) -> bytes:
    """A gzip body decompressed (several gzip members one after the other, as RFC 1952
    allows, are read in turn), refused 413 as soon as it grows past `limit` bytes and 400 if
    it is not whole, valid gzip."""
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(_GZIP_WINDOW)
        try:
            # at most limit + 1 bytes out: the bound, and one more to know it was passed
            out += inflater.decompress(rest, limit - len(out) + 1)
        except zlib.error as exc:
            raise BodyRefused(
                400,
                HEADER,
                f"Content-Encoding is gzip but the body is not gzip ({exc}): "
                "compress the body with gzip, or leave out the header",
            ) from None
        if len(out) > limit:
            raise BodyRefused(
                413,
                "body",
                f"the body decompresses to more than {limit} bytes; at most "
                f"{limit} decompressed: {what}",
            )
        if not inflater.eof:
            raise BodyRefused(
                400,
                HEADER,
                "the gzip body ends before its gzip stream does: send the whole compressed body",
            )
        rest = inflater.unused_data
        if not rest:
            return bytes(out)


def content_length(request: HttpRequest) -> int:
    """The Content-Length the request came with (0 without one), or 400 naming it when it is
    not a size in bytes: digits 0-9 alone (RFC 9110 §8.6), at most MAX_LENGTH_DIGITS of them.
    str.isdigit() alone takes '²' and Arabic-Indic digits, which int() (Django's reading of
    the body too) refuses, as it refuses thousands of digits: a 500, were they let through."""
    raw = request.META.get("CONTENT_LENGTH") or ""
    if not raw:
        return 0
    length = digit_count(raw.strip(" \t"), 10**MAX_LENGTH_DIGITS - 1)  # OWS around a value
    if length is None:
        shown = repr(raw) if len(raw) <= 20 else repr(raw[:20]) + "..."
        raise BodyRefused(
            400,
            "Content-Length",
            f"is {shown}, not a size in bytes: send the body's length in bytes as digits "
            f"0-9 (at most {MAX_LENGTH_DIGITS}), e.g. Content-Length: 512",
        )
    return length


def decoded_body(request: HttpRequest, *, limit: int, what: str) -> bytes:
    """The body as the endpoint reads it: decompressed if it came gzip, at most `limit` bytes
    either way (413 past it, compressed or not, told by Content-Length before it is read)."""
    coding = content_coding(request)
    size = content_length(request)
    if size <= limit:
        size = len(request.body)
    if size > limit:
        sent = "compressed body" if coding else "body"
        raise BodyRefused(413, "body", f"{sent} is {size} bytes; at most {limit}: {what}")
    if coding is None:
        return request.body
    return gunzip(request.body, limit=limit, what=what)
