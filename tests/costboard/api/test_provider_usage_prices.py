"""Each provider's raw usage, posted as a user's client sends it, costs what genai-prices
charges for the same response, to the last decimal."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import genai_prices
import pytest

from costboard.models import Step
from costboard.pricing.names import canonical_provider
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent
from tests.otlp_spans import parsed, post_spans, span, spans_of

pytestmark = pytest.mark.django_db

WHEN = datetime(2026, 11, 20, 12, tzinfo=UTC)

# (id, genai-prices provider, api flavor, model, provider as the client names it, response)
CASES: list[tuple[str, str, str, str, str, dict[str, Any]]] = [
    (
        "openai-chat-cached-reasoning",
        "openai",
        "chat",
        "o3",
        "openai",
        {
            "usage": {
                "prompt_tokens": 12000,
                "completion_tokens": 3000,
                "total_tokens": 15000,
                "prompt_tokens_details": {"cached_tokens": 8000},
                "completion_tokens_details": {"reasoning_tokens": 2000},
            }
        },
    ),
    (
        # audio tokens are inside prompt_tokens and completion_tokens; this model's price has
        # no audio rate (docs/pricing.md: modality rates are not modelled)
        "openai-chat-audio",
        "openai",
        "chat",
        "gpt-4o-audio-preview",
        "openai",
        {
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 500,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 600},
                "completion_tokens_details": {"audio_tokens": 400},
            }
        },
    ),
    (
        "openai-responses",
        "openai",
        "responses",
        "gpt-5",
        "openai",
        {
            "usage": {
                "input_tokens": 50000,
                "output_tokens": 4000,
                "total_tokens": 54000,
                "input_tokens_details": {"cached_tokens": 30000},
                "output_tokens_details": {"reasoning_tokens": 3000},
            }
        },
    ),
    (
        # the Realtime API's response.done usage, a text-only conversation: "token", singular
        "openai-realtime-text",
        "openai",
        "realtime",
        "gpt-realtime",
        "openai",
        {
            "response": {
                "usage": {
                    "total_tokens": 9300,
                    "input_tokens": 9000,
                    "output_tokens": 300,
                    "input_token_details": {
                        "text_tokens": 9000,
                        "audio_tokens": 0,
                        "image_tokens": 0,
                        "cached_tokens": 8192,
                        "cached_tokens_details": {"text_tokens": 8192},
                    },
                    "output_token_details": {"text_tokens": 300, "audio_tokens": 0},
                }
            }
        },
    ),
    (
        "anthropic-5m-1h",
        "anthropic",
        "default",
        "claude-sonnet-4-5",
        "anthropic",
        {
            "usage": {
                "input_tokens": 3000,
                "output_tokens": 700,
                "cache_read_input_tokens": 40000,
                "cache_creation_input_tokens": 15000,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 5000,
                    "ephemeral_1h_input_tokens": 10000,
                },
            }
        },
    ),
    (
        "anthropic-long-context",
        "anthropic",
        "default",
        "claude-sonnet-4-5",
        "anthropic",
        {
            "usage": {
                "input_tokens": 150000,
                "output_tokens": 700,
                "cache_read_input_tokens": 40000,
                "cache_creation_input_tokens": 15000,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 5000,
                    "ephemeral_1h_input_tokens": 10000,
                },
            }
        },
    ),
    (
        "anthropic-opus-1h-only",
        "anthropic",
        "default",
        "claude-opus-4-1",
        "anthropic",
        {
            "usage": {
                "input_tokens": 30,
                "output_tokens": 900,
                "cache_creation_input_tokens": 12000,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 0,
                    "ephemeral_1h_input_tokens": 12000,
                },
            }
        },
    ),
    (
        "gemini-cache-thoughts",
        "google",
        "default",
        "gemini-2.5-pro",
        "google",
        {
            "modelVersion": "gemini-2.5-pro",
            "usageMetadata": {
                "promptTokenCount": 90000,
                "candidatesTokenCount": 1000,
                "cachedContentTokenCount": 60000,
                "thoughtsTokenCount": 2500,
                "totalTokenCount": 93500,
            },
        },
    ),
    (
        "bedrock-converse",
        "aws",
        "default",
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "aws.bedrock",
        {
            "usage": {
                "inputTokens": 2000,
                "outputTokens": 500,
                "cacheReadInputTokens": 30000,
                "cacheWriteInputTokens": 8000,
                "totalTokens": 40500,
            }
        },
    ),
    (
        "bedrock-converse-1h",
        "aws",
        "default",
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "aws.bedrock",
        {
            "usage": {
                "inputTokens": 2000,
                "outputTokens": 500,
                "cacheReadInputTokens": 30000,
                "cacheWriteInputTokens": 8000,
                "totalTokens": 40500,
                "cacheDetails": [
                    {"ttl": "5m", "inputTokens": 3000},
                    {"ttl": "1h", "inputTokens": 5000},
                ],
            }
        },
    ),
    (
        "bedrock-anthropic",
        "aws",
        "anthropic",
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "aws.bedrock",
        {
            "usage": {
                "input_tokens": 2000,
                "output_tokens": 500,
                "cache_read_input_tokens": 30000,
                "cache_creation_input_tokens": 8000,
            }
        },
    ),
    (
        "azure-chat",
        "azure",
        "chat",
        "gpt-4o",
        "azure",
        {
            "usage": {
                "prompt_tokens": 12000,
                "completion_tokens": 3000,
                "prompt_tokens_details": {"cached_tokens": 8000},
            }
        },
    ),
    (
        "xai-chat-reasoning",
        "x-ai",
        "chat",
        "grok-3-mini",
        "xai",
        {
            "usage": {
                "prompt_tokens": 1200,
                "completion_tokens": 300,
                "total_tokens": 2400,
                "prompt_tokens_details": {"cached_tokens": 200},
                "completion_tokens_details": {"reasoning_tokens": 900},
            }
        },
    ),
    (
        "deepseek-chat",
        "deepseek",
        "chat",
        "deepseek-chat",
        "deepseek",
        {
            "usage": {
                "prompt_tokens": 1200,
                "completion_tokens": 300,
                "prompt_tokens_details": {"cached_tokens": 1000},
            }
        },
    ),
]


@pytest.mark.parametrize(
    ("provider_id", "flavor", "model", "provider", "response"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_raw_usage_costs_what_genai_prices_charges(
    agent: Agent, provider_id: str, flavor: str, model: str, provider: str, response: dict
) -> None:
    prices_sync()
    extracted = genai_prices.extract_usage(
        {"model": model, **response}, provider_id=provider_id, api_flavor=flavor
    )
    theirs = genai_prices.calc_price(
        extracted.usage, model, provider_id=provider_id, genai_request_timestamp=WHEN
    )
    usage = response.get("usage") or response.get("usageMetadata") or response["response"]["usage"]
    reply = agent.post(
        {
            "events": [
                {
                    "step_type": "response",
                    "model": model,
                    "provider": provider,
                    "usage": usage,
                    "timestamp": WHEN.isoformat(),
                }
            ]
        }
    )
    assert reply.status_code == 200, reply.content
    stored = Step.objects.get()
    assert stored.price_id is not None
    assert stored.cost_usd == theirs.total_price > 0


# OpenTelemetry's GenAI attributes: the input total includes the cache reads and writes.
OTLP_CASES = [
    pytest.param("openai", "gpt-4o", 12000, 3000, 8000, 0, id="openai"),
    pytest.param("anthropic", "claude-sonnet-4-5", 58000, 700, 40000, 15000, id="anthropic"),
    pytest.param(
        "anthropic", "claude-sonnet-4-5", 205000, 700, 40000, 15000, id="anthropic-long-context"
    ),
    pytest.param("gcp.gemini", "gemini-2.5-pro", 90000, 1000, 60000, 0, id="gemini"),
    pytest.param(
        "aws.bedrock",
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        40000,
        500,
        30000,
        8000,
        id="bedrock",
    ),
]


@pytest.mark.parametrize(
    ("provider", "model", "input_total", "output", "cache_read", "cache_write"), OTLP_CASES
)
def test_otlp_usage_costs_what_genai_prices_charges(
    agent: Agent,
    provider: str,
    model: str,
    input_total: int,
    output: int,
    cache_read: int,
    cache_write: int,
) -> None:
    prices_sync()
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.response.model": model,
        "gen_ai.usage.input_tokens": input_total,
        "gen_ai.usage.output_tokens": output,
        "gen_ai.usage.cache_read.input_tokens": cache_read,
        "gen_ai.usage.cache_creation.input_tokens": cache_write,
    }
    start = int(WHEN.timestamp()) * 10**9
    spans = spans_of(lambda tracer: span(tracer, f"chat {model}", attributes, start=start))
    assert not parsed(post_spans(agent, spans)).HasField("partial_success")
    stored = Step.objects.get()
    theirs = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=input_total,
            output_tokens=output,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        ),
        model,
        provider_id=canonical_provider(provider),
        genai_request_timestamp=WHEN,
    )
    assert stored.price_id is not None
    assert stored.cost_usd == theirs.total_price


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        (
            {"inputTokens": 10, "outputTokens": 1, "cacheDetails": {"ttl": "1h"}},
            "usage.cacheDetails",
        ),
        (
            {
                "inputTokens": 10,
                "outputTokens": 1,
                "cacheDetails": [{"ttl": "1h", "inputTokens": -1}],
            },
            "usage.cacheDetails.0.inputTokens",
        ),
        ({"inputTokens": 10, "outputTokens": 1.5}, "usage.outputTokens"),
    ],
)
def test_a_bad_bedrock_usage_is_422_naming_the_field(
    agent: Agent, usage: dict[str, Any], field: str
) -> None:
    reply = agent.post(
        {"events": [{"step_type": "response", "model": "test-sonnet", "usage": usage}]}
    )
    assert reply.status_code == 422
    assert [error["field"] for error in reply.json()["errors"]] == [field]
    assert not Step.objects.exists()
