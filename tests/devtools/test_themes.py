"""The demo's data files (devtools/demo_data/): the shipped ones load into the themes seed_demo
writes, and a file that can't be used is refused before anything is written, naming the file,
the field and the fix."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from devtools.themes import DATA_DIR, DemoDataError, Shape, demo_data, demo_data_load


def test_the_shipped_files_load_into_three_themes() -> None:
    data = demo_data_load()
    assert [t.slug for t in data.themes] == ["support-bot", "research-agent", "code-review"]
    assert data.embedding.model == "text-embedding-3-small"
    assert data.models["gemini-2.5-pro"].shape is Shape.GEMINI
    assert data.models["o3"].reasoning and not data.models["gpt-4o"].reasoning
    support, research, review = data.themes
    assert support.canary is not None and support.canary.model == "acme-finetune-v2"
    assert (research.token_cap, research.cost_cap_usd) == (250_000, Decimal("10.00"))
    assert (review.token_cap, review.cost_cap_usd) == (200_000, None)
    for theme in data.themes:
        assert len(theme.memories) == 17
        assert all(m.said for m in theme.memories)
        assert {m.type for m in theme.memories} == {"user", "feedback", "project", "reference"}
        assert any(m.approved for m in theme.memories)
        assert theme.selection_key in theme.vocab
        assert all(provider in data.transient_errors for provider in ("anthropic", "openai"))
    assert demo_data() == data  # read once a process, the same


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "demo_data"
    shutil.copytree(DATA_DIR, target)
    return target


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


THEME = "themes/support-bot.toml"
BROKEN: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "an unknown model",
        lambda d: edit(d / THEME, 'model = "gpt-4o-mini"', 'model = "gpt-5-nano"'),
        "support-bot.toml: routers: no model 'gpt-5-nano' in demo.toml; add it under [models]",
    ),
    (
        "a word the texts use but vocab lacks",
        lambda d: edit(d / THEME, "Where is my order {order}?", "Where is my {parcel}?"),
        "support-bot.toml: vocab: the texts use {parcel}; add parcel = [...] to [vocab]",
    ),
    (
        "a memory over 150 characters",
        lambda d: edit(d / THEME, '"apologise once per reply at most"', '"' + "a" * 151 + '"'),
        "support-bot.toml: memories.7.content: String should have at most 150 characters",
    ),
    (
        "a memory type that does not exist",
        lambda d: edit(d / THEME, 'type = "reference"', 'type = "preference"'),
        "support-bot.toml: memories.12.type: Input should be 'user', 'feedback', 'project'",
    ),
    (
        "a misspelt field",
        lambda d: edit(d / THEME, "filter_rate =", "filter_ratio ="),
        "support-bot.toml: filter_rate: Field required; filter_ratio: Extra inputs are not "
        "permitted",
    ),
    (
        "a file named for another slug",
        lambda d: edit(d / THEME, 'slug = "support-bot"', 'slug = "help-desk"'),
        "support-bot.toml: slug: is 'help-desk'; name the file help-desk.toml",
    ),
    (
        "a range the wrong way round",
        lambda d: edit(d / THEME, "output_tokens = [80, 480]", "output_tokens = [480, 80]"),
        "support-bot.toml: output_tokens: [from, to] with 0 ≤ from ≤ to; got (480, 80)",
    ),
    (
        "a provider without transient errors",
        lambda d: edit(d / "demo.toml", "acme = [", "acne = ["),
        "demo.toml: transient_errors: nothing for provider 'acme' (of acme-finetune-v2)",
    ),
    (
        "a theme listed but missing",
        lambda d: (d / "themes/code-review.toml").unlink(),
        "code-review.toml: missing; restore it from the repository",
    ),
    (
        "broken TOML",
        lambda d: edit(d / THEME, 'name = "Support Bot"', 'name = "Support Bot'),
        "support-bot.toml: not valid TOML",
    ),
    (
        "a usage shape that does not exist",
        lambda d: edit(d / "demo.toml", 'usage = "gemini"', 'usage = "vertex"'),
        "demo.toml: models.gemini-2.5-pro.usage: Input should be 'fields', 'openai' or 'gemini'",
    ),
]


@pytest.mark.parametrize(("what", "breaks", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_file_that_cannot_be_used_is_refused_by_name(
    copy: Path, what: str, breaks: Callable[[Path], None], message: str
) -> None:
    demo_data_load(copy)  # as shipped, fine
    breaks(copy)
    with pytest.raises(DemoDataError) as refused:
        demo_data_load(copy)
    assert message in str(refused.value)
