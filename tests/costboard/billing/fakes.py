"""A local stand-in for the providers' billing APIs: a real HTTP server on 127.0.0.1 that
answers OpenAI's organization Costs and Usage (completions) endpoints and Anthropic's cost
report and messages usage report in their documented shapes — daily buckets over the window
asked for, a page of at most `page_size` buckets with `has_more` and an opaque `next_page` —
checks each provider's auth headers, and records every request. Faults (a 429 with
Retry-After, a 5xx, a body that is not JSON, an answer cut off before its Content-Length) are
queued per path, each matched by a test's predicate on the request's parameters; after `hold()`
every request waits for `release()` before it is answered."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.servers import Holding, serve

OPENAI_KEY = "sk-admin-test-openai"
ANTHROPIC_KEY = "sk-ant-admin01-test"
OPENAI_PATHS = {"costs": "/v1/organization/costs", "usage": "/v1/organization/usage/completions"}
ANTHROPIC_PATHS = {
    "costs": "/v1/organizations/cost_report",
    "usage": "/v1/organizations/usage_report/messages",
}
Params = dict[str, list[str]]
CUT = "X-Fake-Cut"  # marks a fault's answer to cut off (never sent)


class Number:
    """A JSON number written exactly as its text (json.dumps would go through float)."""

    def __init__(self, text: str) -> None:
        self.text = text


@dataclass
class Fault:
    status: int
    body: bytes = b'{"error": {"message": "fault"}}'
    headers: dict[str, str] = field(default_factory=dict)
    when: Callable[[Params], bool] = lambda params: True
    times: int = 1  # how many requests it answers (a large number: every one)
    cut: bool = False  # the connection closed halfway through the body its Content-Length told


@dataclass
class Request:
    path: str
    params: Params
    headers: dict[str, str]


@dataclass
class FakeBilling(Holding):
    """Both providers' billing APIs; `results[path][day]` is that day's bucket's results."""

    page_size: int = 2
    results: dict[str, dict[date, list[dict[str, Any]]]] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    base_url: str = ""
    _stop: Callable[[], None] = lambda: None

    def fault(self, path: str, fault: Fault) -> None:
        with self.lock:
            self.faults.setdefault(path, []).append(fault)

    def asked(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def start(self) -> FakeBilling:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.wait_if_held()
                url = urllib.parse.urlsplit(self.path)
                params = urllib.parse.parse_qs(url.query, keep_blank_values=True)
                status, body, headers = fake.answer(url.path, params, dict(self.headers.items()))
                cut = headers.pop(CUT, None) is not None
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if cut:  # half the body told, then the connection closed
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.base_url, self._stop = serve(Handler)
        return self

    def stop(self) -> None:
        self.release()  # a held handler would keep server_close waiting
        self._stop()

    # --- answers ---------------------------------------------------------------------------

    def answer(
        self, path: str, params: Params, headers: dict[str, str]
    ) -> tuple[int, bytes, dict[str, str]]:
        with self.lock:
            self.requests.append(Request(path, params, headers))
            for fault in self.faults.get(path, []):
                if fault.times > 0 and fault.when(params):
                    fault.times -= 1
                    cut = {CUT: "1"} if fault.cut else {}
                    return fault.status, fault.body, {**fault.headers, **cut}
        lowered = {name.lower(): value for name, value in headers.items()}
        if path in OPENAI_PATHS.values():
            if lowered.get("authorization") != f"Bearer {OPENAI_KEY}":
                return 401, b'{"error": {"message": "invalid admin key"}}', {}
            return 200, self._openai(path, params), {}
        if path in ANTHROPIC_PATHS.values():
            if lowered.get("x-api-key") != ANTHROPIC_KEY or not lowered.get("anthropic-version"):
                return 401, b'{"type": "error", "error": {"type": "authentication_error"}}', {}
            return 200, self._anthropic(path, params), {}
        return 404, b'{"error": {"message": "not found"}}', {}

    def _page(self, path: str, days: list[date], params: Params) -> tuple[list[date], Any]:
        limit = min(int(params.get("limit", ["7"])[0]), self.page_size)
        first = 0
        if "page" in params:
            first = int(base64.b64decode(params["page"][0]).decode().removeprefix("page_"))
        chosen = days[first : first + limit]
        after = first + len(chosen)
        more = after < len(days)
        token = base64.b64encode(f"page_{after}".encode()).decode() if more else None
        return chosen, {"has_more": more, "next_page": token}

    def _openai(self, path: str, params: Params) -> bytes:
        start = datetime.fromtimestamp(int(params["start_time"][0]), tz=UTC).date()
        end = datetime.fromtimestamp(int(params["end_time"][0]), tz=UTC).date()
        days = [start + timedelta(days=n) for n in range((end - start).days)]
        chosen, paging = self._page(path, days, params)
        kind = "costs" if path == OPENAI_PATHS["costs"] else "usage.completions"
        data = [
            {
                "object": "bucket",
                "start_time": _epoch(day),
                "end_time": _epoch(day + timedelta(days=1)),
                "results": [
                    {"object": f"organization.{kind}.result", **result}
                    for result in self.results.get(path, {}).get(day, [])
                ],
            }
            for day in chosen
        ]
        return _dumps({"object": "page", "data": data, **paging})

    def _anthropic(self, path: str, params: Params) -> bytes:
        start = _rfc3339_day(params["starting_at"][0])
        end = _rfc3339_day(params["ending_at"][0])
        days = [start + timedelta(days=n) for n in range((end - start).days)]
        chosen, paging = self._page(path, days, params)
        data = [
            {
                "starting_at": f"{day}T00:00:00Z",
                "ending_at": f"{day + timedelta(days=1)}T00:00:00Z",
                "results": self.results.get(path, {}).get(day, []),
            }
            for day in chosen
        ]
        return _dumps({"data": data, **paging})


def _epoch(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())


def _rfc3339_day(text: str) -> date:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).date()


def _dumps(value: Any) -> bytes:
    def exact(item: Any) -> Any:
        if isinstance(item, Number | Decimal):
            return f"\x00{item.text if isinstance(item, Number) else item}\x00"
        raise TypeError(type(item))

    text = json.dumps(value, default=exact)
    return re.sub(r'"\\u0000([^"\\]*)\\u0000"', r"\1", text).encode()
