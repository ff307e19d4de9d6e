"""A project with two weeks of spend: 2026-W46 (Nov 9–15) and 2026-W47 (Nov 16–22), and a step
on the Monday after, which no report of W47 counts. Prices are tests/conftest.py's TEST_RATES
($3 per million input tokens, $15 per million output).

W46: ann $3.00 (customer=acme-corp, test-sonnet), bob $1.50 (no tag, test-haiku).
W47: ann $6.00 (customer=acme-corp), carol $0.30 (customer=<script>…, late on Sunday),
     a session without a user $0.15 (no tag). Total $6.45 against $4.50: +$1.95, +43.3 %.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

from costboard.models import ApiKey
from tests.conftest import Agent, add_price, make_agent

W47 = (date(2026, 11, 16), date(2026, 11, 22))
W46 = (date(2026, 11, 9), date(2026, 11, 15))
# Wednesday of W48: the last complete week (UTC) is W47
NOW = "2026-11-25T10:00:00Z"
SCRIPT = "<script>alert(1)</script>"


@dataclass
class Showback:
    agent: Agent
    read_key: str


def step(session: str, at: str, model: str, **usage: Any) -> dict[str, Any]:
    return {"session_id": session, "step_type": "llm", "model": model, "timestamp": at, **usage}


def spend_two_weeks(agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "p1", "user_id": "ann"},
        {"type": "session", "session_id": "p2", "user_id": "bob"},
        {"type": "session", "session_id": "c1", "user_id": "ann"},
        {"type": "session", "session_id": "c2", "user_id": "carol"},
        {"type": "session", "session_id": "c3"},
        step(
            "p1",
            "2026-11-10T09:00:00Z",
            "test-sonnet",
            input_tokens=1_000_000,
            tags={"customer": "acme-corp"},
        ),
        step("p2", "2026-11-15T23:59:00Z", "test-haiku", output_tokens=100_000),
        step(
            "c1",
            "2026-11-17T09:00:00Z",
            "test-sonnet",
            input_tokens=2_000_000,
            tags={"customer": "acme-corp"},
        ),
        step(
            "c2",
            "2026-11-22T23:30:00Z",
            "test-haiku",
            input_tokens=100_000,
            tags={"customer": SCRIPT},
        ),
        step("c3", "2026-11-18T12:00:00Z", "test-sonnet", output_tokens=10_000),
        # Monday of W48: after the week
        step("c3", "2026-11-23T00:30:00Z", "test-sonnet", output_tokens=500_000),
    )


def showback_made() -> Showback:
    add_price("test-sonnet")
    add_price("test-haiku")
    agent = make_agent(
        "acme",
        report_recipients="ann@example.com, boss@example.com\nnot-an-address",
        report_tag_key="customer",
    )
    spend_two_weeks(agent)
    return Showback(agent, ApiKey.issue(project=agent.project, role="read")[1])
