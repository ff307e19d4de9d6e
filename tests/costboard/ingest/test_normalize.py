from __future__ import annotations

from decimal import Decimal

import pytest

from costboard.ingest.normalize import Tokens, UsageError, normalize_usage


def test_anthropic_usage_is_taken_as_is() -> None:
    tokens = normalize_usage(
        {
            "input_tokens": 12,
            "output_tokens": 340,
            "cache_read_input_tokens": 45_000,
            "cache_creation_input_tokens": 2_000,
            "cache_creation": {"ephemeral_5m_input_tokens": 500, "ephemeral_1h_input_tokens": 1500},
            "output_tokens_details": {"thinking_tokens": 120},
        }
    )
    assert tokens == Tokens(
        input_tokens=12,
        output_tokens=340,
        cache_read_input_tokens=45_000,
        cache_creation_input_tokens=2_000,
        cache_creation_1h_input_tokens=1_500,
        reasoning_tokens=120,
    )


def test_openai_chat_cached_tokens_are_moved_out_of_the_prompt() -> None:
    tokens = normalize_usage(
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 64},
        }
    )
    assert tokens == Tokens(
        input_tokens=86, output_tokens=300, cache_read_input_tokens=1920, reasoning_tokens=64
    )


def test_openai_responses_cached_tokens_are_moved_out_of_the_input() -> None:
    tokens = normalize_usage(
        {
            "input_tokens": 5000,
            "input_tokens_details": {"cached_tokens": 4096},
            "output_tokens": 800,
            "output_tokens_details": {"reasoning_tokens": 500},
            "total_tokens": 5800,
        }
    )
    assert tokens == Tokens(
        input_tokens=904, output_tokens=800, cache_read_input_tokens=4096, reasoning_tokens=500
    )


def test_openai_cache_writes_are_moved_out_of_the_prompt_too() -> None:
    """Newer OpenAI usage reports cache writes beside cache reads, both inside the prompt."""
    chat = normalize_usage(
        {
            "prompt_tokens": 5000,
            "completion_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 3000, "cache_write_tokens": 1500},
        }
    )
    assert (chat.input_tokens, chat.cache_read_input_tokens, chat.cache_creation_input_tokens) == (
        500,
        3000,
        1500,
    )
    responses = normalize_usage(
        {
            "input_tokens": 5000,
            "output_tokens": 40,
            "total_tokens": 5040,
            "input_tokens_details": {"cached_tokens": 3000, "cache_write_tokens": 1500},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    )
    assert (
        responses.input_tokens,
        responses.cache_read_input_tokens,
        responses.cache_creation_input_tokens,
    ) == (500, 3000, 1500)
    with pytest.raises(UsageError) as error:
        normalize_usage(
            {
                "prompt_tokens": 100,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 80, "cache_write_tokens": 30},
            }
        )
    assert "cache_write_tokens" in str(error.value)


def test_litellms_one_hour_cache_writes_are_kept_apart() -> None:
    """LiteLLM translates Anthropic's usage into OpenAI Chat's shape, the writes' split by
    cache lifetime in prompt_tokens_details.cache_creation_token_details: the 1-hour ones are
    priced above the 5-minute ones."""
    tokens = normalize_usage(
        {
            "prompt_tokens": 1811,
            "completion_tokens": 11,
            "prompt_tokens_details": {
                "cached_tokens": 1301,
                "cache_write_tokens": 503,
                "cache_creation_token_details": {
                    "ephemeral_5m_input_tokens": 102,
                    "ephemeral_1h_input_tokens": 401,
                },
            },
        }
    )
    assert tokens == Tokens(
        input_tokens=7,
        output_tokens=11,
        cache_read_input_tokens=1301,
        cache_creation_input_tokens=503,
        cache_creation_1h_input_tokens=401,
    )


def test_gemini_thoughts_are_billed_as_output() -> None:
    tokens = normalize_usage(
        {
            "promptTokenCount": 1000,
            "cachedContentTokenCount": 600,
            "candidatesTokenCount": 50,
            "thoughtsTokenCount": 200,
        }
    )
    assert tokens == Tokens(
        input_tokens=400, output_tokens=250, cache_read_input_tokens=600, reasoning_tokens=200
    )


def test_a_whole_json_number_is_accepted_and_a_fraction_is_not() -> None:
    assert normalize_usage({"input_tokens": Decimal("10"), "output_tokens": 1}).input_tokens == 10
    with pytest.raises(UsageError) as caught:
        normalize_usage({"input_tokens": Decimal("10.5"), "output_tokens": 1})
    assert caught.value.field == "usage.input_tokens"


def test_cached_tokens_larger_than_the_prompt_are_refused() -> None:
    with pytest.raises(UsageError) as caught:
        normalize_usage(
            {
                "prompt_tokens": 10,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 11},
            }
        )
    assert caught.value.field == "usage.prompt_tokens_details.cached_tokens"
    assert "cannot be larger" in str(caught.value)


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"input_tokens": -1, "output_tokens": 0}, "usage.input_tokens"),
        ({"prompt_tokens": "12", "completion_tokens": 1}, "usage.prompt_tokens"),
        ({"input_tokens": True, "output_tokens": 0}, "usage.input_tokens"),
        ({"tokens": 5}, "usage"),
        ({"prompt_tokens": 1, "prompt_tokens_details": [1]}, "usage.prompt_tokens_details"),
    ],
)
def test_unreadable_usage_names_the_field(usage: dict[str, object], field: str) -> None:
    with pytest.raises(UsageError) as caught:
        normalize_usage(usage)
    assert caught.value.field == field


# Gemini's usageMetadata of a call whose tools' prompts (a search's results, fed back) are
# reported beside promptTokenCount: 150,000 + 60,000 input, past gemini-2.5-pro's 200k tier
GEMINI_WITH_TOOL_PROMPTS = {
    "promptTokenCount": 150_000,
    "cachedContentTokenCount": 20_000,
    "candidatesTokenCount": 500,
    "thoughtsTokenCount": 300,
    "toolUsePromptTokenCount": 60_000,
    "totalTokenCount": 210_800,
}


def test_gemini_tool_use_prompt_tokens_are_billed_as_input() -> None:
    # toolUsePromptTokenCount (a search's results fed back) is beside promptTokenCount, not
    # inside it; Google bills it as input, as genai-prices' own usage extractor counts it
    tokens = normalize_usage(GEMINI_WITH_TOOL_PROMPTS)
    assert tokens == Tokens(
        input_tokens=190_000,
        output_tokens=800,
        cache_read_input_tokens=20_000,
        reasoning_tokens=300,
    )


def test_openai_chat_audio_is_kept_as_part_of_the_input_and_output() -> None:
    tokens = normalize_usage(
        {
            "prompt_tokens": 1000,
            "completion_tokens": 500,
            "prompt_tokens_details": {"cached_tokens": 100, "audio_tokens": 600},
            "completion_tokens_details": {"audio_tokens": 400},
        }
    )
    assert tokens == Tokens(
        input_tokens=900,
        output_tokens=500,
        cache_read_input_tokens=100,
        input_audio_tokens=600,
        output_audio_tokens=400,
    )


def test_chat_audio_past_the_uncached_prompt_was_read_from_the_cache() -> None:
    # 700 audio tokens in a prompt of 1000 with 600 cached: at least 300 of them were cached
    tokens = normalize_usage(
        {
            "prompt_tokens": 1000,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 600, "audio_tokens": 700},
        }
    )
    assert (tokens.input_tokens, tokens.input_audio_tokens) == (400, 400)
    assert (tokens.cache_read_input_tokens, tokens.cache_audio_read_tokens) == (600, 300)


def test_realtime_cached_audio_is_read_from_its_cached_tokens_details() -> None:
    tokens = normalize_usage(
        {
            "input_tokens": 9000,
            "output_tokens": 800,
            "input_token_details": {
                "text_tokens": 3000,
                "audio_tokens": 6000,
                "cached_tokens": 5000,
                "cached_tokens_details": {"text_tokens": 1500, "audio_tokens": 3500},
            },
            "output_token_details": {"text_tokens": 200, "audio_tokens": 600},
        }
    )
    assert tokens == Tokens(
        input_tokens=4000,
        output_tokens=800,
        cache_read_input_tokens=5000,
        input_audio_tokens=2500,
        cache_audio_read_tokens=3500,
        output_audio_tokens=600,
    )


def test_gemini_audio_is_read_from_its_modality_details() -> None:
    tokens = normalize_usage(
        {
            "promptTokenCount": 9000,
            "cachedContentTokenCount": 4000,
            "candidatesTokenCount": 800,
            "toolUsePromptTokenCount": 100,
            "promptTokensDetails": [
                {"modality": "TEXT", "tokenCount": 3000},
                {"modality": "AUDIO", "tokenCount": 6000},
            ],
            "toolUsePromptTokensDetails": [{"modality": "AUDIO", "tokenCount": 100}],
            "cacheTokensDetails": [{"modality": "AUDIO", "tokenCount": 3000}],
            "candidatesTokensDetails": [{"modality": "AUDIO", "tokenCount": 600}],
        }
    )
    assert tokens == Tokens(
        input_tokens=5100,
        output_tokens=800,
        cache_read_input_tokens=4000,
        input_audio_tokens=3100,
        cache_audio_read_tokens=3000,
        output_audio_tokens=600,
    )


@pytest.mark.parametrize(
    ("usage", "field", "message"),
    [
        (
            {
                "prompt_tokens": 100,
                "completion_tokens": 1,
                "prompt_tokens_details": {"audio_tokens": 101},
            },
            "usage.prompt_tokens_details.audio_tokens",
            "usage.prompt_tokens_details.audio_tokens (101) exceeds usage.prompt_tokens less "
            "its cache writes (100); the audio tokens are part of usage.prompt_tokens less its "
            "cache writes, so they cannot be more",
        ),
        (
            {
                "prompt_tokens": 100,
                "completion_tokens": 1,
                "completion_tokens_details": {"audio_tokens": 2},
            },
            "usage.completion_tokens_details.audio_tokens",
            "usage.completion_tokens_details.audio_tokens (2) exceeds usage.completion_tokens "
            "(1); the audio tokens are part of usage.completion_tokens, so they cannot be more",
        ),
        (
            {
                "input_tokens": 100,
                "output_tokens": 1,
                "input_token_details": {
                    "audio_tokens": 50,
                    "cached_tokens": 40,
                    "cached_tokens_details": {"audio_tokens": 41},
                },
            },
            "usage.input_token_details.audio_tokens",
            "the cached audio tokens (41) exceed the audio tokens (50) or the cached tokens "
            "(40); they are part of both, so they cannot be more",
        ),
        (
            {"promptTokenCount": 1, "promptTokensDetails": [5, {"modality": "AUDIO"}]},
            "usage.promptTokensDetails.0",
            "usage.promptTokensDetails.0 must be an object",
        ),
        (
            {
                "promptTokenCount": 1,
                "promptTokensDetails": [{"modality": "AUDIO", "tokenCount": -1}],
            },
            "usage.promptTokensDetails.0.tokenCount",
            "usage.promptTokensDetails.0.tokenCount must be >= 0, got -1",
        ),
        (
            {
                "input_tokens": 1,
                "output_tokens": 1,
                "input_token_details": {"cached_tokens_details": 3},
            },
            "usage.input_token_details.cached_tokens_details",
            "usage.input_token_details.cached_tokens_details must be an object",
        ),
    ],
)
def test_unreadable_or_impossible_audio_names_the_field(
    usage: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        normalize_usage(usage)
    assert (caught.value.field, str(caught.value)) == (field, message)
