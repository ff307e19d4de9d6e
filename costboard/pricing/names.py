"""What a model and a provider are called: a provider as a client names it → the rate table's
id, the provider genai-prices gives a bare model name, and the other names a model is known by
(without a provider prefix or a date suffix). Read by the rate table, the price edits, a step's
price explanation and reconciliation."""

from __future__ import annotations

import re
from functools import lru_cache

# Aliases tried after exact and regex matches fail.
_PROVIDER_PREFIX = re.compile(r"^(?:[a-z0-9_.-]+/)+|^[a-z0-9_.-]+:(?=[a-z])")
_DATED_SUFFIX = re.compile(r"(?:[-@](?:\d{8}|\d{4}-\d{2}-\d{2})|-latest|-v\d+(?::\d+)?)$")


@lru_cache(maxsize=4096)
def home_provider(model: str) -> str | None:
    """The provider genai-prices would pick for a bare model name (claude-… → anthropic)."""
    from genai_prices import data_snapshot

    try:
        return data_snapshot.get_snapshot().find_provider(model, None, None).id
    except LookupError:
        return None


@lru_cache(maxsize=1024)
def canonical_provider(name: str) -> str:
    """A provider as named by a client (`Anthropic`, `aws.bedrock`, `azure.ai.openai`) → the
    rate table's id (`anthropic`, `aws`, `azure`); unknown names pass through lower-cased."""
    from genai_prices import data_snapshot

    lowered = name.strip().lower()
    if not lowered:
        return ""
    found = data_snapshot.find_provider_by_id(data_snapshot.get_snapshot().providers, lowered)
    if found is None and "." in lowered:
        found = data_snapshot.find_provider_by_id(
            data_snapshot.get_snapshot().providers, lowered.split(".")[0]
        )
    return found.id if found is not None else lowered


def model_aliases(model: str) -> list[str]:
    """Other names a model is known by: without a provider prefix, without a date suffix."""
    names = []
    bare = _PROVIDER_PREFIX.sub("", model)
    if bare != model:
        names.append(bare)
    for name in [model, bare]:
        undated = _DATED_SUFFIX.sub("", name)
        while undated != name:
            names.append(undated)
            name = undated
            undated = _DATED_SUFFIX.sub("", name)
    seen: list[str] = []
    for n in names:
        if n and n not in seen and n != model:
            seen.append(n)
    return seen


@lru_cache(maxsize=1024)
def _resold(provider: str) -> frozenset[str]:
    """The providers whose models `provider` sells at their prices (genai-prices'
    `fallback_model_providers`: Azure's OpenAI models, Vertex's Claude)."""
    from genai_prices import data_snapshot

    found = data_snapshot.find_provider_by_id(data_snapshot.get_snapshot().providers, provider)
    return frozenset(found.fallback_model_providers or ()) if found is not None else frozenset()


def billing_provider(price_provider: str, sent: str) -> str:
    """The provider that bills a step: its price row's, except that a step sent through a
    provider reselling the row's provider's models (Azure for OpenAI's, Google for
    Anthropic's) is billed by the one it was sent through; without a row's provider, the one
    it was sent with (canonical)."""
    provider = canonical_provider(sent)  # "" when none was sent
    if not price_provider:
        return provider
    price_provider = price_provider.lower()
    if provider and provider != price_provider and price_provider in _resold(provider):
        return provider
    return price_provider
