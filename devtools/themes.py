"""The demo's data, read from TOML files under devtools/demo_data/ and checked before a session is
written: `demo.toml` (the models, their providers' transient errors, which themes in which
order) and `themes/<slug>.toml` (one project each: what its users ask, which model runs each
pipeline step, what its agent proposes to remember).

A file that can't be used stops the seeding with a DemoDataError naming the file, the field
and the fix, rather than a KeyError halfway through a million steps.
"""

from __future__ import annotations

import string
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memory_ui.models import MAX_CONTENT

DATA_DIR = Path(__file__).resolve().with_name("demo_data")


class DemoDataError(ValueError):
    """A demo data file that can't be used: which file, which field, and how to fix it."""


class Shape(StrEnum):
    """How a provider reports a call's tokens (docs/api.md, "Raw provider usage")."""

    FIELDS = "fields"  # the token fields themselves, Anthropic semantics
    OPENAI = "openai"  # an OpenAI Chat Completions usage object
    GEMINI = "gemini"  # a Gemini usageMetadata object


@dataclass(frozen=True, slots=True)
class Llm:
    model: str
    provider: str
    shape: Shape
    ms_per_output_token: int
    reasoning: bool = False
    # The name the provider's answer carries (a dated snapshot: gpt-4o-2024-08-06), which a
    # client reporting the response's model sends instead; "" when it is the model's own.
    answered_as: str = ""


@dataclass(frozen=True, slots=True)
class RetryLoop:
    """How a theme's agent gets stuck: one step retried with the same failing arguments."""

    step_type: str
    llm: Llm
    error: str
    apology: str


@dataclass(frozen=True, slots=True)
class MemoryIdea:
    type: str
    content: str
    approved: bool = False
    said: str = ""  # the sentence it came from, quoted on its review card


@dataclass(frozen=True)
class Theme:
    slug: str
    name: str
    weight: float  # share of the traffic
    session_prefix: str
    user_prefix: str
    system_prompt_tokens: int
    routers: tuple[tuple[Llm, int], ...]  # intent, filter and compress, weighted
    responders: tuple[tuple[Llm, int], ...]
    filter_rate: float
    search_rate: float
    retrieved_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    compress_over: int  # history tokens past which a long session is compressed
    openers: tuple[str, ...]
    follow_ups: tuple[str, ...]
    answers: tuple[str, ...]
    queries: tuple[str, ...]
    focuses: tuple[str, ...]
    selection_key: str
    vocab: Mapping[str, tuple[str, ...]]
    channels: tuple[str, ...]
    retry_loop: RetryLoop
    memories: tuple[MemoryIdea, ...]
    canary: Llm | None = None
    token_cap: int | None = None  # the project's per-session caps (None: the defaults)
    cost_cap_usd: Decimal | None = None


@dataclass(frozen=True, slots=True)
class DemoData:
    models: Mapping[str, Llm]
    embedding: Llm  # a search step's model
    transient_errors: Mapping[str, tuple[str, ...]]  # by provider
    themes: tuple[Theme, ...]


# --- the files' shapes ------------------------------------------------------------------------

Texts = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ModelFile(_File):
    provider: str = Field(min_length=1)
    usage: Shape
    ms_per_output_token: int = Field(ge=0)
    reasoning: bool = False
    answered_as: str = ""


class _DemoFile(_File):
    themes: Annotated[list[str], Field(min_length=1)]
    embedding_model: str
    models: dict[str, _ModelFile]
    transient_errors: dict[str, Texts]


class _Weighted(_File):
    model: str
    weight: int = Field(gt=0)


class _RetryLoopFile(_File):
    step_type: str = Field(min_length=1)
    model: str
    error: str = Field(min_length=1)
    apology: str = Field(min_length=1)


class _MemoryFile(_File):
    type: Literal["user", "feedback", "project", "reference"]
    content: str = Field(min_length=1, max_length=MAX_CONTENT)
    approved: bool = False
    said: str = Field(min_length=1, max_length=2000)


class _ThemeFile(_File):
    slug: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    name: str = Field(min_length=1)
    weight: float = Field(gt=0)
    session_prefix: str = Field(min_length=1)
    user_prefix: str = Field(min_length=1)
    system_prompt_tokens: int = Field(ge=0)
    token_cap: int | None = Field(default=None, gt=0)
    cost_cap_usd: Decimal | None = Field(default=None, gt=0)
    routers: Annotated[list[_Weighted], Field(min_length=1)]
    responders: Annotated[list[_Weighted], Field(min_length=1)]
    canary: str | None = None
    filter_rate: float = Field(ge=0, le=1)
    search_rate: float = Field(ge=0, le=1)
    retrieved_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    compress_over: int = Field(gt=0)
    openers: Texts
    follow_ups: Texts
    answers: Texts
    queries: Texts
    focuses: Texts
    selection_key: str
    channels: Texts
    vocab: dict[str, Texts]
    retry_loop: _RetryLoopFile
    memories: list[_MemoryFile]


# --- reading ----------------------------------------------------------------------------------

_F = TypeVar("_F", bound=_File)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise DemoDataError(f"{path}: missing; restore it from the repository") from None
    except tomllib.TOMLDecodeError as exc:
        raise DemoDataError(f"{path}: not valid TOML ({exc}): fix the syntax") from None


def _parsed(kind: type[_F], path: Path, raw: dict[str, Any]) -> _F:
    try:
        return kind.model_validate(raw)
    except ValidationError as exc:
        # a misspelt field is two errors (required, not permitted): name both
        problems = [
            f"{'.'.join(str(part) for part in error['loc']) or '(the file)'}: {error['msg']}"
            for error in exc.errors()[:3]
        ]
        raise DemoDataError(f"{path}: {'; '.join(problems)}") from None


def _model(models: Mapping[str, Llm], name: str, path: Path, field: str) -> Llm:
    if name not in models:
        raise DemoDataError(
            f"{path}: {field}: no model {name!r} in demo.toml; add it under [models] or use one "
            f"of {', '.join(sorted(models))}"
        )
    return models[name]


def _placeholders(templates: Iterable[str]) -> set[str]:
    return {name for text in templates for _, name, _, _ in string.Formatter().parse(text) if name}


def _theme(raw: _ThemeFile, path: Path, models: Mapping[str, Llm]) -> Theme:
    if raw.slug != path.stem:
        raise DemoDataError(f"{path}: slug: is {raw.slug!r}; name the file {raw.slug}.toml")
    for field in ("retrieved_tokens", "output_tokens"):
        low, high = getattr(raw, field)
        if not 0 <= low <= high:
            raise DemoDataError(f"{path}: {field}: [from, to] with 0 ≤ from ≤ to; got {low, high}")
    if raw.selection_key not in raw.vocab:
        raise DemoDataError(f"{path}: selection_key: {raw.selection_key!r} is not in [vocab]")
    used = _placeholders([*raw.openers, *raw.follow_ups, *raw.answers, *raw.queries])
    unknown = sorted(used - set(raw.vocab))
    if unknown:
        raise DemoDataError(
            f"{path}: vocab: the texts use {{{unknown[0]}}}; add {unknown[0]} = [...] to [vocab]"
        )
    return Theme(
        slug=raw.slug,
        name=raw.name,
        weight=raw.weight,
        session_prefix=raw.session_prefix,
        user_prefix=raw.user_prefix,
        system_prompt_tokens=raw.system_prompt_tokens,
        routers=tuple((_model(models, w.model, path, "routers"), w.weight) for w in raw.routers),
        responders=tuple(
            (_model(models, w.model, path, "responders"), w.weight) for w in raw.responders
        ),
        filter_rate=raw.filter_rate,
        search_rate=raw.search_rate,
        retrieved_tokens=raw.retrieved_tokens,
        output_tokens=raw.output_tokens,
        compress_over=raw.compress_over,
        openers=tuple(raw.openers),
        follow_ups=tuple(raw.follow_ups),
        answers=tuple(raw.answers),
        queries=tuple(raw.queries),
        focuses=tuple(raw.focuses),
        selection_key=raw.selection_key,
        vocab={key: tuple(words) for key, words in raw.vocab.items()},
        channels=tuple(raw.channels),
        retry_loop=RetryLoop(
            step_type=raw.retry_loop.step_type,
            llm=_model(models, raw.retry_loop.model, path, "retry_loop.model"),
            error=raw.retry_loop.error,
            apology=raw.retry_loop.apology,
        ),
        memories=tuple(MemoryIdea(m.type, m.content, m.approved, m.said) for m in raw.memories),
        canary=None if raw.canary is None else _model(models, raw.canary, path, "canary"),
        token_cap=raw.token_cap,
        cost_cap_usd=raw.cost_cap_usd,
    )


def demo_data_load(directory: Path = DATA_DIR) -> DemoData:
    """Read and check the demo's files."""
    index_path = directory / "demo.toml"
    index = _parsed(_DemoFile, index_path, _read(index_path))
    models = {
        name: Llm(name, m.provider, m.usage, m.ms_per_output_token, m.reasoning, m.answered_as)
        for name, m in index.models.items()
    }
    for llm in models.values():
        if llm.provider not in index.transient_errors:
            raise DemoDataError(
                f"{index_path}: transient_errors: nothing for provider {llm.provider!r} (of "
                f'{llm.model}); add {llm.provider} = ["…"]'
            )
    themes = []
    for slug in index.themes:
        path = directory / "themes" / f"{slug}.toml"
        themes.append(_theme(_parsed(_ThemeFile, path, _read(path)), path, models))
    return DemoData(
        models=models,
        embedding=_model(models, index.embedding_model, index_path, "embedding_model"),
        transient_errors={k: tuple(v) for k, v in index.transient_errors.items()},
        themes=tuple(themes),
    )


@cache
def demo_data() -> DemoData:
    """The demo's files, read once a process."""
    return demo_data_load()
