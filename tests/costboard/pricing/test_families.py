"""A model's family: one name for what providers and SDKs spell several ways."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from costboard.pricing.families import is_tool_model, model_family, step_family
from costboard.pricing.rates import rate_table
from costboard.pricing.sync import prices_sync


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("gpt-4o", "gpt-4o"),
        ("GPT-4o", "gpt-4o"),
        ("gpt-4o-2024-08-06", "gpt-4o"),  # a dated snapshot
        ("openai/gpt-4o", "gpt-4o"),  # a router's provider prefix
        ("openai:gpt-4o", "gpt-4o"),  # pydantic-ai's
        ("vertex_ai/claude-3-5-sonnet@20240620", "claude-3-5-sonnet"),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet"),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4"),  # Bedrock
        ("bedrock:anthropic.claude-3-5-sonnet-20240620-v1:0", "claude-3-5-sonnet"),
        ("gpt-4-32k-0613", "gpt-4-32k"),  # month-day
        ("mistral-large-2407", "mistral-large"),  # year-month
        ("models/gemini-1.5-pro-002", "gemini-1.5-pro"),
        ("chatgpt-4o-latest", "chatgpt-4o"),
        # names that only look like it stay themselves
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("gpt-4o:extended", "gpt-4o:extended"),  # not a provider before the colon
        ("ft:gpt-4o", "ft:gpt-4o"),  # a fine-tune is a family of its own
        ("deepseek-v3", "deepseek-v3"),  # a version, not Bedrock's -v1:0
        ("llama3-70b-8192", "llama3-70b-8192"),  # a context size, not a date
        ("llama3:8b", "llama3:8b"),
        ("none", "none"),
    ],
)
def test_a_model_name_and_its_family(name: str, family: str) -> None:
    assert model_family(name) == family


def test_steps_without_a_model_are_tool_steps() -> None:
    assert is_tool_model("none") and is_tool_model(" None ")
    assert not is_tool_model("gpt-4o") and not is_tool_model("unknown")
    assert step_family("none", "gpt-4o") == "none"  # whatever a price row might say


def test_a_priced_step_takes_its_price_rows_model_as_family() -> None:
    assert step_family("claude-4-sonnet", "claude-sonnet-4-0") == "claude-sonnet-4-0"
    assert step_family("mystery-llm-2025-01-01", None) == "mystery-llm"


@pytest.mark.slow
@pytest.mark.django_db
def test_the_built_in_rate_table_brings_every_spelling_of_gpt_4o_to_one_family() -> None:
    """With genai-prices' rows: the dated name is matched by openai's gpt-4o row, the prefixed
    one by openrouter's `openai/gpt-4o`; both are family gpt-4o, as is Azure's."""
    prices_sync()
    table = rate_table()
    when = datetime(2026, 5, 1, tzinfo=UTC)
    families = set()
    for model, provider in [
        ("gpt-4o", ""),
        ("gpt-4o-2024-08-06", ""),
        ("openai/gpt-4o", ""),
        ("gpt-4o", "azure"),
        ("gpt-4o-2024-11-20", "openai"),
    ]:
        rate = table.rate_at(model, provider, when)
        assert rate is not None, model
        families.add(step_family(model, rate.model))
    assert families == {"gpt-4o"}
