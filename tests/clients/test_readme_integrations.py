"""docs/integrations.md's "From LiteLLM", "From the LiteLLM proxy" and "From LangChain" snippets,
run as written (offline: their models answer with mock responses) against a live test server; the
proxy is the real `litellm` proxy, started on a free 127.0.0.1 port and stopped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import litellm
import openai
import pytest
import yaml
from genai_prices import Usage, calc_price

from costboard.models import PeriodBudget, Session, Step
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent, make_agent
from tests.servers import free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
INTEGRATIONS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
MASTER_KEY = "sk-costboard-test-0123456789abcdef"


def snippet(heading: str, language: str, index: int = 0) -> str:
    """The `index`-th fenced `language` block of the section `## heading` of
    docs/integrations.md (up to the next heading of that level)."""
    text = INTEGRATIONS.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else None]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)[index]


@pytest.fixture
def acme(transactional_db: None) -> Agent:
    prices_sync()
    return make_agent("acme")


@pytest.fixture
def costboard_env(live_server: Any, acme: Agent, monkeypatch: pytest.MonkeyPatch) -> Agent:
    monkeypatch.setenv("COSTBOARD_URL", live_server.url)
    monkeypatch.setenv("COSTBOARD_API_KEY", acme.key)
    return acme


def gpt_4o(**tokens: int) -> Any:
    return calc_price(Usage(**tokens), "gpt-4o", provider_id="openai").total_price


def test_from_litellm(costboard_env: Agent) -> None:
    namespace: dict[str, Any] = {}
    before = list(litellm.callbacks)
    try:
        exec(snippet("From LiteLLM", "python"), namespace)
    finally:
        logger = namespace.get("costboard")
        litellm.callbacks = before
        if logger is not None:
            litellm.logging_callback_manager.remove_callback_from_all_lists(logger)
            logger.client.close(timeout=5)
    [step] = Step.objects.filter(session__external_id="chat-42")
    assert step.event_id == namespace["response"].id
    assert (step.model, step.input_tokens, step.output_tokens, step.turn.number) == (  # type: ignore[union-attr]
        "gpt-4o",
        10,
        20,
        1,
    )
    assert step.cost_usd == gpt_4o(input_tokens=10, output_tokens=20)
    assert step.tags == {"feature": "search"}
    assert Session.objects.get(external_id="chat-42").user_id == "u-7"


def test_from_langchain(costboard_env: Agent) -> None:
    namespace: dict[str, Any] = {}
    try:
        exec(snippet("From LangChain", "python"), namespace)
    finally:
        if "costboard" in namespace:
            namespace["costboard"].client.close(timeout=5)
    [step] = Step.objects.filter(session__external_id="chat-42")
    assert (step.input_tokens, step.cache_read_input_tokens, step.output_tokens) == (200, 1000, 20)
    assert step.cost_usd == gpt_4o(input_tokens=1200, cache_read_tokens=1000, output_tokens=20)
    assert step.tags == {"feature": "search"}
    assert Session.objects.get(external_id="chat-42").user_id == "u-7"


@pytest.fixture
def proxy(costboard_env: Agent, live_server: Any, tmp_path: Path) -> Iterator[str]:
    """The real LiteLLM proxy with the documented config, on a free port; its URL."""
    config = tmp_path / "litellm.yaml"
    config.write_text(snippet("From the LiteLLM proxy", "yaml"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # no proxy database
    env.update(
        COSTBOARD_URL=live_server.url,
        COSTBOARD_API_KEY=costboard_env.key,
        LITELLM_MASTER_KEY=MASTER_KEY,
        OPENAI_API_KEY="sk-never-used",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    binary = str(Path(sys.executable).with_name("litellm"))
    log = (tmp_path / "proxy.log").open("wb")
    process = subprocess.Popen(
        [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def alive() -> bool:
            assert process.poll() is None, (tmp_path / "proxy.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health/liveliness", timeout=1):
                    return True
            except OSError:
                return False

        wait_until(alive, what="the LiteLLM proxy to start", timeout=90, every=0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def stored_steps(session: str, count: int) -> list[Step]:
    def enough() -> list[Step]:
        steps = list(Step.objects.filter(session__external_id=session))
        return steps if len(steps) >= count else []

    return wait_until(enough, what=f"{count} steps of {session} stored")


def test_the_documented_proxy_config_reads_its_master_key_from_the_environment() -> None:
    # today's proxy refuses to start without a master key (general_settings.master_key, or
    # LITELLM_MASTER_KEY); the config says where it comes from, as LiteLLM's refusal asks
    config = yaml.safe_load(snippet("From the LiteLLM proxy", "yaml"))
    assert config["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}
    assert "LITELLM_MASTER_KEY=" in snippet("From the LiteLLM proxy", "sh")


def test_from_the_litellm_proxy(
    proxy: str, costboard_env: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = PeriodBudget.objects.create(
        project=costboard_env.project,
        name="daily tokens",
        period="day",
        token_limit=50,
        action="stop",
    )
    costboard_env.events({"type": "session", "session_id": "chat-42", "token_cap": 25})
    monkeypatch.setenv("LITELLM_MASTER_KEY", MASTER_KEY)
    caller = snippet("From the LiteLLM proxy", "python").replace("http://127.0.0.1:4000", proxy)

    namespace: dict[str, Any] = {}
    exec(caller, namespace)
    assert namespace["answer"].choices[0].message.content == "Three flights found."
    [step] = stored_steps("chat-42", 1)
    assert step.event_id == namespace["answer"].id
    assert (step.model, step.provider, step.input_tokens, step.output_tokens) == (
        "gpt-4o",
        "openai",
        10,
        20,
    )
    assert step.cost_usd == gpt_4o(input_tokens=10, output_tokens=20)
    assert step.tags == {"feature": "search"}
    session = Session.objects.get(external_id="chat-42")
    assert session.user_id == "u-7"
    assert session.tokens_used == 30  # of 25: exhausted

    # The proxy's client has read the ingest response by now, or its check waits for it.
    with pytest.raises(openai.BadRequestError) as refused:
        exec(caller, {})
    message = str(refused.value)
    assert "costboard: session 'chat-42' has exhausted its budget" in message
    assert "tokens 30/25" in message

    # Another session, no cap of its own: its call takes the daily stop-budget to 60 of 50
    other = caller.replace("chat-42", "chat-43")
    exec(other, {})
    stored_steps("chat-43", 1)
    with pytest.raises(openai.BadRequestError) as stopped:
        exec(other, {})
    message = str(stopped.value)
    named = f"costboard: session 'chat-43' is stopped by budget 'daily tokens' (budget:{budget.pk})"
    assert named in message
    assert "tokens 60/50" in message

    # Another key is refused (a proxy without a database of keys says "No connected db.")
    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-not-the-key")
    with pytest.raises(openai.APIStatusError) as unknown:
        exec(caller.replace("chat-42", "chat-44"), {})
    assert unknown.value.status_code in (400, 401)
    assert "costboard" not in str(unknown.value)

    time.sleep(0.5)  # had the provider been called for a refused call, its step would be in
    assert Step.objects.filter(session__external_id="chat-42").count() == 1
    assert Step.objects.filter(session__external_id="chat-43").count() == 1
    assert not Step.objects.filter(session__external_id="chat-44").exists()
