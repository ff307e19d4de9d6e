"""Ranked search: each component moves the order the way it should with the others held equal,
the weights come from settings, and only the scope's live memories are searched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

from costboard.models import Project
from memory_ui.cleaners import MemoryInputError, Search
from memory_ui.models import Memory
from memory_ui.ranking import Ranked, freshness, memories_search, ranking_weights, terms
from memory_ui.text import fingerprint

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's full-text search (CI)"
)


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Acme", slug="acme")


def remember(project: Project, content: str, **fields: Any) -> Memory:
    return Memory.objects.create(
        project=project,
        type=fields.pop("type", "project"),
        content=content,
        status=fields.pop("status", "approved"),
        decided_at=fields.pop("decided_at", NOW),
        fingerprint=fingerprint(content),
        **fields,
    )


def search(project: Project, query: str, **options: Any) -> list[Ranked]:
    asked = Search.of(query=query, scope=options.pop("scope", None), k=options.pop("k", None))
    return memories_search(project=project, search=asked, now=NOW, **options)


def ids(results: list[Ranked]) -> list[int]:
    return [r.memory_id for r in results]


def test_a_more_relevant_memory_ranks_higher(project: Project) -> None:
    # no memory has all three words: each is found by the words it has
    two = remember(project, "The staging database moved to a new host")
    one = remember(project, "Database backups run nightly")
    remember(project, "Deploys happen on Tuesdays")
    results = search(project, "staging database port")
    assert ids(results) == [two.pk, one.pk]
    assert results[0].components["relevance"] > results[1].components["relevance"] > 0
    assert results[0].components["relevance"] == 1.0 or connection.vendor != "postgresql"


def test_a_more_important_memory_ranks_higher(project: Project) -> None:
    low = remember(project, "Use ruff for lint, rule A", importance=Decimal("0.3"))
    high = remember(project, "Use ruff for lint, rule B", importance=Decimal("0.9"))
    results = search(project, "ruff lint")
    assert ids(results) == [high.pk, low.pk]
    assert [r.components["importance"] for r in results] == [0.9, 0.3]
    assert results[0].components["relevance"] == results[1].components["relevance"]


def test_a_fresher_memory_ranks_higher_halving_every_half_life(project: Project) -> None:
    old = remember(project, "Use ruff for lint, rule A", decided_at=NOW - timedelta(days=60))
    new = remember(project, "Use ruff for lint, rule B", decided_at=NOW - timedelta(days=30))
    never_decided = remember(project, "Use ruff for lint, rule C", decided_at=None, created_at=NOW)
    results = search(project, "ruff lint")
    assert ids(results) == [never_decided.pk, new.pk, old.pk]
    assert [round(r.components["freshness"], 6) for r in results] == [1.0, 0.5, 0.25]


def test_freshness_follows_the_half_life_setting() -> None:
    with override_settings(COSTBOARD_MEMORY_HALF_LIFE_DAYS=10):
        from memory_ui.ranking import half_life_days

        assert half_life_days() == 10.0
    assert freshness(NOW - timedelta(days=10), NOW, now=NOW, half_life=10) == 0.5
    assert freshness(NOW + timedelta(days=1), NOW, now=NOW, half_life=10) == 1.0  # never above 1


def test_a_more_credible_source_ranks_higher(project: Project) -> None:
    tool = remember(project, "Use ruff for lint, rule A", source="tool_output")
    agent = remember(project, "Use ruff for lint, rule B", source="agent_inferred")
    user = remember(project, "Use ruff for lint, rule C", source="user_stated")
    results = search(project, "ruff lint")
    assert ids(results) == [user.pk, agent.pk, tool.pk]
    assert [r.components["credibility"] for r in results] == [1.0, 0.6, 0.3]


def test_the_score_is_the_weighted_sum_of_its_components(project: Project) -> None:
    remember(project, "Use ruff for lint", importance=Decimal("0.8"), source="user_stated")
    (result,) = search(project, "ruff")
    weights = ranking_weights()
    assert weights == {"relevance": 0.5, "importance": 0.2, "freshness": 0.15, "credibility": 0.15}
    parts = result.components
    expected = (
        weights["relevance"] * parts["relevance"]
        + weights["importance"] * parts["importance"]
        + weights["freshness"] * parts["freshness"]
        + weights["credibility"] * parts["credibility"]
    )
    assert result.score == pytest.approx(expected)
    assert result.components == {
        "relevance": 1.0,
        "importance": 0.8,
        "freshness": 1.0,
        "credibility": 1.0,
    }
    assert result.to_dict()["score"] == round(expected, 4)


def test_weights_from_settings_change_the_order(project: Project) -> None:
    important = remember(
        project,
        "Use ruff for lint, rule A",
        importance=Decimal("1"),
        decided_at=NOW - timedelta(days=30),
    )
    fresh = remember(project, "Use ruff for lint, rule B", importance=Decimal("0.5"))
    assert ids(search(project, "ruff")) == [important.pk, fresh.pk]
    only_freshness = {"relevance": 0, "importance": 0, "freshness": 1, "credibility": 0}
    with override_settings(COSTBOARD_MEMORY_WEIGHTS=only_freshness):
        results = search(project, "ruff")
    assert ids(results) == [fresh.pk, important.pk]
    assert [r.score for r in results] == [1.0, pytest.approx(0.5)]


def test_a_partial_weights_setting_keeps_the_other_defaults() -> None:
    with override_settings(COSTBOARD_MEMORY_WEIGHTS={"relevance": 0.9}):
        assert ranking_weights()["relevance"] == 0.9
        assert ranking_weights()["importance"] == 0.2


@pytest.mark.parametrize("weights", [{"recency": 1}, {"relevance": -1}, {"relevance": "high"}])
def test_a_bad_weights_setting_names_the_fix(weights: dict[str, Any]) -> None:
    with (
        override_settings(COSTBOARD_MEMORY_WEIGHTS=weights),
        pytest.raises(ImproperlyConfigured, match="COSTBOARD_MEMORY_WEIGHTS"),
    ):
        ranking_weights()


def test_only_live_memories_of_the_scope_are_searched(project: Project) -> None:
    live = remember(project, "ruff: the live one")
    remember(project, "ruff: pending", status="pending", decided_at=None)
    remember(project, "ruff: rejected", status="rejected")
    remember(project, "ruff: expired", status="expired")
    remember(project, "ruff: merged", status="merged")
    remember(project, "ruff: past its TTL", expires_at=NOW - timedelta(seconds=1))
    remember(project, "ruff: another scope", scope="user:u-1")
    remember(project, "ruff: an approved eviction", proposal="evict")
    other = Project.objects.create(name="Other", slug="other")
    remember(other, "ruff: another project")
    assert ids(search(project, "ruff", k=50)) == [live.pk]
    user = search(project, "ruff", scope="user:u-1")
    assert [r.content for r in user] == ["ruff: another scope"]


def test_k_caps_and_ties_keep_a_stable_order(project: Project) -> None:
    made = [remember(project, f"ruff rule {n}") for n in range(6)]
    assert ids(search(project, "ruff", k=3)) == [m.pk for m in made[:3]]


def test_a_typo_or_part_of_a_word_is_found_by_trigrams(project: Project) -> None:
    ruff = remember(project, "Always use ruff")
    remember(project, "Deploys happen on Tuesdays")
    (result,) = search(project, "ruf")
    assert result.memory_id == ruff.pk
    assert 0.6 <= result.components["relevance"] < 1


def test_nothing_relevant_is_an_empty_list(project: Project) -> None:
    remember(project, "Always use ruff")
    assert search(project, "kubernetes helm chart") == []
    assert len(search(project, "ruff")) == 1  # positive control: a word it holds finds it


def test_bad_arguments_name_the_field(project: Project) -> None:
    with pytest.raises(MemoryInputError) as error:
        search(project, "  ")
    assert error.value.field == "q"
    with pytest.raises(MemoryInputError) as error:
        search(project, "ruff", k=0)
    assert error.value.field == "k"
    with pytest.raises(MemoryInputError) as error:
        search(project, "ruff", scope="team")
    assert error.value.field == "scope"


def test_the_portable_terms_drop_stop_words_and_plurals() -> None:
    assert terms("Where are the Deploys of the staging hosts? (gas)") == {
        "deploy",
        "staging",
        "host",
        "gas",
    }


def test_a_minus_word_keeps_its_memories_out_of_every_try(project: Project) -> None:
    remember(project, "Deploys to staging run on port 5433")
    release = remember(project, "Releases go out on Tuesdays")
    plain = remember(project, "Use ruff for lint")
    remember(project, "Use ruff, never black")
    # no memory has every word: the memories with any of them, none with the word refused
    assert ids(search(project, "deploy -staging")) == []
    assert ids(search(project, "deploy releases -staging")) == [release.pk]
    assert ids(search(project, "ruff -black")) == [plain.pk]
    # nor does a typo found by trigrams bring one back
    assert ids(search(project, "stagng -staging")) == []
    assert ids(search(project, "deploy staging"))  # positive control


@on_postgres
def test_postgresql_full_text_stems_words(project: Project) -> None:
    deploys = remember(project, "Deploys happen on Tuesdays after the standup")
    remember(project, "Always use ruff")
    results = search(project, "deploying on tuesday")
    assert ids(results) == [deploys.pk]
    assert results[0].components["relevance"] == 1.0


@on_postgres
def test_postgresql_every_word_first_then_any_word(project: Project) -> None:
    both = remember(project, "Deploy staging after the standup")
    one = remember(project, "Deploy production on Fridays")
    # every word matches one memory: only it is returned
    assert ids(search(project, "deploy staging")) == [both.pk]
    # no memory has every word: those with any of them, the one with more first
    assert ids(search(project, "deploy staging kubernetes")) == [both.pk, one.pk]


@on_postgres
def test_postgresql_web_search_syntax(project: Project) -> None:
    black = remember(project, "Use ruff, never black")
    plain = remember(project, "Use ruff for lint")
    assert ids(search(project, "ruff -black")) == [plain.pk]
    assert ids(search(project, '"never black"')) == [black.pk]


@on_postgres
def test_postgresql_relevance_is_relative_to_the_best_match(project: Project) -> None:
    strong = remember(project, "ruff ruff: ruff formats and ruff lints")
    weak = remember(project, "We also looked at ruff once")
    results = search(project, "ruff")
    assert ids(results) == [strong.pk, weak.pk]
    assert results[0].components["relevance"] == 1.0
    assert 0 < results[1].components["relevance"] < 1


def test_a_very_old_memory_has_no_freshness_left_and_is_still_found(project: Project) -> None:
    ancient = remember(project, "Use ruff for lint", decided_at=NOW - timedelta(days=36_500))
    with override_settings(COSTBOARD_MEMORY_HALF_LIFE_DAYS=1):
        (result,) = search(project, "ruff")
    assert result.memory_id == ancient.pk
    assert result.components["freshness"] == 0.0
