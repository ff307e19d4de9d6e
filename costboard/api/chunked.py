"""Chunked request bodies (Transfer-Encoding: chunked, no Content-Length), read for Django.

Django reads Content-Length bytes of a body, so a chunked one reads as empty. gunicorn (what
`make run` serves with) decodes chunked bodies and marks its input `wsgi.input_terminated`
(the WSGI extension that says reading to the end is safe): there the body is read here, up to
`limit` + 1 bytes, and handed on with its Content-Length, so every endpoint's own limits (413)
apply. A server that does not decode them leaves the request as it came, and the API answers
411 naming Content-Length (costboard/api/boundary.py).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def chunked_bodies(app: WsgiApp, *, limit: int) -> WsgiApp:
    """`app` reading the chunked bodies its server has decoded (at most `limit` + 1 bytes)."""

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not environ.get("CONTENT_LENGTH") and environ.get("wsgi.input_terminated"):
            body = environ["wsgi.input"].read(limit + 1)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        return app(environ, start_response)

    return application
