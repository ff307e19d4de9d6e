"""A provider's raw usage object → Costboard's token fields (Anthropic semantics).

Costboard counts like Anthropic: `input_tokens` excludes cache reads and cache writes, and
each of the four kinds is priced at its own rate. OpenAI and Gemini count cached tokens inside
their prompt total, so they are subtracted here — once — never counted twice.

| shape                  | recognized by                                   |
|------------------------|-------------------------------------------------|
| Anthropic Messages     | cache_read_input_tokens / cache_creation_input_tokens,     |
|                        | or input_tokens + output_tokens alone                      |
| OpenAI Chat            | prompt_tokens / completion_tokens               |
| OpenAI Responses       | input_tokens with input_tokens_details, output_tokens_details |
|                        | or total_tokens (Realtime: input_token_details)            |
| Gemini usageMetadata   | promptTokenCount / candidatesTokenCount         |
| Bedrock Converse       | inputTokens / outputTokens                      |

Reasoning tokens are reported apart for information; they are already inside output tokens
(OpenAI's completion_tokens and Anthropic's output_tokens include them), so they are not priced
again; Gemini's are not (thoughtsTokenCount is beside candidatesTokenCount), so they are added
to its output. xAI's are not either: its completion_tokens leaves them out, which its
total_tokens shows (prompt + completion + reasoning), and then they are added to the output, as
genai-prices and xAI bill them. Gemini's toolUsePromptTokenCount (the prompts of its tools, beside
promptTokenCount) is added to its input, as genai-prices and Google bill it.

Audio tokens are read where genai-prices reads them: OpenAI Chat's
prompt_tokens_details.audio_tokens and completion_tokens_details.audio_tokens, the Realtime
API's input_token_details.audio_tokens (the cached audio in its cached_tokens_details) and
output_token_details.audio_tokens, Gemini's AUDIO entries of promptTokensDetails (and
toolUsePromptTokensDetails), cacheTokensDetails and candidatesTokensDetails. Each provider
counts them inside its totals; Costboard keeps each as a part of the count it is in: the
uncached input, the cache reads, the output (docs/api.md, "Audio tokens").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class UsageError(ValueError):
    """A usage object that cannot be read; the message says what is wrong and how to fix it."""

    def __init__(self, message: str, field: str = "usage") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Tokens:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    reasoning_tokens: int = 0
    # each part of the count before it in its name: of input_tokens (uncached), of
    # cache_read_input_tokens, of output_tokens (docs/api.md, "Audio tokens")
    input_audio_tokens: int = 0
    cache_audio_read_tokens: int = 0
    output_audio_tokens: int = 0


def _count(usage: Mapping[str, Any], key: str, path: str = "usage") -> int:
    value = usage.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        # JSON numbers with a fraction arrive as Decimal; a whole-valued one is accepted.
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            as_int = None
        if as_int is None or as_int != value or isinstance(value, bool):
            raise UsageError(
                f"{path}.{key} must be a whole number of tokens, got {value!r}",
                field=f"{path}.{key}",
            )
        value = as_int
    if value < 0:
        raise UsageError(f"{path}.{key} must be >= 0, got {value}", field=f"{path}.{key}")
    return value


def _details(usage: Mapping[str, Any], key: str, path: str = "usage") -> Mapping[str, Any]:
    details = usage.get(key)
    if details is None:
        return {}
    if not isinstance(details, Mapping):
        raise UsageError(f"{path}.{key} must be an object", field=f"{path}.{key}")
    return details


def _subtract(total: int, part: int, total_name: str, part_name: str) -> int:
    if part > total:
        raise UsageError(
            f"usage.{part_name} ({part}) exceeds usage.{total_name} ({total}); the cached part "
            f"is included in {total_name}, so it cannot be larger",
            field=f"usage.{part_name}",
        )
    return total - part


def audio_split(
    audio: int, cached_audio: int, uncached: int, cached: int, audio_field: str, total_field: str
) -> tuple[int, int]:
    """A provider's audio input tokens (cache reads included, as its prompt total counts
    them) as Costboard's (uncached audio, cached audio): `cached_audio` is what it says was
    read from the cache; audio past the uncached input was read from it too (a usage that
    does not say which audio was cached)."""
    if audio > uncached + cached:
        raise UsageError(
            f"{audio_field} ({audio}) exceeds {total_field} ({uncached + cached}); the audio "
            f"tokens are part of {total_field}, so they cannot be more",
            field=audio_field,
        )
    if cached_audio > min(audio, cached):
        raise UsageError(
            f"the cached audio tokens ({cached_audio}) exceed the audio tokens ({audio}) or "
            f"the cached tokens ({cached}); they are part of both, so they cannot be more",
            field=audio_field,
        )
    uncached_audio = audio - cached_audio
    if uncached_audio > uncached:
        cached_audio += uncached_audio - uncached
        uncached_audio = uncached
    return uncached_audio, cached_audio


def _modality(usage: Mapping[str, Any], key: str, modality: str) -> int:
    """Gemini's tokens of one modality in a `…TokensDetails` list: the first entry of it, as
    genai-prices reads it."""
    details = usage.get(key)
    if details is None:
        return 0
    if not isinstance(details, list):
        raise UsageError(f"usage.{key} must be an array", field=f"usage.{key}")
    for index, detail in enumerate(details):
        if not isinstance(detail, Mapping):
            raise UsageError(f"usage.{key}.{index} must be an object", field=f"usage.{key}.{index}")
        if detail.get("modality") == modality:
            return _count(detail, "tokenCount", f"usage.{key}.{index}")
    return 0


def _part(part: int, total: int, part_field: str, total_field: str) -> int:
    if part > total:
        raise UsageError(
            f"{part_field} ({part}) exceeds {total_field} ({total}); the audio tokens are "
            f"part of {total_field}, so they cannot be more",
            field=part_field,
        )
    return part


def _cache_parts(details: str, written: int) -> str:
    """What was subtracted from the prompt, as named in an error."""
    return f"{details}.cached_tokens" + (f" + {details}.cache_write_tokens" if written else "")


def normalize_usage(usage: Mapping[str, Any]) -> Tokens:
    """Read a raw usage object; raises UsageError naming the field at fault."""
    if not isinstance(usage, Mapping):
        raise UsageError("usage must be an object (a provider's raw usage)")

    if "prompt_tokens" in usage or "completion_tokens" in usage:  # OpenAI Chat Completions
        prompt = _count(usage, "prompt_tokens")
        prompt_details = _details(usage, "prompt_tokens_details")
        cached = _count(prompt_details, "cached_tokens", "usage.prompt_tokens_details")
        # newer APIs report cache writes too; like reads, they are part of prompt_tokens
        written = _count(prompt_details, "cache_write_tokens", "usage.prompt_tokens_details")
        # LiteLLM's translation of Anthropic's usage keeps the 1-hour writes (priced higher
        # than the 5-minute ones) in prompt_tokens_details.cache_creation_token_details
        ttl_path = "usage.prompt_tokens_details.cache_creation_token_details"
        ttl = prompt_details.get("cache_creation_token_details")
        if ttl is not None and not isinstance(ttl, Mapping):
            raise UsageError(f"{ttl_path} must be an object", field=ttl_path)
        one_hour = _count(ttl or {}, "ephemeral_1h_input_tokens", ttl_path)
        completion_details = _details(usage, "completion_tokens_details")
        completion = _count(usage, "completion_tokens")
        reasoning = _count(
            completion_details, "reasoning_tokens", "usage.completion_tokens_details"
        )
        total = usage.get("total_tokens")
        if reasoning and total == prompt + completion + reasoning:
            # xAI: the reasoning is billed as output but left out of completion_tokens
            completion += reasoning
        uncached = _subtract(
            prompt,
            cached + written,
            "prompt_tokens",
            _cache_parts("prompt_tokens_details", written),
        )
        # the audio of the prompt and of the completion, each inside its total
        audio_in, audio_read = audio_split(
            _count(prompt_details, "audio_tokens", "usage.prompt_tokens_details"),
            0,
            uncached,
            cached,
            "usage.prompt_tokens_details.audio_tokens",
            "usage.prompt_tokens less its cache writes",
        )
        return Tokens(
            input_tokens=uncached,
            output_tokens=completion,
            cache_read_input_tokens=cached,
            cache_creation_input_tokens=written,
            cache_creation_1h_input_tokens=min(one_hour, written),
            reasoning_tokens=reasoning,
            input_audio_tokens=audio_in,
            cache_audio_read_tokens=audio_read,
            output_audio_tokens=_part(
                _count(completion_details, "audio_tokens", "usage.completion_tokens_details"),
                completion,
                "usage.completion_tokens_details.audio_tokens",
                "usage.completion_tokens",
            ),
        )

    if "promptTokenCount" in usage or "candidatesTokenCount" in usage:  # Gemini
        prompt = _count(usage, "promptTokenCount")
        cached = _count(usage, "cachedContentTokenCount")
        thoughts = _count(usage, "thoughtsTokenCount")
        # the prompts of its tools (a search's results) are billed as input, reported apart
        tool_prompt = _count(usage, "toolUsePromptTokenCount")
        uncached = (
            _subtract(prompt, cached, "promptTokenCount", "cachedContentTokenCount") + tool_prompt
        )
        # thinking is billed as output but reported beside the candidates
        output = _count(usage, "candidatesTokenCount") + thoughts
        # the AUDIO entries of the modality breakdowns: the prompt's and its tools' (the
        # cached audio among them), and the candidates'
        audio_in, audio_read = audio_split(
            _modality(usage, "promptTokensDetails", "AUDIO")
            + _modality(usage, "toolUsePromptTokensDetails", "AUDIO"),
            _modality(usage, "cacheTokensDetails", "AUDIO"),
            uncached,
            cached,
            "usage.promptTokensDetails",
            "usage.promptTokenCount + toolUsePromptTokenCount",
        )
        return Tokens(
            input_tokens=uncached,
            output_tokens=output,
            cache_read_input_tokens=cached,
            reasoning_tokens=thoughts,
            input_audio_tokens=audio_in,
            cache_audio_read_tokens=audio_read,
            output_audio_tokens=_part(
                _modality(usage, "candidatesTokensDetails", "AUDIO"),
                output,
                "usage.candidatesTokensDetails",
                "usage.candidatesTokenCount + thoughtsTokenCount",
            ),
        )

    if "inputTokens" in usage or "outputTokens" in usage:  # Bedrock Converse
        return _bedrock_usage(usage)

    if "input_tokens" in usage or "output_tokens" in usage:
        anthropic_cache = (
            "cache_read_input_tokens" in usage
            or "cache_creation_input_tokens" in usage
            or "cache_creation" in usage
        )
        responses_shape = (
            "input_tokens_details" in usage
            or "output_tokens_details" in usage
            or "input_token_details" in usage
            or "total_tokens" in usage
        )
        if responses_shape and not anthropic_cache:  # OpenAI Responses (or Realtime)
            input_total = _count(usage, "input_tokens")
            # the Realtime API's response.done usage says input_token_details (singular)
            key = "input_tokens_details"
            if key not in usage and "input_token_details" in usage:
                key = "input_token_details"
            input_details = _details(usage, key)
            cached = _count(input_details, "cached_tokens", f"usage.{key}")
            written = _count(input_details, "cache_write_tokens", f"usage.{key}")
            uncached = _subtract(
                input_total, cached + written, "input_tokens", _cache_parts(key, written)
            )
            output = _count(usage, "output_tokens")
            # Realtime: the audio of the input (the cached audio among it, in
            # cached_tokens_details) and of the output
            cached_details = _details(input_details, "cached_tokens_details", f"usage.{key}")
            audio_in, audio_read = audio_split(
                _count(input_details, "audio_tokens", f"usage.{key}"),
                _count(cached_details, "audio_tokens", f"usage.{key}.cached_tokens_details"),
                uncached,
                cached,
                f"usage.{key}.audio_tokens",
                "usage.input_tokens less its cache writes",
            )
            output_key = "output_token_details" if "output_token_details" in usage else ""
            return Tokens(
                input_tokens=uncached,
                output_tokens=output,
                cache_read_input_tokens=cached,
                cache_creation_input_tokens=written,
                reasoning_tokens=_count(
                    _details(usage, "output_tokens_details"),
                    "reasoning_tokens",
                    "usage.output_tokens_details",
                ),
                input_audio_tokens=audio_in,
                cache_audio_read_tokens=audio_read,
                output_audio_tokens=_part(
                    _count(_details(usage, output_key), "audio_tokens", f"usage.{output_key}")
                    if output_key
                    else 0,
                    output,
                    f"usage.{output_key}.audio_tokens",
                    "usage.output_tokens",
                ),
            )
        # Anthropic Messages: input_tokens already excludes the cache.
        creation = _count(usage, "cache_creation_input_tokens")
        split = _details(usage, "cache_creation")
        one_hour = _count(split, "ephemeral_1h_input_tokens", "usage.cache_creation")
        five_min = _count(split, "ephemeral_5m_input_tokens", "usage.cache_creation")
        if not creation and (one_hour or five_min):
            creation = one_hour + five_min
        output_details = _details(usage, "output_tokens_details")
        return Tokens(
            input_tokens=_count(usage, "input_tokens"),
            output_tokens=_count(usage, "output_tokens"),
            cache_read_input_tokens=_count(usage, "cache_read_input_tokens"),
            cache_creation_input_tokens=creation,
            cache_creation_1h_input_tokens=min(one_hour, creation),
            reasoning_tokens=_count(
                output_details, "thinking_tokens", "usage.output_tokens_details"
            ),
        )

    raise UsageError(
        "usage is not a recognized usage object: expected Anthropic (input_tokens, "
        "output_tokens, cache_*), OpenAI Chat (prompt_tokens, completion_tokens) or OpenAI "
        "Responses (input_tokens, output_tokens, *_details), Gemini (promptTokenCount, "
        "candidatesTokenCount) or Bedrock Converse (inputTokens, outputTokens); or send the "
        "token fields directly"
    )


def _bedrock_usage(usage: Mapping[str, Any]) -> Tokens:
    """Bedrock Converse's usage: inputTokens excludes the cache, as Anthropic's input_tokens
    does; `cacheDetails` lists the cache writes by time to live (`5m`, `1h`)."""
    written = _count(usage, "cacheWriteInputTokens")
    details = usage.get("cacheDetails")
    if details is None:
        details = []
    if not isinstance(details, list):
        raise UsageError("usage.cacheDetails must be an array", field="usage.cacheDetails")
    one_hour = listed = 0
    for index, detail in enumerate(details):
        path = f"usage.cacheDetails.{index}"
        if not isinstance(detail, Mapping):
            raise UsageError(f"{path} must be an object", field=path)
        tokens = _count(detail, "inputTokens", path)
        listed += tokens
        if detail.get("ttl") == "1h":
            one_hour += tokens
    if not written:
        written = listed
    return Tokens(
        input_tokens=_count(usage, "inputTokens"),
        output_tokens=_count(usage, "outputTokens"),
        cache_read_input_tokens=_count(usage, "cacheReadInputTokens"),
        cache_creation_input_tokens=written,
        cache_creation_1h_input_tokens=min(one_hour, written),
    )
