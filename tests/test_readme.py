"""The README's example request, sent as written, answers what the README shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from costboard.pricing.sync import prices_sync
from tests.conftest import make_agent

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def test_the_readme_events_example_answers_as_shown() -> None:
    text = README.read_text()
    request = re.search(r"api/v1/events .*?-d '(\{\"events\".*?\})'\n```", text, re.S)
    answer = re.search(r"stop when `state` is `exhausted`:\n\n```json\n(.*?)\n```", text, re.S)
    assert request is not None and answer is not None
    prices_sync()
    agent = make_agent("support-bot")
    response = agent.client.post(
        "/api/v1/events",
        data=request.group(1),
        content_type="application/json",
        headers={"authorization": f"Bearer {agent.key}"},
    )
    assert response.status_code == 200
    assert response.json() == json.loads(answer.group(1))
