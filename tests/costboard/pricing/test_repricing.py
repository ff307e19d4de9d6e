from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.test import Client

from costboard.models import (
    DailyRollup,
    ModelPrice,
    Session,
    SessionModelUsage,
    Step,
    TagDailyRollup,
    Turn,
    UserDailyRollup,
)
from costboard.outbox import outbox_dispatch
from costboard.pricing.repricing import PriceMatch, models_affected, steps_reprice
from costboard.pricing.services import prices_reprice_later
from tests.conftest import Agent, add_price, make_agent, usd
from tests.waiting import wait_until


def traffic(agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "s1", "user_id": "ann", "tags": {"team": "core"}},
        {
            "session_id": "s1",
            "turn": 1,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 1000,
            "output_tokens": 100,
            "cache_read_input_tokens": 10_000,
        },
        {
            "session_id": "s1",
            "turn": 2,
            "step_type": "intent",
            "model": "house-llm",
            "input_tokens": 2000,
            "output_tokens": 200,
            "tags": {"feature": "intent"},
        },
        {
            "session_id": "s2",
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 3000,
            "output_tokens": 300,
        },
    )


ROLLUP_SUMS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cost_usd")


def assert_rollups_match_steps() -> None:
    """Every session, turn, daily rollup and model-mix row is the sum of its steps (rollups
    and model mix keyed by family and exact model), and none is left without steps; each
    session's families are its steps'."""
    for session in Session.objects.all():
        steps = list(Step.objects.filter(session=session))
        assert session.cost_usd == sum((s.cost_usd for s in steps), Decimal(0))
        assert session.families == {s.family: True for s in steps}
    for turn in Turn.objects.all():
        assert turn.cost_usd == sum((s.cost_usd for s in turn.steps.all()), Decimal(0))
    keys = set()
    for rollup in DailyRollup.objects.all():
        steps = [
            s
            for s in Step.objects.filter(
                family=rollup.family, model=rollup.model, step_type=rollup.step_type
            )
            if s.timestamp.date() == rollup.day
        ]
        assert rollup.calls == len(steps) > 0
        for name in ROLLUP_SUMS:
            assert getattr(rollup, name) == sum(getattr(s, name) for s in steps), name
        assert rollup.unpriced_calls == sum(s.price_id is None and not s.is_tool for s in steps)
        keys.add((rollup.day, rollup.family, rollup.model, rollup.step_type))
    steps_keys = {(s.timestamp.date(), s.family, s.model, s.step_type) for s in Step.objects.all()}
    assert keys == steps_keys
    usage_keys = set()
    for usage in SessionModelUsage.objects.all():
        steps = list(
            Step.objects.filter(session_id=usage.session_id, family=usage.family, model=usage.model)
        )
        assert usage.calls == len(steps) > 0
        assert usage.cost_usd == sum((s.cost_usd for s in steps), Decimal(0))
        assert usage.tokens_used == sum(s.input_tokens + s.output_tokens for s in steps)
        usage_keys.add((usage.session_id, usage.family, usage.model))
    assert usage_keys == {(s.session_id, s.family, s.model) for s in Step.objects.all()}
    # the spend by user and by tag (the spend API's and the pages' breakdowns) too
    for by_user in UserDailyRollup.objects.all():
        steps = [
            s
            for s in Step.objects.filter(session__user_id=by_user.user_id)
            if s.timestamp.date() == by_user.day
        ]
        assert by_user.calls == len(steps) > 0
        assert by_user.cost_usd == sum((s.cost_usd for s in steps), Decimal(0)), by_user.user_id
    for by_tag in TagDailyRollup.objects.all():
        steps = [
            s
            for s in Step.objects.all()
            if (s.tags or {}).get(by_tag.key) == by_tag.value and s.timestamp.date() == by_tag.day
        ]
        assert by_tag.calls == len(steps) > 0
        assert by_tag.cost_usd == sum((s.cost_usd for s in steps), Decimal(0)), by_tag.value


@pytest.mark.django_db
def test_editing_a_price_in_the_admin_reprices_its_steps(staff: Client, agent: Agent) -> None:
    price = add_price("test-sonnet")
    traffic(agent)
    response = staff.post(
        f"/admin/costboard/modelprice/{price.pk}/change/",
        {
            "provider": "testco",
            "model": "test-sonnet",
            "model_regex": "",
            "input_mtok": "4",
            "output_mtok": "15",
            "cache_read_mtok": "0.4",
            "cache_write_mtok": "3.75",
            "cache_write_1h_mtok": "6",
            "tiers": "[]",
            "context_window": "",
            "effective_from_0": "2000-01-01",
            "effective_from_1": "00:00:00",
            "source": "manual",
            "external_id": "",
        },
    )
    assert outbox_dispatch().kinds == {"prices.reprice": 1}  # one repricing, after commit
    assert response.status_code == 302, response.content.decode()[:3000]
    price.refresh_from_db()
    assert price.edited_by_admin
    s1 = Session.objects.get(external_id="s1")
    assert s1.cost_usd == usd(1000, Decimal(4)) + usd(100, Decimal(15)) + usd(
        10_000, Decimal("0.4")
    )
    s2 = Session.objects.get(external_id="s2")
    assert s2.cost_usd == usd(3000, Decimal(4)) + usd(300, Decimal(15))
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_editing_an_audio_rate_in_the_admin_reprices_the_audio_of_its_steps(
    staff: Client, agent: Agent
) -> None:
    """A voice step priced with blank audio rates (its audio at the text rates) is repriced
    at the audio rates an admin sets; every total stays the sum of its steps."""
    price = add_price("test-voice")
    agent.events(
        {
            "session_id": "v1",
            "turn": 1,
            "step_type": "voice",
            "model": "test-voice",
            "input_tokens": 1000,
            "input_audio_tokens": 600,
            "cache_read_input_tokens": 10_000,
            "cache_audio_read_tokens": 4000,
            "output_tokens": 100,
            "output_audio_tokens": 80,
        }
    )
    # blank audio rates: audio in at $3, audio out at $15, cached audio at $3 + $0.30 − $3
    step = Step.objects.get()
    assert step.cost_usd == usd(1000, Decimal(3)) + usd(10_000, Decimal("0.3")) + usd(
        100, Decimal(15)
    )
    response = staff.post(
        f"/admin/costboard/modelprice/{price.pk}/change/",
        {
            "provider": "testco",
            "model": "test-voice",
            "model_regex": "",
            "input_mtok": "3",
            "output_mtok": "15",
            "cache_read_mtok": "0.3",
            "cache_write_mtok": "3.75",
            "cache_write_1h_mtok": "6",
            "input_audio_mtok": "32",
            "cache_audio_read_mtok": "0.4",
            "output_audio_mtok": "64",
            "tiers": "[]",
            "context_window": "",
            "effective_from_0": "2000-01-01",
            "effective_from_1": "00:00:00",
            "source": "manual",
            "external_id": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert outbox_dispatch().kinds == {"prices.reprice": 1}
    step.refresh_from_db()
    assert step.cost_input_usd == usd(400, Decimal(3)) + usd(600, Decimal(32))
    assert step.cost_cache_read_usd == usd(6000, Decimal("0.3")) + usd(4000, Decimal("0.4"))
    assert step.cost_output_usd == usd(20, Decimal(15)) + usd(80, Decimal(64))
    assert step.cost_usd == Decimal("0.02922")
    assert Session.objects.get(external_id="v1").cost_usd == step.cost_usd
    assert_rollups_match_steps()
    # the session page shows the step's audio counts, and its price explanation the rates
    page = staff.get(f"/sessions/{step.session_id}/").content.decode()
    shown = [
        " ".join(cell.split()) for cell in re.findall(r'class="muted audio"[^>]*>([^<]*)<', page)
    ]
    assert shown == ["600 audio", "80 audio", "4,000 audio"]
    explained = re.search(r'data-price-explanation="([^"]*)"', page)
    assert explained is not None
    assert (
        "$3 in / $15 out / $0.3 cache read / $3.75 cache write / $32 audio in / "
        "$0.4 cached audio / $64 audio out per million tokens"
    ) in explained[1]
    assert "List cost $0.02922." in explained[1]


@pytest.mark.django_db
def test_a_negative_audio_rate_is_refused_naming_the_field(staff: Client) -> None:
    price = add_price("test-voice")
    response = staff.post(
        f"/admin/costboard/modelprice/{price.pk}/change/",
        {
            "provider": "testco",
            "model": "test-voice",
            "input_mtok": "3",
            "output_mtok": "15",
            "input_audio_mtok": "-1",
            "tiers": "[]",
            "effective_from_0": "2000-01-01",
            "effective_from_1": "00:00:00",
            "source": "manual",
        },
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["input_audio_mtok"]
    assert errors["input_audio_mtok"][0].startswith("must be 0 or more USD per million tokens")
    price.refresh_from_db()
    assert price.input_audio_mtok is None


@pytest.mark.django_db
def test_adding_a_price_prices_the_unpriced_steps(staff: Client, agent: Agent) -> None:
    add_price("test-sonnet")
    traffic(agent)
    assert DailyRollup.objects.get(model="house-llm").unpriced_calls == 1
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {
            "provider": "",
            "model": "house-llm",
            "model_regex": "",
            "input_mtok": "1",
            "output_mtok": "2",
            "cache_read_mtok": "",
            "cache_write_mtok": "",
            "cache_write_1h_mtok": "",
            "tiers": "[]",
            "context_window": "",
            "effective_from_0": "2000-01-01",
            "effective_from_1": "00:00:00",
            "source": "manual",
            "external_id": "",
        },
    )
    outbox_dispatch()
    assert response.status_code == 302, response.content.decode()[:3000]
    step = Step.objects.get(model="house-llm")
    assert step.price_id is not None
    assert step.cost_usd == usd(2000, Decimal(1)) + usd(200, Decimal(2))
    assert DailyRollup.objects.get(model="house-llm").unpriced_calls == 0
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_deleting_a_price_leaves_its_steps_unpriced(staff: Client, agent: Agent) -> None:
    price = add_price("test-sonnet")
    traffic(agent)
    response = staff.post(f"/admin/costboard/modelprice/{price.pk}/delete/", {"post": "yes"})
    outbox_dispatch()
    assert response.status_code == 302
    assert set(Step.objects.filter(model="test-sonnet").values_list("cost_usd", flat=True)) == {
        Decimal(0)
    }
    assert Session.objects.get(external_id="s2").cost_usd == 0
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_the_admin_refuses_a_bad_regex(staff: Client) -> None:
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {
            "provider": "",
            "model": "x",
            "model_regex": "gpt-(4",
            "input_mtok": "1",
            "output_mtok": "1",
            "tiers": "[]",
            "effective_from_0": "2000-01-01",
            "effective_from_1": "00:00:00",
            "source": "manual",
        },
    )
    assert response.status_code == 200
    assert b"not a valid regular expression" in response.content
    assert not ModelPrice.objects.filter(model="x").exists()


@pytest.mark.django_db
def test_repricing_crosses_a_budget_the_new_price_reaches(agent: Agent) -> None:
    price = add_price("test-sonnet", input_mtok=Decimal("1"))
    agent.events(
        {"type": "session", "session_id": "s1", "cost_cap_usd": "1.00", "token_cap": 10**7},
        {"session_id": "s1", "step_type": "x", "model": "test-sonnet", "input_tokens": 500_000},
    )
    assert Session.objects.get(external_id="s1").state == "ok"
    ModelPrice.objects.filter(pk=price.pk).update(input_mtok=Decimal(2))
    result = steps_reprice(models=["test-sonnet"])
    assert (result.steps_changed, result.cost_delta) == (1, Decimal("0.5"))
    session = Session.objects.get(external_id="s1")
    assert (session.cost_usd, session.state) == (Decimal(1), "exhausted")
    assert session.exhausted_at is not None


@pytest.mark.django_db
def test_repricing_twice_changes_nothing_the_second_time(agent: Agent) -> None:
    add_price("test-sonnet")
    traffic(agent)
    ModelPrice.objects.filter(model="test-sonnet").update(output_mtok=Decimal(30))
    assert steps_reprice(models=["test-sonnet"]).steps_changed == 2
    assert steps_reprice(models=["test-sonnet"]).steps_changed == 0
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_a_price_match_covers_aliases_of_step_models(agent: Agent) -> None:
    agent.events(
        {"step_type": "x", "model": "testco/test-sonnet-20260101"},
        {"step_type": "x", "model": "other-model"},
        {"step_type": "x", "model": "house-v2"},
    )
    assert models_affected([PriceMatch("test-sonnet")]) == ["testco/test-sonnet-20260101"]
    assert models_affected([PriceMatch("house", r"^house-v\d$")]) == ["house-v2"]


@pytest.mark.slow
def test_a_worker_reprices_through_the_broker(outbox_beat: None) -> None:
    agent = make_agent("worker")
    price = add_price("test-sonnet")
    traffic(agent)
    ModelPrice.objects.filter(pk=price.pk).update(input_mtok=Decimal(6))
    prices_reprice_later([PriceMatch("test-sonnet")])  # autocommit: queued at once
    expected = usd(3000, Decimal(6)) + usd(300, Decimal(15))
    wait_until(
        lambda: Session.objects.get(external_id="s2").cost_usd == expected,
        what=f"the worker to reprice s2 to {expected}",
    )
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_a_price_that_takes_over_a_model_moves_its_steps_to_the_new_family(
    agent: Agent,
) -> None:
    """Unpriced, a dated name is its own name's family; once a price row covers it, the row's
    model is its family: the step moves between rollup rows, whole, and back on delete."""
    agent.events(
        {"session_id": "s1", "step_type": "x", "model": "gpt-9-2031-01-01", "input_tokens": 1000},
        {"session_id": "s1", "step_type": "x", "model": "gpt-9", "input_tokens": 2000},
        {"session_id": "s1", "step_type": "tool", "model": "none", "duration_ms": 40},
    )
    assert set(Step.objects.values_list("model", "family")) == {
        ("gpt-9-2031-01-01", "gpt-9"),
        ("gpt-9", "gpt-9"),
        ("none", "none"),
    }
    assert DailyRollup.objects.filter(family="gpt-9").count() == 2
    assert_rollups_match_steps()

    price = add_price("house-nine", input_mtok=Decimal(1), model_regex=r"^gpt-9-\d{4}")
    prices_reprice_later([PriceMatch(price.model, price.model_regex)])
    outbox_dispatch()
    dated = Step.objects.get(model="gpt-9-2031-01-01")
    assert (dated.price_id, dated.family, dated.cost_usd) == (
        price.pk,
        "house-nine",
        usd(1000, Decimal(1)),
    )
    assert list(DailyRollup.objects.filter(family="house-nine").values_list("model", "calls")) == [
        ("gpt-9-2031-01-01", 1)
    ]
    assert list(DailyRollup.objects.filter(family="gpt-9").values_list("model", "calls")) == [
        ("gpt-9", 1)
    ]
    assert_rollups_match_steps()

    ModelPrice.objects.filter(pk=price.pk).delete()
    prices_reprice_later([PriceMatch(price.model, price.model_regex)])
    outbox_dispatch()
    dated.refresh_from_db()
    assert (dated.price_id, dated.family, dated.cost_usd) == (None, "gpt-9", Decimal(0))
    assert not DailyRollup.objects.filter(family="house-nine").exists()
    assert not SessionModelUsage.objects.filter(family="house-nine").exists()
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_renaming_a_price_row_renames_the_family_of_its_steps(agent: Agent) -> None:
    price = add_price("house-llm")
    agent.events({"session_id": "s1", "step_type": "x", "model": "house-llm-2030-01-01"})
    assert Step.objects.get().family == "house-llm"
    ModelPrice.objects.filter(pk=price.pk).update(model="house-llm-pro", model_regex="^house-llm")
    steps_reprice(models=models_affected([PriceMatch("house-llm"), PriceMatch("house-llm-pro")]))
    assert Step.objects.get().family == "house-llm-pro"
    assert list(DailyRollup.objects.values_list("family", "calls")) == [("house-llm-pro", 1)]
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_tool_steps_are_never_repriced_even_by_a_price_that_matches_none(agent: Agent) -> None:
    agent.events({"session_id": "s1", "step_type": "tool", "model": "none", "input_tokens": 5})
    add_price("catch-all", model_regex="one")  # its regex would match "none"
    assert models_affected([PriceMatch("catch-all", "one")]) == []
    steps_reprice(models=["none"])
    step = Step.objects.get()
    assert (step.price_id, step.cost_usd, step.family) == (None, Decimal(0), "none")
    assert DailyRollup.objects.get().unpriced_calls == 0
    assert_rollups_match_steps()


@pytest.mark.django_db
def test_repricing_keeps_the_family_ingest_gave_a_step_of_a_nameless_price_row(
    agent: Agent,
) -> None:
    """Ingest and repricing classify a step with one function (pricing/families.py,
    `step_classify`): a priced step is of its row's family whatever that is, even the empty
    family of a row whose model is blank and whose regex does the matching. Repricing used to
    fall back to the step's own name there, moving it between rollup rows though no price
    changed."""
    price = add_price("", model_regex="^mystery-", input_mtok=Decimal(2))
    agent.events(
        {"session_id": "s1", "step_type": "x", "model": "mystery-llm", "input_tokens": 500}
    )
    step = Step.objects.get()
    assert (step.price_id, step.family, step.cost_usd) == (price.pk, "", usd(500, Decimal(2)))
    result = steps_reprice(models=["mystery-llm"])
    assert (result.steps_seen, result.steps_changed, result.cost_delta) == (1, 0, Decimal(0))
    step.refresh_from_db()
    assert (step.price_id, step.family, step.cost_usd) == (price.pk, "", usd(500, Decimal(2)))
    assert list(DailyRollup.objects.values_list("family", "model", "calls")) == [
        ("", "mystery-llm", 1)
    ]
    assert_rollups_match_steps()
