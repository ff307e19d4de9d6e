"""A step's model family: the one name pages group it under.

`gpt-4o-2024-08-06`, `openai/gpt-4o` and `gpt-4o` are one model to whoever reads a breakdown.
A step keeps the exact name it was sent with and the price row it matched; its family is the
model of that row (the rate table's canonical name: regexes and aliases already brought the
step there), else its own name, each without a provider or vendor prefix and without a
snapshot suffix. Steps without a model (tool calls, retrievals: `TOOL_MODEL`) are their own
family, never priced.

The prefix and suffix rules are the ones pricing's aliases use (`names.model_aliases`), made
safe for grouping every name rather than for a lookup that failed: a `name:` prefix is cut
only when it names a provider (`openai:gpt-4o`, not `gpt-4o:extended`), a `-v2` only with
Bedrock's `:0` (`-v2:0`, not `deepseek-v3`); and they know two more snapshot forms, `-0613` or
`-2407` (month-day, year-month) and Gemini's `-001`, and Bedrock's `us.anthropic.` prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache

from costboard.models import STANDARD_TIER, TOOL_MODEL
from costboard.pricing.names import canonical_provider
from costboard.pricing.rates import NO_AUDIO, UNPRICED_PICO, Audio, PicoCost, Rate, RateTable

_SLASH_PREFIX = re.compile(r"^(?:[a-z0-9_.-]+/)+")
_COLON_PREFIX = re.compile(r"^([a-z0-9_.-]+):(?=[a-z])")
# Bedrock: `anthropic.claude-…`, `us.anthropic.claude-…`, genai-prices' `regional.anthropic.`
_VENDOR_PREFIX = re.compile(r"^(?:[a-z]+\.)+(?=[a-z][a-z0-9.]*-)")
_SNAPSHOT_SUFFIX = re.compile(
    r"(?:[-@](?:\d{8}|\d{4}-\d{2}-\d{2})"  # -20241022, @20240620, -2024-08-06
    r"|-(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])"  # -0613, -1106 (month-day)
    r"|-2\d(?:0[1-9]|1[0-2])"  # -2407, -2501 (year-month)
    r"|-00\d"  # -001 (Gemini's stable versions)
    r"|-latest|-v\d+:\d+)$"  # -latest, Bedrock's -v2:0
)
# A colon prefix that is not a provider but a fine-tune's marker: kept (`ft:gpt-4o` is a family).
_KEPT_COLON_PREFIXES = frozenset({"ft"})


def is_tool_model(model: str) -> bool:
    """A step sent without a model (a tool call, a retrieval): OTLP stores `none`, and the
    events API takes `"model": "none"` for the same."""
    return model.strip().lower() == TOOL_MODEL


@lru_cache(maxsize=8192)
def model_family(model: str) -> str:
    """The family of a model name: lower-cased, without a provider or vendor prefix and
    without snapshot suffixes (`openai/gpt-4o-2024-08-06` → `gpt-4o`)."""
    name = model.strip().lower()
    if name == TOOL_MODEL:
        return TOOL_MODEL
    bare = _SLASH_PREFIX.sub("", name)
    if bare == name and (colon := _COLON_PREFIX.match(name)):
        prefix = colon.group(1)
        if prefix not in _KEPT_COLON_PREFIXES and _is_provider(prefix):
            bare = name[colon.end() :]
    bare = _VENDOR_PREFIX.sub("", bare) or bare
    while (undated := _SNAPSHOT_SUFFIX.sub("", bare)) != bare and undated:
        bare = undated
    return bare or name


def _is_provider(name: str) -> bool:
    from genai_prices import data_snapshot

    providers = data_snapshot.get_snapshot().providers
    return data_snapshot.find_provider_by_id(providers, canonical_provider(name)) is not None


def step_family(model: str, rate_model: str | None) -> str:
    """A step's family: its matched price row's model's (`rate_model`), else its own name's."""
    if is_tool_model(model):
        return TOOL_MODEL
    return model_family(rate_model if rate_model else model)


def step_classify(
    table: RateTable,
    families: Mapping[int, str],
    model: str,
    provider: str,
    when: datetime,
    input_tokens: int,
    output_tokens: int,
    cache_read_input_tokens: int,
    cache_creation_input_tokens: int,
    cache_creation_1h_input_tokens: int,
    service_tier: str = STANDARD_TIER,
    project_id: int | None = None,
    audio: Audio = NO_AUDIO,
) -> tuple[PicoCost, str, bool]:
    """A step's price (pico-dollars, `RateTable.price_pico`), family and whether it is
    unpriced: the one rule ingest (plan._step) and repricing both follow. A tool step (no
    model) is $0 by nature and never unpriced, its family `TOOL_MODEL`; a model no row prices
    is unpriced, of its own name's family; a priced step is of its row's family
    (`families`: `price_families` of the same table), whatever that row's model is. Priced by
    its service tier's row (else standard: `RateTable.price_pico`), then, for a project, by
    the negotiated adjustment in force (docs/pricing.md)."""
    if is_tool_model(model):
        return UNPRICED_PICO, TOOL_MODEL, False
    cost = table.price_pico(
        model,
        provider,
        when,
        input_tokens,
        output_tokens,
        cache_read_input_tokens,
        cache_creation_input_tokens,
        cache_creation_1h_input_tokens,
        service_tier,
        audio,
    )
    price_id = cost[0]
    if price_id is None:
        return cost, model_family(model), True
    family = families[price_id]
    if project_id is not None and table.adjustments:  # a negotiated rate
        cost = table.adjust(cost, project_id, provider, family, when)
    return cost, family, False


_cached: tuple[object, dict[int, str]] | None = None


def price_families(rates: Iterable[Rate], *, key: object = None) -> dict[int, str]:
    """Each price row's family by its id. With `key` (the rate table they come from), the
    last answer is reused while the key is the same object."""
    global _cached
    cached = _cached
    if key is not None and cached is not None and cached[0] is key:
        return cached[1]
    families = {rate.id: model_family(rate.model) for rate in rates}
    if key is not None:
        _cached = (key, families)
    return families
