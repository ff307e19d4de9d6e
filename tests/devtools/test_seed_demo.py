from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from costboard.billing.proposals import drift_proposals
from costboard.billing.reconcile import Wanted, reconcile
from costboard.budgets.caps import session_caps
from costboard.models import (
    SYSTEM_SESSION_ID,
    BudgetEvent,
    DailyRollup,
    IngestTally,
    ModelPrice,
    Project,
    Session,
    Step,
)
from devtools.demo import demo_seed
from memory_ui.models import Memory, MemoryEvent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SESSIONS = 40


def seed(**options: object) -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out, **options)
    return out.getvalue()


def money_sum(values: object) -> Decimal:
    """Summed in Python: each value as the database returns it, so SQLite's float SUM() plays
    no part."""
    return sum(values, Decimal(0))  # type: ignore[call-overload]


@pytest.fixture
def seeded() -> str:
    assert not ModelPrice.objects.exists()
    return seed(sessions=SESSIONS)


def test_it_loads_prices_and_seeds_several_projects_over_the_window(seeded: str) -> None:
    assert "loaded" in seeded and "prices from genai-prices" in seeded
    assert "100%" in seeded
    assert seeded.strip().splitlines()[-1].startswith("seeded 3 projects")
    assert ModelPrice.objects.count() > 1000

    projects = set(Project.objects.values_list("slug", flat=True))
    assert projects >= {"support-bot", "research-agent", "code-review"}
    chats = Session.objects.exclude(external_id=SYSTEM_SESSION_ID)
    assert chats.count() == SESSIONS
    for slug in projects:
        assert chats.filter(project__slug=slug).count() >= 8
    days = {started.date() for started in chats.values_list("started_at", flat=True)}
    assert len(days) >= 25
    assert chats.filter(parent__isnull=True, ended_at__isnull=False).exists()
    assert chats.filter(turn_count__gte=2).count() > SESSIONS // 2

    steps = Step.objects.all()
    assert steps.count() > 10 * SESSIONS
    assert set(steps.values_list("step_type", flat=True)) >= {
        "intent",
        "filter",
        "search",
        "response",
        "compress",
    }
    assert steps.filter(cache_read_input_tokens__gt=0, model__startswith="claude").exists()
    assert steps.filter(cache_read_input_tokens__gt=0, model__startswith="gpt").exists()
    assert steps.filter(cache_creation_input_tokens__gt=0).exists()
    assert steps.filter(success=False).exclude(error="").exists()
    assert steps.filter(session__external_id=SYSTEM_SESSION_ID).exists()
    unpriced = steps.filter(price__isnull=True)
    assert unpriced.exists()
    assert set(unpriced.values_list("model", flat=True)) == {"acme-finetune-v2"}
    assert set(unpriced.values_list("cost_usd", flat=True)) == {Decimal(0)}


def test_the_budget_examples_reach_their_states_through_their_caps(seeded: str) -> None:
    near_cap = Session.objects.filter(state=Session.State.WARNING, metadata__scenario="near-cap")
    assert near_cap.count() == 3
    for session in near_cap:
        assert session.token_cap is not None
        assert session.tokens_used < session.token_cap
        assert session.warned_at is not None
        assert session.exhausted_at is None

    exhausted = Session.objects.filter(state=Session.State.EXHAUSTED)
    examples = exhausted.filter(metadata__scenario="exhausted")
    assert examples.count() == 3
    assert any(s.token_cap is not None and s.tokens_used >= s.token_cap for s in examples)
    assert any(s.cost_cap_usd is not None and s.cost_usd >= s.cost_cap_usd for s in examples)
    for session in exhausted:
        kinds = set(session.budget_events.values_list("kind", flat=True))
        # a cap reached, or a runaway told to stop
        assert {"runaway" if session.runaway else "soft_warned", "exhausted"} <= kinds

    runaway = Session.objects.filter(runaway_at__isnull=False)
    assert runaway.count() == 3
    for session in runaway:
        assert session.state == "exhausted" and session.exhausted_at == session.runaway_at
        event = BudgetEvent.objects.get(session=session, kind=BudgetEvent.Kind.RUNAWAY)
        assert event.at == session.runaway_at
        # flagged by ingest's own rule, at the step that made it five failures in a row
        assert event.detail["rule"] == "retry_loop"
        evidence = event.detail["evidence"]
        assert evidence["failed_in_a_row"] == evidence["threshold"] == 5
        assert session.runaway_reason == (
            f"retry loop: 5 failed steps in a row in turn {evidence['turn']}"
        )
        failed = session.steps.filter(
            success=False, step_type=evidence["step_type"], turn__number=evidence["turn"]
        )
        assert failed.count() >= 40
        assert failed.filter(timestamp__lte=event.at).count() == 5


def test_money_adds_up_exactly(seeded: str) -> None:
    by_session: dict[int, Decimal] = defaultdict(Decimal)
    for session_id, cost in Step.objects.values_list("session_id", "cost_usd"):
        by_session[session_id] += cost
    for session in Session.objects.all():
        assert session.cost_usd == by_session[session.pk], session.external_id

    steps_total = money_sum(Step.objects.values_list("cost_usd", flat=True))
    rollups_total = money_sum(DailyRollup.objects.values_list("cost_usd", flat=True))
    assert steps_total > 0
    assert rollups_total == steps_total
    assert sum(DailyRollup.objects.values_list("calls", flat=True)) == Step.objects.count()
    assert f"${steps_total:,.2f} in all" in seeded


def test_memory_candidates_wait_for_review_in_every_project(seeded: str) -> None:
    for project in Project.objects.all():
        pending = Memory.objects.filter(project=project, status=Memory.Status.PENDING)
        assert pending.count() >= 10
        assert set(pending.values_list("type", flat=True)) == {
            "user",
            "feedback",
            "project",
            "reference",
        }
        assert Memory.objects.filter(project=project, status=Memory.Status.APPROVED).exists()
        for memory in Memory.objects.filter(project=project):
            assert len(memory.content) <= 150
            assert Decimal(0) <= memory.importance <= Decimal(1)
            assert memory.turn is not None
            assert memory.turn.session == memory.session
            expected = "user:" if memory.type == "user" else "project"
            assert memory.scope.startswith(expected)
            assert memory.evidence  # each quotes the sentence it came from
        # each project's correction of a memory waits as a conflict, side by side
        corrections = pending.filter(conflicts_with__isnull=False).distinct()
        assert corrections.count() >= 1, project.slug
        for correction in corrections:
            (old,) = correction.conflicts_with.all()
            assert correction.frame_key == old.frame_key and correction.content != old.content


def test_a_second_run_stores_nothing_new(seeded: str) -> None:
    counts = (
        Step.objects.count(),
        Session.objects.count(),
        Memory.objects.count(),
        BudgetEvent.objects.count(),
    )
    again = seed(sessions=SESSIONS)
    assert (
        Step.objects.count(),
        Session.objects.count(),
        Memory.objects.count(),
        BudgetEvent.objects.count(),
    ) == counts
    assert "0 events stored" in again.splitlines()[-1]
    assert "0 memories, 0 runaways flagged" in again


def test_metrics_count_every_event_the_demo_stored(seeded: str) -> None:
    """The seeder gives its batches to the ingest service, not the API: /metrics counts them
    all the same, and a second run's replays as duplicates."""
    from django.db.models import Sum

    stored = int(
        seeded.splitlines()[-1].split(" events stored")[0].rsplit(" ", 1)[1].replace(",", "")
    )
    assert stored > 10 * SESSIONS
    assert IngestTally.objects.aggregate(n=Sum("accepted"))["n"] == stored
    seed(sessions=SESSIONS)
    tally = IngestTally.objects.aggregate(accepted=Sum("accepted"), duplicates=Sum("duplicates"))
    assert tally == {"accepted": stored, "duplicates": stored}


def test_the_demo_sends_dated_names_shown_under_one_model(seeded: str) -> None:
    """Providers answer with a dated snapshot name; the demo sends it for every other call,
    and the rollups hold both under one family."""
    steps = Step.objects.filter(model__startswith="gpt-4o").exclude(model__startswith="gpt-4o-mini")
    assert set(steps.values_list("model", "family")) == {
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
    }
    families = set(DailyRollup.objects.values_list("family", flat=True))
    assert "gpt-4o-2024-08-06" not in families and "claude-sonnet-4-5-20250929" not in families
    assert {"gpt-4o", "claude-sonnet-4-5", "gpt-4o-mini"} <= families


def test_if_empty_does_nothing_when_there_are_sessions() -> None:
    project = Project.objects.create(name="Mine", slug="mine")
    Session.objects.create(project=project, external_id="s1")
    out = seed(if_empty=True)
    assert "nothing to do" in out
    assert Project.objects.count() == 1
    assert Session.objects.count() == 1
    assert not Step.objects.exists()
    assert not Memory.objects.exists()


def test_steps_scales_the_number_of_sessions() -> None:
    out = seed(steps=2500, days=7, projects=4, seed=7)
    chats = Session.objects.exclude(external_id=SYSTEM_SESSION_ID)
    assert 1800 <= Step.objects.count() <= 3200
    assert Project.objects.count() == 4
    assert Project.objects.filter(slug="support-bot-2").exists()
    assert 80 <= chats.count() <= 250
    assert "seeded 4 projects" in out


def test_sessions_and_steps_cannot_both_be_given() -> None:
    with pytest.raises(CommandError, match="not both"):
        seed(sessions=10, steps=1000)


def _everything_seeded() -> dict[str, object]:
    """What a seed wrote, by its stable names (no database ids)."""
    steps = Step.objects.order_by("event_id")
    return {
        "sessions": sorted(
            Session.objects.values_list(
                "project__slug", "external_id", "state", "input_tokens", "cost_usd", "turn_count"
            )
        ),
        "steps": list(steps.values_list("event_id", "model", "cost_usd", "timestamp")),
        "cost": money_sum(Step.objects.values_list("cost_usd", flat=True)),
        "rollups": money_sum(DailyRollup.objects.values_list("cost_usd", flat=True)),
        "memories": sorted(
            Memory.objects.values_list(
                "project__slug",
                "type",
                "content",
                "scope",
                "status",
                "importance",
                "session__external_id",
                "created_at",
                "decided_at",
                "expires_at",
            )
        ),
        "history": sorted(
            MemoryEvent.objects.values_list("memory__content", "action", "actor_name", "at")
        ),
    }


def _wipe() -> None:
    """Back to an empty database but for the rate table."""
    MemoryEvent.objects.all().delete()
    Memory.objects.all().delete()
    Step.objects.all().delete()
    Project.objects.all().delete()


def test_the_same_seed_on_fresh_databases_gives_the_same_data() -> None:
    now = timezone.now() - timedelta(days=1)  # the same moment for both: the window ends there
    first = demo_seed(sessions=24, now=now, seed=5)
    seeded = _everything_seeded()
    assert first.memories_created == 51 and first.accepted > 0
    _wipe()
    assert not Session.objects.exists() and not Memory.objects.exists()
    second = demo_seed(sessions=24, now=now, seed=5)
    assert (second.sessions, second.steps, second.accepted, second.duplicates) == (
        first.sessions,
        first.steps,
        first.accepted,
        0,
    )
    assert second.cost_usd == first.cost_usd > 0
    assert _everything_seeded() == seeded
    _wipe()
    other = demo_seed(sessions=24, now=now, seed=6)
    assert _everything_seeded()["steps"] != seeded["steps"]  # the seed matters
    assert other.sessions == first.sessions


def test_the_demo_budgets_and_tags_count_what_was_sent(seeded: str) -> None:
    from costboard.budgets.periods import ledger_now, period_bounds
    from costboard.models import PeriodBudget

    now = timezone.now()
    for project in Project.objects.filter(slug__in=["support-bot", "research-agent"]):
        names = set(PeriodBudget.objects.filter(project=project).values_list("name", flat=True))
        assert names == {"Monthly spend", "Enterprise customers", "Daily per user"}
        monthly = PeriodBudget.objects.get(project=project, name="Monthly spend")
        ledger = ledger_now(monthly, now)
        assert ledger is not None and ledger.state == "warning"  # near its limit, on purpose
        start, end = period_bounds("month", "UTC", now)
        steps = Step.objects.filter(project=project, timestamp__gte=start, timestamp__lt=end)
        assert ledger.cost_usd == sum((s.cost_usd for s in steps), Decimal(0))
        assert monthly.cost_limit_usd is not None
        assert Decimal("0.8") <= ledger.cost_usd / monthly.cost_limit_usd < 1
        enterprise = PeriodBudget.objects.get(project=project, name="Enterprise customers")
        tagged = [s for s in steps if (s.tags or {}).get("plan") == "enterprise"]
        assert tagged and len(tagged) < steps.count()
        tag_ledger = ledger_now(enterprise, now)
        assert tag_ledger is not None
        assert tag_ledger.cost_usd == sum((s.cost_usd for s in tagged), Decimal(0))
        sessions = Session.objects.filter(project=project).exclude(external_id="system")
        assert all(set(s.tags) == {"customer", "plan"} for s in sessions)
        assert len({s.tags["customer"] for s in sessions}) > 3  # a real spread


def test_the_system_session_has_its_projects_system_caps_and_room_to_spare(
    seeded: str,
) -> None:
    """No caps of its own (docs/budgets.md, "Caps": they default to the project's); a month of
    background jobs uses some of them, not 0.00 % of ten billion tokens."""
    for system in Session.objects.filter(external_id=SYSTEM_SESSION_ID).select_related("project"):
        project = system.project
        assert (system.token_cap, system.cost_cap_usd) == (None, None)
        caps = session_caps(system)
        assert (caps.token_cap, caps.cost_cap_usd) == (
            project.system_token_cap,
            project.system_cost_cap_usd,
        )
        assert system.state == "ok"
        assert 0.01 < system.tokens_used / caps.token_cap < 0.8


def test_progress_tells_no_rate_before_the_first_batch_is_stored(seeded: str) -> None:
    progress = [line for line in seeded.splitlines() if "sessions," in line and "%" in line]
    assert progress and not any(" 0 events/s" in line for line in progress), progress
    for line in progress:
        stored = int(line.split(" steps, ")[1].split(" events stored")[0].replace(",", ""))
        assert line.endswith("events/s") if stored else line.endswith("still filling")


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def test_every_memory_cites_a_turn_that_states_it(seeded: str) -> None:
    """A memory's source turn says it: the sentence quoted on its card is the turn's, and the
    fact's numbers are the turn's (a 45-day rule is not cited from a turn about 30 days)."""
    memories = list(Memory.objects.select_related("turn", "session"))
    assert len(memories) >= 3 * 15
    for memory in memories:
        turn = memory.turn
        assert turn is not None, memory.content
        assert turn.session == memory.session and turn.project_id == memory.project_id
        said = f"{turn.user_message}\n{turn.assistant_response}"
        assert memory.evidence, memory.content
        assert memory.evidence in said, (memory.content, said)
        assert _numbers(memory.content) <= _numbers(said), (memory.content, said)
        assert memory.created_at > turn.started_at  # proposed after it was said


def test_every_replacement_is_dated_after_what_it_replaces(seeded: str) -> None:
    pairs: list[tuple[Memory | None, Memory]] = [
        (new, old) for new in Memory.objects.all() for old in new.conflicts_with.all()
    ]
    pairs += [(m.superseded_by, m) for m in Memory.objects.filter(superseded_by__isnull=False)]
    assert len(pairs) >= 3, "each project has a correction"
    for new, old in pairs:
        assert new is not None and new.turn is not None and old.turn is not None
        assert new.created_at > old.created_at, (new.content, old.content)
        assert new.turn.started_at > old.turn.started_at, (new.content, old.content)
        proposed = MemoryEvent.objects.get(memory=new, action=MemoryEvent.Action.PROPOSED)
        assert proposed.at > old.created_at


def test_the_demo_bill_reconciles_with_a_proposal_and_an_uninstrumented_day(
    seeded: str, staff: Client
) -> None:
    """The first project's bill: anthropic at exactly 90 % of the estimate every day (a −10 %
    proposal per family), openai within a few percent (none), a mistral day with no step."""
    project = Project.objects.get(slug="support-bot")
    today = timezone.now().date()
    lines = reconcile(Wanted([project.pk], today - timedelta(days=40), today))
    assert lines and max(line.day for line in lines) < today  # billed through yesterday
    anthropic = [line for line in lines if line.provider == "anthropic"]
    assert anthropic and all(line.steps > 0 for line in anthropic)
    for line in anthropic:  # each day and model: 90 % of the steps' cost, to 12 places
        assert line.billed_cost_usd == (line.estimated_cost_usd * Decimal("0.9")).quantize(
            Decimal("1e-12")
        ), line
    openai = [line for line in lines if line.provider == "openai" and line.billed_cost_usd]
    assert openai and all(abs(o.drift_pct or Decimal(0)) <= 3 for o in openai)
    [mistral] = [line for line in lines if line.provider == "mistral"]
    assert mistral.uninstrumented and mistral.billed_cost_usd == Decimal("3.40")
    assert "billed" in seeded and "one mistral day with no step" in seeded

    proposals = drift_proposals(lines)
    assert proposals and {p.provider for p in proposals} == {"anthropic"}
    for proposal in proposals:
        assert proposal.days >= 7
        assert -10 - Decimal("0.0001") <= proposal.percent <= -10 + Decimal("0.0001")
    page = staff.get("/reconciliation/", {"project": "support-bot"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="proposals"' in html and "under list for claude-" in html
    assert 'id="uninstrumented"' in html and "mistral-large-latest" in html
