"""Each provider's raw usage, posted as a user's client sends it, costs what genai-prices
charges for the same response, to the last decimal."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
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
        # audio tokens inside prompt_tokens and completion_tokens, priced at gpt-audio's audio
        # rates ($32 and $64 per million, text $2.50 and $10)
        "openai-chat-audio-rates",
        "openai",
        "chat",
        "gpt-audio",
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
        # more audio than the uncached prompt: the rest of it was read from the cache
        "openai-chat-audio-cached",
        "openai",
        "chat",
        "gpt-audio-mini",
        "openai",
        {
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 500,
                "prompt_tokens_details": {"cached_tokens": 600, "audio_tokens": 600},
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
        # a voice conversation: audio in and out, cached audio at its own rate
        "openai-realtime-audio",
        "openai",
        "realtime",
        "gpt-realtime",
        "openai",
        {
            "response": {
                "usage": {
                    "total_tokens": 9800,
                    "input_tokens": 9000,
                    "output_tokens": 800,
                    "input_token_details": {
                        "text_tokens": 3000,
                        "audio_tokens": 6000,
                        "image_tokens": 0,
                        "cached_tokens": 5000,
                        "cached_tokens_details": {"text_tokens": 1500, "audio_tokens": 3500},
                    },
                    "output_token_details": {"text_tokens": 200, "audio_tokens": 600},
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
        # audio in the prompt, some of it from the cache ($1 and $0.10 per million)
        "gemini-audio-cached",
        "google",
        "default",
        "gemini-2.5-flash",
        "google",
        {
            "modelVersion": "gemini-2.5-flash",
            "usageMetadata": {
                "promptTokenCount": 9000,
                "candidatesTokenCount": 300,
                "cachedContentTokenCount": 4000,
                "thoughtsTokenCount": 100,
                "promptTokensDetails": [
                    {"modality": "TEXT", "tokenCount": 3000},
                    {"modality": "AUDIO", "tokenCount": 6000},
                ],
                "cacheTokensDetails": [
                    {"modality": "TEXT", "tokenCount": 1000},
                    {"modality": "AUDIO", "tokenCount": 3000},
                ],
            },
        },
    ),
    (
        # the Live API: audio in and out ($3 and $12 per million, text $0.50 and $2)
        "gemini-live-audio",
        "google",
        "default",
        "gemini-live-2.5-flash",
        "google",
        {
            "modelVersion": "gemini-live-2.5-flash",
            "usageMetadata": {
                "promptTokenCount": 9000,
                "candidatesTokenCount": 800,
                "promptTokensDetails": [
                    {"modality": "TEXT", "tokenCount": 3000},
                    {"modality": "AUDIO", "tokenCount": 6000},
                ],
                "candidatesTokensDetails": [
                    {"modality": "TEXT", "tokenCount": 200},
                    {"modality": "AUDIO", "tokenCount": 600},
                ],
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


# Each audio case's stored audio counts: (audio input, cached audio, audio output), each part
# of its text count (input_tokens without the cache, cache_read_input_tokens, output_tokens).
STORED_AUDIO = {
    "openai-chat-audio": (600, 0, 400),
    "openai-chat-audio-rates": (600, 0, 400),
    "openai-chat-audio-cached": (400, 200, 400),
    "openai-realtime-text": (0, 0, 0),
    "openai-realtime-audio": (2500, 3500, 600),
    "gemini-audio-cached": (3000, 3000, 0),
    "gemini-live-audio": (6000, 0, 600),
}


@pytest.mark.parametrize(
    ("provider", "model", "response", "audio"),
    [
        pytest.param(case[4], case[3], case[5], STORED_AUDIO[case[0]], id=case[0])
        for case in CASES
        if case[0] in STORED_AUDIO
    ],
)
def test_raw_usage_audio_is_stored_on_the_step_as_parts_of_the_text_counts(
    agent: Agent, provider: str, model: str, response: dict, audio: tuple[int, int, int]
) -> None:
    usage = response.get("usage") or response.get("usageMetadata") or response["response"]["usage"]
    event = {"step_type": "voice", "model": model, "provider": provider, "usage": usage}
    assert agent.post({"events": [event]}).status_code == 200
    stored = Step.objects.get()
    assert stored.audio == audio
    audio_in, audio_read, audio_out = audio
    assert audio_in <= stored.input_tokens
    assert audio_read <= stored.cache_read_input_tokens
    assert audio_out <= stored.output_tokens
    # none is stored as NULL: no room taken in the row
    without = [
        name
        for name, count in zip(
            ("input_audio_tokens", "cache_audio_read_tokens", "output_audio_tokens"),
            audio,
            strict=True,
        )
        if not count
    ]
    assert Step.objects.filter(**{f"{name}__isnull": True for name in without}).count() == 1


def test_audio_sent_as_fields_costs_what_genai_prices_charges(agent: Agent) -> None:
    """A voice step with the audio counts as fields: gpt-realtime's audio at $32 (in), $0.40
    (cached) and $64 (out) per million, the text at $4, $0.40 and $16; each part of the cost
    in the column of its kind, so every rollup stays a sum of steps."""
    prices_sync()
    event = {
        "step_type": "voice",
        "model": "gpt-realtime",
        "provider": "openai",
        "timestamp": WHEN.isoformat(),
        "input_tokens": 4000,
        "input_audio_tokens": 2500,
        "cache_read_input_tokens": 5000,
        "cache_audio_read_tokens": 3500,
        "output_tokens": 800,
        "output_audio_tokens": 600,
    }
    reply = agent.post({"events": [event]})
    assert reply.status_code == 200, reply.content
    theirs = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=9000,
            cache_read_tokens=5000,
            input_audio_tokens=6000,
            cache_audio_read_tokens=3500,
            output_tokens=800,
            output_audio_tokens=600,
        ),
        "gpt-realtime",
        provider_id="openai",
        genai_request_timestamp=WHEN,
    )
    stored = Step.objects.get()
    assert stored.cost_usd == theirs.total_price == Decimal("0.1296")
    # 1500 × $4 + 2500 × $32; 1500 × $0.40 + 3500 × $0.40; 200 × $16 + 600 × $64 (per million)
    assert stored.cost_input_usd == Decimal("0.086")
    assert stored.cost_cache_read_usd == Decimal("0.002")
    assert stored.cost_output_usd == Decimal("0.0416")
    assert stored.cost_cache_write_usd == 0
    session = stored.session
    assert session.cost_usd == stored.cost_usd
    assert (stored.input_audio_tokens, stored.cache_audio_read_tokens) == (2500, 3500)
    assert stored.output_audio_tokens == 600


@pytest.mark.parametrize(
    ("fields", "field", "fix"),
    [
        (
            {"input_tokens": 100, "input_audio_tokens": 101},
            "input_audio_tokens",
            "input_audio_tokens (101) exceeds input_tokens (100): the audio tokens are part of "
            "the uncached input, not in addition to it; send input_tokens with the audio "
            "included",
        ),
        (
            {"cache_read_input_tokens": 10, "cache_audio_read_tokens": 11},
            "cache_audio_read_tokens",
            "cache_audio_read_tokens (11) exceeds cache_read_input_tokens (10): the audio "
            "tokens are part of the cache reads, not in addition to it; send "
            "cache_read_input_tokens with the audio included",
        ),
        (
            {"output_audio_tokens": 5},
            "output_audio_tokens",
            "output_audio_tokens (5) exceeds output_tokens (0): the audio tokens are part of "
            "the output, not in addition to it; send output_tokens with the audio included",
        ),
    ],
)
def test_an_audio_count_past_its_text_count_is_422_naming_the_field_and_nothing_is_stored(
    agent: Agent, fields: dict[str, int], field: str, fix: str
) -> None:
    good = {"step_type": "voice", "model": "gpt-realtime", "input_tokens": 10}
    bad = {"step_type": "voice", "model": "gpt-realtime", **fields}
    reply = agent.post({"events": [good, bad]})
    assert reply.status_code == 422
    assert reply.json()["errors"] == [{"index": 1, "field": field, "message": fix}]
    assert not Step.objects.exists()


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        (
            {
                "prompt_tokens": 100,
                "completion_tokens": 10,
                "prompt_tokens_details": {"audio_tokens": 101},
            },
            "usage.prompt_tokens_details.audio_tokens",
        ),
        (
            {
                "prompt_tokens": 100,
                "completion_tokens": 10,
                "completion_tokens_details": {"audio_tokens": 11},
            },
            "usage.completion_tokens_details.audio_tokens",
        ),
        (
            {
                "input_tokens": 100,
                "output_tokens": 10,
                "input_token_details": {
                    "audio_tokens": 50,
                    "cached_tokens": 40,
                    "cached_tokens_details": {"audio_tokens": 60},
                },
            },
            "usage.input_token_details.audio_tokens",
        ),
        (
            {
                "promptTokenCount": 100,
                "candidatesTokenCount": 10,
                "candidatesTokensDetails": [{"modality": "AUDIO", "tokenCount": 11}],
            },
            "usage.candidatesTokensDetails",
        ),
        (
            {"promptTokenCount": 100, "candidatesTokenCount": 10, "promptTokensDetails": {}},
            "usage.promptTokensDetails",
        ),
    ],
)
def test_a_raw_usage_with_more_audio_than_its_total_is_422_naming_the_field(
    agent: Agent, usage: dict[str, Any], field: str
) -> None:
    event = {"step_type": "voice", "model": "gpt-realtime", "usage": usage}
    reply = agent.post({"events": [event]})
    assert reply.status_code == 422
    assert [error["field"] for error in reply.json()["errors"]] == [field]
    assert not Step.objects.exists()


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


# A voice call's audio over OTLP: OpenInference's prompt_details / completion_details, and
# the gen_ai.usage.*_audio_tokens of LiveKit Agents (OTel's own conventions have none).
OTLP_AUDIO_KEYS = [
    pytest.param(
        "llm.token_count.prompt_details.audio",
        "llm.token_count.completion_details.audio",
        id="openinference",
    ),
    pytest.param(
        "gen_ai.usage.input_audio_tokens", "gen_ai.usage.output_audio_tokens", id="livekit"
    ),
]


@pytest.mark.parametrize(("audio_in_key", "audio_out_key"), OTLP_AUDIO_KEYS)
def test_otlp_audio_costs_what_genai_prices_charges(
    agent: Agent, audio_in_key: str, audio_out_key: str
) -> None:
    prices_sync()
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.response.model": "gpt-realtime",
        "gen_ai.usage.input_tokens": 9000,
        "gen_ai.usage.cache_read.input_tokens": 2000,
        audio_in_key: 6000,
        "gen_ai.usage.output_tokens": 800,
        audio_out_key: 600,
    }
    start = int(WHEN.timestamp()) * 10**9
    spans = spans_of(lambda tracer: span(tracer, "chat gpt-realtime", attributes, start=start))
    assert not parsed(post_spans(agent, spans)).HasField("partial_success")
    stored = Step.objects.get()
    theirs = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=9000,
            cache_read_tokens=2000,
            input_audio_tokens=6000,
            cache_audio_read_tokens=0,
            output_tokens=800,
            output_audio_tokens=600,
        ),
        "gpt-realtime",
        provider_id="openai",
        genai_request_timestamp=WHEN,
    )
    assert stored.audio == (6000, 0, 600)
    assert stored.cost_usd == theirs.total_price == Decimal("0.2384")


def test_an_otlp_span_with_more_audio_than_output_is_rejected_naming_it(agent: Agent) -> None:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.response.model": "gpt-realtime",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.usage.output_audio_tokens": 6,
    }
    response = parsed(post_spans(agent, spans_of(lambda tracer: span(tracer, "chat", attributes))))
    assert response.partial_success.rejected_spans == 1
    assert (
        "gen_ai.usage.output_audio_tokens (6) exceeds gen_ai.usage.output_tokens (5)"
        in response.partial_success.error_message
    )
    assert not Step.objects.exists()


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
