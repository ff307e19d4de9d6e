"""Memory detection: precision and recall over the labelled corpus, no secret reaching a
candidate (redaction itself: test_redaction), the write policy, and the Celery task end to
end."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest

from costboard.models import Turn
from memory_ui.detect import MAX_CONTENT, MAX_EVIDENCE, Candidate, detect, detect_many
from memory_ui.models import Memory
from memory_ui.tasks import memory_detect
from tests.conftest import Agent
from tests.memory_ui.corpus import CORPUS, Sample

TYPES = ("user", "feedback", "project", "reference")
# Floors for detection over the corpus: a message counts as a true positive when its expected
# type is among its candidates' types, a false positive for each other type proposed.
OVERALL_PRECISION = 0.9
OVERALL_RECALL = 0.9
PER_TYPE_PRECISION = 0.8
PER_TYPE_RECALL = 0.8


def _scores() -> tuple[dict[str, tuple[float, float]], tuple[float, float], list[str]]:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    misses: list[str] = []
    for sample in CORPUS:
        found = {c.type for c in detect(sample.text, sample.assistant)}
        if sample.expected is not None:
            if sample.expected in found:
                tp[sample.expected] += 1
            else:
                fn[sample.expected] += 1
        wrong = found - {sample.expected}
        fp.update(wrong)
        if wrong or (sample.expected is not None and sample.expected not in found):
            misses.append(f"  expected {sample.expected}, got {sorted(found)}: {sample.text!r}")
    per_type = {t: (tp[t] / ((tp[t] + fp[t]) or 1), tp[t] / ((tp[t] + fn[t]) or 1)) for t in TYPES}
    all_tp, all_fp, all_fn = sum(tp.values()), sum(fp.values()), sum(fn.values())
    overall = (all_tp / ((all_tp + all_fp) or 1), all_tp / ((all_tp + all_fn) or 1))
    summary = [f"  {t:9} tp={tp[t]:3} fp={fp[t]:3} fn={fn[t]:3}" for t in TYPES]
    return per_type, overall, summary + misses


def test_the_corpus_covers_every_kind_of_message() -> None:
    counts = Counter(s.expected for s in CORPUS)
    assert len(CORPUS) >= 70
    assert all(counts[t] >= 10 for t in TYPES), counts
    assert counts[None] >= 30
    kinds = {k for s in CORPUS for k in s.redactions}
    assert {"api_key", "password", "bearer_token", "jwt", "email", "phone", "card_number"} <= kinds


def test_detection_precision_and_recall_are_above_their_floors() -> None:
    per_type, (precision, recall), report = _scores()
    table = "\n".join(
        [f"overall precision={precision:.3f} recall={recall:.3f}"]
        + [f"  {t:9} precision={p:.3f} recall={r:.3f}" for t, (p, r) in per_type.items()]
        + report
    )
    assert precision >= OVERALL_PRECISION, table
    assert recall >= OVERALL_RECALL, table
    for memory_type, (p, r) in per_type.items():
        assert p >= PER_TYPE_PRECISION, f"{memory_type} precision\n{table}"
        assert r >= PER_TYPE_RECALL, f"{memory_type} recall\n{table}"


@pytest.mark.parametrize("sample", [s for s in CORPUS if s.secrets], ids=lambda s: s.text[:40])
def test_no_secret_reaches_a_candidate(sample: Sample) -> None:
    # positive control: the secret is really in what the detector reads
    assert all(secret in sample.text + sample.assistant for secret in sample.secrets)
    for candidate in detect(sample.text, sample.assistant):
        for secret in sample.secrets:
            assert secret not in candidate.content
            assert secret not in candidate.evidence


def test_a_kept_sentence_notes_what_was_redacted() -> None:
    (candidate,) = detect("Never paste API keys like sk-live-AbCdEfGhIjKlMnOpQrStUv12 into chat.")
    assert candidate.type == "feedback"
    assert candidate.content == "never paste API keys like [redacted:api_key] into chat"
    assert candidate.redactions == ["api_key"]
    assert "sk-live" not in candidate.evidence


def test_a_sentence_whose_point_is_a_secret_is_dropped() -> None:
    assert detect("my password is hunter2") == []
    assert detect("Here's my OpenAI key: sk-proj-4fG7hK9mN2pQ5rS8tV1wX3yZ6aB0cD2eF4gH") == []
    assert detect("My email is jane.doe@example.com.") == []
    # positive control: a rule of the same shape without a secret is kept
    assert [c.type for c in detect("Always use ruff for linting.")] == ["feedback"]


def test_content_is_at_most_150_characters_and_cut_at_a_word() -> None:
    long_rule = (
        "Always run the full integration test suite against a fresh PostgreSQL 16 database "
        "with the production settings module, the feature flags from staging and the seeded "
        "demo data before you open any pull request for the billing service"
    )
    (candidate,) = detect(long_rule + ".")
    assert len(candidate.content) <= MAX_CONTENT
    assert candidate.content.endswith("…")
    assert long_rule.lower().startswith(candidate.content[:-1].lower())
    assert candidate.evidence == long_rule + "."
    for sample in CORPUS:
        for found in detect(sample.text, sample.assistant):
            assert 0 < len(found.content) <= MAX_CONTENT
            assert len(found.evidence) <= MAX_EVIDENCE
            assert found.content == found.content.strip()


def test_a_long_sentence_that_says_nothing_once_cut_is_dropped() -> None:
    rambling = "Always " + "really " * 40 + "use ruff."
    assert detect(rambling) == []
    # the rule itself comes after the first 150 characters
    late = (
        "Because the quarterly planning offsite with the whole platform group, the two new "
        "contractors from the agency and everyone from the data team is long, please always "
        "book the big room."
    )
    assert detect(late) == []
    # positive control: the same rule, short, is kept
    assert [c.type for c in detect("Please always book the big room.")] == ["feedback"]


def test_explicit_rules_are_more_important_than_weak_statements() -> None:
    (explicit,) = detect("Always use ruff, never black.")
    (remember,) = detect("Please remember that the staging DB is on port 5433.")
    (weak,) = detect("I like dark mode.")
    (plain,) = detect("The staging DB is on port 5433.")
    assert explicit.importance > weak.importance
    assert remember.importance > plain.importance
    assert {"always", "never"} <= set(explicit.signals)
    assert "remember" in remember.signals
    for candidate in (explicit, remember, weak, plain):
        assert Decimal(0) <= candidate.importance <= Decimal(1)
        assert candidate.importance.as_tuple().exponent == -3


def test_the_assistant_only_counts_for_commitments_at_lower_importance() -> None:
    (stated,) = detect("Never commit directly to main.")
    (inferred,) = detect("ok", "Got it. I'll never commit directly to main.")
    assert inferred.source == "agent_inferred"
    assert stated.source == "user_stated"
    assert inferred.content == stated.content == "never commit directly to main"
    assert inferred.importance < stated.importance
    assert detect("fix it", "Sure, I'll fix the test. Always run ruff before pushing.") == []


def test_the_same_memory_from_both_sides_is_proposed_once() -> None:
    found = detect("I prefer metric units.", "Noted: you prefer metric units.")
    assert [(c.type, c.content, c.source) for c in found] == [
        ("user", "prefers metric units", "user_stated")
    ]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("I prefer concise answers.", "prefers concise answers"),
        ("I'd rather see code than prose.", "would rather see code than prose"),
        ("I really don't like emojis.", "really doesn't like emojis"),
        ("My timezone is CET.", "timezone is CET"),
        ("You should always use ruff, never black.", "always use ruff, never black"),
        ("From now on, reply in Spanish.", "reply in Spanish"),
        ("Remember that the staging DB is on port 5433.", "the staging DB is on port 5433"),
    ],
)
def test_content_is_phrased_as_a_memory_line(text: str, content: str) -> None:
    (candidate,) = detect(text)
    assert candidate.content == content


def test_a_message_with_several_memories_yields_each() -> None:
    found = detect(
        "Hi! I prefer concise answers. Also, the staging DB is on port 5433. "
        "The demo is next Tuesday. Always use ruff, never black. Thanks!"
    )
    assert [c.type for c in found] == ["user", "reference", "project", "feedback"]


def test_candidates_are_frozen_and_explain_themselves() -> None:
    (candidate,) = detect("Always use ruff, never black.")
    assert isinstance(candidate, Candidate)
    with pytest.raises(AttributeError):
        candidate.content = "changed"  # type: ignore[misc]
    assert candidate.signals
    assert hash(candidate)


def test_detect_many_runs_detect_per_turn() -> None:
    turns: list[str | tuple[str, str]] = ["thanks!", ("ok", "Noted: you prefer metric units.")]
    assert detect_many(turns) == [
        detect("thanks!"),
        detect("ok", "Noted: you prefer metric units."),
    ]


def test_empty_and_huge_messages_are_fine() -> None:
    assert detect("") == []
    assert detect("   ", "") == []
    found = detect("Always use ruff. " + "x" * 200_000)
    assert [c.content for c in found] == ["always use ruff"]


# --------------------------------------------------------------------------------------------
# The Celery task


def _turn(agent: Agent, *, user_message: str, assistant: str = "", user_id: str = "") -> Turn:
    session = {
        "type": "session",
        "session_id": "chat-1",
        **({"user_id": user_id} if user_id else {}),
    }
    agent.events(
        session,
        {
            "type": "turn",
            "session_id": "chat-1",
            "turn": 1,
            "user_message": user_message,
            "assistant_response": assistant,
        },
    )
    return Turn.objects.get(session__external_id="chat-1", number=1)


def test_the_task_proposes_pending_candidates_from_a_stored_turn(agent: Agent) -> None:
    turn = _turn(
        agent,
        user_message=(
            "I prefer concise answers. Always use ruff, never black. "
            "My password is hunter2. The staging DB is on port 5433."
        ),
        assistant="I'll remember that the deadline is March 3.",
        user_id="u-42",
    )
    proposed = memory_detect.delay([turn.id]).get()

    memories = Memory.objects.filter(project=agent.project).order_by("pk")
    assert proposed == 4
    rows = {(m.type, m.content, m.scope, m.source) for m in memories}
    assert rows == {
        ("user", "prefers concise answers", "user:u-42", "user_stated"),
        ("feedback", "always use ruff, never black", "project", "user_stated"),
        ("reference", "the staging DB is on port 5433", "project", "user_stated"),
        ("project", "the deadline is March 3", "project", "agent_inferred"),
    }
    for memory in memories:
        assert memory.status == Memory.Status.PENDING
        assert memory.proposed_by == "detector"
        assert memory.turn_id == turn.id
        assert memory.session_id == turn.session_id
        assert memory.evidence
        assert "hunter2" not in memory.content + memory.evidence


def test_the_task_notes_redactions_and_merges_a_repeat(agent: Agent) -> None:
    turn = _turn(agent, user_message="Always CC legal@acme.io on contract questions.")
    assert memory_detect([turn.id]) == 1
    assert memory_detect([turn.id]) == 1  # proposed again: merged, not duplicated

    (memory,) = Memory.objects.filter(project=agent.project)
    assert memory.content == "always CC [redacted:email] on contract questions"
    assert memory.redactions == ["email"]
    assert memory.times_proposed == 2
    assert "legal@acme.io" not in memory.evidence


def test_a_user_memory_without_a_user_id_is_project_scoped(agent: Agent) -> None:
    turn = _turn(agent, user_message="I prefer metric units.")
    assert memory_detect([turn.id]) == 1
    assert Memory.objects.get(project=agent.project).scope == "project"


def test_the_task_skips_turns_that_are_gone_and_small_talk(agent: Agent) -> None:
    turn = _turn(agent, user_message="thanks, that works!")
    assert memory_detect([turn.id, 999_999]) == 0
    assert not Memory.objects.filter(project=agent.project).exists()
    # positive control: a rule in a later turn of the same session is proposed
    rule = _turn(agent, user_message="Always use ruff for linting.")
    assert memory_detect([rule.id, 999_999]) == 1
    assert Memory.objects.filter(project=agent.project, status="pending").count() == 1


def test_a_user_id_a_scope_cannot_hold_skips_only_that_candidate(agent: Agent) -> None:
    turn = _turn(
        agent,
        user_message="I prefer metric units. The staging DB is on port 5433.",
        user_id="jane\tdoe",  # a control character: events take it, a scope does not
    )
    assert memory_detect([turn.id]) == 1
    (memory,) = Memory.objects.filter(project=agent.project)
    assert (memory.type, memory.scope) == ("reference", "project")


@pytest.mark.parametrize(
    "user_id", ["auth0|5f1a9c", "google-oauth2|1170", "tenant:42/u 7", "Jane Doe"]
)
def test_any_user_id_events_take_gets_its_user_scope(agent: Agent, user_id: str) -> None:
    turn = _turn(agent, user_message="I prefer metric units.", user_id=user_id)
    assert memory_detect([turn.id]) == 1
    assert Memory.objects.get(project=agent.project).scope == f"user:{user_id}"
